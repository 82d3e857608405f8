"use strict";
// The modules of src/ in layers that only point down (client/node/README.md): a
// module imports modules of lower ranks only, never one of its own rank or above,
// so there is no import circle. A new module must be given its rank here.
const assert = require("node:assert/strict");
const fs = require("node:fs");
const path = require("node:path");
const { test } = require("node:test");

const RANKS = [
  ["protocol_gen"], // generated from client/protocol.json: imports nothing
  ["http"], // responses, the extension's answers read, the client's own problems
  ["common"], // requests, SQL literals and columns, kept headers, the storage table
  ["fault"], // database faults and connection watches
  ["router"], // Citus routing (its pools watched as fault.ts says)
  ["transactional", "lease"], // the two protocols
  ["batch"], // many keys at once, over the Client's options and answers
  ["adapter"], // the request runner under the framework adapters
  ["express", "fastify"], // framework glue
  ["index"], // the package's entry point
];

test("every module of src/ imports only modules of lower layers", () => {
  const src = path.join(__dirname, "..", "src");
  const rank = new Map(RANKS.flatMap((names, i) => names.map((name) => [name, i])));
  const files = fs.readdirSync(src).filter((f) => f.endsWith(".ts")).map((f) => f.slice(0, -3));
  assert.deepEqual(files.filter((f) => !rank.has(f)), [], "modules without a rank");
  for (const file of files) {
    const text = fs.readFileSync(path.join(src, file + ".ts"), "utf8");
    const imports = [...text.matchAll(/from "\.\/([a-z_]+)"/g)].map((m) => m[1]);
    for (const target of imports) {
      assert.ok(rank.has(target), `${file} imports ${target}, which has no rank`);
      assert.ok(rank.get(target) < rank.get(file), `${file} (layer ${rank.get(file)}) imports ${target} (layer ${rank.get(target)})`);
    }
  }
});

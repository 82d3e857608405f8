"use strict";
// src/protocol_gen.ts is what tools/protocol_gen.py makes of client/protocol.json now
// (a stale file fails), and no other source spells a problem type, a status table or
// a protocol header by hand: those come from the extension or from the generated file.
const assert = require("node:assert/strict");
const { spawnSync } = require("node:child_process");
const fs = require("node:fs");
const path = require("node:path");
const { test } = require("node:test");

const root = path.resolve(__dirname, "..", "..", "..");
const src = path.join(__dirname, "..", "src");

test("src/protocol_gen.ts is not stale (tools/protocol_gen.py node)", () => {
  // The system's Python 3, as the other generated-file checks run it (stdlib only).
  const python = fs.existsSync("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
  const run = spawnSync(python, [path.join(root, "tools", "protocol_gen.py"), "node"], { encoding: "utf8" });
  assert.equal(run.status, 0, run.stderr);
  const committed = fs.readFileSync(path.join(src, "protocol_gen.ts"), "utf8");
  assert.equal(committed, run.stdout, "run: python3 tools/protocol_gen.py node > client/node/src/protocol_gen.ts");
});

test("no problem type, title or protocol header is written by hand in src/", () => {
  const table = JSON.parse(fs.readFileSync(path.join(root, "client", "protocol.json"), "utf8"));
  const spelled = [
    ...Object.values(table.problems).flatMap((p) => [`"${p.type}"`, `"${p.title}"`]),
    ...Object.values(table.outcomes).filter((o) => o.detail).map((o) => `"${o.detail}"`),
    ...Object.values(table.client_details).map((detail) => `"${detail}"`),
    `"${table.problem_type_base}"`,
    `"${table.expires_header}"`,
    `"${table.stream_chunks_entry}"`,
    `"${table.not_kept_entry}"`,
    `"${table.routing.stale_placement.message}"`,
  ];
  for (const file of fs.readdirSync(src).filter((f) => f.endsWith(".ts") && f !== "protocol_gen.ts")) {
    const text = fs.readFileSync(path.join(src, file), "utf8");
    for (const literal of spelled) assert.ok(!text.includes(literal), `${file} spells ${literal}`);
  }
});

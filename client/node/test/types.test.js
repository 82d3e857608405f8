"use strict";
// The shipped declarations (dist/*.d.ts) type-check an application's use of
// the package, Express's request augmentation included.
const assert = require("node:assert/strict");
const { spawnSync } = require("node:child_process");
const path = require("node:path");
const { test } = require("node:test");

test("dist/*.d.ts type-check a TypeScript consumer (tsc --noEmit --strict)", () => {
  // The package's bin (TypeScript 7 exports no "./bin/tsc" subpath to require.resolve).
  const tsc = path.join(__dirname, "..", "node_modules", "typescript", "bin", "tsc");
  const file = path.join(__dirname, "types", "consumer.ts");
  const flags = ["--ignoreConfig", "--noEmit", "--strict", "--esModuleInterop", "--skipLibCheck",
    "--target", "ES2020", "--module", "commonjs", "--types", "node"];
  const run = spawnSync(process.execPath, [tsc, ...flags, file], { encoding: "utf8" });
  assert.equal(run.status, 0, run.stdout + run.stderr);
});

test("the package's entry point and types are where package.json says", () => {
  const pkg = require("../package.json");
  assert.ok(require("node:fs").existsSync(path.join(__dirname, "..", pkg.types)));
  const main = require(path.join(__dirname, "..", pkg.main));
  for (const name of ["Client", "LeaseRunner", "Response", "Problem", "idempotency", "fingerprint", "problemResponse",
    "beginBatch", "completeBatch", "claimBatch", "pushUnique", "Router", "ROUTING"]) {
    assert.ok(name in main, name);
  }
  assert.deepEqual(Object.keys(pkg.dependencies), ["fastify-plugin", "pg"]);
});

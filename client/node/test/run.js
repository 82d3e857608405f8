#!/usr/bin/env node
// Runs the tests against one throwaway PostgreSQL cluster: starts it with
// scripts/pgcluster.sh (PGBIN picks the binaries; IDEM_NODE_TEST_PORT the port,
// default random in 30000-39999), runs `node --test` on test/*.test.js with
// IDEM_NODE_PG set, stops the cluster. Extra arguments go to `node --test`.
"use strict";
const { spawnSync } = require("node:child_process");
const fs = require("node:fs");
const os = require("node:os");
const path = require("node:path");

const root = path.resolve(__dirname, "..", "..", "..");
const script = path.join(root, "scripts", "pgcluster.sh");
const folder = fs.mkdtempSync(path.join(os.tmpdir(), "idem-node-test."));
const port = Number(process.env.IDEM_NODE_TEST_PORT || 30000 + Math.floor(Math.random() * 10000));
const start = spawnSync("bash", [script, "start", path.join(folder, "pg"), String(port)], { stdio: "inherit" });
let status = 1;
try {
  if (start.status === 0) {
    const files = fs
      .readdirSync(__dirname)
      .filter((f) => f.endsWith(".test.js"))
      .sort()
      .map((f) => path.join(__dirname, f));
    const env = { ...process.env, IDEM_NODE_PG: JSON.stringify({ host: path.join(folder, "pg"), port, user: "postgres" }) };
    // One file at a time where node knows the flag (20.10+): timing and round-trip tests stay quiet.
    const [major, minor] = process.versions.node.split(".").map(Number);
    const serial = major > 20 || (major === 20 && minor >= 10) ? ["--test-concurrency=1"] : [];
    const run = spawnSync(process.execPath, ["--test", ...serial, ...process.argv.slice(2), ...files], {
      stdio: "inherit",
      env,
    });
    status = run.status ?? 1;
  }
} finally {
  spawnSync("bash", [script, "stop", path.join(folder, "pg")], { stdio: "inherit" });
  fs.rmSync(folder, { recursive: true, force: true });
}
process.exit(status);

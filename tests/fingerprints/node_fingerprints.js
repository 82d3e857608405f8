#!/usr/bin/env node
// Prints the fingerprint (hex) of each request read from stdin, computed by the
// Node client (client/node, built) exactly as its begin() sends the values:
// one JSON array [method, path, body hex or null] per line in, one digest per
// line out. Used by agree.py.
//
//   node node_fingerprints.js --dsn "host=... port=... dbname=..." < requests.jsonl
"use strict";
const path = require("node:path");
const readline = require("node:readline");

const client = path.join(__dirname, "..", "..", "client", "node");
const { fingerprint } = require(path.join(client, "dist", "index.js"));
const pg = require(require.resolve("pg", { paths: [client] }));

/** A libpq key=value connection string as node-pg settings. */
function parseDsn(dsn) {
  const config = {};
  const names = { host: "host", port: "port", dbname: "database", user: "user", password: "password" };
  for (const [, name, raw] of dsn.matchAll(/(\w+)\s*=\s*('(?:[^'\\]|\\.)*'|\S*)/g)) {
    const value = raw.startsWith("'") ? raw.slice(1, -1).replace(/\\(.)/g, "$1") : raw;
    if (names[name]) config[names[name]] = name === "port" ? Number(value) : value;
  }
  return config;
}

async function main() {
  const at = process.argv.indexOf("--dsn");
  const conn = new pg.Client(parseDsn(at > 0 ? process.argv[at + 1] : ""));
  await conn.connect();
  const out = [];
  try {
    for await (const line of readline.createInterface({ input: process.stdin })) {
      if (!line) continue;
      const [method, route, body] = JSON.parse(line);
      const digest = await fingerprint(conn, method, route, body === null ? null : Buffer.from(body, "hex"));
      out.push(digest.toString("hex"));
    }
  } finally {
    await conn.end();
  }
  process.stdout.write(out.join("\n") + "\n");
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});

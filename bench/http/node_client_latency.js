#!/usr/bin/env node
// Time per request of the Node client on one connection, one request at a
// time: the plain route's BEGIN / INSERT / COMMIT against Client.handle with
// its statements prepared once per session (the default) and sent in full
// (prepare: false). Rounds alternate the three; medians. Reaches PostgreSQL
// through node-pg's PG* environment variables (PGHOST, PGPORT, PGUSER,
// PGDATABASE); the database needs the extension. Needs client/node built.
//
//   PGHOST=/tmp/pg PGDATABASE=shop node bench/http/node_client_latency.js [ROUNDS] [REQUESTS]
"use strict";
const path = require("node:path");

const client = path.join(__dirname, "..", "..", "client", "node");
const pg = require(require.resolve("pg", { paths: [client] }));
const { Client, Response } = require(path.join(client, "dist", "index.js"));

async function main() {
  const rounds = Number(process.argv[2] || 8);
  const n = Number(process.argv[3] || 300);
  const db = new pg.Client();
  await db.connect();
  await db.query(
    "CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, principal text NOT NULL, item text NOT NULL," +
      " quantity int NOT NULL, created_at timestamptz NOT NULL DEFAULT now())",
  );
  const handler = async (c) => {
    const { rows } = await c.query(
      "INSERT INTO orders (principal, item, quantity) VALUES ($1, $2, $3) RETURNING id::text, created_at::text",
      ["bench", "book", 1],
    );
    return new Response(201, [["Content-Type", "application/json"], ["Location", `/orders/${rows[0].id}`]],
      JSON.stringify({ id: rows[0].id }));
  };
  const prepared = new Client();
  const inline = new Client({ prepare: false });
  const body = '{"item":"book","quantity":1}';
  const request = (k) => ({ principal: "bench", key: k, method: "POST", path: "/orders", body });
  const variants = {
    plain: async () => {
      await db.query("BEGIN");
      await handler(db);
      await db.query("COMMIT");
    },
    prepared: (k) => prepared.handle(db, request(k), handler),
    inline: (k) => inline.handle(db, request(k), handler),
  };
  const results = { plain: [], prepared: [], inline: [] };
  const run = `${Date.now()}-${Math.random()}`;
  for (let round = 0; round < rounds; round++) {
    for (const [name, fn] of Object.entries(variants)) {
      const start = process.hrtime.bigint();
      for (let i = 0; i < n; i++) await fn(`${run}-${name}-${round}-${i}`);
      results[name].push(Number(process.hrtime.bigint() - start) / n / 1000);
    }
  }
  const median = (a) => {
    const s = [...a].sort((x, y) => x - y);
    return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
  };
  for (const [name, a] of Object.entries(results)) {
    console.log(`${name.padEnd(9)} ${median(a).toFixed(0).padStart(6)} us per request (median); rounds: ${a.map((x) => x.toFixed(0)).join(" ")}`);
  }
  await db.end();
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});

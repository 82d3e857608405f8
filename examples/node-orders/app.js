#!/usr/bin/env node
// node-orders: the orders service of examples/orders-service on Express and
// node-pg, idempotent through pg-idempotency's middleware (client/node).
//
//   node app.js --port 8080 --dsn "host=... port=... dbname=..." [--threads 8]
//
// Same routes, bodies and headers as the C++ and Python services:
//
//   POST /orders          {"item": "...", "quantity": n}; Idempotency-Key;
//                         Authorization: Bearer <principal>; ?delay_ms=N slows the handler
//   POST /reject/orders   the same in reject mode: a duplicate of a running request
//                         gets 409 with Retry-After at once instead of waiting
//   POST /plain/orders    the same handler without the middleware (baseline)
//   POST /classic/orders  the same as /orders (the C++ service's five-round-trip variant)
//   POST /flaky/orders    the first run for each (principal, key) inserts the order,
//                         then answers 500: rolled back, not stored, the retry runs again
//   POST /api-keys        {"name": "..."}: the secret is answered once (one_time_secret)
//   POST /orders/stream   {"chunks": n, "chunk_bytes": m}: inserts one order, then streams
//                         n chunks of m bytes (chunk i is the digit i % 10), chunked;
//                         kept for replay up to 65536 bytes (maxStreamBytes)
//   GET  /orders/count    {"orders": n}
//   GET  /health          ok
"use strict";

const path = require("node:path");

function load(name) {
  try {
    return require(name);
  } catch (error) {
    if (error.code !== "MODULE_NOT_FOUND") throw error;
    // Not installed here: the package's own folder (client/node, built with tsc) and its node_modules.
    const client = path.join(__dirname, "..", "..", "client", "node");
    if (name === "pg-idempotency") return require(path.join(client, "dist", "index.js"));
    return require(require.resolve(name, { paths: [client] }));
  }
}

const express = load("express");
const pg = load("pg");
const { Client, idempotency } = load("pg-idempotency");

/** Compact JSON with sorted members: the bytes nlohmann_json writes in the C++ service. */
function dumps(value) {
  const sort = (v) =>
    v && typeof v === "object" && !Array.isArray(v)
      ? Object.fromEntries(Object.keys(v).sort().map((k) => [k, sort(v[k])]))
      : v;
  return Buffer.from(JSON.stringify(sort(value)), "utf8");
}

function problem(status, title, detail) {
  return [status, [["Content-Type", "application/problem+json"]], dumps({ type: "about:blank", title, status, detail })];
}

/** A libpq connection string ("host=/tmp port=5432 dbname=shop") as node-pg settings. */
function parseDsn(dsn) {
  const config = {};
  const names = { host: "host", port: "port", dbname: "database", user: "user", password: "password" };
  const pattern = /(\w+)\s*=\s*('(?:[^'\\]|\\.)*'|\S*)/g;
  for (const [, name, raw] of dsn.matchAll(pattern)) {
    const value = raw.startsWith("'") ? raw.slice(1, -1).replace(/\\(.)/g, "$1") : raw;
    if (names[name]) config[names[name]] = name === "port" ? Number(value) : value;
  }
  return config;
}

function principalOf(req) {
  const auth = req.get("Authorization") ?? "";
  return auth.length > 7 && auth.startsWith("Bearer ") ? auth.slice(7) : null;
}

const flakyFailed = new Set();
/** True the first time for each (principal, key). */
function firstRun(principal, key) {
  const id = JSON.stringify([principal, key]);
  if (flakyFailed.has(id)) return false;
  flakyFailed.add(id);
  return true;
}

function parse(body) {
  try {
    return JSON.parse(body.toString("utf8"));
  } catch {
    return null;
  }
}

/** POST /orders: [status, headers, body] and the new order's id. */
async function createOrder(db, principal, body, delayMs) {
  const data = parse(body);
  if (!data || typeof data !== "object" || Array.isArray(data) || typeof data.item !== "string" || !data.item) {
    return [problem(400, "Invalid order", 'The body must be a JSON object with a non-empty "item" string.'), null];
  }
  const quantity = data.quantity ?? 1;
  if (!Number.isInteger(quantity) || quantity < 1 || quantity > 1000) {
    return [problem(422, "Invalid quantity", "quantity must be 1 to 1000."), null];
  }
  if (delayMs > 0) await db.query("SELECT pg_sleep($1::float8 / 1000)", [delayMs]);
  const { rows } = await db.query(
    "INSERT INTO orders (principal, item, quantity) VALUES ($1, $2, $3) RETURNING id::text, created_at::text",
    [principal, data.item, quantity],
  );
  const id = rows[0].id;
  const out = dumps({ id: Number(id), item: data.item, quantity, created_at: rows[0].created_at });
  return [[201, [["Content-Type", "application/json"], ["Location", `/orders/${id}`]], out], id];
}

/** POST /api-keys: the response carries a secret, so it is sent once and never stored. */
async function createApiKey(db, principal, body) {
  const data = parse(body);
  if (!data || typeof data !== "object" || Array.isArray(data) || typeof data.name !== "string" || !data.name) {
    return [problem(400, "Invalid API key request", 'The body must be a JSON object with a non-empty "name" string.'), null];
  }
  const { rows } = await db.query(
    "INSERT INTO api_keys (principal, name) VALUES ($1, $2)" +
      " RETURNING id::text, 'sk_' || replace(pg_catalog.gen_random_uuid()::text, '-', '') AS secret",
    [principal, data.name],
  );
  const out = dumps({ id: Number(rows[0].id), name: data.name, secret: rows[0].secret });
  return [[201, [["Content-Type", "application/json"], ["Location", `/api-keys/${rows[0].id}`]], out], rows[0].id];
}

/** [chunks, chunkBytes] of a POST /orders/stream body, or null when it is not valid. */
function streamSpec(body) {
  const data = parse(body);
  if (!data || typeof data !== "object" || Array.isArray(data)) return null;
  const { chunks: n, chunk_bytes: m } = data;
  if (!Number.isInteger(n) || !Number.isInteger(m)) return null;
  return n >= 1 && n <= 1000 && m >= 1 && m <= 65536 ? [n, m] : null;
}

/** Resolves when res takes more (drain) or is gone (close). */
function drained(res) {
  if (res.destroyed) return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      res.off("drain", done);
      res.off("close", done);
      resolve();
    };
    res.on("drain", done);
    res.on("close", done);
  });
}

/** POST /orders/stream: one order, then n chunks of m digits, each written (a chunk) on its own. */
async function streamOrder(req, res) {
  const context = req.idempotency;
  if (!context) return send(res, problem(401, "Unauthorized", "Send Authorization: Bearer <token>."));
  const spec = streamSpec(req.body);
  if (spec === null) {
    const detail = 'The body must be a JSON object with "chunks" 1 to 1000 and "chunk_bytes" 1 to 65536.';
    return send(res, problem(400, "Invalid stream request", detail));
  }
  const [n, m] = spec;
  const { rows } = await context.db.query(
    "INSERT INTO orders (principal, item, quantity) VALUES ($1, 'stream', $2) RETURNING id::text",
    [context.request.principal, n],
  );
  context.resourceId = rows[0].id;
  res.status(200);
  res.setHeader("Content-Type", "text/plain");
  for (let i = 0; i < n && !res.destroyed; i++) {
    if (!res.write(Buffer.alloc(m, String(i % 10)))) await drained(res);
  }
  res.end();
  return undefined;
}

function send(res, [status, headers, body]) {
  res.status(status);
  for (const [name, value] of headers) res.setHeader(name, value); // res.set would add "; charset=utf-8"
  res.end(body);
}

/** The service: routes, the business handlers, and the middleware around them. */
function makeApp(pool) {
  const app = express();
  app.disable("x-powered-by");
  app.set("etag", false);
  app.use(
    idempotency({
      pool,
      client: new Client(),
      principal: principalOf,
      applies: (req) => req.method === "POST" && req.path !== "/plain/orders",
      duplicates: (req) => (req.path === "/reject/orders" ? "reject" : "wait"),
      maxStreamBytes: 65536,
    }),
  );
  app.get("/health", (req, res) => res.type("text/plain").send("ok"));
  app.get("/orders/count", async (req, res) => {
    const { rows } = await pool.query("SELECT count(*)::text AS n FROM orders");
    send(res, [200, [["Content-Type", "application/json"]], dumps({ orders: Number(rows[0].n) })]);
  });
  const delayOf = (req) => (/^\d+$/.test(String(req.query.delay_ms ?? "")) ? Number(req.query.delay_ms) : 0);
  app.post("/plain/orders", express.raw({ type: () => true }), async (req, res) => {
    const principal = principalOf(req);
    if (principal === null) return send(res, problem(401, "Unauthorized", "Send Authorization: Bearer <token>."));
    const db = await pool.connect();
    try {
      await db.query("BEGIN");
      const [result] = await createOrder(db, principal, Buffer.isBuffer(req.body) ? req.body : Buffer.alloc(0), delayOf(req));
      await db.query(result[0] < 300 ? "COMMIT" : "ROLLBACK");
      send(res, result);
    } catch (error) {
      await db.query("ROLLBACK").catch(() => undefined);
      throw error;
    } finally {
      db.release();
    }
  });
  const keyed = (route) => async (req, res) => {
    const context = req.idempotency;
    if (!context) return send(res, problem(401, "Unauthorized", "Send Authorization: Bearer <token>."));
    const principal = context.request.principal;
    let result;
    let resourceId;
    if (route === "api-key") {
      [result, resourceId] = await createApiKey(context.db, principal, req.body);
      context.oneTimeSecret = result[0] < 300;
    } else {
      [result, resourceId] = await createOrder(context.db, principal, req.body, delayOf(req));
      if (route === "flaky" && result[0] < 300 && firstRun(principal, context.request.key ?? "")) {
        result = problem(500, "Internal error", "The request failed; it is safe to retry with the same key.");
      }
    }
    context.resourceId = resourceId;
    send(res, result);
  };
  app.post("/orders", keyed("order"));
  app.post("/reject/orders", keyed("order"));
  app.post("/classic/orders", keyed("order"));
  app.post("/flaky/orders", keyed("flaky"));
  app.post("/api-keys", keyed("api-key"));
  app.post("/orders/stream", streamOrder);
  app.use((req, res) => send(res, problem(404, "Not found", "No such route.")));
  app.use((error, req, res, next) => {
    void next;
    console.error("node-orders:", error);
    send(res, problem(500, "Internal error", "The request failed; it is safe to retry with the same key."));
  });
  return app;
}

async function main() {
  const args = { port: 8080, dsn: "", threads: 8 };
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i += 2) {
    const name = argv[i].replace(/^--/, "");
    if (!(name in args) || argv[i + 1] === undefined) {
      console.error("usage: app.js --port N --dsn CONNINFO [--threads N]");
      return 2;
    }
    args[name] = name === "dsn" ? argv[i + 1] : Number(argv[i + 1]);
  }
  const config = parseDsn(args.dsn);
  const pool = new pg.Pool({ ...config, max: args.threads });
  pool.on("error", (error) => console.error("node-orders: idle connection lost:", error.message));
  // The tables, made once the database answers: a service starts while its database
  // is down (or restarting) and serves when it is back.
  const prepare = async () => {
    try {
      await pool.query(
        "CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, principal text NOT NULL," +
          " item text NOT NULL, quantity int NOT NULL," +
          " created_at timestamptz NOT NULL DEFAULT now())",
      );
      await pool.query(
        "CREATE TABLE IF NOT EXISTS api_keys (id bigserial PRIMARY KEY, principal text NOT NULL," +
          " name text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())",
      );
    } catch (error) {
      console.error(`node-orders: cannot prepare the database yet (${error.message}); retrying`);
      setTimeout(prepare, 1000);
    }
  };
  void prepare();
  const server = makeApp(pool).listen(args.port, "127.0.0.1", () => {
    console.error(`node-orders: listening on 127.0.0.1:${args.port}`);
  });
  server.keepAliveTimeout = 60_000;
  const stop = () => server.close(() => pool.end().then(() => process.exit(0)));
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
  return undefined;
}

main().then((code) => {
  if (code !== undefined) process.exit(code);
});

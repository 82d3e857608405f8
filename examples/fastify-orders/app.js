#!/usr/bin/env node
// fastify-orders: the orders service of examples/orders-service on Fastify 5 and
// node-pg, idempotent through pg-idempotency's Fastify plugin (client/node).
//
//   node app.js --port 8080 --dsn "host=... port=... dbname=..." [--threads 8]
//
// Same routes, bodies and headers as examples/node-orders (Express) and the C++ and
// Python services (README.md has the table); passes tests/conformance.
"use strict";

const path = require("node:path");
const { Readable } = require("node:stream");

function load(name) {
  try {
    return require(name);
  } catch (error) {
    if (error.code !== "MODULE_NOT_FOUND") throw error;
    // Not installed here: the package's own folder (client/node, built with tsc) and its node_modules.
    const client = path.join(__dirname, "..", "..", "client", "node");
    if (name.startsWith("pg-idempotency")) return require(path.join(client, name.slice("pg-idempotency".length) || "."));
    return require(require.resolve(name, { paths: [client] }));
  }
}

const Fastify = load("fastify");
const pg = load("pg");
const { Client } = load("pg-idempotency");
const { idempotency } = load("pg-idempotency/fastify");

/** Compact JSON with sorted members: the bytes nlohmann_json writes in the C++ service. */
function dumps(value) {
  const sort = (v) =>
    v && typeof v === "object" && !Array.isArray(v)
      ? Object.fromEntries(Object.keys(v).sort().map((k) => [k, sort(v[k])]))
      : v;
  return Buffer.from(JSON.stringify(sort(value)), "utf8");
}

function problem(status, title, detail) {
  const body = dumps({ type: "about:blank", title, status, detail });
  return [status, [["Content-Type", "application/problem+json"]], body];
}

const UNAUTHORIZED = problem(401, "Unauthorized", "Send Authorization: Bearer <token>.");

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

function principalOf(request) {
  const auth = request.headers.authorization ?? "";
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
    return JSON.parse(Buffer.isBuffer(body) ? body.toString("utf8") : "");
  } catch {
    return null;
  }
}

const isObject = (data) => data && typeof data === "object" && !Array.isArray(data);

/** POST /orders: [status, headers, body] and the new order's id. */
async function createOrder(db, principal, body, delayMs) {
  const data = parse(body);
  if (!isObject(data) || typeof data.item !== "string" || !data.item) {
    const detail = 'The body must be a JSON object with a non-empty "item" string.';
    return [problem(400, "Invalid order", detail), null];
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
  if (!isObject(data) || typeof data.name !== "string" || !data.name) {
    const detail = 'The body must be a JSON object with a non-empty "name" string.';
    return [problem(400, "Invalid API key request", detail), null];
  }
  const { rows } = await db.query(
    "INSERT INTO api_keys (principal, name) VALUES ($1, $2)" +
      " RETURNING id::text, 'sk_' || replace(pg_catalog.gen_random_uuid()::text, '-', '') AS secret",
    [principal, data.name],
  );
  const out = dumps({ id: Number(rows[0].id), name: data.name, secret: rows[0].secret });
  const headers = [["Content-Type", "application/json"], ["Location", `/api-keys/${rows[0].id}`]];
  return [[201, headers, out], rows[0].id];
}

/** [chunks, chunkBytes] of a POST /orders/stream body, or null when it is not valid. */
function streamSpec(body) {
  const data = parse(body);
  if (!isObject(data)) return null;
  const { chunks: n, chunk_bytes: m } = data;
  if (!Number.isInteger(n) || !Number.isInteger(m)) return null;
  return n >= 1 && n <= 1000 && m >= 1 && m <= 65536 ? [n, m] : null;
}

function send(reply, [status, headers, body]) {
  reply.code(status);
  for (const [name, value] of headers) reply.header(name, value);
  return reply.send(body);
}

/** The service: routes, the business handlers, and the plugin around them. */
async function makeApp(pool) {
  const app = Fastify({ logger: false, keepAliveTimeout: 60_000 });
  // Every body as its bytes: the handlers parse JSON themselves and answer 400 the same way
  // whatever the Content-Type (as the C++ and Python services do).
  app.removeAllContentTypeParsers();
  app.addContentTypeParser("*", { parseAs: "buffer" }, (request, body, done) => done(null, body));
  await app.register(idempotency, {
    pool,
    client: new Client(),
    principal: principalOf,
    applies: (request) => request.method === "POST" && request.url.split("?")[0] !== "/plain/orders",
    duplicates: (request) => (request.url.split("?")[0] === "/reject/orders" ? "reject" : "wait"),
    maxStreamBytes: 65536,
  });
  const bodyOf = (request) => (Buffer.isBuffer(request.body) ? request.body : Buffer.alloc(0));
  const delayOf = (request) => {
    const delay = String(request.query.delay_ms ?? "");
    return /^\d+$/.test(delay) ? Number(delay) : 0;
  };
  app.get("/health", async (request, reply) => reply.header("Content-Type", "text/plain").send("ok"));
  app.get("/orders/count", async (request, reply) => {
    const { rows } = await pool.query("SELECT count(*)::text AS n FROM orders");
    return send(reply, [200, [["Content-Type", "application/json"]], dumps({ orders: Number(rows[0].n) })]);
  });
  app.post("/plain/orders", async (request, reply) => {
    const principal = principalOf(request);
    if (principal === null) return send(reply, UNAUTHORIZED);
    const db = await pool.connect();
    try {
      await db.query("BEGIN");
      const [result] = await createOrder(db, principal, bodyOf(request), delayOf(request));
      await db.query(result[0] < 300 ? "COMMIT" : "ROLLBACK");
      return send(reply, result);
    } catch (error) {
      await db.query("ROLLBACK").catch(() => undefined);
      throw error;
    } finally {
      db.release();
    }
  });
  const keyed = (route) => async (request, reply) => {
    const context = request.idempotency;
    if (!context) return send(reply, UNAUTHORIZED);
    const principal = context.request.principal;
    let result;
    let resourceId;
    if (route === "api-key") {
      [result, resourceId] = await createApiKey(context.db, principal, bodyOf(request));
      context.oneTimeSecret = result[0] < 300;
    } else {
      [result, resourceId] = await createOrder(context.db, principal, bodyOf(request), delayOf(request));
      if (route === "flaky" && result[0] < 300 && firstRun(principal, context.request.key ?? "")) {
        result = problem(500, "Internal error", "The request failed; it is safe to retry with the same key.");
      }
    }
    context.resourceId = resourceId;
    return send(reply, result);
  };
  app.post("/orders", keyed("order"));
  app.post("/reject/orders", keyed("order"));
  app.post("/classic/orders", keyed("order"));
  app.post("/flaky/orders", keyed("flaky"));
  app.post("/api-keys", keyed("api-key"));
  // One order, then n chunks of m digits (chunk i is the digit i % 10), each its own piece.
  app.post("/orders/stream", async (request, reply) => {
    const context = request.idempotency;
    if (!context) return send(reply, UNAUTHORIZED);
    const spec = streamSpec(bodyOf(request));
    if (spec === null) {
      const detail = 'The body must be a JSON object with "chunks" 1 to 1000 and "chunk_bytes" 1 to 65536.';
      return send(reply, problem(400, "Invalid stream request", detail));
    }
    const [n, m] = spec;
    const { rows } = await context.db.query(
      "INSERT INTO orders (principal, item, quantity) VALUES ($1, 'stream', $2) RETURNING id::text",
      [context.request.principal, n],
    );
    context.resourceId = rows[0].id;
    const pieces = (function* () {
      for (let i = 0; i < n; i++) yield Buffer.alloc(m, String(i % 10));
    })();
    return reply.code(200).header("Content-Type", "text/plain").send(Readable.from(pieces));
  });
  app.setNotFoundHandler((request, reply) => send(reply, problem(404, "Not found", "No such route.")));
  app.setErrorHandler((error, request, reply) => {
    const status = Number.isInteger(error.statusCode) ? error.statusCode : 500;
    if (status < 500) return send(reply, problem(status, "Bad request", error.message));
    console.error("fastify-orders:", error);
    return send(reply, problem(500, "Internal error", "The request failed; it is safe to retry with the same key."));
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
  if (!Number.isInteger(args.port) || !Number.isInteger(args.threads) || args.threads < 1) {
    console.error("app.js: --port and --threads take whole numbers");
    return 2;
  }
  const pool = new pg.Pool({ ...parseDsn(args.dsn), max: args.threads });
  pool.on("error", (error) => console.error("fastify-orders: idle connection lost:", error.message));
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
      console.error(`fastify-orders: cannot prepare the database yet (${error.message}); retrying`);
      setTimeout(prepare, 1000);
    }
  };
  void prepare();
  const app = await makeApp(pool);
  await app.listen({ port: args.port, host: "127.0.0.1" });
  console.error(`fastify-orders: listening on 127.0.0.1:${args.port}`);
  const stop = () => app.close().then(() => pool.end()).then(() => process.exit(0));
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
  return undefined;
}

main().then(
  (code) => {
    if (code !== undefined) process.exit(code);
  },
  (error) => {
    console.error("fastify-orders:", error.message);
    process.exit(1);
  },
);

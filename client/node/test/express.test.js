"use strict";
const assert = require("node:assert/strict");
const { test, before, after } = require("node:test");
const express = require("express");
const pg = require("pg");
const { pkg, database, principal, key } = require("./helpers");

const { Client, idempotency } = pkg();
const db = database();

let server;
let pool;
let base;
let runs = 0;

before(async () => {
  await db.init();
  pool = new pg.Pool({ ...db.config, max: 4 });
  pool.on("error", () => undefined); // idle connections dropped with the database
  const app = express();
  app.use(
    idempotency({
      pool,
      client: new Client(),
      principal: (req) => req.get("X-User") ?? null,
      applies: (req) => req.method === "POST",
    }),
  );
  app.post("/orders", async (req, res) => {
    runs++;
    const input = JSON.parse(req.body.toString());
    const { rows } = await req.idempotency.db.query(
      "INSERT INTO orders (principal, item, quantity) VALUES ($1, $2, 1) RETURNING id",
      [req.idempotency.request.principal, input.item],
    );
    req.idempotency.resourceId = String(rows[0].id);
    res.status(201).location(`/orders/${rows[0].id}`).set("X-Run", String(runs)).json({ id: Number(rows[0].id), item: input.item });
  });
  app.post("/fail", async (req) => {
    await req.idempotency.db.query("INSERT INTO orders (principal, item, quantity) VALUES ($1, 'fail', 1)", [req.idempotency.request.principal]);
    throw new Error("handler failed");
  });
  // The route's own backend dies under it (terminated), or its statement is cancelled.
  app.post("/die", async (req) => {
    const insert = "INSERT INTO orders (principal, item, quantity) VALUES ($1, 'die', 1)";
    await req.idempotency.db.query(insert, [req.idempotency.request.principal]);
    await req.idempotency.db.query("SELECT pg_terminate_backend(pg_backend_pid())");
  });
  app.post("/cancel", async (req) => {
    const insert = "INSERT INTO orders (principal, item, quantity) VALUES ($1, 'cancel', 1)";
    await req.idempotency.db.query(insert, [req.idempotency.request.principal]);
    await req.idempotency.db.query("SELECT pg_cancel_backend(pg_backend_pid()), pg_sleep(5)");
  });
  app.post("/secret", (req, res) => {
    req.idempotency.oneTimeSecret = true;
    res.status(201).type("json").send('{"secret":"sk_x"}');
  });
  app.post("/invalid", (req, res) => {
    res.status(400).type("application/problem+json").send('{"title":"bad"}');
  });
  app.use((error, req, res, next) => {
    void next;
    if (process.env.DEBUG_EXPRESS) console.error(error);
    res.status(500).type("text/plain").send("internal");
  });
  await new Promise((resolve) => {
    server = app.listen(0, "127.0.0.1", resolve);
  });
  base = `http://127.0.0.1:${server.address().port}`;
});

after(async () => {
  await new Promise((resolve) => server.close(resolve));
  await pool.end();
});

async function post(path, body, who, k) {
  const headers = { "Content-Type": "application/json" };
  if (who) headers["X-User"] = who;
  if (k !== undefined) headers["Idempotency-Key"] = k;
  const response = await fetch(base + path, { method: "POST", headers, body });
  return { status: response.status, headers: response.headers, body: await response.text() };
}

async function count(who) {
  const { rows } = await pool.query("SELECT count(*)::int AS n FROM orders WHERE principal = $1", [who]);
  return rows[0].n;
}

test("express: 201, then a replay with the kept headers, then 422", async () => {
  const who = principal();
  const k = key();
  const first = await post("/orders", '{"item":"book"}', who, k);
  assert.equal(first.status, 201);
  assert.equal(first.headers.get("idempotent-replay"), null);
  assert.match(first.headers.get("location"), /^\/orders\/\d+$/);
  const retry = await post("/orders", '{ "item" : "book" }', who, k);
  assert.equal(retry.status, 201);
  assert.equal(retry.body, first.body);
  assert.equal(retry.headers.get("idempotent-replay"), "true");
  assert.equal(retry.headers.get("location"), first.headers.get("location"));
  assert.equal(retry.headers.get("content-type"), first.headers.get("content-type"));
  assert.equal(retry.headers.get("etag"), first.headers.get("etag"));
  assert.equal(retry.headers.get("x-run"), null);
  const other = await post("/orders", '{"item":"pen"}', who, k);
  assert.equal(other.status, 422);
  assert.equal(other.headers.get("content-type"), "application/problem+json");
  assert.equal(await count(who), 1);
  const { rows } = await pool.query("SELECT resource_id FROM idempotency.lookup($1, $2)", [who, k]);
  assert.equal(rows[0].resource_id, JSON.parse(first.body).id.toString());
});

test("express: missing key 400; no principal passes through untouched", async () => {
  const who = principal();
  const missing = await post("/orders", '{"item":"book"}', who, undefined);
  assert.equal(missing.status, 400);
  assert.equal(missing.body, '{"detail":"POST requests need an Idempotency-Key header.","status":400,"title":"Idempotency-Key header is missing","type":"/problems/idempotency-key-missing"}');
  const anonymous = await post("/secret", "{}", null, undefined);
  assert.equal(anonymous.status, 500, "the route needs req.idempotency: the app's own error");
});

test("express: a route that throws answers 500, stores nothing, rolls back", async () => {
  const who = principal();
  const k = key();
  const failed = await post("/fail", "{}", who, k);
  assert.equal(failed.status, 500);
  assert.equal(failed.body, "internal");
  assert.equal(await count(who), 0);
  const { rows } = await pool.query("SELECT count(*)::int AS n FROM idempotency.lookup($1, $2)", [who, k]);
  assert.equal(rows[0].n, 0);
});

test("express: a final 4xx is stored and replayed; a one-time secret is sent once", async () => {
  const who = principal();
  const k = key();
  const first = await post("/invalid", "{}", who, k);
  const again = await post("/invalid", "{}", who, k);
  assert.equal(first.status, 400);
  assert.equal(again.status, 400);
  assert.equal(again.body, '{"title":"bad"}');
  assert.equal(again.headers.get("idempotent-replay"), "true");
  const s = key();
  const secret = await post("/secret", "{}", who, s);
  assert.equal(secret.body, '{"secret":"sk_x"}');
  const retry = await post("/secret", "{}", who, s);
  assert.equal(retry.status, 409);
  assert.ok(!retry.body.includes("sk_x"));
});

test("express: a backend terminated or cancelled under the route: the fault answer", async () => {
  const { databaseFaultResponse } = pkg();
  const want = databaseFaultResponse();
  const who = principal();
  for (const path of ["/die", "/cancel", "/die"]) {
    const k = key();
    const first = await post(path, "{}", who, k);
    assert.equal(first.status, 503, path);
    assert.equal(first.body, want.body.toString(), path);
    assert.equal(first.headers.get("content-type"), "application/problem+json", path);
    assert.equal(first.headers.get("retry-after"), "1", path);
    assert.equal((await post(path, "{}", who, k)).status, 503, path); // nothing was kept
  }
  assert.equal(await count(who), 0);
  // The process lives and the pool serves: a new request runs once, its retry replays.
  const k = key();
  const created = await post("/orders", '{"item":"after"}', who, k);
  assert.equal(created.status, 201);
  assert.equal((await post("/orders", '{"item":"after"}', who, k)).body, created.body);
  assert.equal(await count(who), 1);
  // An application error keeps its answer: the route's 500 through Express's handler.
  assert.equal((await post("/fail", "{}", who, key())).status, 500);
});

test("express: a body over the limit is 413; the process and the pool go on", async () => {
  const small = express();
  small.use(idempotency({ pool, client: new Client(), principal: () => "p", limit: 8 }));
  small.post("/x", (req, res) => res.status(201).end("x"));
  const listener = await new Promise((resolve) => {
    const s = small.listen(0, "127.0.0.1", () => resolve(s));
  });
  const url = `http://127.0.0.1:${listener.address().port}/x`;
  try {
    const headers = { "Idempotency-Key": key() };
    const big = await fetch(url, { method: "POST", headers, body: '{"item":"far too long"}' });
    assert.equal(big.status, 413);
    const fits = await fetch(url, { method: "POST", headers: { "Idempotency-Key": key() }, body: "{}" });
    assert.equal(fits.status, 201);
  } finally {
    await new Promise((resolve) => listener.close(resolve));
  }
});

test("express: bad options are refused when the middleware is made", () => {
  const client = new Client();
  const principal = () => "p";
  assert.throws(() => idempotency({ client, principal }), TypeError);
  assert.throws(() => idempotency({ pool, principal }), TypeError);
  assert.throws(() => idempotency({ pool, client }), TypeError);
  assert.throws(() => idempotency({ pool, client, principal, limit: "big" }), RangeError);
  assert.throws(() => idempotency({ pool, client, principal, maxStreamBytes: -1 }), RangeError);
  assert.throws(() => idempotency({ pool, client, principal, duplicates: "sometimes" }), RangeError);
});

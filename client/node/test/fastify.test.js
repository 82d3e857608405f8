"use strict";
// The Fastify plugin (src/fastify.ts) through Fastify's inject: the Express
// middleware's semantics (test/express.test.js, test/streams.test.js).
const assert = require("node:assert/strict");
const { Readable } = require("node:stream");
const { test, before, after } = require("node:test");
const Fastify = require("fastify");
const pg = require("pg");
const { pkg, database, principal, key } = require("./helpers");

const { Client, databaseFaultResponse } = pkg();
const { idempotency } = require("../fastify");
const db = database();

let app;
let pool;
let runs = 0;

before(async () => {
  await db.init();
  pool = new pg.Pool({ ...db.config, max: 4 });
  pool.on("error", () => undefined); // idle connections dropped with the database
  app = Fastify();
  await app.register(idempotency, {
    pool,
    client: new Client(),
    principal: (request) => request.headers["x-user"] ?? null,
    applies: (request) => request.method === "POST",
    duplicates: (request) => (request.url.startsWith("/reject") ? "reject" : null),
    maxStreamBytes: 100,
  });
  const insert = (request, item) =>
    request.idempotency.db.query(
      "INSERT INTO orders (principal, item, quantity) VALUES ($1, $2, 1) RETURNING id::text",
      [request.idempotency.request.principal, item],
    );
  app.post("/orders", async (request, reply) => {
    runs++;
    const { rows } = await insert(request, request.body.item); // Fastify's JSON parser ran
    request.idempotency.resourceId = rows[0].id;
    if (request.query.delay_ms) await request.idempotency.db.query("SELECT pg_sleep(0.3)");
    reply.code(201).header("Location", `/orders/${rows[0].id}`).header("X-Run", String(runs));
    return { id: Number(rows[0].id), item: request.body.item };
  });
  app.post("/reject/orders", async (request, reply) => {
    await insert(request, "reject");
    await request.idempotency.db.query("SELECT pg_sleep(0.3)");
    return reply.code(201).send({ ok: true });
  });
  app.post("/fail", async (request) => {
    await insert(request, "fail");
    throw new Error("handler failed");
  });
  app.post("/die", async (request) => {
    await insert(request, "die");
    await request.idempotency.db.query("SELECT pg_terminate_backend(pg_backend_pid())");
  });
  app.post("/cancel", async (request) => {
    await insert(request, "cancel");
    await request.idempotency.db.query("SELECT pg_cancel_backend(pg_backend_pid()), pg_sleep(5)");
  });
  app.post("/secret", async (request, reply) => {
    request.idempotency.oneTimeSecret = true;
    return reply.code(201).type("application/json").send('{"secret":"sk_x"}');
  });
  app.post("/invalid", async (request, reply) => {
    await insert(request, "invalid");
    return reply.code(400).type("application/problem+json").send('{"title":"bad"}');
  });
  app.post("/busy", async (request, reply) => {
    await insert(request, "busy");
    return reply.code(429).send("slow down");
  });
  app.post("/stream", async (request, reply) => {
    await insert(request, "stream");
    const n = Number(request.query.n ?? 3);
    const pieces = Array.from({ length: n }, (_, i) => Buffer.alloc(10, String(i % 10)));
    return reply.code(200).type("text/plain").send(Readable.from(pieces));
  });
  app.post("/stream/broken", async (request, reply) => {
    await insert(request, "broken");
    const body = new Readable({ read() {} });
    body.push("first");
    setTimeout(() => body.destroy(new Error("the source failed")), 20);
    return reply.code(200).type("text/plain").send(body);
  });
  app.get("/health", async () => "ok");
  await app.ready();
});

after(async () => {
  await app.close();
  await pool.end();
});

function post(url, payload, who, k, headers = {}) {
  const all = { "content-type": "application/json", ...headers };
  if (who) all["x-user"] = who;
  if (k !== undefined) all["idempotency-key"] = k;
  return app.inject({ method: "POST", url, headers: all, payload });
}

async function count(who, item) {
  const { rows } = await pool.query("SELECT count(*)::int AS n FROM orders WHERE principal = $1 AND item = $2", [
    who,
    item,
  ]);
  return rows[0].n;
}

async function stored(who, k) {
  const { rows } = await pool.query(
    "SELECT resource_id, response_headers::text FROM idempotency.keys WHERE principal = $1 AND key = $2",
    [who, k],
  );
  return rows[0];
}

test("fastify: 201, then a byte-identical replay with the kept headers, then 422", async () => {
  const who = principal();
  const k = key();
  const first = await post("/orders", '{"item":"book"}', who, k);
  assert.equal(first.statusCode, 201);
  assert.equal(first.headers["idempotent-replay"], undefined);
  assert.match(first.headers.location, /^\/orders\/\d+$/);
  assert.ok(first.headers["idempotency-expires"].endsWith(" GMT"));
  const retry = await post("/orders", '{ "item" : "book" }', who, k);
  assert.equal(retry.statusCode, 201);
  assert.deepEqual(retry.rawPayload, first.rawPayload);
  assert.equal(retry.headers["idempotent-replay"], "true");
  assert.equal(retry.headers.location, first.headers.location);
  assert.equal(retry.headers["content-type"], first.headers["content-type"]);
  assert.equal(retry.headers["idempotency-expires"], first.headers["idempotency-expires"]);
  assert.equal(retry.headers["x-run"], undefined, "not a kept header");
  const other = await post("/orders", '{"item":"pen"}', who, k);
  assert.equal(other.statusCode, 422);
  assert.equal(other.headers["content-type"], "application/problem+json");
  assert.equal(await count(who, "book"), 1);
  assert.equal(await count(who, "pen"), 0);
  assert.equal((await stored(who, k)).resource_id, String(JSON.parse(first.body).id));
});

test("fastify: missing or malformed key 400; no principal and GET pass through untouched", async () => {
  const who = principal();
  const missing = await post("/orders", '{"item":"book"}', who, undefined);
  assert.equal(missing.statusCode, 400);
  assert.equal(
    missing.body,
    '{"detail":"POST requests need an Idempotency-Key header.","status":400,' +
      '"title":"Idempotency-Key header is missing","type":"/problems/idempotency-key-missing"}',
  );
  assert.equal((await post("/orders", '{"item":"book"}', who, "bad\u0001key")).statusCode, 400);
  const anonymous = await post("/secret", "{}", null, undefined);
  assert.equal(anonymous.statusCode, 500, "the route needs request.idempotency: the app's own error");
  const health = await app.inject({ method: "GET", url: "/health", headers: { "x-user": who } });
  assert.equal(health.body, "ok");
  assert.equal(await count(who, "book"), 0);
});

test("fastify: a route that throws answers 500, stores nothing, rolls back; 429 is not stored", async () => {
  const who = principal();
  for (const [url, item, status] of [["/fail", "fail", 500], ["/busy", "busy", 429]]) {
    const k = key();
    assert.equal((await post(url, "{}", who, k)).statusCode, status);
    assert.equal((await post(url, "{}", who, k)).statusCode, status, "runs again: nothing kept");
    assert.equal(await count(who, item), 0);
    assert.equal(await stored(who, k), undefined);
  }
});

test("fastify: a final 4xx is stored after the rollback and replayed; a one-time secret is sent once", async () => {
  const who = principal();
  const k = key();
  const first = await post("/invalid", "{}", who, k);
  const again = await post("/invalid", "{}", who, k);
  assert.equal(first.statusCode, 400);
  assert.equal(again.statusCode, 400);
  assert.equal(again.body, '{"title":"bad"}');
  assert.equal(again.headers["idempotent-replay"], "true");
  assert.equal(await count(who, "invalid"), 0, "the 4xx's writes were rolled back");
  const s = key();
  const secret = await post("/secret", "{}", who, s);
  assert.equal(secret.statusCode, 201);
  assert.equal(secret.body, '{"secret":"sk_x"}');
  const retry = await post("/secret", "{}", who, s);
  assert.equal(retry.statusCode, 409);
  assert.ok(!retry.body.includes("sk_x"));
});

test("fastify: a duplicate in reject mode gets 409 with Retry-After; in wait mode the replay", async () => {
  const who = principal();
  for (const url of ["/reject/orders", "/orders?delay_ms=300"]) {
    const k = key();
    const running = post(url, '{"item":"dup"}', who, k);
    await new Promise((resolve) => setTimeout(resolve, 100));
    const duplicate = await post(url, '{"item":"dup"}', who, k);
    const first = await running;
    if (url.startsWith("/reject")) {
      assert.equal(duplicate.statusCode, 409);
      assert.ok(Number(duplicate.headers["retry-after"]) >= 1);
    } else {
      assert.equal(duplicate.statusCode, 201);
      assert.equal(duplicate.body, first.body);
      assert.equal(duplicate.headers["idempotent-replay"], "true");
    }
    assert.equal(first.statusCode, 201);
  }
  assert.equal(await count(who, "reject") + (await count(who, "dup")), 2);
});

test("fastify: a backend terminated or cancelled under the route: the fault answer", async () => {
  const want = databaseFaultResponse();
  const who = principal();
  for (const url of ["/die", "/cancel", "/die"]) {
    const k = key();
    const first = await post(url, "{}", who, k);
    assert.equal(first.statusCode, 503, url);
    assert.deepEqual(first.rawPayload, want.body, url);
    assert.equal(first.headers["content-type"], "application/problem+json", url);
    assert.equal(first.headers["retry-after"], "1", url);
    assert.equal((await post(url, "{}", who, k)).statusCode, 503, url); // nothing was kept
  }
  assert.equal(await count(who, "die") + (await count(who, "cancel")), 0);
  const k = key();
  const created = await post("/orders", '{"item":"after"}', who, k);
  assert.equal(created.statusCode, 201);
  assert.equal((await post("/orders", '{"item":"after"}', who, k)).body, created.body);
});

test("fastify: a streamed payload is kept and replayed as the same chunks; past the limit 409", async () => {
  const who = principal();
  const k = key();
  const first = await post("/stream?n=3", "{}", who, k);
  assert.equal(first.statusCode, 200);
  assert.equal(first.body, "000000000011111111112222222222");
  const row = await stored(who, k);
  assert.deepEqual(JSON.parse(row.response_headers).find(([n]) => n === ":chunks"), [":chunks", "10,10,10"]);
  const replay = await post("/stream?n=3", "{}", who, k);
  assert.equal(replay.body, first.body);
  assert.equal(replay.headers["idempotent-replay"], "true");
  const big = key();
  const whole = await post("/stream?n=20", "{}", who, big);
  assert.equal(whole.body.length, 200, "sent whole, not kept");
  const notKept = await post("/stream?n=20", "{}", who, big);
  assert.equal(notKept.statusCode, 409);
  assert.match(notKept.body, /response-not-kept/);
  assert.equal(await count(who, "stream"), 2);
});

test("fastify: a stream that fails midway is rolled back and not kept", async () => {
  const who = principal();
  const k = key();
  await post("/stream/broken", "{}", who, k).catch(() => undefined);
  await new Promise((resolve) => setTimeout(resolve, 100));
  assert.equal(await count(who, "broken"), 0);
  assert.equal(await stored(who, k), undefined);
});

test("fastify: a body over the limit is 413; bad options are refused at registration", async () => {
  const small = Fastify();
  await small.register(idempotency, { pool, client: new Client(), principal: () => "p", limit: 8 });
  small.post("/x", async () => "x");
  const response = await small.inject({
    method: "POST",
    url: "/x",
    headers: { "content-type": "application/json", "idempotency-key": key() },
    payload: '{"item":"far too long"}',
  });
  assert.equal(response.statusCode, 413);
  await small.close();
  for (const options of [{}, { pool }, { pool, client: new Client() }]) {
    const bad = Fastify();
    await assert.rejects(bad.register(idempotency, options).ready(), TypeError);
    await bad.close();
  }
  const principal = () => "p";
  for (const extra of [{ limit: "big" }, { maxStreamBytes: -1 }, { duplicates: "sometimes" }]) {
    const bad = Fastify();
    await assert.rejects(bad.register(idempotency, { pool, client: new Client(), principal, ...extra }).ready(), RangeError);
    await bad.close();
  }
});

test("fastify: a client that goes away mid-stream: rolled back, not kept, the connection back", async () => {
  const http = require("node:http");
  const one = new pg.Pool({ ...db.config, max: 1 });
  const server = Fastify();
  await server.register(idempotency, { pool: one, client: new Client(), principal: () => "gone" });
  server.post("/s", async (request, reply) => {
    await request.idempotency.db.query("INSERT INTO orders (principal, item, quantity) VALUES ('gone', 'gone', 1)");
    const body = new Readable({ read() {} });
    let n = 0;
    const timer = setInterval(() => {
      body.push(Buffer.alloc(65536, "x"));
      if (++n > 200) {
        clearInterval(timer);
        body.push(null);
      }
    }, 5);
    return reply.header("content-type", "text/plain").send(body);
  });
  await server.listen({ port: 0, host: "127.0.0.1" });
  const k = key();
  try {
    await new Promise((resolve) => {
      const headers = { "idempotency-key": k, "content-type": "application/json" };
      const req = http.request({ port: server.server.address().port, method: "POST", path: "/s", headers }, (res) => {
        res.once("data", () => setTimeout(() => resolve(req.destroy()), 30));
      });
      req.on("error", () => undefined);
      req.end("{}");
    });
    await new Promise((resolve) => setTimeout(resolve, 1500));
    const { rows } = await one.query("SELECT count(*)::int AS n FROM orders WHERE principal = 'gone'");
    assert.equal(rows[0].n, 0, "rolled back; and the pool's one connection came back");
    assert.equal(await stored("gone", k), undefined);
  } finally {
    await server.close();
    await one.end();
  }
});

"use strict";
// Router (routing by principal under Citus) through the Express middleware, on a fake
// placement: three databases of one cluster stand for the nodes (the default one,
// "<db>_a" as a.test:5432 and "<db>_b" as b.test:5432), and the placement query reads
// route_fake in the default database. Each keyed request's route writes an order: the
// key row and the order must land in the routed database and nowhere else. Node a's
// database has tests/scale-out/fake_citus.sql (Citus's catalogs, faked): there the
// extension refuses a principal whose shard moved with the real stale-placement error.
const assert = require("node:assert/strict");
const fs = require("node:fs");
const net = require("node:net");
const path = require("node:path");
const { test, before, after } = require("node:test");
const express = require("express");
const Fastify = require("fastify");
const pg = require("pg");
const { pkg, database, principal, key, root } = require("./helpers");

const { Client, ROUTING, Router, idempotency, isStalePlacement, routedPoolConfig } = pkg();
const { idempotency: fastifyIdempotency } = require("../fastify");
const db = database();
const FAKE = "SELECT node_name, node_port FROM route_fake WHERE principal = $1";
const ORDERS =
  "CREATE TABLE orders (id bigserial PRIMARY KEY, principal text NOT NULL, item text NOT NULL," +
  " quantity int NOT NULL, created_at timestamptz NOT NULL DEFAULT now())";

const pools = {}; // default, a, b: pools on 127.0.0.1
const names = {};
let tcp;

function poolFor(database, extra = {}) {
  const pool = new pg.Pool({ ...tcp, database, max: 3, ...extra });
  pool.on("error", () => undefined); // idle connections dropped with the database
  return pool;
}

before(async () => {
  await db.init();
  tcp = { host: "127.0.0.1", port: db.config.port, user: db.config.user };
  names.default = db.config.database;
  names.a = db.config.database + "_a";
  names.b = db.config.database + "_b";
  pools.default = poolFor(names.default);
  const fake = fs.readFileSync(path.join(root, "tests", "scale-out", "fake_citus.sql"), "utf8");
  for (const node of ["a", "b"]) {
    await pools.default.query(`CREATE DATABASE "${names[node]}"`);
    // One session of its own: the extension reads the placement once per session, so
    // the pool's sessions must all start after the fake catalogs exist.
    const setup = new pg.Client({ ...tcp, database: names[node] });
    await setup.connect();
    await setup.query("CREATE EXTENSION idempotency");
    if (node === "a") await setup.query(fake);
    await setup.query(ORDERS);
    await setup.end();
    // A node's pool as docs/node.md says: routedPoolConfig, the user's options kept.
    pools[node] = poolFor(names[node], routedPoolConfig({ options: "-c work_mem=7MB" }));
  }
  await pools.default.query(
    "CREATE TABLE route_fake (principal text PRIMARY KEY, node_name text, node_port int)",
  );
});

after(async () => {
  // helpers' after hook (registered first) may have dropped the default database already.
  await Promise.all(Object.values(pools).map((pool) => pool.end()));
  const admin = new pg.Client({ ...tcp, database: "postgres" });
  await admin.connect();
  for (const node of ["a", "b"]) await admin.query(`DROP DATABASE "${names[node]}" WITH (FORCE)`);
  await admin.end();
});

/** A port on 127.0.0.1 where nothing listens. */
async function closedPort() {
  const server = net.createServer();
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/** Places `who` on node "host:5432" (null: removes the placement). */
async function place(who, host) {
  await pools.default.query("DELETE FROM route_fake WHERE principal = $1", [who]);
  if (host === null) return;
  await pools.default.query("INSERT INTO route_fake VALUES ($1, $2, 5432)", [who, host]);
}

/** Raises the extension's stale-placement error (as the route's own statement). */
const RAISE_STALE =
  "DO $$BEGIN RAISE EXCEPTION USING ERRCODE = '0A000'," +
  " MESSAGE = 'the key''s shard is not on this node'; END$$";

/** Moves `who`'s shard away from node a: node a's extension refuses it from now on. */
async function moveAwayFromA(who) {
  await pools.a.query("INSERT INTO pg_catalog.fake_citus_shard VALUES ($1, 2)", [who]);
}

/**
 * An Express app behind the middleware with `router`; returns post(who, key, headers),
 * runs() (how many times the route ran) and close(). A request with X-Stale: the route
 * writes its order, then a statement fails with the stale-placement error.
 */
async function service(router, framework = "express") {
  if (framework === "fastify") return fastifyService(router);
  const app = express();
  const principalOf = (req) => req.get("X-User") ?? null;
  let runs = 0;
  app.use(idempotency({ router, client: new Client(), principal: principalOf }));
  app.post("/orders", async (req, res) => {
    runs++;
    const ctx = req.idempotency;
    const { rows } = await ctx.db.query(
      "INSERT INTO orders (principal, item, quantity) VALUES ($1, 'book', 1) RETURNING id",
      [ctx.request.principal],
    );
    if (req.get("X-Stale")) await ctx.db.query(RAISE_STALE);
    const here = await ctx.db.query("SELECT current_database() AS d");
    res.status(201).json({ id: Number(rows[0].id), db: here.rows[0].d });
  });
  app.use((error, req, res, next) => {
    void next;
    res.status(500).type("text/plain").send(String(error));
  });
  const server = await new Promise((resolve) => {
    const s = app.listen(0, "127.0.0.1", () => resolve(s));
  });
  const base = `http://127.0.0.1:${server.address().port}`;
  return {
    post: async (who, k, extra = {}) => {
      const r = await fetch(base + "/orders", {
        method: "POST",
        headers: { "X-User": who, "Idempotency-Key": k, "Content-Type": "application/json", ...extra },
        body: "{}",
      });
      const replayed = r.headers.get("idempotent-replay");
      return { status: r.status, replayed, body: await r.text() };
    },
    runs: () => runs,
    close: () => new Promise((resolve) => server.close(resolve)),
  };
}

/** The same service on Fastify, behind the plugin with `router`. */
async function fastifyService(router) {
  const app = Fastify();
  let runs = 0;
  await app.register(fastifyIdempotency, { router, client: new Client(), principal: (r) => r.headers["x-user"] ?? null });
  app.post("/orders", async (request, reply) => {
    runs++;
    const ctx = request.idempotency;
    const { rows } = await ctx.db.query(
      "INSERT INTO orders (principal, item, quantity) VALUES ($1, 'book', 1) RETURNING id",
      [ctx.request.principal],
    );
    if (request.headers["x-stale"]) await ctx.db.query(RAISE_STALE);
    const here = await ctx.db.query("SELECT current_database() AS d");
    return reply.code(201).send({ id: Number(rows[0].id), db: here.rows[0].d });
  });
  app.setErrorHandler((error, request, reply) => reply.code(500).type("text/plain").send(String(error)));
  return {
    post: async (who, k, extra = {}) => {
      const headers = { "x-user": who, "idempotency-key": k, "content-type": "application/json", ...extra };
      const r = await app.inject({ method: "POST", url: "/orders", headers: lower(headers), payload: "{}" });
      return { status: r.statusCode, replayed: r.headers["idempotent-replay"] ?? null, body: r.body };
    },
    runs: () => runs,
    close: () => app.close(),
  };
}

const lower = (headers) => Object.fromEntries(Object.entries(headers).map(([n, v]) => [n.toLowerCase(), v]));

/** Where `who`'s rows are: "orders/keys" counts per database. */
async function where(who) {
  const out = {};
  for (const node of ["default", "a", "b"]) {
    const { rows } = await pools[node].query(
      "SELECT (SELECT count(*) FROM orders WHERE principal = $1)::int AS o," +
        " (SELECT count(*) FROM idempotency.keys WHERE principal = $1)::int AS k",
      [who],
    );
    out[node] = `${rows[0].o}/${rows[0].k}`;
  }
  return out;
}

function nodes(extra = {}) {
  return { "a.test:5432": pools.a, "b.test:5432": pools.b, ...extra };
}

/** The router's counters as an object, in their order. */
function counters(lookups, lookupFailures, routed, defaulted, nodesMarkedDown, stalePlacements = 0) {
  return { lookups, lookupFailures, routed, defaulted, nodesMarkedDown, stalePlacements };
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

for (const framework of ["express", "fastify"]) test(`${framework} router: key and writes land on the principal's node; no placement: default`, async () => {
  const router = new Router(pools.default, nodes(), { placementSql: FAKE });
  const svc = await service(router, framework);
  try {
    const [p1, p2, p3] = [principal(), principal(), principal()];
    await place(p1, "a.test");
    await place(p2, "b.test");
    const k1 = key();
    const first = await svc.post(p1, k1);
    assert.equal(first.status, 201, first.body);
    assert.equal(JSON.parse(first.body).db, names.a);
    assert.equal((await svc.post(p2, key())).status, 201);
    assert.equal((await svc.post(p3, key())).status, 201);
    assert.deepEqual(await where(p1), { default: "0/0", a: "1/1", b: "0/0" });
    assert.deepEqual(await where(p2), { default: "0/0", a: "0/0", b: "1/1" });
    assert.deepEqual(await where(p3), { default: "1/1", a: "0/0", b: "0/0" });
    const replay = await svc.post(p1, k1); // the retry finds its key on the same node
    assert.equal(replay.status, 201);
    assert.equal(replay.replayed, "true");
    assert.equal(replay.body, first.body);
    assert.deepEqual(await where(p1), { default: "0/0", a: "1/1", b: "0/0" });
    assert.deepEqual(router.counters, counters(3, 0, 3, 1, 0));
  } finally {
    await svc.close();
  }
});

test("router: one lookup per principal per refreshMs; a move is followed", async () => {
  // refreshMs is 1 s (not less): the three requests before it must fit in it on a loaded machine.
  const refreshMs = 1000;
  const router = new Router(pools.default, nodes(), { placementSql: FAKE, refreshMs });
  const svc = await service(router);
  try {
    const who = principal();
    await place(who, "a.test");
    const start = Date.now();
    assert.equal((await svc.post(who, key())).status, 201);
    assert.equal((await svc.post(who, key())).status, 201);
    assert.equal(router.counters.lookups, 1, "the second request used the cache");
    await place(who, "b.test"); // the shard moves
    assert.equal((await svc.post(who, key())).status, 201); // stale: the old node, still correct
    assert.deepEqual(await where(who), { default: "0/0", a: "3/3", b: "0/0" });
    assert.ok(Date.now() - start < refreshMs, "the machine is too slow for this test");
    await sleep(refreshMs + 50); // cached after start and before now: expired after this
    assert.equal((await svc.post(who, key())).status, 201);
    assert.equal(router.counters.lookups, 2, "looked up again after refreshMs");
    assert.deepEqual(await where(who), { default: "0/0", a: "3/3", b: "1/1" });
  } finally {
    await svc.close();
  }
});

test("router: a node that cannot connect: default, down, tried after nodeDownMs", async () => {
  const dead = poolFor(names.a, { port: await closedPort(), connectionTimeoutMillis: 2000 });
  let attempts = 0;
  const counted = {
    connect: () => (attempts++, dead.connect()),
    query: (...args) => dead.query(...args),
  };
  const options = { placementSql: FAKE, nodeDownMs: 1000 };
  const router = new Router(pools.default, nodes({ "c.test:5432": counted }), options);
  const svc = await service(router);
  try {
    const who = principal();
    await place(who, "c.test");
    assert.equal((await svc.post(who, key())).status, 201);
    assert.equal(attempts, 1);
    assert.equal(router.counters.nodesMarkedDown, 1);
    assert.equal((await svc.post(who, key())).status, 201);
    assert.equal(attempts, 1, "a node marked down is not tried");
    assert.equal(router.counters.lookups, 2, "the failure dropped the cached placement");
    await sleep(1050);
    assert.equal((await svc.post(who, key())).status, 201);
    assert.equal(attempts, 2, "tried again after nodeDownMs");
    assert.equal(router.counters.nodesMarkedDown, 2);
    assert.deepEqual(await where(who), { default: "3/3", a: "0/0", b: "0/0" });
    assert.equal(router.counters.defaulted, 3);
  } finally {
    await svc.close();
    await dead.end();
  }
});

test("router: a placement query that fails or times out: default, counted", async () => {
  for (const [sql, timeout] of [
    ["SELECT node_name, node_port FROM no_such_table WHERE principal = $1", 1000],
    ["SELECT node_name, node_port FROM route_fake, pg_sleep(2) WHERE principal = $1", 150],
  ]) {
    const options = { placementSql: sql, lookupTimeoutMs: timeout };
    const router = new Router(pools.default, nodes(), options);
    const svc = await service(router);
    try {
      const who = principal();
      await place(who, "a.test");
      assert.equal((await svc.post(who, key())).status, 201);
      assert.equal((await svc.post(who, key())).status, 201);
      assert.deepEqual(router.counters, counters(2, 2, 0, 2, 0));
      assert.deepEqual(await where(who), { default: "2/2", a: "0/0", b: "0/0" });
    } finally {
      await svc.close();
    }
  }
});

test("router: a node name the router has no pool for goes to the default, counted", async () => {
  const router = new Router(pools.default, nodes(), { placementSql: FAKE });
  const svc = await service(router);
  try {
    const who = principal();
    await place(who, "z.test");
    assert.equal((await svc.post(who, key())).status, 201);
    assert.deepEqual(await where(who), { default: "1/1", a: "0/0", b: "0/0" });
    assert.deepEqual(router.counters, counters(1, 0, 0, 1, 0));
  } finally {
    await svc.close();
  }
});

test("router: the cache keeps at most maxPrincipals, least recently used out first", async () => {
  const router = new Router(pools.default, nodes(), { placementSql: FAKE, maxPrincipals: 2 });
  const [p1, p2, p3] = [principal(), principal(), principal()];
  await place(p1, "a.test");
  assert.equal((await router.route(p1)).node, "a.test:5432");
  await router.route(p2);
  await router.route(p1); // p1 used last: p2 is the oldest
  await router.route(p3);
  assert.equal(router.size, 2);
  assert.equal(router.counters.lookups, 3);
  await router.route(p1);
  assert.equal(router.counters.lookups, 3, "p1 stayed");
  await router.route(p2);
  assert.equal(router.counters.lookups, 4, "p2 was evicted");
  // Concurrent requests of one principal share one lookup.
  const p4 = principal();
  await Promise.all([router.route(p4), router.route(p4), router.route(p4)]);
  assert.equal(router.counters.lookups, 5);
});

test("router: bad settings are refused", () => {
  assert.throws(() => new Router(pools.default, { "a.test": pools.a }), RangeError);
  assert.throws(() => new Router(pools.default, {}, { maxPrincipals: 0 }), RangeError);
  assert.throws(() => new Router(pools.default, {}, { refreshMs: -1 }), RangeError);
  assert.throws(() => new Router(pools.default, {}, { placementSql: " " }), RangeError);
  const router = new Router(pools.default, {});
  assert.throws(() => idempotency({ client: new Client(), principal: () => null }), TypeError);
  const both = { pool: pools.default, router, client: new Client(), principal: () => null };
  assert.throws(() => idempotency(both), TypeError);
});

for (const framework of ["express", "fastify"]) test(`${framework} router: a begin refused for a stale placement runs once more on the node looked up again`, async () => {
  const router = new Router(pools.default, nodes(), { placementSql: FAKE }); // refreshMs 60 s
  const svc = await service(router, framework);
  try {
    const who = principal();
    await place(who, "a.test");
    assert.equal((await svc.post(who, key())).status, 201); // served on a: placement cached
    assert.deepEqual(await where(who), { default: "0/0", a: "1/1", b: "0/0" });
    await moveAwayFromA(who); // the shard moves to b; the cache still says a
    await place(who, "b.test");
    const moved = await svc.post(who, key());
    assert.equal(moved.status, 201, moved.body);
    assert.equal(JSON.parse(moved.body).db, names.b);
    assert.equal(svc.runs(), 2, "the route ran once per request");
    assert.deepEqual(await where(who), { default: "0/0", a: "1/1", b: "1/1" });
    // routed 3: a (served), a (refused), b; the second lookup only because of the refusal.
    assert.deepEqual(router.counters, counters(2, 0, 3, 0, 0, 1));
  } finally {
    await svc.close();
  }
});

for (const framework of ["express", "fastify"]) test(`${framework} router: refused again after the lookup: the request fails, the placement is dropped`, async () => {
  const router = new Router(pools.default, nodes(), { placementSql: FAKE });
  const svc = await service(router, framework);
  try {
    const who = principal();
    await place(who, "a.test");
    assert.equal((await svc.post(who, key())).status, 201);
    await moveAwayFromA(who); // the placement query still says a: the second try is refused too
    const failed = await svc.post(who, key());
    assert.equal(failed.status, 500);
    assert.match(failed.body, /the key's shard is not on this node/);
    assert.equal(svc.runs(), 1, "the route never ran for the refused request");
    assert.deepEqual(router.counters, counters(2, 0, 3, 0, 0, 2));
    await place(who, "b.test");
    assert.equal((await svc.post(who, key())).status, 201);
    assert.equal(router.counters.lookups, 3, "the failed request dropped the placement");
    assert.deepEqual(await where(who), { default: "0/0", a: "1/1", b: "1/1" });
  } finally {
    await svc.close();
  }
});

for (const framework of ["express", "fastify"]) test(`${framework} router: a stale placement from the route's own statement: reported, not run again`, async () => {
  const router = new Router(pools.default, nodes(), { placementSql: FAKE });
  const svc = await service(router, framework);
  try {
    const who = principal();
    await place(who, "a.test");
    const failed = await svc.post(who, key(), { "X-Stale": "1" });
    assert.equal(failed.status, 500); // as any database error of the route: rolled back, not stored
    assert.equal(svc.runs(), 1);
    assert.deepEqual(await where(who), { default: "0/0", a: "0/0", b: "0/0" });
    assert.deepEqual(router.counters, counters(1, 0, 1, 0, 0, 1));
    assert.equal((await svc.post(who, key())).status, 201);
    assert.equal(router.counters.lookups, 2, "the placement had been dropped");
    assert.deepEqual(await where(who), { default: "0/0", a: "1/1", b: "0/0" });
  } finally {
    await svc.close();
  }
});

test("router: isStalePlacement is SQLSTATE 0A000 with the protocol's message, nothing else", async () => {
  const error = (code, message) => Object.assign(new Error(message), { code });
  const { message, sqlstate } = ROUTING.stalePlacement;
  assert.equal(isStalePlacement(error(sqlstate, message)), true);
  assert.equal(isStalePlacement(error("0A000", "cannot do that on a distributed table")), false);
  assert.equal(isStalePlacement(error("0A000", message + ".")), false);
  assert.equal(isStalePlacement(error("XX000", message)), false);
  assert.equal(isStalePlacement(new Error(message)), false);
  for (const nothing of [null, undefined, message, 0]) assert.equal(isStalePlacement(nothing), false);
  const real = await pools.default.query(RAISE_STALE).then(() => null, (e) => e);
  assert.equal(isStalePlacement(real), true, "node-pg's DatabaseError of the server");
  const who = principal();
  await moveAwayFromA(who);
  const begin = "SELECT * FROM idempotency.begin($1, 'k', 'act', idempotency.fingerprint('POST', '/1'))";
  const refused = await pools.a.query(begin, [who]).then(
    () => null,
    (e) => e,
  );
  assert.equal(isStalePlacement(refused), true, "the extension's own refusal");
});

test("router: reportStalePlacement drops the principal's placement, counts, marks no node down", async () => {
  const router = new Router(pools.default, nodes(), { placementSql: FAKE });
  const [who, other] = [principal(), principal()];
  await place(who, "a.test");
  await place(other, "a.test");
  await router.route(who);
  await router.route(other);
  assert.equal(router.size, 2);
  router.reportStalePlacement(who);
  assert.equal(router.size, 1, "only that principal's entry went");
  assert.deepEqual(router.counters, counters(2, 0, 2, 0, 0, 1));
  assert.equal((await router.route(who)).node, "a.test:5432", "looked up again, node a not down");
  assert.equal((await router.route(other)).node, "a.test:5432");
  assert.deepEqual(router.counters, counters(3, 0, 4, 0, 0, 1));
});

test("router: node pools (routedPoolConfig) run with idempotency.routed on, the default's off", async () => {
  const show = async (pool) =>
    (await pool.query("SELECT coalesce(current_setting('idempotency.routed', true), 'off') AS r, current_setting('work_mem') AS w")).rows[0];
  assert.deepEqual(await show(pools.a), { r: "on", w: "7MB" }, "routed, the user's option kept");
  assert.deepEqual(await show(pools.b), { r: "on", w: "7MB" });
  assert.equal((await show(pools.default)).r, "off");
  assert.deepEqual(routedPoolConfig({ max: 2 }), { max: 2, options: "-c idempotency.routed=on" });
  const own = routedPoolConfig({ options: "-c idempotency.routed=off" }).options;
  assert.equal(own, "-c idempotency.routed=on -c idempotency.routed=off", "a later -c of yours wins");
});

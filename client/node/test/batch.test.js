"use strict";
// beginBatch / completeBatch / claimBatch against the extension's batch functions
// (0.8.0). Against an older extension these tests fail (42883: the functions do
// not exist); they never skip.
const assert = require("node:assert/strict");
const { test } = require("node:test");
const { pkg, database, principal } = require("./helpers");

const { Client, Response, beginBatch, completeBatch, claimBatch } = pkg();
const db = database();

function request(who, key, body = '{"item":"book"}') {
  return { principal: who, key, method: "POST", path: "/orders", body };
}

async function order(conn, who, key) {
  const { rows } = await conn.query(
    "INSERT INTO orders (principal, item, quantity) VALUES ($1, 'book', 1) RETURNING id", [who]);
  const headers = [["Content-Type", "application/json"], ["X-Not-Kept", "1"]];
  return new Response(201, headers, key, { resourceId: String(rows[0].id) });
}

const summary = (outcomes) => outcomes.map((o) => `${o.ord}:${o.key}:${o.outcome}`).join(" ");

test("beginBatch answers each key as begin would; completeBatch stores the rest", async () => {
  const conn = await db.connect();
  const holder = await db.connect();
  const client = new Client({ duplicates: "reject" });
  const who = principal();
  for (const key of ["done", "other"]) {
    await client.handle(conn, request(who, key), (c) => order(c, who, key));
  }
  await holder.query("BEGIN");
  await holder.query(
    "SELECT * FROM idempotency.begin($1, 'held', 'a', idempotency.fingerprint('POST', '/o'))", [who]);
  const requests = [
    request(who, "new-1"),
    request(who, "done", Buffer.from('{ "item" : "b\\u006fok" }')),
    request(who, "other", '{"item":"pen"}'),
    request(who, "held"),
    request(who, "new-2"),
  ];
  await conn.query("BEGIN");
  const began = Date.now();
  const outcomes = await beginBatch(conn, requests, client);
  assert.ok(Date.now() - began < 2000, "reject mode does not wait for the held key");
  assert.equal(summary(outcomes),
    "1:new-1:started 2:done:replay 3:other:mismatch 4:held:in_progress 5:new-2:started");
  const [fresh, replay, mismatch, busy] = outcomes;
  assert.equal(fresh.response, null);
  assert.equal(replay.response.status, 201);
  assert.equal(replay.response.body.toString(), "done");
  assert.equal(replay.response.header("Idempotent-Replay"), "true");
  assert.ok(replay.response.header("Idempotency-Expires"));
  assert.equal(replay.response.header("X-Not-Kept"), undefined);
  assert.equal(replay.responseStatus, 201);
  assert.match(replay.expiresAt, /^\d{4}-\d\d-\d\dT/);
  assert.match(replay.createdAt, /^\d{4}-\d\d-\d\dT/);
  assert.equal(mismatch.response.status, 422);
  assert.equal(busy.response.status, 409);
  assert.equal(busy.response.header("Retry-After"), "1");
  assert.equal(client.counters.replayed, 1);

  const started = requests.filter((_, i) => outcomes[i].outcome === "started");
  const responses = [];
  for (const r of started) responses.push(await order(conn, who, r.key));
  const done = await completeBatch(conn, started, responses, client);
  assert.deepEqual(done, [
    { ord: 1, key: "new-1", completed: true },
    { ord: 2, key: "new-2", completed: true },
  ]);
  await conn.query("COMMIT");
  await holder.query("ROLLBACK");

  await conn.query("BEGIN");
  const again = await beginBatch(conn, started, client);
  await conn.query("COMMIT");
  assert.equal(summary(again), "1:new-1:replay 2:new-2:replay");
  assert.deepEqual(again.map((o) => o.response.body.toString()), ["new-1", "new-2"]);
  assert.equal(again[0].resourceId, responses[0].resourceId);
  const { rows } = await conn.query(
    "SELECT count(*)::int AS n FROM orders WHERE principal = $1", [who]);
  assert.equal(rows[0].n, 4);
});

test("batches refuse bad input with an SQLSTATE, or before the server", async () => {
  const conn = await db.connect();
  const who = principal();
  const inTx = async (call) => {
    await conn.query("BEGIN");
    try {
      return await call();
    } finally {
      await conn.query("ROLLBACK");
    }
  };
  const many = Array.from({ length: 1001 }, (_, i) => request(who, `k${i}`));
  const twice = [request(who, "a"), request(who, "a")];
  await assert.rejects(inTx(() => beginBatch(conn, twice)), (e) => e.code === "22023");
  await assert.rejects(inTx(() => beginBatch(conn, many)), (e) => e.code === "54000");
  await assert.rejects(inTx(() => claimBatch(conn, who, ["c", "c"])), (e) => e.code === "22023");
  await assert.rejects(
    inTx(async () => {
      await beginBatch(conn, [request(who, "b")]);
      return completeBatch(conn, [request(who, "b")], [new Response(500)]);
    }),
    (e) => e.code === "22023",
  );
  const two = [request(who, "a"), request(who + "x", "b")];
  await assert.rejects(beginBatch(conn, two), /one principal/);
  await assert.rejects(beginBatch(conn, [request(who, null)]), /has no key/);
  await assert.rejects(completeBatch(conn, [request(who, "a")], []), /1 requests and 0 responses/);
  assert.deepEqual(await beginBatch(conn, []), []);
});

test("claimBatch claims each key once and rolls back with the transaction", async () => {
  const conn = await db.connect();
  const who = principal();
  const claims = (list) => list.map((c) => `${c.ord}:${c.key}:${c.claimed}`).join(" ");
  await conn.query("BEGIN");
  assert.equal(claims(await claimBatch(conn, who, ["b", "a"])), "1:b:true 2:a:true");
  await conn.query("ROLLBACK");
  assert.equal(claims(await claimBatch(conn, who, ["a", "b"], 60000)), "1:a:true 2:b:true");
  assert.equal(claims(await claimBatch(conn, who, ["c", "b"])), "1:c:true 2:b:false");
});

test("two claim batches over the same keys in opposite orders do not deadlock", async () => {
  const [one, two] = [await db.connect(), await db.connect()];
  const who = principal();
  const keys = Array.from({ length: 50 }, (_, i) => `k${String(i).padStart(2, "0")}`);
  const run = async (conn, list) => {
    await conn.query("BEGIN");
    const result = await claimBatch(conn, who, list);
    await new Promise((resolve) => setTimeout(resolve, 100));
    await conn.query("COMMIT");
    return new Map(result.map((c) => [c.key, c.claimed]));
  };
  const [a, b] = await Promise.all([run(one, keys), run(two, [...keys].reverse())]);
  for (const k of keys) assert.notEqual(a.get(k), b.get(k), `key ${k} claimed by one batch`);
});

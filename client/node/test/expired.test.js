"use strict";
// The outcome "expired" (a retry of a key that expired under the action's on_expiry
// 'refuse' policy: 410 with the past Idempotency-Expires), and the lease runner's
// expiry and wait/reject mode. The end-to-end expired tests need an extension with
// idempotency.set_expiry_policy (0.8.0) and are skipped, saying so, on an older one.
const assert = require("node:assert/strict");
const fs = require("node:fs");
const path = require("node:path");
const { test } = require("node:test");
const { pkg, database, principal, key } = require("./helpers");

const { Client, LeaseRunner, Response, EXPIRES_HEADER, httpDate } = pkg();
const table = JSON.parse(fs.readFileSync(path.join(__dirname, "..", "..", "protocol.json"), "utf8"));
const db = database();
const ORDER = '{"item":"book","quantity":2}';
const PAST = 1700000000; // Tue, 14 Nov 2023 22:13:20 GMT

function goneBody() {
  const kind = table.problems.key_expired;
  return {
    detail: table.outcomes.expired.detail,
    status: 410,
    title: kind.title,
    type: table.problem_type_base + kind.type,
  };
}

test("the lease runner carries acquire's past expiry with the extension's 410", () => {
  const runner = new LeaseRunner({});
  const told = "Tue, 14 Nov 2023 22:13:20 GMT";
  const result = runner.unstarted({
    outcome: "expired",
    expires_epoch: String(PAST),
    status: "410",
    headers: JSON.stringify([["Content-Type", "application/problem+json"], [EXPIRES_HEADER, told]]),
    body: "\\x7b7d",
  });
  assert.equal(result.outcome, "expired");
  assert.equal(result.response.status, 410);
  assert.equal(result.response.header(EXPIRES_HEADER), told);
  assert.equal(result.expiresEpoch, PAST);
  assert.equal(result.response.replayed, false);
  assert.equal(result.response.body.toString(), "{}");
});

test("the lease runner's wait follows the duplicate mode", () => {
  const waiting = new LeaseRunner({}, { waitMs: 3000 });
  assert.equal(waiting.waitText({ duplicates: "reject" }), "0 milliseconds");
  assert.equal(waiting.waitText({}), "3000 milliseconds");
  assert.equal(new LeaseRunner({}, { duplicates: "reject", waitMs: 3000 }).waitText({}), "0 milliseconds");
  assert.equal(new LeaseRunner({}).waitText({}), null);
  assert.throws(() => waiting.waitText({ duplicates: "maybe" }), /duplicates/);
  assert.throws(() => new LeaseRunner({}, { duplicates: "maybe" }), /duplicates/);
});

async function storedEpoch(conn, who, k) {
  const { rows } = await conn.query(
    "SELECT floor(extract(epoch FROM expires_at))::bigint AS e FROM idempotency.lookup($1, $2)", [who, k]);
  return Number(rows[0].e);
}

test("a lease result carries the row's expiry; a released key none", async (t) => {
  const conn = await db.connect();
  const runner = new LeaseRunner(db.config, { policy: "remember" });
  t.after(() => runner.close());
  const who = principal();
  const k = key();
  const request = { principal: who, key: k, method: "POST", path: "/pay", body: ORDER };
  const first = await runner.run(request, () => new Response(201, [], "{}"));
  const want = await storedEpoch(conn, who, k);
  assert.equal(first.outcome, "fresh");
  assert.equal(first.expiresEpoch, want);
  assert.ok(want * 1000 > Date.now());
  assert.equal(first.response.header(EXPIRES_HEADER), httpDate(want));
  const again = await runner.run(request, () => new Response(201, [], "{}"));
  assert.equal(again.outcome, "replayed");
  assert.equal(again.expiresEpoch, want);
  assert.equal(again.response.header(EXPIRES_HEADER), httpDate(want));
  const released = await runner.run({ ...request, key: key() }, () => new Response(503));
  assert.equal(released.expiresEpoch, null);
  assert.equal(released.response.header(EXPIRES_HEADER), undefined);
});

test("a completion after the ttl carries the expiry complete gave the key", async (t) => {
  // The body outlives the ttl (its lease keeps the key): complete keeps the key one more
  // ttl from its own now(), and the result tells that expiry, not acquire's past one.
  const conn = await db.connect();
  const runner = new LeaseRunner(db.config, { policy: "remember", ttlMs: 1000, leaseMs: 30000 });
  t.after(() => runner.close());
  const who = principal();
  const k = key();
  const request = { principal: who, key: k, method: "POST", path: "/pay", body: ORDER };
  const late = await runner.run(request, async () => {
    await new Promise((resolve) => setTimeout(resolve, 1300));
    return new Response(201, [], "{}");
  });
  const want = await storedEpoch(conn, who, k);
  assert.equal(late.outcome, "fresh");
  assert.equal(late.expiresEpoch, want);
  assert.equal(late.response.header(EXPIRES_HEADER), httpDate(want));
});

async function refusing(t, conn) {
  const { rows } = await conn.query("SELECT to_regproc('idempotency.set_expiry_policy') IS NOT NULL AS ok");
  if (!rows[0].ok) {
    t.skip("the extension has no idempotency.set_expiry_policy (0.8.0 tombstones)");
    return false;
  }
  await conn.query("SELECT idempotency.set_expiry_policy('POST /orders', 'refuse')");
  t.after(() => conn.query("SELECT idempotency.set_expiry_policy('POST /orders', 'run')"));
  return true;
}

// The contract's test sequence; returns the expiry (epoch seconds) the tombstone keeps.
async function expire(conn, who, k) {
  await conn.query(
    "UPDATE idempotency.keys SET created_at = now() - interval '1 hour'," +
      " expires_at = now() - interval '1 second' WHERE principal = $1 AND key = $2",
    [who, k],
  );
  const { rows } = await conn.query("SELECT floor(extract(epoch FROM now() - interval '1 second'))::bigint AS e");
  await conn.query("SELECT idempotency.cleanup_batch(1000)");
  return Number(rows[0].e);
}

test("a retry after expiry is 410 with the past expiry, without running", async (t) => {
  const conn = await db.connect();
  if (!(await refusing(t, conn))) return;
  const client = new Client();
  const who = principal();
  const k = key();
  let runs = 0;
  const handler = () => {
    runs++;
    return new Response(201, [["Content-Type", "application/json"]], "{}");
  };
  const request = { principal: who, key: k, method: "POST", path: "/orders", body: ORDER };
  assert.equal((await client.handle(conn, request, handler)).status, 201);
  const expired = await expire(conn, who, k);
  const gone = await client.handle(conn, request, handler);
  assert.equal(gone.status, 410);
  assert.deepEqual(JSON.parse(gone.body.toString("utf8")), goneBody());
  assert.equal(client.counters.expired, 1);
  const told = Date.parse(gone.header(EXPIRES_HEADER)) / 1000;
  assert.ok(Math.abs(told - expired) <= 1 && told * 1000 < Date.now(), gone.header(EXPIRES_HEADER));
  assert.equal(runs, 1);
  const other = await client.handle(conn, { ...request, body: "{}" }, handler);
  assert.equal(other.status, 422);
  assert.equal(runs, 1);

  const runner = new LeaseRunner(db.config);
  t.after(() => runner.close());
  const leased = await runner.run(request, handler);
  assert.equal(leased.outcome, "expired");
  assert.equal(leased.response.status, 410);
  assert.ok(Math.abs(leased.expiresEpoch - expired) <= 1);
  assert.equal(runs, 1);
});

"use strict";
const assert = require("node:assert/strict");
const { test } = require("node:test");
const { setTimeout: sleep } = require("node:timers/promises");
const { pkg, database, principal, key } = require("./helpers");

const { LeaseRunner, Response } = pkg();
const db = database();

function request(who, k, body = '{"amount":10}') {
  return { principal: who, key: k, method: "POST", path: "/charges", body };
}

test("remember: the body runs once, the retry replays; fences are bigint", async (t) => {
  const runner = new LeaseRunner(db.config, { policy: "remember", leaseMs: 5000 });
  t.after(() => runner.close());
  const who = principal();
  const k = key();
  let calls = 0;
  const body = async () => {
    calls++;
    return new Response(201, [["Content-Type", "application/json"], ["Location", "/charges/1"]], '{"id":1}', { resourceId: "1" });
  };
  const first = await runner.run(request(who, k), body);
  assert.equal(first.outcome, "fresh");
  assert.equal(typeof first.fence, "bigint");
  assert.ok(first.fence > 0n);
  assert.match(first.leaseUntil, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{1,6}[+-]\d\d:\d\d$/);
  const retry = await runner.run(request(who, k, '{ "amount" : 10 }'), body);
  assert.equal(retry.outcome, "replayed");
  assert.equal(retry.response.header("Idempotent-Replay"), "true");
  assert.equal(retry.response.header("Location"), "/charges/1");
  assert.equal(retry.response.body.toString(), '{"id":1}');
  assert.equal(retry.response.resourceId, "1");
  const other = await runner.run(request(who, k, '{"amount":11}'), body);
  assert.equal(other.outcome, "mismatch");
  assert.equal(other.response.status, 422);
  assert.equal(calls, 1);
  const second = await runner.run(request(who, key()), body);
  assert.ok(second.fence > first.fence, "fences come from one increasing sequence");
});

test("once: a repeat is a duplicate (409); a throw marks the key done and propagates", async (t) => {
  const runner = new LeaseRunner(db.config, { policy: "once" });
  t.after(() => runner.close());
  const who = principal();
  const k = key();
  await assert.rejects(runner.run(request(who, k), async () => { throw new Error("upstream down"); }), /upstream down/);
  const again = await runner.run(request(who, k), async () => new Response(200));
  assert.equal(again.outcome, "duplicate");
  assert.equal(again.response.status, 409);
  assert.match(again.response.body.toString(), /request-already-processed/);
});

test("commit_on_success: a failure releases the key, the retry runs; a success is then a duplicate", async (t) => {
  const runner = new LeaseRunner(db.config, { policy: "commit_on_success" });
  t.after(() => runner.close());
  const who = principal();
  const k = key();
  const failed = await runner.run(request(who, k), async () => new Response(502));
  assert.equal(failed.outcome, "fresh");
  const ok = await runner.run(request(who, k), async () => new Response(200));
  assert.equal(ok.outcome, "fresh");
  const dup = await runner.run(request(who, k), async () => new Response(200));
  assert.equal(dup.outcome, "duplicate");
});

test("a live lease is 409 with Retry-After; the lease is renewed while the body runs", async (t) => {
  const runner = new LeaseRunner(db.config, { leaseMs: 900 });
  const other = new LeaseRunner(db.config, { leaseMs: 900 });
  t.after(async () => { await runner.close(); await other.close(); });
  const who = principal();
  const k = key();
  let busy;
  const result = await runner.run(request(who, k), async () => {
    await sleep(2000); // more than twice the lease: only renewals keep it
    busy = await other.run(request(who, k), async () => new Response(200));
    return new Response(201, [], "done");
  });
  assert.equal(result.outcome, "fresh");
  assert.ok(result.renewals >= 2, `renewals ${result.renewals}`);
  assert.equal(busy.outcome, "in_progress");
  assert.equal(busy.response.status, 409);
  assert.equal(busy.response.header("Retry-After"), "1");
});

test("a lost lease gives fresh_unfenced and stores nothing", async (t) => {
  const runner = new LeaseRunner(db.config, { leaseMs: 150, renew: false });
  const thief = new LeaseRunner(db.config, { leaseMs: 5000 });
  t.after(async () => { await runner.close(); await thief.close(); });
  const who = principal();
  const k = key();
  let stolen;
  const result = await runner.run(request(who, k), async () => {
    await sleep(400);
    stolen = await thief.run(request(who, k), async () => new Response(201, [], "thief"));
    return new Response(201, [], "late");
  });
  assert.equal(stolen.outcome, "fresh");
  assert.equal(result.outcome, "fresh_unfenced");
  assert.equal(result.response.body.toString(), "late");
  const replay = await thief.run(request(who, k), async () => new Response(500));
  assert.equal(replay.response.body.toString(), "thief");
});

test("missing and malformed keys are rejected before the database", async (t) => {
  const runner = new LeaseRunner(db.config);
  t.after(() => runner.close());
  const missing = await runner.run({ principal: "p", method: "POST", path: "/" }, async () => new Response());
  assert.equal(missing.outcome, "rejected");
  assert.match(missing.response.body.toString(), /idempotency-key-missing/);
  const bad = await runner.run({ principal: "p", key: "\u00e9", method: "POST", path: "/" }, async () => new Response());
  assert.equal(bad.response.status, 400);
  assert.throws(() => new LeaseRunner(db.config, { leaseMs: 0 }), RangeError);
});

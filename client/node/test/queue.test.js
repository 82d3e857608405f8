"use strict";
// pushUnique: the job row and its key row (idempotency.claim) in the caller's
// transaction; true only for the call that enqueued.
const assert = require("node:assert/strict");
const { test, before } = require("node:test");
const { pkg, database, principal } = require("./helpers");

const { pushUnique } = pkg();
const db = database();

before(async () => {
  await db.init();
  const conn = await db.connect();
  await conn.query(
    "CREATE TABLE jobs (id bigserial PRIMARY KEY, principal text NOT NULL, job text NOT NULL)");
});

function insertJob(who, calls) {
  return async (conn) => {
    calls.n++;
    await conn.query("INSERT INTO jobs (principal, job) VALUES ($1, 'report')", [who]);
  };
}

async function jobs(conn, who) {
  const sql = "SELECT count(*)::int AS n FROM jobs WHERE principal = $1";
  return (await conn.query(sql, [who])).rows[0].n;
}

async function keyRows(conn, who, key) {
  const sql = "SELECT count(*)::int AS n FROM idempotency.lookup($1, $2)";
  return (await conn.query(sql, [who, key])).rows[0].n;
}

/** pushUnique in a transaction of its own, committed (or rolled back). */
async function push(conn, who, key, ttlMs, enqueue, end = "COMMIT") {
  await conn.query("BEGIN");
  try {
    const pushed = await pushUnique(conn, who, key, ttlMs, enqueue);
    await conn.query(end);
    return pushed;
  } catch (error) {
    await conn.query("ROLLBACK");
    throw error;
  }
}

test("pushUnique enqueues once per window; a rolled-back push leaves the key free", async () => {
  const conn = await db.connect();
  const who = principal();
  const calls = { n: 0 };
  assert.equal(await push(conn, who, "job-1", null, insertJob(who, calls), "ROLLBACK"), true);
  assert.equal(await jobs(conn, who), 0);
  assert.equal(await keyRows(conn, who, "job-1"), 0, "no key row after the rollback");
  assert.equal(await push(conn, who, "job-1", null, insertJob(who, calls)), true);
  assert.equal(await push(conn, who, "job-1", null, insertJob(who, calls)), false);
  assert.equal(await jobs(conn, who), 1);
  assert.equal(calls.n, 2, "enqueue is not run when the key was claimed before");
  // A short window: pushed again once it has passed.
  assert.equal(await push(conn, who, "job-2", 1000, insertJob(who, calls)), true);
  await new Promise((resolve) => setTimeout(resolve, 1300));
  assert.equal(await push(conn, who, "job-2", 1000, insertJob(who, calls)), true);
  assert.equal(await jobs(conn, who), 3);
});

test("pushUnique: a throwing enqueue propagates; after the rollback the key is free", async () => {
  const conn = await db.connect();
  const who = principal();
  const full = async () => {
    throw new Error("queue full");
  };
  await assert.rejects(push(conn, who, "job", null, full), /queue full/);
  assert.equal(await keyRows(conn, who, "job"), 0);
  assert.equal(await push(conn, who, "job", null, insertJob(who, { n: 0 })), true);
});

for (const end of ["COMMIT", "ROLLBACK"]) {
  test(`concurrent pushes of one key wait; exactly one enqueues (first: ${end})`, async () => {
    const holder = await db.connect();
    const who = principal();
    await holder.query("BEGIN");
    assert.equal(await pushUnique(holder, who, "job", null, insertJob(who, { n: 0 })), true);
    const waiters = await Promise.all([1, 2, 3].map(() => db.connect()));
    let settled = 0;
    const pushes = waiters.map((conn) =>
      push(conn, who, "job", null, insertJob(who, { n: 0 })).finally(() => settled++),
    );
    await new Promise((resolve) => setTimeout(resolve, 300));
    assert.equal(settled, 0, "the other pushes wait for the transaction that holds the key");
    await holder.query(end);
    const results = await Promise.all(pushes);
    const trues = results.filter(Boolean).length + (end === "COMMIT" ? 1 : 0);
    assert.equal(trues, 1, `results ${results}`);
    assert.equal(await jobs(holder, who), 1);
  });
}

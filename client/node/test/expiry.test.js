"use strict";
// The key's expiry header (Idempotency-Expires) and wait-or-reject per call:
// the table's values (client/protocol.json) and the behaviour on a live database.
const assert = require("node:assert/strict");
const fs = require("node:fs");
const path = require("node:path");
const { test } = require("node:test");
const { pkg, database, principal, key } = require("./helpers");

const { Client, Response, EXPIRES_HEADER, EXPIRES_FORMAT, DUPLICATE_MODES, DEFAULT_DUPLICATE_MODE, httpDate } = pkg();
const table = JSON.parse(fs.readFileSync(path.join(__dirname, "..", "..", "protocol.json"), "utf8"));
const db = database();
const ORDER = '{"item":"book","quantity":2}';

test("expiry header, its format and the duplicate modes are the table's", () => {
  assert.equal(EXPIRES_HEADER, table.expires_header);
  assert.equal(EXPIRES_FORMAT, table.expires_format);
  assert.equal(httpDate(784111777), "Sun, 06 Nov 1994 08:49:37 GMT"); // RFC 9110's example
  assert.deepEqual([...DUPLICATE_MODES], table.duplicate_modes);
  assert.equal(DEFAULT_DUPLICATE_MODE, table.default_duplicate_mode);
  assert.equal(new Client().options.duplicates, table.default_duplicate_mode);
});

// The handler sets the header itself, among the kept headers: the client's value replaces it.
function order(who, status = 201) {
  return async (conn) => {
    await conn.query("INSERT INTO orders (principal, item, quantity) VALUES ($1, 'book', 2)", [who]);
    return new Response(status, [["Content-Type", "application/json"], [EXPIRES_HEADER, "handler's own"]], "{}");
  };
}

const values = (r) => r.headers.filter(([n]) => n.toLowerCase() === EXPIRES_HEADER.toLowerCase()).map(([, v]) => v);

async function storedExpiry(conn, who, k) {
  const { rows } = await conn.query(
    "SELECT floor(extract(epoch FROM expires_at))::bigint AS e FROM idempotency.lookup($1, $2)", [who, k]);
  return httpDate(Number(rows[0].e));
}

test("first answer, replay and 422 carry the stored row's expiry, never stored as a kept header", async () => {
  const conn = await db.connect();
  const client = new Client({ keptHeaders: ["Content-Type", EXPIRES_HEADER] });
  const who = principal();
  const k = key();
  const request = { principal: who, key: k, method: "POST", path: "/orders", body: ORDER };
  const first = await client.handle(conn, request, order(who));
  assert.deepEqual(values(first), [await storedExpiry(conn, who, k)]);
  const { rows } = await conn.query("SELECT response_headers::text AS h FROM idempotency.keys WHERE key = $1", [k]);
  assert.ok(!rows[0].h.toLowerCase().includes(EXPIRES_HEADER.toLowerCase()), rows[0].h);
  await new Promise((resolve) => setTimeout(resolve, 1100)); // a recomputed value would move
  const retry = await client.handle(conn, request, order(who));
  assert.equal(retry.replayed, true);
  assert.deepEqual(values(retry), values(first));
  const other = await client.handle(conn, { ...request, body: "{}" }, order(who));
  assert.equal(other.status, 422);
  assert.deepEqual(values(other), values(first));
});

test("a stored final error carries its own row's expiry", async () => {
  const conn = await db.connect();
  const who = principal();
  const k = key();
  const first = await new Client().handle(conn, { principal: who, key: k, method: "POST", path: "/o", body: ORDER }, order(who, 409));
  assert.equal(first.status, 409);
  assert.deepEqual(values(first), [await storedExpiry(conn, who, k)]);
});

for (const where of ["options", "request"]) {
  test(`reject (${where}) answers 409 with Retry-After at once`, async () => {
    const holder = await db.connect();
    const conn = await db.connect();
    const who = principal();
    const k = key();
    await holder.query("BEGIN");
    const { rows } = await holder.query(
      "SELECT outcome FROM idempotency.begin($1, $2, 'POST /orders', idempotency.fingerprint('POST', '/orders', $3::bytea, NULL))",
      [who, k, Buffer.from(ORDER)]);
    assert.equal(rows[0].outcome, "started");
    const client = new Client({ duplicates: where === "options" ? "reject" : "wait" });
    const request = { principal: who, key: k, method: "POST", path: "/orders", body: ORDER };
    if (where === "request") request.duplicates = "reject";
    const started = Date.now();
    const busy = await client.handle(conn, request, order(who));
    const took = Date.now() - started;
    await holder.query("ROLLBACK");
    assert.equal(busy.status, 409);
    assert.equal(busy.header("Retry-After"), String(table.default_retry_after_seconds));
    assert.ok(took < 1000, `took ${took} ms (the server's wait_timeout is 5 s)`);
  });
}

test("an unknown duplicate mode is refused", async () => {
  const conn = await db.connect();
  await assert.rejects(
    new Client().handle(conn, { principal: principal(), key: key(), method: "POST", path: "/o", duplicates: "maybe" }, order("x")),
    /duplicates/,
  );
});

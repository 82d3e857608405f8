"use strict";
const assert = require("node:assert/strict");
const { test } = require("node:test");
const { pkg, database, principal, key } = require("./helpers");

const { Client, Response, fingerprint } = pkg();
const db = database();

const INSERT = "INSERT INTO orders (principal, item, quantity) VALUES ($1, $2, 1) RETURNING id";

function order(who, item = "book") {
  return async (conn) => {
    const { rows } = await conn.query(INSERT, [who, item]);
    return new Response(201, [["Content-Type", "application/json"], ["Location", `/orders/${rows[0].id}`], ["X-Trace", "t"]],
      JSON.stringify({ id: Number(rows[0].id) }), { resourceId: String(rows[0].id) });
  };
}

async function count(conn, who) {
  const { rows } = await conn.query("SELECT count(*)::int AS n FROM orders WHERE principal = $1", [who]);
  return rows[0].n;
}

test("first request runs, a retry with the body spelled differently replays, another body is 422", async () => {
  const conn = await db.connect();
  const client = new Client();
  const who = principal();
  const k = key();
  const first = await client.handle(conn, { principal: who, key: k, method: "POST", path: "/orders", body: '{"item":"book","quantity":2}' }, order(who));
  assert.equal(first.status, 201);
  assert.equal(first.replayed, false);
  const retry = await client.handle(conn, { principal: who, key: k, method: "post", path: "/orders", body: Buffer.from('{ "quantity": 2.0, "item": "b\\u006fok" }') }, order(who));
  assert.equal(retry.status, 201);
  assert.equal(retry.replayed, true);
  assert.deepEqual(retry.body, first.body);
  assert.equal(retry.header("Location"), first.header("Location"));
  assert.equal(retry.header("Content-Type"), "application/json");
  assert.equal(retry.header("X-Trace"), undefined, "only kept headers are replayed");
  assert.equal(retry.header("Idempotent-Replay"), "true");
  assert.equal(retry.resourceId, first.resourceId);
  const other = await client.handle(conn, { principal: who, key: k, method: "POST", path: "/orders", body: '{"item":"pen"}' }, order(who));
  assert.equal(other.status, 422);
  assert.equal(other.header("Content-Type"), "application/problem+json");
  assert.equal(await count(conn, who), 1);
  assert.deepEqual(client.counters.started, 1);
  assert.deepEqual(client.counters.replayed, 1);
  assert.deepEqual(client.counters.mismatched, 1);
});

test("missing and malformed keys are 400 and run nothing; GET without a key runs in a transaction", async () => {
  const conn = await db.connect();
  const client = new Client();
  const who = principal();
  const missing = await client.handle(conn, { principal: who, method: "POST", path: "/o" }, order(who));
  assert.equal(missing.status, 400);
  assert.equal(missing.body.toString(), '{"detail":"POST requests need an Idempotency-Key header.","status":400,"title":"Idempotency-Key header is missing","type":"/problems/idempotency-key-missing"}');
  for (const bad of ["", "k".repeat(256), "cl\u00e9", "a\nb"]) {
    const r = await client.handle(conn, { principal: who, key: bad, method: "POST", path: "/o" }, order(who));
    assert.equal(r.status, 400, JSON.stringify(bad));
    assert.match(r.body.toString(), /idempotency-key-malformed/);
  }
  const get = await client.handle(conn, { principal: who, method: "GET", path: "/o" }, order(who));
  assert.equal(get.status, 201);
  assert.equal(await count(conn, who), 1);
});

test("a key the server refuses (22P02) is 400 malformed; a body too deep to fingerprint is 400", async () => {
  const conn = await db.connect();
  const client = new Client();
  const who = principal();
  await conn.query("SET idempotency.key_format = 'uuid'");
  try {
    const r = await client.handle(conn, { principal: who, key: "not-a-uuid", method: "POST", path: "/o" }, order(who));
    assert.equal(r.status, 400);
    assert.match(r.body.toString(), /refused by the server/);
  } finally {
    await conn.query("RESET idempotency.key_format");
  }
  const deep = "[".repeat(5000) + "]".repeat(5000);
  const r = await client.handle(conn, { principal: who, key: key(), method: "POST", path: "/o", body: deep }, order(who));
  assert.equal(r.status, 400);
  assert.match(r.body.toString(), /request-body-invalid/);
  assert.equal(await count(conn, who), 0);
});

test("a final 4xx rolls the effect back and is stored; a 5xx and a throw store nothing", async () => {
  const conn = await db.connect();
  const client = new Client();
  const who = principal();
  const k = key();
  const refuse = async (c) => {
    await order(who)(c);
    return new Response(409, [["Content-Type", "application/json"]], '{"error":"conflict"}');
  };
  const first = await client.handle(conn, { principal: who, key: k, method: "POST", path: "/o", body: "{}" }, refuse);
  assert.equal(first.status, 409);
  assert.equal(await count(conn, who), 0);
  const again = await client.handle(conn, { principal: who, key: k, method: "POST", path: "/o", body: "{}" }, order(who));
  assert.equal(again.status, 409);
  assert.equal(again.replayed, true);
  assert.equal(again.body.toString(), '{"error":"conflict"}');

  const k2 = key();
  const fail = await client.handle(conn, { principal: who, key: k2, method: "POST", path: "/o" }, async (c) => {
    await order(who)(c);
    return new Response(503, [], "down");
  });
  assert.equal(fail.status, 503);
  await assert.rejects(client.handle(conn, { principal: who, key: k2, method: "POST", path: "/o" }, async (c) => {
    await order(who)(c);
    throw new Error("boom");
  }), /boom/);
  assert.equal(await count(conn, who), 0);
  const ok = await client.handle(conn, { principal: who, key: k2, method: "POST", path: "/o" }, order(who));
  assert.equal(ok.status, 201);
  assert.equal(ok.replayed, false);
  assert.equal(await count(conn, who), 1);
  assert.equal(client.counters.notStored, 1);
  assert.equal(client.counters.storedErrors, 1);
  // The connection is usable and idle afterwards.
  const { rows } = await conn.query("SELECT 1 AS one");
  assert.equal(rows[0].one, 1);
});

test("a key held by another transaction is 409 with Retry-After once the wait runs out", async () => {
  const holder = await db.connect();
  const conn = await db.connect();
  const client = new Client({ waitMs: 200 });
  const who = principal();
  const k = key();
  await holder.query("BEGIN");
  await holder.query("SELECT * FROM idempotency.begin($1, $2, 'a', idempotency.fingerprint('POST', '/o'))", [who, k]);
  const busy = await client.handle(conn, { principal: who, key: k, method: "POST", path: "/o" }, order(who));
  await holder.query("ROLLBACK");
  assert.equal(busy.status, 409);
  assert.equal(busy.header("Retry-After"), "1");
  assert.equal(busy.body.toString(), '{"detail":"A request with this Idempotency-Key is still being processed; retry later.","status":409,"title":"A request with this Idempotency-Key is in progress","type":"/problems/request-in-progress"}');
  const ok = await client.handle(conn, { principal: who, key: k, method: "POST", path: "/o" }, order(who));
  assert.equal(ok.status, 201);
});

test("what is stored follows idempotency.http_storage (the server's final_statuses), read once", async () => {
  const conn = await db.connect();
  await conn.query("SET idempotency.final_statuses = '2xx,503'");
  const client = new Client();
  const who = principal();
  const answer = (status) => async (c) => {
    await c.query(INSERT, [who, String(status)]);
    return new Response(status, [], String(status));
  };
  const request = (k) => ({ principal: who, key: k, method: "POST", path: "/o" });
  const [unavailable, missing, created] = [key(), key(), key()];
  assert.equal((await client.handle(conn, request(unavailable), answer(503))).status, 503);
  assert.equal((await client.handle(conn, request(missing), answer(404))).status, 404);
  assert.equal((await client.handle(conn, request(created), answer(201))).status, 201);
  assert.deepEqual(
    { storedErrors: client.counters.storedErrors, notStored: client.counters.notStored, started: client.counters.started },
    { storedErrors: 1, notStored: 1, started: 3 },
  );
  const replay = await client.handle(conn, request(unavailable), answer(503));
  assert.equal(replay.replayed, true, "a 503 is saved after the rollback when final_statuses says so");
  assert.equal((await client.handle(conn, request(missing), answer(404))).replayed, false, "404 is not stored here");
  assert.equal(await count(conn, who), 1, "only the 201's row stays: a 503 and a 404 roll back");
  await conn.query("RESET idempotency.final_statuses");
});

test("the client's retryAfter and problemTypeBase go to http_answer, prepared or inline", async () => {
  for (const prepare of [true, false]) {
    const holder = await db.connect();
    const conn = await db.connect();
    const client = new Client({ duplicates: "reject", retryAfter: 7, problemTypeBase: "https://e.test/'q'/", prepare });
    const who = principal();
    const k = key();
    await holder.query("BEGIN");
    await holder.query("SELECT * FROM idempotency.begin($1, $2, 'a', idempotency.fingerprint('POST', '/o'))", [who, k]);
    const busy = await client.handle(conn, { principal: who, key: k, method: "POST", path: "/o" }, order(who));
    await holder.query("ROLLBACK");
    assert.equal(busy.status, 409, `prepare ${prepare}`);
    assert.equal(busy.header("Retry-After"), "7", `prepare ${prepare}`);
    assert.equal(JSON.parse(busy.body.toString()).type, "https://e.test/'q'/request-in-progress");
    assert.equal(client.counters.inProgress, 1);
  }
  assert.throws(() => new Client({ retryAfter: 1.5 }), RangeError);
  assert.throws(() => new Client({ retryAfter: Number.NaN }), RangeError);
});

test("a one-time secret is sent once; the retry is 409 one-time-secret", async () => {
  const conn = await db.connect();
  const client = new Client();
  const who = principal();
  const k = key();
  const secret = async (c) => {
    await order(who)(c);
    return new Response(201, [["Content-Type", "application/json"]], '{"secret":"sk_1"}', { oneTimeSecret: true });
  };
  const first = await client.handle(conn, { principal: who, key: k, method: "POST", path: "/k" }, secret);
  assert.equal(first.body.toString(), '{"secret":"sk_1"}');
  const retry = await client.handle(conn, { principal: who, key: k, method: "POST", path: "/k" }, secret);
  assert.equal(retry.status, 409);
  assert.equal(retry.header("Idempotent-Replay"), "true");
  assert.match(retry.body.toString(), /one-time-secret/);
  const { rows } = await conn.query("SELECT response_status, one_time_secret FROM idempotency.lookup($1, $2)", [who, k]);
  assert.deepEqual(rows[0], { response_status: 201, one_time_secret: true });
});

test("serialization failures rerun the handler; the last one propagates", async () => {
  const conn = await db.connect();
  const client = new Client({ maxAttempts: 3 });
  const who = principal();
  let runs = 0;
  const flaky = async (c) => {
    runs++;
    if (runs < 3) await c.query("DO $$BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END$$");
    return order(who)(c);
  };
  const r = await client.handle(conn, { principal: who, key: key(), method: "POST", path: "/o" }, flaky);
  assert.equal(r.status, 201);
  assert.equal(runs, 3);
  assert.equal(client.counters.retries, 2);
  runs = -10;
  await assert.rejects(client.handle(conn, { principal: who, key: key(), method: "POST", path: "/o" }, flaky), (e) => e.code === "40001");
  assert.equal(await count(conn, who), 1);
});

test("values with quotes, backslashes and non-ASCII go through as literals unchanged", async () => {
  const conn = await db.connect();
  const client = new Client();
  const who = "o'brien\\ \"x\" \u00e9\u20ac\ud83d\ude00";
  const k = "k'\\ \"";
  const path = "/\u00e9t\u00e9/o'\\";
  const body = Buffer.from([0, 1, 2, 0x27, 0x5c, 0xff]);
  const exclude = ["/a\"b", "/c\\d", "/e'f", "/g,h{}"];
  const handler = async () => new Response(200, [["Content-Type", "x/y'\\"]], Buffer.from([0, 0x5c, 0x27]));
  const first = await client.handle(conn, { principal: who, key: k, method: "POST", path, body, exclude, action: "a'\\" }, handler);
  const replay = await client.handle(conn, { principal: who, key: k, method: "POST", path, body, exclude, action: "a'\\" }, handler);
  assert.equal(replay.replayed, true);
  assert.deepEqual(replay.body, first.body);
  assert.equal(replay.header("Content-Type"), "x/y'\\");
  const { rows } = await conn.query(
    "SELECT action, request_sha256 = idempotency.fingerprint($3, $4, $5::bytea, $6::text[]) AS same FROM idempotency.keys WHERE principal = $1 AND key = $2",
    [who, k, "POST", path, body, exclude],
  );
  assert.deepEqual(rows[0], { action: "a'\\", same: true });
  const fp = await fingerprint(conn, "POST", path, body, exclude);
  const direct = await conn.query("SELECT idempotency.fingerprint($1, $2, $3::bytea, $4::text[]) AS f", ["POST", path, body, exclude]);
  assert.deepEqual(fp, direct.rows[0].f);
  await assert.rejects(client.handle(conn, { principal: "nul\0", key: "k", method: "POST", path: "/" }, handler), (e) => e.code === "22021");
});

test("a handler may answer a plain object of the Response's shape", async () => {
  const conn = await db.connect();
  const client = new Client();
  const who = principal();
  const k = key();
  const plainAnswer = async () => ({ status: 201, headers: [["Content-Type", "text/plain"]], body: "made" });
  const first = await client.handle(conn, { principal: who, key: k, method: "POST", path: "/p" }, plainAnswer);
  assert.equal(first.body.toString(), "made");
  const replay = await client.handle(conn, { principal: who, key: k, method: "POST", path: "/p" }, plainAnswer);
  assert.equal(replay.replayed, true);
  assert.equal(replay.body.toString(), "made");
  await assert.rejects(client.handle(conn, { principal: who, key: key(), method: "POST", path: "/p" }, async () => 42), TypeError);
  await assert.rejects(client.handle(conn, { principal: who, key: key(), method: "POST", path: "/p" }, async () => new Response(99)), RangeError);
});

test("kept headers keep their order and repeated names; the object form of older rows replays too", async () => {
  const conn = await db.connect();
  const client = new Client({ keptHeaders: ["Link", "Content-Type", "Location"] });
  const who = principal();
  const k = key();
  const answer = async () =>
    new Response(201, [["Link", "</a>; rel=a"], ["Content-Type", "text/plain"], ["X-No", "1"], ["Link", "</b>; rel=b"]], "x");
  await client.handle(conn, { principal: who, key: k, method: "POST", path: "/h" }, answer);
  const replay = await client.handle(conn, { principal: who, key: k, method: "POST", path: "/h" }, answer);
  // The key's expiry header comes last, added to every answer (see expiry.test.js).
  const noExpiry = (headers) => headers.filter(([n]) => n !== "Idempotency-Expires");
  assert.deepEqual(noExpiry(replay.headers), [["Link", "</a>; rel=a"], ["Content-Type", "text/plain"], ["Link", "</b>; rel=b"], ["Idempotent-Replay", "true"]]);
  assert.equal(replay.headers[replay.headers.length - 1][0], "Idempotency-Expires");
  const { rows } = await conn.query("SELECT jsonb_typeof(response_headers) AS t FROM idempotency.keys WHERE principal = $1 AND key = $2", [who, k]);
  assert.equal(rows[0].t, "array");
  const old = key();
  await conn.query("BEGIN");
  await conn.query("SELECT * FROM idempotency.begin($1, $2, 'POST /h', idempotency.fingerprint('POST', '/h'))", [who, old]);
  await conn.query("SELECT idempotency.complete($1, $2, 201, $3, $4)", [who, old, Buffer.from("y"), '{"Location":"/o/1"}']);
  await conn.query("COMMIT");
  const objectForm = await client.handle(conn, { principal: who, key: old, method: "POST", path: "/h" }, answer);
  assert.deepEqual(noExpiry(objectForm.headers), [["Location", "/o/1"], ["Idempotent-Replay", "true"]]);
  // A value the server refuses (CR/LF could split the header line on replay): 22023, nothing stored.
  await assert.rejects(
    client.handle(conn, { principal: who, key: key(), method: "POST", path: "/h" }, async () => new Response(201, [["Location", "/a\r\nX: y"]], "z")),
    (e) => e.code === "22023",
  );
});

test("statements are prepared once per session; a session that lost them (DISCARD ALL) still works", async () => {
  const conn = await db.connect();
  const client = new Client();
  const who = principal();
  const prepared = async () =>
    (await conn.query("SELECT count(*)::int AS n FROM pg_prepared_statements WHERE name LIKE 'pg_idempotency_%'")).rows[0].n;
  const run = (k) => client.handle(conn, { principal: who, key: k, method: "POST", path: "/o", body: "{}" }, order(who));
  assert.equal((await run(key())).status, 201);
  assert.equal(await prepared(), 3);
  assert.equal((await run(key())).status, 201);
  assert.equal(await prepared(), 3);
  await conn.query("DISCARD ALL");
  const k = key();
  assert.equal((await run(k)).status, 201, "inline after the statements were lost");
  assert.equal((await run(k)).replayed, true);
  assert.equal(await prepared(), 3, "prepared again");
  // One of the names already taken on a new session (42P05): DEALLOCATE, inline, prepare again.
  const { rows } = await conn.query("SELECT name FROM pg_prepared_statements WHERE name LIKE 'pg_idempotency_%_complete'");
  const fresh = await db.connect();
  await fresh.query(`PREPARE ${rows[0].name} AS SELECT 1`);
  const other = new Client();
  const k2 = key();
  const viaFresh = (kk) => other.handle(fresh, { principal: who, key: kk, method: "POST", path: "/o" }, order(who));
  assert.equal((await viaFresh(k2)).status, 201);
  assert.equal((await viaFresh(k2)).replayed, true, "prepared again, with the real statements");
  const again = await fresh.query("SELECT count(*)::int AS n FROM pg_prepared_statements WHERE name LIKE 'pg_idempotency_%'");
  assert.equal(again.rows[0].n, 3);
  assert.equal((await viaFresh(key())).status, 201);
  assert.equal(await count(conn, who), 5);
});

test("prepare: false sends every statement in full and prepares nothing", async () => {
  const conn = await db.connect();
  await conn.query("DISCARD ALL");
  const client = new Client({ prepare: false });
  const who = principal();
  const k = key();
  const first = await client.handle(conn, { principal: who, key: k, method: "POST", path: "/o", body: "{}" }, order(who));
  const retry = await client.handle(conn, { principal: who, key: k, method: "POST", path: "/o", body: "{ }" }, order(who));
  assert.equal(first.status, 201);
  assert.equal(retry.replayed, true);
  const refused = await client.handle(conn, { principal: who, key: key(), method: "POST", path: "/o" }, async () => new Response(404, [], "x"));
  assert.equal(refused.status, 404);
  const { rows } = await conn.query("SELECT count(*)::int AS n FROM pg_prepared_statements");
  assert.equal(rows[0].n, 0);
});

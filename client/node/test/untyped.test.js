"use strict";
// Every function of the extension is callable the way node-pg sends parameters:
// every value as text of unknown type (or null), no casts, and NULL for every
// optional argument. A failure names the call and the SQLSTATE (42725 "function
// is not unique", 42P18 "could not determine data type", 42883 "does not exist").
const assert = require("node:assert/strict");
const crypto = require("node:crypto");
const { test } = require("node:test");
const { database } = require("./helpers");

const db = database();

const FP = "\\x" + Buffer.from([...Array(32).keys()]).toString("hex");
const BODY = "\\x" + Buffer.from('{"id":1}').toString("hex");
const BEGIN = `SELECT * FROM idempotency.begin('p', 'k', 'a', '${FP}'::bytea)`;
const ACQUIRE = `SELECT * FROM idempotency.acquire('p', 'k', 'a', '${FP}'::bytea)`;

// [name, setup statements, call, parameters as node-pg sends them]
const CASES = [
  ["jcs", [], "SELECT idempotency.jcs($1)", ['{"b":1,"a":2}']],
  ["fingerprint/2", [], "SELECT idempotency.fingerprint($1, $2)", ["POST", "/x"]],
  ["fingerprint/4 nulls", [], "SELECT idempotency.fingerprint($1, $2, $3, $4)", ["POST", "/x", null, null]],
  ["fingerprint/4", [], "SELECT idempotency.fingerprint($1, $2, $3, $4)", ["POST", "/x", BODY, "{/a}"]],
  ["fingerprint/4 Buffer and array", [], "SELECT idempotency.fingerprint($1, $2, $3, $4)", ["POST", "/x", Buffer.from("{}"), ["/a"]]],
  ["begin/4", [], "SELECT * FROM idempotency.begin($1, $2, $3, $4)", ["p", "k", "a", FP]],
  ["begin/4 Buffer", [], "SELECT * FROM idempotency.begin($1, $2, $3, $4)", ["p", "k", "a", Buffer.alloc(32, 7)]],
  ["begin/6 nulls", [], "SELECT * FROM idempotency.begin($1, $2, $3, $4, $5, $6)", ["p", "k", "a", FP, null, null]],
  ["begin/6 intervals", [], "SELECT * FROM idempotency.begin($1, $2, $3, $4, $5, $6)", ["p", "k", "a", FP, "1 hour", "100 ms"]],
  ["begin with fingerprint()", [], "SELECT * FROM idempotency.begin($1, $2, $3, idempotency.fingerprint($4, $5, $6, $7))", ["p", "k", "a", "POST", "/x", null, null]],
  ["complete/3", [BEGIN], "SELECT idempotency.complete($1, $2, $3)", ["p", "k", "204"]],
  ["complete/3 number", [BEGIN], "SELECT idempotency.complete($1, $2, $3)", ["p", "k", 204]],
  ["complete/4 null body", [BEGIN], "SELECT idempotency.complete($1, $2, $3, $4)", ["p", "k", "204", null]],
  ["complete/4 text body", [BEGIN], "SELECT idempotency.complete($1, $2, $3, $4)", ["p", "k", "200", BODY]],
  ["complete/4 Buffer body", [BEGIN], "SELECT idempotency.complete($1, $2, $3, $4)", ["p", "k", "200", Buffer.from("{}")]],
  ["complete/7", [BEGIN], "SELECT idempotency.complete($1, $2, $3, $4, $5, $6, $7)", ["p", "k", "201", BODY, '{"Location":"/o/1"}', "1", "false"]],
  ["complete/7 object headers", [BEGIN], "SELECT idempotency.complete($1, $2, $3, $4, $5, $6, $7)", ["p", "k", 201, null, { Location: "/o/1" }, "1", false]],
  ["complete/7 pairs as JSON text", [BEGIN], "SELECT idempotency.complete($1, $2, $3, $4, $5, $6, $7)", ["p", "k", 201, null, JSON.stringify([["Link", "</a>"], ["Link", "</b>"]]), null, null]],
  ["complete/7 nulls", [BEGIN], "SELECT idempotency.complete($1, $2, $3, $4, $5, $6, $7)", ["p", "k", "201", null, null, null, null]],
  ["complete/8 fence null", [BEGIN], "SELECT idempotency.complete($1, $2, $3, $4, $5, $6, $7, $8)", ["p", "k", "201", null, null, null, null, null]],
  ["complete/8 fenced", [ACQUIRE], "SELECT idempotency.complete($1, $2, $3, $4, $5, $6, $7, $8)", ["p", "k", "200", BODY, null, null, "false", "1"]],
  ["complete with fence (named)", [ACQUIRE], "SELECT idempotency.complete($1, $2, status => $3, fence => $4)", ["p", "k", "200", "1"]],
  ["complete fence as bigint", [ACQUIRE], "SELECT idempotency.complete($1, $2, status => $3, fence => $4)", ["p", "k", 200, 1n]],
  ["save_final/5", [], "SELECT idempotency.save_final($1, $2, $3, $4, $5)", ["p", "k", "a", FP, "409"]],
  ["save_final/8 nulls", [], "SELECT idempotency.save_final($1, $2, $3, $4, $5, $6, $7, $8)", ["p", "k", "a", FP, "409", null, null, null]],
  ["save_final/9 nulls", [], "SELECT idempotency.save_final($1, $2, $3, $4, $5, $6, $7, $8, $9)", ["p", "k", "a", FP, "409", null, null, null, null]],
  ["is_final", [], "SELECT idempotency.is_final($1)", ["201"]],
  ["forget", [], "SELECT idempotency.forget($1, $2)", ["p", "k"]],
  ["acquire/4", [], "SELECT * FROM idempotency.acquire($1, $2, $3, $4)", ["p", "k", "a", FP]],
  ["acquire/7 nulls", [], "SELECT * FROM idempotency.acquire($1, $2, $3, $4, $5, $6, $7)", ["p", "k", "a", FP, null, null, null]],
  ["acquire/7 intervals", [], "SELECT * FROM idempotency.acquire($1, $2, $3, $4, $5, $6, $7)", ["p", "k", "a", FP, "30 seconds", "1 day", "0"]],
  ["renew/3", [ACQUIRE], "SELECT idempotency.renew($1, $2, $3)", ["p", "k", "1"]],
  ["renew/4 null", [ACQUIRE], "SELECT idempotency.renew($1, $2, $3, $4)", ["p", "k", "1", null]],
  ["release", [ACQUIRE], "SELECT idempotency.release($1, $2, $3)", ["p", "k", "1"]],
  ["claim/2", [], "SELECT idempotency.claim($1, $2)", ["p", "k"]],
  ["claim/3 null", [], "SELECT idempotency.claim($1, $2, $3)", ["p", "k", null]],
  ["lookup", [], "SELECT * FROM idempotency.lookup($1, $2)", ["p", "k"]],
  ["cleanup_batch", [], "SELECT * FROM idempotency.cleanup_batch($1, $2)", ["10", null]],
  ["bound_principal", [], "SELECT idempotency.bound_principal($1)", ["p"]],
];

for (const [name, setup, call, params] of CASES) {
  test(`untyped: ${name}`, async () => {
    const conn = await db.connect();
    const who = "u-" + crypto.randomBytes(4).toString("hex");
    await conn.query("BEGIN"); // rolled back: only whether the call resolves and runs matters
    try {
      for (const statement of setup) await conn.query(statement.replace("'p'", `'${who}'`));
      await conn.query(call, params.map((p) => (p === "p" ? who : p)));
    } finally {
      await conn.query("ROLLBACK");
    }
  });
}

test("untyped: CALL idempotency.cleanup", async () => {
  const conn = await db.connect();
  await conn.query("CALL idempotency.cleanup($1, $2)", ["100", null]);
  await conn.query("CALL idempotency.cleanup($1, $2)", [100, "1 second"]);
});

test("a JS array for jsonb is sent as a PostgreSQL array literal, not JSON: JSON.stringify it", async () => {
  const conn = await db.connect();
  await conn.query("BEGIN");
  try {
    await conn.query(BEGIN.replace("'p'", "'arr'"));
    await assert.rejects(
      conn.query("SELECT idempotency.complete($1, $2, $3, headers => $4)", ["arr", "k", 201, [["Link", "</a>"]]]),
      (e) => e.code === "22P02",
    );
  } finally {
    await conn.query("ROLLBACK");
  }
});

test("SELECT * FROM begin(...) runs begin once; the row has every column", async () => {
  const conn = await db.connect();
  await conn.query("BEGIN");
  try {
    const { rows } = await conn.query("SELECT * FROM idempotency.begin($1, $2, $3, idempotency.fingerprint($4, $5))", ["p-star", "k", "a", "POST", "/x"]);
    assert.equal(rows.length, 1);
    assert.equal(rows[0].outcome, "started");
    assert.equal(typeof rows[0].fence, "string", "node-pg returns bigint as string: the client parses it with BigInt()");
  } finally {
    await conn.query("ROLLBACK");
  }
});

"use strict";
// The answers the client builds itself (a missing or malformed key, a database fault)
// and the extension's answers read into a Response. No database: what an outcome
// means over HTTP is the extension's (sql/http_answer.sql, tests/conformance).
const assert = require("node:assert/strict");
const { test } = require("node:test");
const { pkg } = require("./helpers");

const { Problem, Response, answerResponse, databaseFaultResponse, isDatabaseFault, problemBody, problemResponse } =
  pkg();

test("a problem body is the extension's bytes: sorted members, no whitespace", () => {
  const response = problemResponse(Problem.KEY_MISSING, "POST requests need an Idempotency-Key header.");
  assert.equal(response.status, 400);
  assert.deepEqual(response.headers, [["Content-Type", "application/problem+json"]]);
  assert.equal(
    response.body.toString("utf8"),
    '{"detail":"POST requests need an Idempotency-Key header.","status":400,' +
      '"title":"Idempotency-Key header is missing","type":"/problems/idempotency-key-missing"}',
  );
  const based = problemResponse(Problem.KEY_MALFORMED, "d", "https://api.example.test/errors/");
  assert.ok(based.body.toString().includes('"type":"https://api.example.test/errors/idempotency-key-malformed"'));
});

test("problem body escapes like the server's to_json (and nlohmann_json)", () => {
  const body = problemBody(400, "/p/x", "t", 'quote " backslash \\ tab \t ctl \x01 del \x7f \u00e9 \u20ac');
  assert.equal(
    body.toString("utf8"),
    '{"detail":"quote \\" backslash \\\\ tab \\t ctl \\u0001 del \x7f \u00e9 \u20ac","status":400,"title":"t","type":"/p/x"}',
  );
});

test("the database fault answer: 503, Retry-After at least 1, not a replay", () => {
  const response = databaseFaultResponse(0, "/e/");
  assert.equal(response.status, 503);
  assert.equal(response.header("Retry-After"), "1");
  assert.equal(response.header("Idempotent-Replay"), undefined);
  assert.equal(JSON.parse(response.body.toString("utf8")).type, "/e/database-unavailable");
  assert.equal(databaseFaultResponse(7).header("Retry-After"), "7");
});

test("which errors are database faults", () => {
  const coded = (code) => Object.assign(new Error("e"), { code });
  for (const code of ["57P01", "57P02", "57P03", "57014", "08006", "08001", "53300"]) {
    assert.equal(isDatabaseFault(coded(code)), true, code);
  }
  for (const code of ["23505", "40001", "22P02", "42P01"]) {
    assert.equal(isDatabaseFault(coded(code)), false, code);
  }
  assert.equal(isDatabaseFault(coded("ECONNRESET")), true);
  assert.equal(isDatabaseFault(coded("EPIPE")), true, "five capitals, but a socket error, not an SQLSTATE");
  assert.equal(isDatabaseFault(new Error("Connection terminated unexpectedly")), true);
  assert.equal(isDatabaseFault(new Error("the route failed")), false);
  assert.equal(isDatabaseFault(new TypeError("x is undefined")), false);
});

test("an extension's answer as a Response: pairs in order, repeated names, the replay marker", () => {
  const headers = [["Set-Cookie", "a=1"], ["Set-Cookie", "b=2"], [":other", "x"], ["Idempotent-Replay", "true"]];
  const replay = answerResponse("201", JSON.stringify(headers), Buffer.from("{}"));
  assert.equal(replay.status, 201);
  assert.deepEqual(replay.headers, [["Set-Cookie", "a=1"], ["Set-Cookie", "b=2"], ["Idempotent-Replay", "true"]]);
  assert.equal(replay.replayed, true);
  assert.equal(replay.chunks, null);
  const refused = answerResponse("422", '[["Content-Type", "application/problem+json"], ["A"], 7]', null);
  assert.deepEqual(refused.headers, [["Content-Type", "application/problem+json"]]);
  assert.equal(refused.replayed, false);
  assert.equal(refused.body.length, 0);
});

test("headers compare without case and setHeader replaces", () => {
  const response = new Response(200, [["content-type", "a"], ["X-A", "1"], ["Content-Type", "b"]]);
  assert.equal(response.header("CONTENT-TYPE"), "a");
  response.setHeader("Content-Type", "c");
  assert.deepEqual(response.headers, [["X-A", "1"], ["Content-Type", "c"]]);
  assert.equal(response.header("missing"), undefined);
});

"use strict";
const assert = require("node:assert/strict");
const { test } = require("node:test");
const { pkg } = require("./helpers");

const { Problem, Response, problemBody, problemResponse, DETAILS } = pkg();

// Bytes the C++ client (nlohmann_json) produces for the same problem; the
// conformance suite (tests/conformance) checks them against the C++ service.
const CPP_KEY_REUSE =
  '{"detail":"This Idempotency-Key was used for a different request; use a new key for a new request.",' +
  '"status":422,"title":"Idempotency-Key was used for another request",' +
  '"type":"/problems/idempotency-key-reuse"}';

test("problem body matches the C++ client's bytes", () => {
  const response = problemResponse(Problem.KEY_REUSE, DETAILS.keyReuse);
  assert.equal(response.status, 422);
  assert.deepEqual(response.headers, [["Content-Type", "application/problem+json"]]);
  assert.equal(response.body.toString("utf8"), CPP_KEY_REUSE);
});

test("problem body escapes like nlohmann_json (and Python's json.dumps)", () => {
  const body = problemBody(400, "/p/x", "t", 'quote " backslash \\ tab \t ctl \x01 del \x7f \u00e9 \u20ac');
  assert.equal(
    body.toString("utf8"),
    '{"detail":"quote \\" backslash \\\\ tab \\t ctl \\u0001 del \x7f \u00e9 \u20ac","status":400,"title":"t","type":"/p/x"}',
  );
});

test("every problem has its status and slug", () => {
  const expected = {
    KEY_MISSING: [400, "idempotency-key-missing"],
    KEY_MALFORMED: [400, "idempotency-key-malformed"],
    BODY_INVALID: [400, "request-body-invalid"],
    KEY_REUSE: [422, "idempotency-key-reuse"],
    REQUEST_IN_PROGRESS: [409, "request-in-progress"],
    ONE_TIME_SECRET: [409, "one-time-secret"],
    ALREADY_PROCESSED: [409, "request-already-processed"],
    RESPONSE_NOT_KEPT: [409, "response-not-kept"],
    KEY_EXPIRED: [410, "idempotency-key-expired"],
    DATABASE_UNAVAILABLE: [503, "database-unavailable"],
  };
  assert.deepEqual(Object.keys(Problem).sort(), Object.keys(expected).sort());
  for (const [name, [status, slug]] of Object.entries(expected)) {
    const response = problemResponse(Problem[name], "d", "https://api.example.test/errors/");
    assert.equal(response.status, status);
    assert.ok(response.body.toString().includes(`"type":"https://api.example.test/errors/${slug}"`));
  }
});

test("headers compare without case and setHeader replaces", () => {
  const response = new Response(200, [["content-type", "a"], ["X-A", "1"], ["Content-Type", "b"]]);
  assert.equal(response.header("CONTENT-TYPE"), "a");
  response.setHeader("Content-Type", "c");
  assert.deepEqual(response.headers, [["X-A", "1"], ["Content-Type", "c"]]);
  assert.equal(response.header("missing"), undefined);
});

"use strict";
// The Node client's protocol table against client/protocol.json, field by field:
// problem types, titles and statuses, the details and the outcome -> HTTP mapping
// (through the client's own answer()), kept headers, Retry-After default, replay
// header, problem content type and type base, the routing defaults. No database.
const assert = require("node:assert/strict");
const fs = require("node:fs");
const path = require("node:path");
const { test } = require("node:test");
const { pkg } = require("./helpers");

const {
  Client,
  Problem,
  DETAILS,
  DEFAULT_KEPT_HEADERS,
  DEFAULT_MAX_STREAM_BYTES,
  NOT_KEPT_ENTRY,
  PROBLEM_CONTENT_TYPE,
  STREAM_CHUNKS_ENTRY,
  notKeptResponse,
  problemResponse,
} = pkg();
const table = JSON.parse(fs.readFileSync(path.join(__dirname, "..", "..", "protocol.json"), "utf8"));

test("problem types, statuses and titles are the table's", () => {
  assert.deepEqual(Object.keys(Problem).sort(), Object.keys(table.problems).map((n) => n.toUpperCase()).sort());
  for (const [name, want] of Object.entries(table.problems)) {
    const mine = Problem[name.toUpperCase()];
    assert.equal(mine.slug, want.type, name);
    assert.equal(mine.status, want.status, name);
    assert.equal(mine.title, want.title, name);
  }
});

test("content type, type base, kept headers and Retry-After default are the table's", () => {
  assert.equal(PROBLEM_CONTENT_TYPE, table.problem_content_type);
  assert.deepEqual([...DEFAULT_KEPT_HEADERS], table.kept_headers);
  const client = new Client();
  assert.equal(client.options.problemTypeBase, table.problem_type_base);
  assert.deepEqual([...client.options.keptHeaders], table.kept_headers);
  assert.equal(client.options.retryAfter, table.default_retry_after_seconds);
  const response = problemResponse(Problem.KEY_REUSE, "d");
  assert.equal(response.header("Content-Type"), table.problem_content_type);
});

test("every outcome maps to the table's HTTP answer", () => {
  const client = new Client();
  const row = {
    outcome: null,
    response_status: "201",
    response_headers: '[["Location","/o/1"]]',
    response_body: "\\x7b7d",
    resource_id: null,
    lease_seconds: null,
  };
  for (const [outcome, want] of Object.entries(table.outcomes)) {
    if (want.run_handler) continue; // started: the handler runs, nothing is answered
    const response = client.answer(outcome, { ...row, outcome });
    assert.equal(response.header(table.replay_header) === "true", want.replayed, outcome);
    if (want.response === "stored") {
      assert.equal(response.status, 201, outcome);
      continue;
    }
    const problem = table.problems[want.problem];
    const body = JSON.parse(response.body.toString("utf8"));
    assert.deepEqual(body, {
      detail: want.detail,
      status: problem.status,
      title: problem.title,
      type: table.problem_type_base + problem.type,
    }, outcome);
    assert.equal(response.status, problem.status, outcome);
    const retryAfter = want.retry_after ? String(table.default_retry_after_seconds) : undefined;
    assert.equal(response.header("Retry-After"), retryAfter, outcome);
  }
});

test("the details the clients share are the table's", () => {
  assert.equal(DETAILS.keyReuse, table.outcomes.mismatch.detail);
  assert.equal(DETAILS.inProgress, table.outcomes.in_progress.detail);
  assert.equal(DETAILS.oneTimeSecret, table.outcomes.secret_replay.detail);
  assert.equal(DETAILS.keyExpired, table.outcomes.expired.detail);
});

test("the stream entries, the limit and the not-kept answer are the table's", () => {
  assert.equal(STREAM_CHUNKS_ENTRY, table.stream_chunks_entry);
  assert.equal(NOT_KEPT_ENTRY, table.not_kept_entry);
  assert.equal(DEFAULT_MAX_STREAM_BYTES, table.default_max_stream_bytes);
  assert.equal(DETAILS.responseNotKept, table.not_kept_detail);
  const kind = table.problems.response_not_kept;
  const response = notKeptResponse(table.problem_type_base);
  assert.equal(response.status, kind.status);
  assert.deepEqual(JSON.parse(response.body.toString("utf8")), {
    detail: table.not_kept_detail,
    status: kind.status,
    title: kind.title,
    type: table.problem_type_base + kind.type,
  });
});

test("the routing defaults (placement query, refresh, node down, cache size, stale placement) are the table's", () => {
  const { ROUTING, Router } = pkg();
  assert.equal(ROUTING.placementSql, table.routing.placement_sql);
  assert.equal(ROUTING.defaultRefreshSeconds, table.routing.default_refresh_seconds);
  assert.equal(ROUTING.defaultNodeDownSeconds, table.routing.default_node_down_seconds);
  assert.equal(ROUTING.defaultMaxPrincipals, table.routing.default_max_principals);
  assert.deepEqual(ROUTING.stalePlacement, {
    sqlstate: table.routing.stale_placement.sqlstate,
    message: table.routing.stale_placement.message,
  });
  // Every member of the table's routing is one of ROUTING's (a new one fails here).
  const mine = {
    placement_sql: "placementSql",
    default_refresh_seconds: "defaultRefreshSeconds",
    default_node_down_seconds: "defaultNodeDownSeconds",
    default_max_principals: "defaultMaxPrincipals",
    stale_placement: "stalePlacement",
  };
  assert.deepEqual(Object.keys(table.routing).sort(), Object.keys(mine).sort());
  assert.deepEqual(Object.keys(ROUTING).sort(), Object.values(mine).sort());
  const router = new Router({ connect: async () => null, query: async () => null }, {});
  assert.equal(router.options.placementSql, table.routing.placement_sql);
  assert.equal(router.options.refreshMs, table.routing.default_refresh_seconds * 1000);
  assert.equal(router.options.nodeDownMs, table.routing.default_node_down_seconds * 1000);
  assert.equal(router.options.maxPrincipals, table.routing.default_max_principals);
});

test("the database fault answer and its SQLSTATEs are the table's", () => {
  const { databaseFaultResponse, isDatabaseFault, FAULT_SQLSTATE_CLASSES, FAULT_SQLSTATES } = pkg();
  const want = table.database_fault;
  const kind = table.problems[want.problem];
  const base = table.problem_type_base;
  const response = databaseFaultResponse(table.default_retry_after_seconds, base);
  assert.equal(response.status, kind.status);
  assert.equal(response.header("Content-Type"), table.problem_content_type);
  assert.equal(response.header("Retry-After") !== undefined, want.retry_after);
  assert.equal(response.header("Retry-After"), String(table.default_retry_after_seconds));
  assert.equal(response.header(table.replay_header) === "true", want.replayed);
  assert.equal(DETAILS.databaseFault, want.detail);
  assert.deepEqual(JSON.parse(response.body.toString("utf8")), {
    detail: want.detail,
    status: kind.status,
    title: kind.title,
    type: table.problem_type_base + kind.type,
  });
  assert.deepEqual([...FAULT_SQLSTATE_CLASSES], want.sqlstate_classes);
  assert.deepEqual([...FAULT_SQLSTATES], want.sqlstates);
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

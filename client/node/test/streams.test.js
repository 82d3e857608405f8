"use strict";
// Streamed responses in the Express middleware: res.write pieces and piped streams go out
// as written (chunked), are kept with their chunk lengths up to maxStreamBytes and
// replayed as the same chunks; past the limit sent whole, kept as a marker only, a retry
// gets 409 response-not-kept; non-final statuses and streams cut short are not kept.
const assert = require("node:assert/strict");
const net = require("node:net");
const { Readable } = require("node:stream");
const { test, before, after } = require("node:test");
const express = require("express");
const pg = require("pg");
const { pkg, database, principal, key } = require("./helpers");

const { Client, Response, answerResponse, idempotency, keptHeadersJson } = pkg();
const db = database();

let pool;
const servers = [];
let big;
let small;
const during = [];

/** An app whose middleware keeps streams up to maxStreamBytes; its base URL's port. */
async function serve(maxStreamBytes) {
  const app = express();
  app.use(idempotency({ pool, client: new Client(), principal: (req) => req.get("X-User") ?? null, maxStreamBytes }));
  app.post("/stream", async (req, res) => {
    const { n, size, status } = JSON.parse(req.body.toString());
    await req.idempotency.db.query("INSERT INTO orders (principal, item, quantity) VALUES ($1, 'stream', 1)", [
      req.idempotency.request.principal,
    ]);
    res.status(status ?? 200).type("text/plain");
    for (let i = 0; i < n; i++) res.write(String(i % 10).repeat(size));
    const { rows } = await pool.query("SELECT count(*)::int AS n FROM idempotency.keys WHERE principal = $1", [
      req.idempotency.request.principal,
    ]);
    during.push(rows[0].n);
    res.end();
  });
  app.post("/pipe", async (req, res) => {
    res.status(201).set("Content-Type", "text/csv");
    Readable.from([Buffer.from("a,b\n"), Buffer.from("1,2\n"), Buffer.from("3,4\n")]).pipe(res);
  });
  app.post("/cut", (req, res) => {
    res.status(200).type("text/plain");
    res.write("first");
    setTimeout(() => res.destroy(), 50); // the connection goes away mid-stream
  });
  app.use((error, req, res, next) => {
    void next;
    res.status(500).type("text/plain").send("internal");
  });
  const server = await new Promise((resolve) => {
    const s = app.listen(0, "127.0.0.1", () => resolve(s));
  });
  servers.push(server);
  return server.address().port;
}

before(async () => {
  await db.init();
  pool = new pg.Pool({ ...db.config, max: 4 });
  pool.on("error", () => undefined);
  big = await serve(undefined);
  small = await serve(10);
});

after(async () => {
  for (const server of servers) await new Promise((resolve) => server.close(resolve));
  await pool.end();
});

/** POSTs over a raw socket and parses the chunked framing: { status, headers, chunks, body }. */
function raw(port, path, body, who, k) {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, "127.0.0.1");
    const parts = [];
    socket.on("data", (d) => parts.push(d));
    socket.on("error", reject);
    socket.on("close", () => {
      try {
        resolve(parse(Buffer.concat(parts)));
      } catch (error) {
        reject(error);
      }
    });
    const head =
      `POST ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n` +
      `Content-Length: ${Buffer.byteLength(body)}\r\nX-User: ${who}\r\nIdempotency-Key: ${k}\r\nConnection: close\r\n\r\n`;
    socket.write(head + body); // no half-close: node ends such a connection at once
  });
}

function parse(data) {
  const split = data.indexOf("\r\n\r\n");
  if (split < 0) throw new Error(`no header section in ${JSON.stringify(data.toString("latin1").slice(0, 200))}`);
  const lines = data.subarray(0, split).toString("latin1").split("\r\n");
  const headers = new Map(lines.slice(1).map((l) => [l.slice(0, l.indexOf(":")).toLowerCase(), l.slice(l.indexOf(":") + 1).trim()]));
  const rest = data.subarray(split + 4);
  const reply = { status: Number(lines[0].split(" ")[1]), headers, chunks: null, body: rest };
  if (headers.get("transfer-encoding") !== "chunked") return reply;
  reply.chunks = [];
  let at = 0;
  for (;;) {
    const end = rest.indexOf("\r\n", at);
    if (end < 0) throw new Error("chunked body cut short");
    const size = parseInt(rest.subarray(at, end).toString("latin1"), 16);
    at = end + 2;
    if (size === 0) break;
    reply.chunks.push(rest.subarray(at, at + size).toString("latin1"));
    at += size + 2;
  }
  reply.body = Buffer.from(reply.chunks.join(""), "latin1");
  return reply;
}

async function stored(who, k) {
  const { rows } = await pool.query(
    "SELECT response_status, response_headers, response_body FROM idempotency.keys WHERE principal = $1 AND key = $2",
    [who, k],
  );
  return rows[0] ?? null;
}

async function count(who) {
  const { rows } = await pool.query("SELECT count(*)::int AS n FROM orders WHERE principal = $1", [who]);
  return rows[0].n;
}

test("streams: the stored form carries the chunks or the marker alone", () => {
  const streamed = new Response(200, [["Content-Type", "text/plain"]], "aabbb", { chunks: [2, 3] });
  assert.equal(keptHeadersJson(streamed, ["Content-Type"]), '[["Content-Type","text/plain"],[":chunks","2,3"]]');
  const tooLarge = new Response(200, [["Content-Type", "text/plain"]], "", { streamTooLarge: true });
  assert.equal(keptHeadersJson(tooLarge, ["Content-Type"]), '{":not_kept":"stream-too-large"}');
  // idempotency.http_answer keeps ":chunks" in its place for the client, which cuts the body by it.
  const answer = '[["Content-Type","text/plain"],[":chunks","2,3"],["Idempotent-Replay","true"]]';
  const replay = answerResponse("200", answer, Buffer.from("aabbb"));
  assert.deepEqual(replay.pieces().map(String), ["aa", "bbb"]);
  assert.deepEqual(replay.headers.map(([n]) => n), ["Content-Type", "Idempotent-Replay"]);
  assert.equal(replay.replayed, true);
  for (const bad of ["2,2", "2,-3", "0,5", "2, 3", "x"]) {
    assert.equal(answerResponse("200", JSON.stringify([[":chunks", bad]]), Buffer.from("aabbb")).chunks, null, bad);
  }
  assert.throws(() => idempotency({ pool: null, client: new Client(), principal: () => null, maxStreamBytes: -1 }), RangeError);
});

test("streams: res.write pieces go out as chunks, are kept, and replay as the same chunks", async () => {
  const who = principal();
  const k = key();
  const body = '{"n":3,"size":4}';
  during.length = 0;
  const first = await raw(big, "/stream", body, who, k);
  assert.equal(first.status, 200);
  assert.deepEqual(first.chunks, ["0000", "1111", "2222"]);
  assert.ok(first.headers.has("idempotency-expires"));
  assert.equal(first.headers.get("idempotent-replay"), undefined);
  assert.deepEqual(during, [0], "nothing committed while the route streams");
  const row = await stored(who, k);
  assert.equal(row.response_body.toString(), "000011112222");
  assert.deepEqual(row.response_headers, [["Content-Type", "text/plain; charset=utf-8"], [":chunks", "4,4,4"]]);
  const retry = await raw(big, "/stream", '{ "size": 4, "n": 3 }', who, k);
  assert.equal(retry.status, 200);
  assert.deepEqual(retry.chunks, ["0000", "1111", "2222"]);
  assert.equal(retry.headers.get("idempotent-replay"), "true");
  assert.equal(retry.headers.get("content-type"), first.headers.get("content-type"));
  assert.ok(![...retry.headers.keys()].some((n) => n.startsWith(":") || n.includes("chunks")));
  assert.equal(await count(who), 1);
});

test("streams: a piped stream is kept; past the limit a retry gets 409 response-not-kept", async () => {
  const who = principal();
  const piped = await raw(big, "/pipe", "{}", who, key());
  assert.equal(piped.status, 201);
  assert.deepEqual(piped.chunks, ["a,b\n", "1,2\n", "3,4\n"]);
  const k = key();
  const whole = await raw(small, "/stream", '{"n":3,"size":4}', who, k);
  assert.deepEqual(whole.chunks, ["0000", "1111", "2222"]);
  const row = await stored(who, k);
  assert.deepEqual(row.response_headers, { ":not_kept": "stream-too-large" });
  assert.equal((row.response_body ?? Buffer.alloc(0)).length, 0);
  const retry = await raw(small, "/stream", '{"n":3,"size":4}', who, k);
  assert.equal(retry.status, 409);
  assert.equal(retry.headers.get("content-type"), "application/problem+json");
  assert.deepEqual(JSON.parse(retry.body.toString()), {
    detail:
      "The first response to this request was streamed and was larger than this service keeps;" +
      " it was sent once and not stored. Use a new key for a new request.",
    status: 409,
    title: "The response to this request was too large to keep",
    type: "/problems/response-not-kept",
  });
  assert.equal(await count(who), 1);
});

test("streams: a non-final status is not kept; a stream cut short is rolled back", async () => {
  const who = principal();
  const k = key();
  const failed = await raw(big, "/stream", '{"n":2,"size":2,"status":503}', who, k);
  assert.deepEqual(failed.chunks, ["00", "11"]);
  assert.ok(!failed.headers.has("idempotency-expires"));
  assert.equal(await stored(who, k), null);
  assert.equal(await count(who), 0);
  const c = key();
  await assert.rejects(raw(big, "/cut", "{}", who, c), /cut short/);
  await new Promise((resolve) => setTimeout(resolve, 200));
  assert.equal(await stored(who, c), null);
});

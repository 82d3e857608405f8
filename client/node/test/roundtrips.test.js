"use strict";
// A keyed request takes no more round trips than the same handler in a plain
// transaction (node-pg: BEGIN, the statement, COMMIT: three).
const assert = require("node:assert/strict");
const http = require("node:http");
const { test } = require("node:test");
const { pkg, database, principal, key, countRoundTrips } = require("./helpers");

const { Client, Response, idempotency } = pkg();
const db = database();

const INSERT = "INSERT INTO orders (principal, item, quantity) VALUES ($1, 'rt', 1) RETURNING id";

function handler(who) {
  return async (conn) => {
    const { rows } = await conn.query(INSERT, [who]);
    return new Response(201, [["Content-Type", "application/json"]], `{"id":${rows[0].id}}`);
  };
}

test("keyed: 3 round trips like the plain route; replay 2; a final error 3", async () => {
  const conn = await db.connect();
  const client = new Client();
  const who = principal();
  await client.handle(conn, { principal: who, key: key(), method: "POST", path: "/o", body: "{}" }, handler(who)); // warm
  const plain = await countRoundTrips(conn, async () => {
    await conn.query("BEGIN");
    await handler(who)(conn);
    await conn.query("COMMIT");
  });
  const request = { principal: who, key: key(), method: "POST", path: "/o", body: '{"a":1}' };
  const keyed = await countRoundTrips(conn, () => client.handle(conn, request, handler(who)));
  const replay = await countRoundTrips(conn, () => client.handle(conn, request, handler(who)));
  const refuse = async (c) => {
    await handler(who)(c);
    return new Response(422, [], "{}");
  };
  const finalError = await countRoundTrips(conn, () =>
    client.handle(conn, { principal: who, key: key(), method: "POST", path: "/o", body: "{}" }, refuse));
  assert.equal(plain, 3);
  assert.equal(keyed, 3);
  assert.equal(replay, 2);
  assert.equal(finalError, 3);
});

test("the Express-style middleware adds no round trip", async () => {
  const conn = await db.connect();
  const who = principal();
  const middleware = idempotency({
    pool: { connect: async () => Object.assign(conn, { release: () => undefined }) },
    client: new Client(),
    principal: () => who,
  });
  const server = http.createServer((req, res) => {
    middleware(req, res, async () => {
      const response = await handler(who)(req.idempotency.db);
      res.statusCode = response.status;
      res.setHeader("Content-Type", "application/json");
      res.end(response.body);
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const post = (k) =>
    new Promise((resolve, reject) => {
      const req = http.request({ host: "127.0.0.1", port: server.address().port, method: "POST", path: "/o", headers: { "Idempotency-Key": k } }, (res) => {
        res.resume();
        res.on("end", () => resolve(res.statusCode));
      });
      req.on("error", reject);
      req.end("{}");
    });
  try {
    assert.equal(await post(key()), 201); // warm: the final-status table is read once per client
    let status;
    const trips = await countRoundTrips(conn, async () => {
      status = await post(key());
    });
    assert.equal(status, 201);
    assert.equal(trips, 3);
  } finally {
    server.close();
  }
});

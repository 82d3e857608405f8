"use strict";
// A new connection's FATAL that arrives with its ready-for-query (one chunk: node-pg
// parses it in one go) is emitted after pg-pool took its idle listener off and before
// the checkout's promise resumes the adapter. Nobody listened then, and the 'error'
// ended the process (fastify-orders died so under faults.sh's terminates). The
// adapters now put their listeners on each new connection as the pool makes it
// (watchPool, src/fault.ts), so the request gets the database fault's 503 instead.
// A stand-in pool plays that order of events; no database is needed.
const assert = require("node:assert/strict");
const { EventEmitter } = require("node:events");
const { test } = require("node:test");
const express = require("express");
const { pkg } = require("./helpers");

const { Client, idempotency } = pkg();

function terminated() {
  return Object.assign(new Error("terminating connection due to administrator command"), {
    code: "57P01",
    severity: "FATAL",
  });
}

// pg-pool's order for a new connection: 'connect' on the pool, the checkout handed
// over (the promise resolved), then, before any promise continuation runs (a tick),
// the same chunk's FATAL on the client (a microtask queued first runs first).
class RacyPool extends EventEmitter {
  constructor() {
    super();
    this.made = 0;
    this.released = [];
  }
  async connect() {
    const client = new EventEmitter();
    client.query = async () => {
      throw terminated();
    };
    client.release = (error) => this.released.push(error);
    this.made++;
    this.emit("connect", client);
    queueMicrotask(() => client.emit("error", terminated()));
    return client;
  }
}

for (const framework of ["express", "fastify"]) {
  test(`${framework}: a FATAL with a new connection's ready-for-query is the fault's 503, not a crash`, async () => {
    const uncaught = [];
    const record = (error) => uncaught.push(error);
    process.on("uncaughtException", record);
    const pool = new RacyPool();
    let server;
    let base;
    let app;
    try {
      const options = { pool, client: new Client(), principal: () => "racy" };
      if (framework === "express") {
        app = express();
        app.use(idempotency({ ...options, applies: (req) => req.method === "POST" }));
        app.post("/orders", (req, res) => res.status(201).json({ ran: true }));
        server = app.listen(0, "127.0.0.1");
        await new Promise((resolve) => server.once("listening", resolve));
        base = `http://127.0.0.1:${server.address().port}`;
      } else {
        app = require("fastify")();
        await app.register(require("../fastify").idempotency, {
          ...options,
          applies: (request) => request.method === "POST",
        });
        app.post("/orders", async (request, reply) => reply.code(201).send({ ran: true }));
        base = await app.listen({ port: 0, host: "127.0.0.1" });
      }
      const response = await fetch(`${base}/orders`, {
        method: "POST",
        headers: { "Idempotency-Key": "k-racy-1", "Content-Type": "application/json" },
        body: "{}",
      });
      await new Promise((resolve) => setImmediate(resolve));
      assert.deepEqual(uncaught.map((e) => e.message), [], "an 'error' nobody listened to");
      assert.equal(response.status, 503);
      const body = await response.json();
      assert.equal(body.status, 503);
      assert.ok(body.type.endsWith("database-unavailable"));
      assert.equal(pool.made, 1);
      assert.deepEqual(pool.released, [true], "the dead connection is discarded, not pooled");
    } finally {
      process.removeListener("uncaughtException", record);
      if (server) server.close();
      if (framework === "fastify" && app) await app.close();
    }
  });
}

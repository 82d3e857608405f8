// Test harness: the cluster test/run.js started (IDEM_NODE_PG), or one of its
// own when a file runs alone; a fresh database with the extension per file.
"use strict";
const { spawnSync } = require("node:child_process");
const crypto = require("node:crypto");
const fs = require("node:fs");
const os = require("node:os");
const path = require("node:path");
const { before, after } = require("node:test");
const pg = require("pg");

const root = path.resolve(__dirname, "..", "..", "..");

/** The package under test: the installed one when IDEM_EXPECT_INSTALLED, else ../dist. */
function pkg() {
  return require(path.join(__dirname, "..", "dist", "index.js"));
}

/**
 * Registers before/after hooks: a database with the extension and an orders
 * table. Returns an object whose `config` (node-pg ClientConfig) is set once
 * the hook ran.
 */
function database() {
  const state = { config: null, clients: [] };
  let own = null;
  let server;
  let name;
  let ready = null;
  /** Creates the database once; hooks of the test file may await it too. */
  state.init = () => (ready ??= init());
  before(() => state.init());
  async function init() {
    if (process.env.IDEM_NODE_PG) {
      server = JSON.parse(process.env.IDEM_NODE_PG);
    } else {
      own = fs.mkdtempSync(path.join(os.tmpdir(), "idem-node-test."));
      const port = 30000 + Math.floor(Math.random() * 10000);
      const r = spawnSync("bash", [path.join(root, "scripts", "pgcluster.sh"), "start", path.join(own, "pg"), String(port)], { stdio: "inherit" });
      if (r.status !== 0) throw new Error("cannot start a cluster");
      server = { host: path.join(own, "pg"), port, user: "postgres" };
    }
    name = "idem_node_" + crypto.randomBytes(6).toString("hex");
    const admin = new pg.Client({ ...server, database: "postgres" });
    await admin.connect();
    await admin.query(`CREATE DATABASE "${name}"`);
    await admin.end();
    state.config = { ...server, database: name };
    const setup = new pg.Client(state.config);
    await setup.connect();
    await setup.query("CREATE EXTENSION idempotency");
    await setup.query(
      "CREATE TABLE orders (id bigserial PRIMARY KEY, principal text NOT NULL, item text NOT NULL," +
        " quantity int NOT NULL, created_at timestamptz NOT NULL DEFAULT now())",
    );
    await setup.end();
  }
  after(async () => {
    for (const c of state.clients) await c.end().catch(() => undefined);
    const admin = new pg.Client({ ...server, database: "postgres" });
    await admin.connect();
    await admin.query(`DROP DATABASE "${name}" WITH (FORCE)`);
    await admin.end();
    if (own) {
      spawnSync("bash", [path.join(root, "scripts", "pgcluster.sh"), "stop", path.join(own, "pg")], { stdio: "inherit" });
      fs.rmSync(own, { recursive: true, force: true });
    }
  });
  /** A connected pg.Client, closed after the file. */
  state.connect = async () => {
    const client = new pg.Client(state.config);
    await client.connect();
    state.clients.push(client);
    return client;
  };
  return state;
}

/** A fresh principal. */
function principal() {
  return "user-" + crypto.randomBytes(5).toString("hex");
}

/** A fresh key. */
function key() {
  return crypto.randomUUID();
}

/**
 * Counts round trips on a node-pg client's socket while `action` runs: one each
 * time the client writes after having received something.
 */
async function countRoundTrips(client, action) {
  const stream = client.connection.stream;
  let trips = 0;
  let received = true;
  const write = stream.write;
  const onData = () => {
    received = true;
  };
  stream.write = function (...args) {
    if (received) trips++;
    received = false;
    return write.apply(this, args);
  };
  stream.on("data", onData);
  try {
    await action();
  } finally {
    stream.write = write;
    stream.off("data", onData);
  }
  return trips;
}

module.exports = { pkg, database, principal, key, countRoundTrips, root };

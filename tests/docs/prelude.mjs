// Prelude of every JavaScript / TypeScript block of the docs (tests/docs/check.py):
// the names a block uses without defining them, bound on globalThis to real values on
// the database "shop" of the cluster in PGHOST/PGPORT/PGUSER, so that a block's own
// const of the same name shadows them. Imported under other names for the same reason.
const { default: docPg } = await import("pg");
const docIdem = await import("pg-idempotency");

const docSetup = new docPg.Client({ database: "shop" });
await docSetup.connect();
await docSetup.query("CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, item text NOT NULL)");
await docSetup.end();

const docOpen = [];
Object.assign(globalThis, {
  userId: "node-user", principal: "node-user", key: "doc-check-node-1", item: "book", fence: 1,
  rawBody: Buffer.from('{"item":"book"}'), bodyBuffer: Buffer.from('{"item":"book"}'),
  responseBuffer: Buffer.from('{"id":1}'),
  req: { headers: { "idempotency-key": "doc-check-node-1" } },
  log: { warn: (...args) => console.error(...args) },
  pool: new docPg.Pool({ database: "shop", max: 2 }),
  authenticatedUser: (req) => req.headers["x-user"] ?? null,
  callPaymentProvider: async () => new docIdem.Response(200, [["Content-Type", "application/json"]], '{"paid":true}'),
  send: (response) => {
    if (!(response instanceof docIdem.Response)) throw new Error(`send() got ${response}`);
  },
});
globalThis.request = { principal: "node-user", key: "doc-check-lease-1", method: "POST", path: "/pay",
                       body: Buffer.from("{}") };
globalThis.db = new docPg.Client({ database: "shop" });
await globalThis.db.connect();
docOpen.push(globalThis.db, globalThis.pool);

globalThis.docCheckEnd = async () => {
  for (const c of docOpen) await c.end();
  process.exit(0);
};

// Compiled (not run) by test/types.test.js against the shipped declarations in
// dist/: what an application in TypeScript writes must type-check.
import express from "express";
import Fastify from "fastify";
import pg from "pg";
import {
  Client,
  LeaseRunner,
  Response,
  Router,
  beginBatch,
  claimBatch,
  completeBatch,
  idempotency,
  pushUnique,
  type BatchOutcome,
  type KeyOutcome,
  type LeaseResult,
  type Request,
  type RequestContext,
  type RouterCounters,
} from "../../dist/index";
import { idempotency as fastifyIdempotency } from "../../dist/fastify";

const pool = new pg.Pool();
const client = new Client({ waitMs: 2000, keptHeaders: ["Content-Type", "Location"] });
const app = express();
app.use(idempotency({ pool, client, principal: (req) => req.headers.authorization ?? null }));
app.post("/orders", async (req, res) => {
  const ctx = req.idempotency;
  if (!ctx) return void res.sendStatus(401);
  const { rows } = await ctx.db.query<{ id: string }>("INSERT INTO orders DEFAULT VALUES RETURNING id::text");
  ctx.resourceId = rows[0].id;
  const raw: Buffer | undefined = req.rawBody;
  res.status(201).end(raw);
});

async function direct(db: pg.PoolClient, request: Request): Promise<Response> {
  return client.handle(db, request, async (conn) => {
    await conn.query("SELECT 1");
    return new Response(201, [["Content-Type", "application/json"]], "{}", { resourceId: "1" });
  });
}

async function lease(request: Request): Promise<bigint> {
  const runner = new LeaseRunner("postgres:///shop", { policy: "commit_on_success", leaseMs: 5000 });
  const result: LeaseResult = await runner.run(request, async () => new Response(200));
  const until: string | null = result.leaseUntil;
  void until;
  await runner.close();
  return result.fence;
}

async function batch(db: pg.PoolClient, requests: Request[]): Promise<bigint | null> {
  const outcomes: BatchOutcome[] = await beginBatch(db, requests, client);
  const started = requests.filter((_, i) => outcomes[i].outcome === "started");
  const done = await completeBatch(db, started, started.map(() => new Response(201)), client);
  const first: KeyOutcome = outcomes[0].outcome;
  const claims = await claimBatch(db, "tenant", ["a", "b"], 60_000);
  const pushed: boolean = await pushUnique(db, "tenant", "job-1", null, (conn) => conn.query("SELECT 1"));
  void [done[0].completed, first, claims[0].claimed, pushed, outcomes[0].response?.status];
  return outcomes[0].fence;
}

async function routed(request: Request): Promise<Response> {
  const router = new Router(pool, { "10.0.0.5:5432": new pg.Pool() }, { refreshMs: 30_000 });
  app.use(idempotency({ router, client, principal: (req) => req.headers.authorization ?? null }));
  const { client: db, node } = await router.connect(request.principal);
  try {
    const counters: RouterCounters = router.counters;
    void [counters.routed, node];
    return await client.handle(db, request, async () => new Response(201));
  } finally {
    db.release();
  }
}

void direct;
void routed;
void lease;
void batch;

// The Fastify plugin (pg-idempotency/fastify): registered, request.idempotency typed.
async function fastifyApp(): Promise<void> {
  const server = Fastify();
  await server.register(fastifyIdempotency, { pool, client, principal: (request) => request.headers["x-user"] as string });
  server.post("/orders", async (request, reply) => {
    const ctx: RequestContext | null = request.idempotency;
    if (!ctx) return reply.code(401).send();
    const raw: Buffer | null = request.rawBody;
    ctx.resourceId = String(raw?.length ?? 0);
    return reply.code(201).send({ ok: true });
  });
}
void fastifyApp;

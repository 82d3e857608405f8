/**
 * Many keys in one call, and a job enqueued at most once:
 *
 * - beginBatch / completeBatch / claimBatch: idempotency.begin_batch,
 *   complete_batch and claim_batch (extension 0.8.0), one round trip each, one
 *   outcome per key in input order; each key behaves as the single-key call, and
 *   the server takes the key locks in sorted key order (two batches never deadlock);
 * - pushUnique: idempotency.claim and the caller's insert of the job row in the
 *   caller's transaction.
 *
 * Values travel as parameters (node-pg: one round trip per call); results are
 * read as the server's text, as the rest of the client reads them.
 */

import { RAW_TYPES, actionName, intervalText, keptHeadersJson, waitFor, type Db, type Request } from "./common";
import { Response } from "./http";
import type { KeyOutcome } from "./protocol_gen";
import { Client } from "./transactional";

/** What begin_batch answered for one key (the columns of idempotency.batch_outcome). */
export interface BatchOutcome {
  /** 1-based position of the key in the batch. */
  ord: number;
  key: string;
  /** "started": the key is held by the transaction (do the work, then completeBatch). */
  outcome: KeyOutcome;
  /**
   * The answer for an outcome that does not run the work, the extension's as for
   * Client.handle (the stored response, 409, 410, 422, with Idempotency-Expires);
   * null for "started".
   */
  response: Response | null;
  /** Status and resource id of the stored response (null when there is none). */
  responseStatus: number | null;
  resourceId: string | null;
  /** The key row's times as the server's ISO 8601 text (microseconds kept), null when NULL. */
  createdAt: string | null;
  expiresAt: string | null;
  leaseUntil: string | null;
  /** The key row's fence, null when it has none. */
  fence: bigint | null;
}

/** What complete_batch answered for one key. */
export interface BatchCompletion {
  ord: number;
  key: string;
  completed: boolean;
}

/** What claim_batch answered for one key: claimed is true for the call that claimed it. */
export interface BatchClaim {
  ord: number;
  key: string;
  claimed: boolean;
}

/** A finite timestamp column as ISO 8601 text, NULL otherwise. */
function iso(column: string): string {
  return `CASE WHEN isfinite(${column}) THEN to_json(${column}) #>> '{}' END`;
}

// The columns of idempotency.batch_outcome, then each key's answer (but a started one's)
// from idempotency.http_answer, as begin's statement (transactional.ts) has them; the
// fingerprints are computed by the server, in order.
const BEGIN_BATCH_SQL =
  "SELECT b.ord, b.key, b.outcome, b.response_status, b.resource_id," +
  ` ${iso("b.created_at")} AS created_at, ${iso("b.expires_at")} AS expires_at,` +
  ` b.fence::text AS fence, ${iso("b.lease_until")} AS lease_until,` +
  " a.status, a.headers::text AS headers, a.body" +
  " FROM idempotency.begin_batch($1::text, $2::text[], $3::text," +
  " ARRAY(SELECT idempotency.fingerprint(u.m, u.p, u.b, $7::text[])" +
  " FROM unnest($4::text[], $5::text[], $6::bytea[]) WITH ORDINALITY AS u(m, p, b, n)" +
  " ORDER BY u.n), $8::interval, $9::interval) AS b" +
  " LEFT JOIN LATERAL (SELECT * FROM idempotency.http_answer(b, $10::text, $11::integer)" +
  " WHERE b.outcome <> 'started' OFFSET 0) AS a ON true ORDER BY b.ord";
const COMPLETE_BATCH_SQL =
  "SELECT ord, key, completed FROM idempotency.complete_batch($1::text, $2::text[]," +
  " $3::integer[], $4::bytea[], $5::text[]::jsonb[], $6::text[]) ORDER BY ord";
const CLAIM_BATCH_SQL =
  "SELECT ord, key, claimed FROM idempotency.claim_batch($1::text, $2::text[], $3::interval)" +
  " ORDER BY ord";
const CLAIM_SQL = "SELECT idempotency.claim($1::text, $2::text, $3::interval) AS claimed";

type Row = Record<string, string | null>;

async function rows(db: Db, text: string, values: unknown[]): Promise<Row[]> {
  const result = await db.query({ text, values, types: RAW_TYPES });
  return result.rows as Row[];
}

/** A row's position and key, and its boolean column K under the same name. */
type Flagged<K extends string> = { ord: number; key: string } & Record<K, boolean>;

/** Each row's position, key and boolean `column` ("t" is true). */
function flags<K extends string>(found: Row[], column: K): Array<Flagged<K>> {
  return found.map((row) => ({ ord: Number(row.ord), key: row.key ?? "", [column]: row[column] === "t" }) as Flagged<K>);
}

/** The key of each request; every request of a batch must have one and share the principal. */
function batchKeys(requests: readonly Request[]): string[] {
  return requests.map((r, i) => {
    if (r.principal !== requests[0].principal) throw new TypeError("a batch has one principal");
    if (r.key === null || r.key === undefined) {
      throw new TypeError(`batch request ${i + 1} has no key`);
    }
    return r.key;
  });
}

/**
 * Claims the keys of `requests` inside the caller's open transaction on `db`, in
 * one round trip (idempotency.begin_batch), and returns one outcome per request,
 * in their order. Do the work of the "started" keys on `db`, then completeBatch
 * them before COMMIT. The requests share one principal, action, exclude list and
 * duplicate mode; `client`'s ttlMs, waitMs, duplicates, problemTypeBase and
 * retryAfter apply (and its counters count the answers, which the extension gives). The server refuses a
 * duplicate key (22023) and more than 1000 keys (54000).
 */
export async function beginBatch(
  db: Db,
  requests: readonly Request[],
  client = new Client(),
): Promise<BatchOutcome[]> {
  if (requests.length === 0) return [];
  const keys = batchKeys(requests);
  const first = requests[0];
  const modeOf = (r: Request) => r.duplicates ?? client.options.duplicates;
  const excludeOf = (r: Request) => JSON.stringify(r.exclude ?? []);
  for (const r of requests) {
    if (actionName(r) !== actionName(first) || modeOf(r) !== modeOf(first) ||
        excludeOf(r) !== excludeOf(first)) {
      throw new TypeError("a batch has one action, one exclude list and one duplicate mode");
    }
  }
  const bodies = requests.map((r) => (typeof r.body === "string" ? Buffer.from(r.body) : r.body));
  const exclude = first.exclude && first.exclude.length > 0 ? [...first.exclude] : null;
  const wait = intervalText(waitFor(first, client.options));
  const found = await rows(db, BEGIN_BATCH_SQL, [
    first.principal,
    keys,
    actionName(first),
    requests.map((r) => r.method),
    requests.map((r) => r.path),
    bodies,
    exclude,
    intervalText(client.options.ttlMs),
    wait,
    client.options.problemTypeBase,
    client.options.retryAfter,
  ]);
  return found.map((row) => {
    const outcome = row.outcome as KeyOutcome;
    // The extension's answer, counted as the client counts a single key's.
    const response = outcome === "started" ? null : client["answer"](outcome, row);
    return {
      ord: Number(row.ord),
      key: row.key ?? "",
      outcome,
      response,
      responseStatus: row.response_status === null ? null : Number(row.response_status),
      resourceId: row.resource_id,
      createdAt: row.created_at,
      expiresAt: row.expires_at,
      leaseUntil: row.lease_until,
      fence: row.fence === null ? null : BigInt(row.fence),
    };
  });
}

/**
 * Stores the final responses of keys that beginBatch started in the caller's
 * transaction on `db` (idempotency.complete_batch), one round trip; COMMIT
 * afterwards. responses[i] answers requests[i]; `client`'s keptHeaders are
 * stored. Every status must be final (else 22023, nothing stored); a one-time
 * secret cannot be completed in a batch (use Client.handle).
 */
export async function completeBatch(
  db: Db,
  requests: readonly Request[],
  responses: readonly Response[],
  client = new Client(),
): Promise<BatchCompletion[]> {
  if (requests.length !== responses.length) {
    throw new TypeError(`${requests.length} requests and ${responses.length} responses`);
  }
  if (requests.length === 0) return [];
  const keys = batchKeys(requests);
  if (responses.some((r) => r.oneTimeSecret)) {
    throw new TypeError("a one-time secret cannot be completed in a batch");
  }
  const found = await rows(db, COMPLETE_BATCH_SQL, [
    requests[0].principal,
    keys,
    responses.map((r) => r.status),
    responses.map((r) => r.body),
    responses.map((r) => keptHeadersJson(r, client.options.keptHeaders)),
    responses.map((r) => r.resourceId ?? null),
  ]);
  return flags(found, "completed");
}

/**
 * Claims many keys at once (idempotency.claim_batch): `claimed` is true for each
 * key this call claimed within ttlMs (null: idempotency.key_ttl), as
 * idempotency.claim would answer. In a transaction the claims commit or roll back
 * with it; outside one the call commits on its own.
 */
export async function claimBatch(
  db: Db,
  principal: string,
  keys: readonly string[],
  ttlMs: number | null = null,
): Promise<BatchClaim[]> {
  if (keys.length === 0) return [];
  const found = await rows(db, CLAIM_BATCH_SQL, [principal, [...keys], intervalText(ttlMs)]);
  return flags(found, "claimed");
}

/**
 * Enqueues a job at most once per window, inside the caller's open transaction
 * on `db`: claims (principal, key) for ttlMs (null: idempotency.key_ttl) and,
 * only when this call claimed it, runs `enqueue(db)` (the insert of the job row)
 * in the same transaction. Resolves to true when this call enqueued the job,
 * false (enqueue not run) when the key was claimed before within the window.
 *
 * The key row and the job row commit or roll back together: a push whose
 * transaction rolls back enqueued nothing and leaves the key free. A concurrent
 * push of the same key waits for this transaction (up to idempotency.wait_timeout,
 * then 55P03) and gets false if it commits, true if it rolls back. An error of
 * `enqueue` propagates: roll the transaction back.
 */
export async function pushUnique(
  db: Db,
  principal: string,
  key: string,
  ttlMs: number | null,
  enqueue: (db: Db) => Promise<unknown> | unknown,
): Promise<boolean> {
  const [row] = await rows(db, CLAIM_SQL, [principal, key, intervalText(ttlMs)]);
  if (row.claimed !== "t") return false;
  await enqueue(db);
  return true;
}

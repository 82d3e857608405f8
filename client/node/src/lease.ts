/**
 * The lease protocol: an effect outside the database (an upstream HTTP call, a
 * payment provider, a broker) at most once per key.
 *
 *     const runner = new LeaseRunner({ connectionString: "postgres:///shop" }, { policy: "remember" });
 *     const result = await runner.run(request, async () => callPaymentProvider(...));
 *     send(result.response);
 *     await runner.close();
 *
 * The key is held by a lease that a timer (setInterval, on a connection of its
 * own) renews every third of its length while the body runs; every statement
 * that settles the key is fenced. Same semantics as idem::LeaseRunner (C++) and the
 * Python LeaseRunner; an outcome that does not run the body is answered by the
 * extension (idempotency.http_answer, in acquire's statement).
 */

import { randomBytes } from "crypto";

import { Client as PgClient, type ClientConfig } from "pg";

import {
  RAW_TYPES,
  StorageTable,
  actionName,
  intervalText,
  keptHeadersJson,
  rowAnswer,
  sqlstate,
  stamped,
  validKey,
  waitFor,
  keyOptions,
  type KeyOptions,
  type Request,
} from "./common";
import { Response, asResponse, problemResponse } from "./http";
import { DEFAULT_RETRY_AFTER_SECONDS, DETAILS, KEY_REFUSED_SQLSTATES, Problem } from "./protocol_gen";

// Statement names, unique per copy of the module: node-pg prepares a named
// statement once per connection, and the runner's connections are its own.
const PREFIX = "pg_idempotency_lease_" + randomBytes(4).toString("hex");

// The answer of an outcome that does not run the body in the same statement, as
// begin's (transactional.ts): no call of http_answer for "started".
const ACQUIRE_SQL =
  "SELECT o.outcome, o.fence::text AS fence, o.resource_id, to_json(o.lease_until) #>> '{}' AS lease_until," +
  " floor(extract(epoch FROM o.expires_at))::bigint AS expires_epoch," +
  " CASE WHEN o.outcome <> 'started' THEN (idempotency.http_answer(o, $11::text, $12::integer)).status END AS status," +
  " CASE WHEN o.outcome <> 'started' THEN (idempotency.http_answer(o, $11::text, $12::integer)).headers::text END AS headers," +
  " CASE WHEN o.outcome <> 'started' THEN (idempotency.http_answer(o, $11::text, $12::integer)).body END AS body" +
  " FROM idempotency.acquire($1, $2, $3, idempotency.fingerprint($4, $5, $6::bytea, $7::text[])," +
  " $8::interval, $9::interval, $10::interval) AS o";
const RENEW_SQL = "SELECT idempotency.renew($1, $2, $3::bigint, $4::interval) AS ok";
const MARK_DONE_SQL = "SELECT idempotency.complete($1, $2, fence => $3::bigint, status => $4::integer) AS ok";
const REMEMBER_SQL =
  "SELECT idempotency.complete($1, $2, fence => $3::bigint, status => $4::integer," +
  " body => $5::bytea, headers => $6::jsonb, resource_id => $7::text, one_time_secret => $8::boolean) AS ok";
const RELEASE_SQL = "SELECT idempotency.release($1, $2, $3::bigint) AS ok";
// The settled row's expiry, read only when the key was completed after acquire's
// expires_at had passed (complete then keeps it one more ttl from its own now()).
const STORED_EXPIRY_SQL =
  "SELECT floor(extract(epoch FROM expires_at))::bigint AS expires_epoch FROM idempotency.lookup($1, $2)";

/**
 * What happens to the key after the effect ran:
 * - "once": at most once; the key is marked done whether the body succeeded, failed or threw;
 * - "commit_on_success": done on success (status below 400); a failure or a throw releases the key;
 * - "remember": the final response is stored and replayed; a non-final one or a throw releases.
 */
export type Policy = "once" | "commit_on_success" | "remember";

/**
 * How a run ended: "fresh" (the body ran and the key was settled with its fence),
 * "replayed" (remember: the stored response), "in_progress" (409), "duplicate"
 * (once / commit_on_success: already done, 409), "mismatch" (422),
 * "fresh_unfenced" (the body ran but the lease was lost meanwhile: nothing was
 * stored), "rejected" (missing or malformed key: 400), "expired" (the key expired
 * under an on_expiry 'refuse' policy: 410, the body did not run).
 */
export type LeaseOutcome =
  | "fresh"
  | "replayed"
  | "in_progress"
  | "duplicate"
  | "mismatch"
  | "fresh_unfenced"
  | "rejected"
  | "expired";

/** Settings of a LeaseRunner (and the shared KeyOptions); every member is optional. */
export interface LeaseOptions extends KeyOptions {
  /** Default "remember". */
  policy?: Policy;
  /** Lease length in ms (default 30 000; the server accepts 100 ms .. 24 h); renewed every third of it. */
  leaseMs?: number;
  /** Renew from a timer on a connection of its own while the body runs (default true). */
  renew?: boolean;
  /** Consecutive renewal errors after which renewing stops (default 3; an error is not a lost lease). */
  maxRenewFailures?: number;
}

/** The result of one run. */
export interface LeaseResult {
  outcome: LeaseOutcome;
  /** What to send: the body's, the stored one, or a problem response. */
  response: Response;
  /** The fence this call held (0n when it held none). */
  fence: bigint;
  /** When the lease acquired by this call ran out at first, as the server's ISO 8601 text with microseconds (null when none). */
  leaseUntil: string | null;
  /** Successful renewals while the body ran. */
  renewals: number;
  /**
   * When the key stops counting: its row's expires_at in seconds since the epoch (in the
   * past for "expired"), null when no row backs the answer (rejected, released). The
   * response already carries it as Idempotency-Expires (httpDate(expiresEpoch)).
   */
  expiresEpoch: number | null;
}

/** The effect: runs outside any database transaction and is never cancelled. */
export type Body = () => Promise<Response> | Response;

/** A connection of its own for `config`, opened; `gone` runs when it reports an error or ends. */
async function connect(config: ClientConfig | string, gone: (conn: PgClient) => void): Promise<PgClient> {
  const conn = new PgClient(config as ClientConfig);
  conn.on("error", () => gone(conn));
  conn.on("end", () => gone(conn));
  await conn.connect();
  return conn;
}

/** Renews a lease from a timer on its own connection until stopped. */
class Renewer {
  lost = false;
  renewals = 0;
  private failures = 0;
  private timer: NodeJS.Timeout;
  private inFlight: Promise<void> | null = null;
  private conn: PgClient | null = null;
  private stopped = false;

  constructor(
    private readonly config: ClientConfig | string,
    private readonly args: unknown[],
    periodMs: number,
    private readonly maxFailures: number,
  ) {
    this.timer = setInterval(() => {
      if (this.inFlight === null && !this.stopped) this.inFlight = this.tick().finally(() => (this.inFlight = null));
    }, periodMs);
  }

  private async tick(): Promise<void> {
    try {
      // A dropped connection is seen at the next query.
      if (this.conn === null) this.conn = await connect(this.config, () => undefined);
      const result = await this.conn.query({ name: PREFIX + "_renew", text: RENEW_SQL, values: this.args, types: RAW_TYPES });
      this.failures = 0;
      if ((result.rows[0] as { ok: string | null }).ok === "t") {
        this.renewals++;
      } else {
        this.lost = true;
        clearInterval(this.timer);
      }
    } catch {
      const conn = this.conn;
      this.conn = null;
      if (conn) conn.end().catch(() => undefined);
      if (++this.failures >= this.maxFailures) clearInterval(this.timer);
    }
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearInterval(this.timer);
    if (this.inFlight) await this.inFlight;
    if (this.conn) await this.conn.end().catch(() => undefined);
    this.conn = null;
  }
}

function epoch(text: string | null | undefined): number | null {
  return text === null || text === undefined ? null : Number(text);
}

/** Runs external effects under leases. Runs may overlap; each uses the runner's connection in turn. */
export class LeaseRunner {
  /** The settings, defaults filled in. */
  readonly options: Required<LeaseOptions>;
  private conn: PgClient | null = null;
  private connecting: Promise<PgClient> | null = null;
  private readonly storage = new StorageTable();

  /**
   * `config` (node-pg's ClientConfig or a connection string) opens the runner's
   * own connection (acquire, complete, release; autocommit) and one per run for
   * the renewal timer.
   */
  constructor(readonly config: ClientConfig | string, options: LeaseOptions = {}) {
    this.options = {
      ...keyOptions(options),
      policy: options.policy ?? "remember",
      leaseMs: options.leaseMs ?? 30_000,
      renew: options.renew ?? true,
      maxRenewFailures: options.maxRenewFailures ?? 3,
    };
    if (!(this.options.leaseMs > 0)) throw new RangeError("leaseMs must be positive");
    if (!["once", "commit_on_success", "remember"].includes(this.options.policy)) {
      throw new RangeError(`unknown policy: ${this.options.policy}`);
    }
  }

  /** The runner's own autocommit connection, reopened when it was lost. */
  async connection(): Promise<PgClient> {
    if (this.conn !== null) return this.conn;
    if (this.connecting === null) {
      const gone = (conn: PgClient) => {
        if (this.conn === conn) this.conn = null;
      };
      this.connecting = connect(this.config, gone)
        .then((conn) => (this.conn = conn))
        .finally(() => (this.connecting = null));
    }
    return this.connecting;
  }

  /** Closes the runner's connection. */
  async close(): Promise<void> {
    const conn = this.conn;
    this.conn = null;
    if (conn) await conn.end();
  }

  private result(outcome: LeaseOutcome, response: Response, expires: string | null = null): LeaseResult {
    stamped(response, expires);
    return { outcome, response, fence: 0n, leaseUntil: null, renewals: 0, expiresEpoch: epoch(expires) };
  }

  /** acquire's wait: 0 in reject mode (409 at once), else waitMs. */
  private waitText(request: Request): string | null {
    return intervalText(waitFor(request, this.options));
  }

  /**
   * The answer of an acquire that did not start (null when it started): the extension's
   * (idempotency.http_answer), but for a duplicate under a policy that keeps nothing.
   */
  private unstarted(row: Record<string, string | null>): LeaseResult | null {
    const outcome = row.outcome as string;
    const expires = row.expires_epoch;
    if (outcome === "started") return null;
    const duplicate = outcome === "replay" || outcome === "secret_replay";
    if (duplicate && this.options.policy !== "remember") {
      const problem = problemResponse(Problem.ALREADY_PROCESSED, DETAILS.alreadyProcessed, this.options.problemTypeBase);
      return this.result("duplicate", problem, expires);
    }
    const response = rowAnswer(row, "acquire");
    const kinds: Record<string, LeaseOutcome> = { mismatch: "mismatch", in_progress: "in_progress", expired: "expired" };
    return { ...this.result(kinds[outcome] ?? "replayed", response), expiresEpoch: epoch(expires) };
  }

  /**
   * Acquires the key, runs `body` while renewing the lease, and settles the key
   * by the policy. The body's error propagates after the key was settled (once:
   * marked done with 500; the other policies: released).
   */
  async run(request: Request, body: Body): Promise<LeaseResult> {
    const options = this.options;
    if (request.key === null || request.key === undefined || !validKey(request.key, options.maxKeyLength)) {
      const problem = request.key === null || request.key === undefined ? Problem.KEY_MISSING : Problem.KEY_MALFORMED;
      const detail = `An Idempotency-Key of 1 to ${options.maxKeyLength} visible ASCII characters is required.`;
      return this.result("rejected", problemResponse(problem, detail, options.problemTypeBase));
    }
    const principal = request.principal;
    const key = request.key;
    let conn = await this.connection();
    if (options.policy === "remember") await this.storage.load(conn); // known before holding anything
    let row: Record<string, string | null>;
    try {
      const body = request.body ?? null;
      const result = await conn.query({
        name: PREFIX + "_acquire",
        text: ACQUIRE_SQL,
        values: [
          principal,
          key,
          actionName(request),
          request.method,
          request.path,
          typeof body === "string" ? Buffer.from(body, "utf8") : body,
          request.exclude && request.exclude.length > 0 ? request.exclude : null,
          intervalText(options.leaseMs),
          intervalText(options.ttlMs),
          this.waitText(request),
          options.problemTypeBase,
          DEFAULT_RETRY_AFTER_SECONDS,
        ],
        types: RAW_TYPES,
      });
      row = result.rows[0] as Record<string, string | null>;
    } catch (error) {
      const state = sqlstate(error);
      if (state !== undefined && KEY_REFUSED_SQLSTATES.includes(state)) {
        return this.result("rejected", problemResponse(Problem.KEY_MALFORMED, DETAILS.keyRefused, options.problemTypeBase));
      }
      throw error;
    }
    const answered = this.unstarted(row);
    if (answered !== null) return answered;
    const fenceText = row.fence as string;
    const fence = BigInt(fenceText);

    // Run the body, never cancelled, while a timer renews the lease.
    const renewer = options.renew
      ? new Renewer(
          this.config,
          [principal, key, fenceText, intervalText(options.leaseMs)],
          Math.max(50, options.leaseMs / 3),
          options.maxRenewFailures,
        )
      : null;
    let failure: unknown = undefined;
    let failed = false;
    let response = new Response();
    try {
      response = asResponse(await body());
    } catch (error) {
      failed = true; // settled by the policy, then thrown again
      failure = error;
    }
    await renewer?.stop();

    // Settle the key by the policy; every statement is fenced.
    conn = await this.connection();
    const ask = async (name: string, text: string, values: unknown[]): Promise<boolean> => {
      const result = await conn.query({ name: `${PREFIX}_${name}`, text, values, types: RAW_TYPES });
      return (result.rows[0] as { ok: string | null }).ok === "t";
    };
    const markDone = (status: number) => ask("done", MARK_DONE_SQL, [principal, key, fenceText, String(status)]);
    let kept = true; // false once the key is released: no row backs the answer
    const release = () => {
      kept = false;
      return ask("release", RELEASE_SQL, [principal, key, fenceText]);
    };
    if (failed) {
      if (options.policy === "once") await markDone(500);
      else await release();
      throw failure;
    }
    let settled: boolean;
    if (options.policy === "once") {
      settled = await markDone(response.status);
    } else if (options.policy === "commit_on_success") {
      settled = response.status < 400 ? await markDone(response.status) : await release();
    } else if (this.storage.isFinal(response.status)) {
      settled = await ask("remember", REMEMBER_SQL, [
        principal,
        key,
        fenceText,
        String(response.status),
        response.body,
        keptHeadersJson(response, options.keptHeaders),
        response.resourceId,
        response.oneTimeSecret ? "true" : "false",
      ]);
    } else {
      settled = await release();
    }
    // The settled row's expiry: acquire's while it is still ahead; read after a late completion.
    let expires = settled && kept ? row.expires_epoch : null;
    if (expires !== null && Number(expires) * 1000 <= Date.now()) {
      const stored = await conn.query({ text: STORED_EXPIRY_SQL, values: [principal, key], types: RAW_TYPES });
      expires = (stored.rows[0] as { expires_epoch: string | null } | undefined)?.expires_epoch ?? null;
    }
    return {
      outcome: settled && !renewer?.lost ? "fresh" : "fresh_unfenced",
      response: stamped(response, expires),
      fence,
      leaseUntil: row.lease_until,
      renewals: renewer?.renewals ?? 0,
      expiresEpoch: epoch(expires),
    };
  }
}

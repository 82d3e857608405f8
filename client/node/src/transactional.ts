/**
 * The transactional protocol: the key row and the application's writes commit together.
 *
 *     const client = new Client();
 *     const response = await client.handle(db, request, async (db) => {
 *       const { rows } = await db.query("INSERT ... RETURNING id", [...]);
 *       return new Response(201, [["Content-Type", "application/json"]], body);
 *     });
 *
 * node-pg has no pipeline mode, so the client sends `BEGIN` with
 * `idempotency.begin(...)` (the fingerprint computed by `idempotency.fingerprint`
 * in the same statement) and `idempotency.complete(...)` with `COMMIT` as one
 * simple-query string each, with the values as escaped literals: a keyed request
 * takes as many round trips as the same handler between `BEGIN` and `COMMIT`.
 * The statements are prepared once per session (PREPARE in the first string,
 * EXECUTE afterwards), so the server does not parse and plan them per request.
 * Every outcome that does not run the handler is answered by the extension
 * (idempotency.http_answer, in begin's statement); what the handler's status means
 * for storage is idempotency.http_storage's table, read once.
 */

import { randomBytes } from "crypto";

import {
  RAW_TYPES,
  StorageTable,
  actionName,
  byteaLiteral,
  intervalText,
  keptHeadersJson,
  literal,
  rowAnswer,
  sqlstate,
  stamped,
  textArrayLiteral,
  validKey,
  waitFor,
  keyOptions,
  type Db,
  type KeyOptions,
  type Request,
} from "./common";
import { Response, asResponse, problemResponse } from "./http";
import {
  BODY_INVALID_SQLSTATES,
  DEFAULT_RETRY_AFTER_SECONDS,
  DETAILS,
  KEY_REFUSED_SQLSTATES,
  Problem,
  RETRYABLE_SQLSTATES,
} from "./protocol_gen";

/** Settings of a Client (and the shared KeyOptions); every member is optional. */
export interface Options extends KeyOptions {
  /** Methods answered 400 when they come without an Idempotency-Key (default POST, PATCH). */
  methodsRequiringKey?: readonly string[];
  /** Attempts of handle() on serialization failures and deadlocks (default 3). */
  maxAttempts?: number;
  /** Retry-After (seconds) of a 409 for a key held by a transaction (default 1). */
  retryAfter?: number;
  /** The statement that opens the transaction (default "BEGIN"; e.g. "BEGIN ISOLATION LEVEL SERIALIZABLE"). */
  beginStatement?: string;
  /**
   * Prepare the client's three statements once per session (PREPARE in the first
   * string, EXECUTE afterwards; default true). false: send the statements in
   * full every time, for poolers that do not keep a session per client
   * (pgbouncer in transaction mode).
   */
  prepare?: boolean;
}

/** What a Client did, for metrics. */
export interface Counters {
  started: number;
  replayed: number;
  mismatched: number;
  inProgress: number;
  secretReplayed: number;
  /** Retries of a key that expired under an on_expiry 'refuse' policy (410). */
  expired: number;
  rejectedKeys: number;
  notStored: number;
  storedErrors: number;
  retries: number;
}

/** The application's work, in the key's transaction on `db`; `expiresEpoch`: begin()'s expiry. */
export type Handler = (db: Db, expiresEpoch?: string | null) => Promise<Response> | Response;

/** The counter each outcome of begin() that does not run the handler counts in. */
const OUTCOME_COUNTERS = {
  replay: "replayed",
  mismatch: "mismatched",
  in_progress: "inProgress",
  secret_replay: "secretReplayed",
  expired: "expired",
} as const;

/** A statement the client sends: $n parameters, their types, a per-process unique name. */
interface Template {
  name: string;
  types: string;
  sql: string;
}

// Unique per copy of the module, so two copies never meet on one session.
const PREFIX = "pg_idempotency_" + randomBytes(4).toString("hex");

// Every column as text: node-pg leaves text as it is, so the query needs no RAW_TYPES (a
// query config object, which node-pg copies through property descriptors on every call).
// http_answer answers every outcome but "started" in the same statement (CASE: no call for
// started), in the one form Citus delegates: SELECT ... FROM f(...), nothing else in FROM.
const BEGIN_T: Template = {
  name: PREFIX + "_begin",
  types: "text, text, text, text, text, bytea, text[], interval, interval, text, integer",
  sql:
    "SELECT o.outcome::text AS outcome, o.resource_id::text AS resource_id," +
    " floor(extract(epoch FROM o.expires_at))::bigint::text AS expires_epoch," +
    " CASE WHEN o.outcome <> 'started' THEN (idempotency.http_answer(o, $10::text, $11::integer)).status END::text AS status," +
    " CASE WHEN o.outcome <> 'started' THEN (idempotency.http_answer(o, $10::text, $11::integer)).headers::text END AS headers," +
    " CASE WHEN o.outcome <> 'started' THEN (idempotency.http_answer(o, $10::text, $11::integer)).body END::text AS body" +
    " FROM idempotency.begin($1::text, $2::text, $3::text," +
    " idempotency.fingerprint($4::text, $5::text, $6::bytea, $7::text[]), $8::interval, $9::interval) AS o",
};
// Named arguments: the same call works on 0.5.0 (two complete overloads) and 0.6.0.
const COMPLETE_T: Template = {
  name: PREFIX + "_complete",
  types: "text, text, integer, bytea, jsonb, text, boolean",
  sql:
    "SELECT idempotency.complete($1::text, $2::text, status => $3::integer, body => $4::bytea," +
    " headers => $5::jsonb, resource_id => $6::text, one_time_secret => $7::boolean)",
};
const SAVE_FINAL_T: Template = {
  name: PREFIX + "_save_final",
  types: "text, text, text, text, text, bytea, text[], integer, bytea, jsonb, interval, boolean",
  sql:
    "SELECT idempotency.save_final($1::text, $2::text, $3::text," +
    " idempotency.fingerprint($4::text, $5::text, $6::bytea, $7::text[]), status => $8::integer," +
    " body => $9::bytea, headers => $10::jsonb, ttl => $11::interval, one_time_secret => $12::boolean)",
};
const TEMPLATES = [BEGIN_T, COMPLETE_T, SAVE_FINAL_T];

/** The sessions (node-pg clients) on which this module's statements are prepared. */
const preparedOn = new WeakSet<object>();

/** The PREPARE statements of every template, for the first string sent on a session. */
function prepareAll(): string {
  return TEMPLATES.map((t) => `PREPARE ${t.name}(${t.types}) AS ${t.sql}`).join("; ");
}

/**
 * A template with its values as SQL literals: `EXECUTE name(...)` when the
 * statements are prepared on the session, else the statement itself with the
 * literals in place of $n (one pass over the template: a value that contains
 * "$2" is not touched).
 */
function render(template: Template, args: string[], prepared: boolean): string {
  if (prepared) return `EXECUTE ${template.name}(${args.join(", ")})`;
  return template.sql.replace(/\$(\d+)/g, (_, n: string) => args[Number(n) - 1]);
}

/** begin's arguments as literals, but the last two (the answer's type base and Retry-After). */
function beginArgs(request: Request, options: Required<KeyOptions>): string[] {
  return [
    literal(request.principal),
    literal(request.key),
    literal(actionName(request)),
    literal(request.method),
    literal(request.path),
    byteaLiteral(request.body),
    textArrayLiteral(request.exclude),
    literal(intervalText(options.ttlMs)),
    literal(intervalText(waitFor(request, options))),
  ];
}

async function rollbackQuietly(db: Db): Promise<void> {
  try {
    await db.query("ROLLBACK"); // outside a transaction only a warning
  } catch {
    // the connection is gone; the server rolls back
  }
}

/** What `work` gives; when it throws, the transaction on `db` rolls back (nothing is stored) and the error propagates. */
async function orRollback<T>(db: Db, work: () => Promise<T>): Promise<T> {
  try {
    return await work();
  } catch (error) {
    await rollbackQuietly(db);
    throw error;
  }
}

/**
 * Runs handlers through the transactional protocol; the outcomes that do not run the
 * handler are answered by the extension (idempotency.http_answer).
 * One Client serves many connections and concurrent requests; a connection
 * serves one request at a time.
 */
export class Client {
  /** The settings, defaults filled in. */
  readonly options: Required<Options>;
  /** What this client did. */
  readonly counters: Counters = {
    started: 0,
    replayed: 0,
    mismatched: 0,
    inProgress: 0,
    secretReplayed: 0,
    expired: 0,
    rejectedKeys: 0,
    notStored: 0,
    storedErrors: 0,
    retries: 0,
  };
  private readonly storage = new StorageTable();

  /** A client with these options (see Options for the defaults). */
  constructor(options: Options = {}) {
    this.options = {
      ...keyOptions(options),
      methodsRequiringKey: options.methodsRequiringKey ?? ["POST", "PATCH"],
      maxAttempts: options.maxAttempts ?? 3,
      retryAfter: options.retryAfter ?? DEFAULT_RETRY_AFTER_SECONDS,
      beginStatement: options.beginStatement ?? "BEGIN",
      prepare: options.prepare ?? true,
    };
    if (!Number.isInteger(this.options.maxAttempts) || this.options.maxAttempts < 1) {
      throw new RangeError("maxAttempts must be at least 1");
    }
    if (!Number.isSafeInteger(this.options.retryAfter)) {
      throw new RangeError(`retryAfter must be an integer number of seconds, not ${this.options.retryAfter}`);
    }
  }

  /** Whether a response with this status is stored (idempotency.http_storage, read once). */
  async isFinal(db: Db, status: number): Promise<boolean> {
    await this.storage.load(db);
    return this.storage.isFinal(status);
  }

  /**
   * Runs `handler` through the protocol on `db` and returns the response to send.
   *
   * `db` must be idle (not in a transaction): the attempt opens the transaction
   * and ends it (commit with the stored key, or rollback). A handler that throws
   * rolls back, stores nothing, and the error propagates. Serialization failures
   * (40001) and deadlocks (40P01) rerun the whole attempt, handler included, up
   * to maxAttempts; then the error propagates (map it to 503 with Retry-After).
   */
  async handle(db: Db, request: Request, handler: Handler): Promise<Response> {
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.attempt(db, request, handler);
      } catch (error) {
        const state = sqlstate(error);
        if (state === undefined || !RETRYABLE_SQLSTATES.includes(state) || attempt >= this.options.maxAttempts) throw error;
        this.counters.retries++;
      }
    }
  }

  /** Wraps `handler` so that it takes (db, request) and runs through handle(). */
  idempotent(handler: Handler): (db: Db, request: Request) => Promise<Response> {
    return (db, request) => this.handle(db, request, handler);
  }

  /** One attempt, without retries. */
  private async attempt(db: Db, request: Request, handler: Handler): Promise<Response> {
    const options = this.options;
    const method = request.method.toUpperCase();
    if (request.key === null || request.key === undefined) {
      if (options.methodsRequiringKey.some((m) => m.toUpperCase() === method)) {
        this.counters.rejectedKeys++;
        return problemResponse(Problem.KEY_MISSING, `${method} requests need an Idempotency-Key header.`, options.problemTypeBase);
      }
      // Not idempotent by key: just a transaction around the handler.
      await db.query(options.beginStatement);
      const response = await orRollback(db, async () => handler(db));
      await db.query("COMMIT");
      return response;
    }
    if (!validKey(request.key, options.maxKeyLength)) {
      this.counters.rejectedKeys++;
      const detail = `The Idempotency-Key must be 1 to ${options.maxKeyLength} visible ASCII characters.`;
      return problemResponse(Problem.KEY_MALFORMED, detail, options.problemTypeBase);
    }
    await this.storage.load(db); // known before any transaction starts

    let row: Record<string, string | null>;
    try {
      row = await this.begin(db, request);
    } catch (error) {
      await rollbackQuietly(db);
      const state = sqlstate(error);
      if (state !== undefined && KEY_REFUSED_SQLSTATES.includes(state)) {
        this.counters.rejectedKeys++;
        return problemResponse(Problem.KEY_MALFORMED, DETAILS.keyRefused, options.problemTypeBase);
      }
      if (state !== undefined && BODY_INVALID_SQLSTATES.includes(state)) {
        return problemResponse(Problem.BODY_INVALID, (error as Error).message, options.problemTypeBase);
      }
      throw error;
    }
    const outcome = row.outcome ?? "";
    if (outcome !== "started") {
      let response: Response;
      try {
        response = this.answer(outcome, row);
      } finally {
        await db.query("COMMIT");
      }
      return response;
    }
    this.counters.started++;

    const answer = await orRollback(db, async () => {
      const response = asResponse(await handler(db, row.expires_epoch));
      if (!Number.isInteger(response.status) || response.status < 100 || response.status > 599) {
        throw new RangeError(`handler returned HTTP status ${response.status}`);
      }
      return response;
    });
    const storage = this.storage.of(answer.status);
    if (storage === "not_stored") {
      // 401, 429, 3xx, 5xx...: no effect may stay and nothing is stored, so a
      // retry after a token refresh, throttling or a crash takes effect once.
      this.counters.notStored++;
      await rollbackQuietly(db);
      return answer;
    }
    const headers = keptHeadersJson(answer, options.keptHeaders);
    const secret = answer.oneTimeSecret;
    if (storage === "saved_after_rollback") {
      // A final error has no effect to keep: roll back, then store it alone
      // (save_final runs in an implicit transaction of its own, same string).
      const args = [
        ...beginArgs(request, options).slice(0, 7),
        String(answer.status),
        byteaLiteral(secret ? Buffer.alloc(0) : answer.body),
        secret ? "NULL" : literal(headers),
        literal(intervalText(options.ttlMs)),
        secret ? "true" : "false",
      ];
      // The stored row's expiry: save_final starts the ttl at its own now().
      const expiry =
        "SELECT floor(extract(epoch FROM expires_at))::bigint AS expires_epoch" +
        ` FROM idempotency.lookup(${args[0]}, ${args[1]})`;
      const results = (await db.query({
        text: `ROLLBACK; ${render(SAVE_FINAL_T, args, options.prepare && preparedOn.has(db))}; ${expiry}`,
        types: RAW_TYPES,
      })) as unknown as Array<{ rows: Array<Record<string, string | null>> }>;
      this.counters.storedErrors++;
      return stamped(answer, results[results.length - 1].rows[0]?.expires_epoch);
    }
    const args = [
      literal(request.principal),
      literal(request.key),
      String(answer.status),
      byteaLiteral(answer.body),
      literal(headers),
      literal(answer.resourceId),
      secret ? "true" : "false",
    ];
    await orRollback(db, () => db.query(`${render(COMPLETE_T, args, options.prepare && preparedOn.has(db))}; COMMIT`));
    return stamped(answer, row.expires_epoch);
  }

  /**
   * Opens the transaction and runs begin() in one simple-query string: on the
   * first use of a session the string also prepares the client's statements
   * (PREPARE is not transactional: they stay for the session), later strings
   * EXECUTE them, so the server parses and plans them once per session.
   */
  private async begin(db: Db, request: Request): Promise<Record<string, string | null>> {
    const options = this.options;
    const answerArgs = [literal(options.problemTypeBase), String(Math.trunc(options.retryAfter))];
    const args = [...beginArgs(request, options), ...answerArgs];
    const send = async (prepare: boolean, prepared: boolean) => {
      const text = `${prepare ? prepareAll() + "; " : ""}${options.beginStatement}; ${render(BEGIN_T, args, prepared)}`;
      const results = (await db.query(text)) as unknown as Array<{
        rows: Array<Record<string, string | null>>;
      }>;
      return results[results.length - 1].rows[0];
    };
    if (!options.prepare) return send(false, false);
    const known = preparedOn.has(db);
    try {
      const row = await send(!known, true);
      preparedOn.add(db);
      return row;
    } catch (error) {
      const state = sqlstate(error);
      if (state === "26000" || state === "42P05") {
        // The session lost our statements (DISCARD ALL, a pooler that switched
        // sessions) or has some of them already: this attempt goes inline, the
        // next one prepares afresh.
        preparedOn.delete(db);
        await rollbackQuietly(db);
        if (state === "42P05") {
          for (const t of TEMPLATES) await db.query(`DEALLOCATE ${t.name}`).catch(() => undefined);
        }
        return send(false, false);
      }
      if (!known && state !== undefined && !state.startsWith("42")) preparedOn.add(db); // the PREPAREs ran
      throw error;
    }
  }

  /** The extension's answer in begin's row (also begin_batch's, batch.ts), counted. */
  private answer(outcome: string, row: Record<string, string | null>): Response {
    const response = rowAnswer(row, "begin");
    if (!Object.prototype.hasOwnProperty.call(OUTCOME_COUNTERS, outcome)) throw new Error(`idempotency.begin returned an unknown outcome: ${outcome}`);
    this.counters[OUTCOME_COUNTERS[outcome as keyof typeof OUTCOME_COUNTERS]]++;
    return response;
  }
}

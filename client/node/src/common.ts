/**
 * What the transactional and the lease protocol share: requests, SQL literals and
 * columns, the kept headers as stored, and the storage table (idempotency.http_storage).
 */

import type { ClientBase } from "pg";

import { Response, answerResponse, checkDuplicates, httpDate } from "./http";
import {
  DEFAULT_DUPLICATE_MODE,
  DEFAULT_KEPT_HEADERS,
  EXPIRES_HEADER,
  NOT_KEPT_ENTRY,
  PROBLEM_TYPE_BASE,
  STREAM_CHUNKS_ENTRY,
  type DuplicateMode,
} from "./protocol_gen";

/** A node-pg connection: pg.Client or a pool's PoolClient. */
export type Db = ClientBase;

/** One HTTP request as the protocol sees it. */
export interface Request {
  /** Whoever the key belongs to (user, API key, tenant), from authentication. */
  principal: string;
  /** The Idempotency-Key header, or null/undefined when the request had none. */
  key?: string | null;
  /** HTTP method; compared in upper case. */
  method: string;
  /** Request path (without the query string, unless the API wants it fingerprinted). */
  path: string;
  /** Request body; fingerprinted as RFC 8785 JSON when it is JSON, as raw bytes otherwise. */
  body?: Buffer | string | null;
  /** RFC 6901 pointers of members left out of the fingerprint (timestamps, nonces). */
  exclude?: readonly string[];
  /** Operation name stored with the key; defaults to "METHOD path". */
  action?: string;
  /** "wait" or "reject" for a duplicate of a running request; default: the client's option. */
  duplicates?: DuplicateMode | null;
}

/** Settings the Client and the LeaseRunner share; every member is optional. */
export interface KeyOptions {
  /** Response headers stored with the key and replayed (default DEFAULT_KEPT_HEADERS). */
  keptHeaders?: readonly string[];
  /** Key lifetime in ms; default idempotency.key_ttl. */
  ttlMs?: number | null;
  /** How long begin/acquire waits for a transaction that holds the key, in ms; default idempotency.wait_timeout. */
  waitMs?: number | null;
  /**
   * "wait" (default): a duplicate of a running request waits for the transaction that
   * holds the key (up to waitMs), then replays; "reject": 409 request-in-progress with
   * Retry-After at once (wait 0). A live lease is 409 at once in both. Request.duplicates
   * overrides it per call.
   */
  duplicates?: DuplicateMode;
  /** Prefix of problem type URIs (default PROBLEM_TYPE_BASE, client/protocol.json). */
  problemTypeBase?: string;
  /** Longest key accepted before asking the server (default 255). */
  maxKeyLength?: number;
}

/** The shared settings with their defaults filled in; RangeError for an unknown duplicate mode. */
export function keyOptions(options: KeyOptions): Required<KeyOptions> {
  const filled = {
    keptHeaders: options.keptHeaders ?? DEFAULT_KEPT_HEADERS,
    ttlMs: options.ttlMs ?? null,
    waitMs: options.waitMs ?? null,
    duplicates: options.duplicates ?? DEFAULT_DUPLICATE_MODE,
    problemTypeBase: options.problemTypeBase ?? PROBLEM_TYPE_BASE,
    maxKeyLength: options.maxKeyLength ?? 255,
  };
  checkDuplicates(filled.duplicates, false);
  return filled;
}

/** How long begin/acquire waits for `request`, in ms: 0 in reject mode (409 at once), else waitMs. */
export function waitFor(request: Request, options: Required<KeyOptions>): number | null {
  const mode = request.duplicates ?? options.duplicates;
  checkDuplicates(mode, false);
  return mode === "reject" ? 0 : options.waitMs;
}

/** Adds the key's expiry header (when known), replacing any value the handler set. */
export function stamped(response: Response, expiresEpoch: string | null | undefined): Response {
  if (expiresEpoch !== null && expiresEpoch !== undefined) {
    response.setHeader(EXPIRES_HEADER, httpDate(Number(expiresEpoch)));
  }
  return response;
}

/** The action stored with the key: request.action or "METHOD path". */
export function actionName(request: Request): string {
  return request.action || `${request.method.toUpperCase()} ${request.path}`;
}

/** 1 to maxLength visible ASCII characters (space included), as the C++ and Python clients check. */
export function validKey(key: string, maxLength: number): boolean {
  if (key.length === 0 || key.length > maxLength) return false;
  for (let i = 0; i < key.length; i++) {
    const c = key.charCodeAt(i);
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

/** An error of this package that carries an SQLSTATE-like code. */
export class IdempotencyError extends Error {
  /** SQLSTATE of the condition (as node-pg's DatabaseError.code). */
  code: string;
  /** An error with a message and an SQLSTATE. */
  constructor(message: string, code: string) {
    super(message);
    this.name = "IdempotencyError";
    this.code = code;
  }
}

/** The SQLSTATE of an error thrown by node-pg (or this package), if any. */
export function sqlstate(error: unknown): string | undefined {
  if (error && typeof error === "object" && "code" in error) {
    const code = (error as { code: unknown }).code;
    if (typeof code === "string" && /^[0-9A-Z]{5}$/.test(code)) return code;
  }
  return undefined;
}

/**
 * A SQL string literal for a value (NULL for null/undefined). Backslashes make it
 * an E'' literal, so it is right whatever standard_conforming_strings says. NUL,
 * which no PostgreSQL text can hold, is refused with 22021.
 */
export function literal(value: string | null | undefined): string {
  if (value === null || value === undefined) return "NULL";
  if (value.includes("\0")) throw new IdempotencyError("text values cannot contain NUL (0x00)", "22021");
  const quoted = "'" + value.replace(/'/g, "''") + "'";
  return value.includes("\\") ? "E" + quoted.replace(/\\/g, "\\\\") : quoted;
}

/** A bytea literal for bytes (a string is taken as UTF-8), NULL for null/undefined (the statements cast it). */
export function byteaLiteral(value: Buffer | string | null | undefined): string {
  if (value === null || value === undefined) return "NULL";
  const bytes = typeof value === "string" ? Buffer.from(value, "utf8") : value;
  return "E'\\\\x" + bytes.toString("hex") + "'"; // literal("\\x" + hex) without its scans of the hex
}

/** A text[] literal for the exclude pointers, NULL when there are none (the statements cast it). */
export function textArrayLiteral(values: readonly string[] | undefined): string {
  if (!values || values.length === 0) return "NULL";
  const items = values.map((v) => '"' + v.replace(/\\/g, "\\\\").replace(/"/g, '\\"') + '"');
  return literal("{" + items.join(",") + "}");
}

/** Milliseconds as interval text ("1500 milliseconds"), as the C++ client writes them; null stays null. */
export function intervalText(ms: number | null | undefined): string | null {
  if (ms === null || ms === undefined) return null;
  if (!Number.isFinite(ms)) throw new RangeError(`not a duration: ${ms}`);
  return `${Math.trunc(ms)} milliseconds`;
}

/**
 * The extension's answer in a row of begin, acquire or begin_batch (its columns status,
 * headers, body as hex text, resource_id) for an outcome that did not start.
 */
export function rowAnswer(row: Record<string, string | null>, call: string): Response {
  if (row.status === null) throw new Error(`idempotency.${call} returned an unknown outcome: ${row.outcome}`);
  return answerResponse(row.status, row.headers, decodeBytea(row.body), row.resource_id);
}

/** Query types that leave every column as the server's text (no Date, no number). */
export const RAW_TYPES = { getTypeParser: () => (value: string) => value };

/** Decodes a bytea column received as text (hex format). */
export function decodeBytea(value: string | null | undefined): Buffer | null {
  if (value === null || value === undefined) return null;
  if (!value.startsWith("\\x")) throw new IdempotencyError("bytea_output must be 'hex'", "22000");
  return Buffer.from(value.slice(2), "hex");
}

const EXPIRES_LOWER = EXPIRES_HEADER.toLowerCase();
const keptSets = new WeakMap<readonly string[], Set<string>>();

/** The kept header names in lower case, made once per list. */
function keptSet(kept: readonly string[]): Set<string> {
  let set = keptSets.get(kept);
  if (set === undefined) keptSets.set(kept, (set = new Set(kept.map((name) => name.toLowerCase()))));
  return set;
}

/**
 * The kept headers of a response as a JSON array of [name, value] pairs, in
 * their order, repeated names (Set-Cookie, Link) included: the form the server
 * stores since 0.6.0 (the Python and C++ clients write the same).
 */
export function keptHeadersJson(response: Response, kept: readonly string[]): string {
  // A stream too large to keep is stored as its marker alone (no body, no header).
  if (response.streamTooLarge) return JSON.stringify({ [NOT_KEPT_ENTRY]: "stream-too-large" });
  // The expiry header belongs to the key, added to every answer: never stored. Names
  // starting with ":" are the reserved entries, written below only.
  const wanted = keptSet(kept);
  const pairs: string[][] = [];
  for (const [name, value] of response.headers) {
    const lower = name.toLowerCase();
    if (wanted.has(lower) && lower !== EXPIRES_LOWER && !name.startsWith(":")) pairs.push([name, value]);
  }
  if (response.chunks !== null) pairs.push([STREAM_CHUNKS_ENTRY, response.chunks.join(",")]);
  return JSON.stringify(pairs);
}

/** What a handler's status means for storage (idempotency.http_storage). */
export type Storage = "committed_with_key" | "saved_after_rollback" | "not_stored";

/** Reads what every status means for storage from the server, once. */
export const STORAGE_SQL =
  "SELECT s::text AS s, idempotency.http_storage(s) AS storage" +
  " FROM pg_catalog.generate_series(100, 599) AS s";

/**
 * idempotency.http_storage of every status, read once per client (the server's
 * idempotency.final_statuses): committed with the key, saved after the rollback, or
 * not stored.
 */
export class StorageTable {
  private table: Storage[] | null = null;
  private loading: Promise<void> | null = null;

  /** Reads the table (one round trip, once); db must be idle. */
  async load(db: Db): Promise<void> {
    if (this.table !== null) return;
    if (this.loading === null) {
      this.loading = (async () => {
        const result = await db.query({ text: STORAGE_SQL, types: RAW_TYPES });
        const table = new Array<Storage>(500).fill("not_stored");
        for (const row of result.rows as Array<{ s: string; storage: Storage }>) {
          table[Number(row.s) - 100] = row.storage;
        }
        this.table = table;
      })().finally(() => {
        this.loading = null;
      });
    }
    return this.loading;
  }

  /** What a response with this status does; load() must have run. */
  of(status: number): Storage {
    if (this.table === null) throw new Error("the storage table is not loaded");
    return status >= 100 && status <= 599 ? this.table[status - 100] : "not_stored";
  }

  /** Whether a response with this status is stored (with the key or after the rollback). */
  isFinal(status: number): boolean {
    return this.of(status) !== "not_stored";
  }
}

/** What a framework adapter (Express middleware, Fastify plugin) hands the route as `idempotency`. */
export interface RequestContext {
  /** The connection whose transaction holds the key: do the request's writes here, never commit. */
  db: Db;
  /** The request as fingerprinted. */
  request: Request;
  /** Set to true when the response carries a secret: it is sent once and not stored. */
  oneTimeSecret: boolean;
  /** Id of what the request created, stored with the key. */
  resourceId: string | null;
}

/**
 * The 32-byte request fingerprint, computed by the server's idempotency.fingerprint
 * with the values exactly as handle() sends them to begin (one round trip; the
 * protocol itself never needs this call).
 */
export async function fingerprint(
  db: Db,
  method: string,
  path: string,
  body?: Buffer | string | null,
  exclude?: readonly string[],
): Promise<Buffer> {
  const result = await db.query({
    text: "SELECT idempotency.fingerprint($1::text, $2::text, $3::bytea, $4::text[]) AS fingerprint",
    values: [method, path, typeof body === "string" ? Buffer.from(body, "utf8") : body ?? null, exclude?.length ? exclude : null],
    types: RAW_TYPES,
  });
  const digest = decodeBytea((result.rows[0] as { fingerprint: string | null }).fingerprint);
  if (digest === null) throw new Error("idempotency.fingerprint returned NULL");
  return digest;
}

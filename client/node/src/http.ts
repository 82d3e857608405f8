/**
 * The HTTP side of the client: responses, header lists, the problems the client
 * answers itself, and the answers idempotency.http_answer gives.
 *
 * No database here. What an outcome of begin/acquire means over HTTP (replay, 409,
 * 410, 422, their RFC 9457 bodies) is the extension's answer; this file only turns
 * its columns into a Response. The problems answered before any SQL call (a missing
 * or malformed key, a database fault) are built here with the generated constants
 * (protocol_gen.ts), byte-identical to the extension's bodies: the members detail,
 * status, title, type in that (sorted) order, no whitespace, raw UTF-8.
 */

import {
  DATABASE_FAULT_DETAIL,
  DEFAULT_MAX_STREAM_BYTES,
  DUPLICATE_MODES,
  PROBLEM_CONTENT_TYPE,
  PROBLEM_TYPE_BASE,
  Problem,
  REPLAY_HEADER,
  STREAM_CHUNKS_ENTRY,
  type DuplicateMode,
  type ProblemType,
} from "./protocol_gen";

/** HTTP header fields in order; names compare case-insensitively. */
export type Headers = Array<[string, string]>;

let lastDate: [number, string] = [NaN, ""];

/** Seconds since the Unix epoch as an IMF-fixdate ("Sun, 06 Nov 1994 08:49:37 GMT"). */
export function httpDate(epochSeconds: number): string {
  // Most answers in one second share an expiry: the last one is kept.
  if (lastDate[0] !== epochSeconds) lastDate = [epochSeconds, new Date(epochSeconds * 1000).toUTCString()];
  return lastDate[1];
}

/** True when two header names are equal ignoring ASCII case. */
export function headerNameEqual(a: string, b: string): boolean {
  return a.length === b.length && a.toLowerCase() === b.toLowerCase();
}

/** An HTTP response produced by a handler, by the extension's answer or by the client. */
export class Response {
  /** HTTP status code (100..599). */
  status: number;
  /** Header fields to send, in order. */
  headers: Headers;
  /** Body bytes, sent and stored as they are. */
  body: Buffer;
  /** True when this is a stored response played back for a retry. */
  replayed: boolean;
  /** Id of what the request created, stored with the key. */
  resourceId: string | null;
  /** The response carries a secret: sent once, never stored (only the status and a marker are). */
  oneTimeSecret: boolean;
  /**
   * A streamed response: the byte lengths of its chunks, in the order written (their
   * concatenation is `body`); stored as the STREAM_CHUNKS_ENTRY and replayed chunk by
   * chunk. null: not streamed.
   */
  chunks: number[] | null;
  /**
   * A streamed response larger than the middleware keeps: stored without its body,
   * marked NOT_KEPT_ENTRY; a retry gets 409 response-not-kept.
   */
  streamTooLarge: boolean;

  /** A response; a string body is encoded as UTF-8. */
  constructor(status = 200, headers: Headers = [], body: Buffer | string = Buffer.alloc(0), extras: ResponseExtras = {}) {
    this.status = status;
    this.headers = headers.map(([n, v]) => [n, v] as [string, string]);
    this.body = typeof body === "string" ? Buffer.from(body, "utf8") : body;
    this.replayed = extras.replayed ?? false;
    this.resourceId = extras.resourceId ?? null;
    this.oneTimeSecret = extras.oneTimeSecret ?? false;
    this.chunks = extras.chunks ?? null;
    this.streamTooLarge = extras.streamTooLarge ?? false;
  }

  /** The body cut at `chunks` (one piece per chunk), or [body] when not streamed. */
  pieces(): Buffer[] {
    if (this.chunks === null) return [this.body];
    const out: Buffer[] = [];
    let start = 0;
    for (const length of this.chunks) {
      out.push(this.body.subarray(start, start + length));
      start += length;
    }
    return out;
  }

  /** The value of the first header with this name, or undefined. */
  header(name: string): string | undefined {
    for (const [n, v] of this.headers) if (headerNameEqual(n, name)) return v;
    return undefined;
  }

  /** Replaces every header with this name by one with `value` (appended last). */
  setHeader(name: string, value: string): void {
    this.headers = this.headers.filter(([n]) => !headerNameEqual(n, name));
    this.headers.push([name, value]);
  }
}

/** Optional parts of a Response (its members of the same names). */
export type ResponseExtras = Partial<Pick<Response, "resourceId" | "oneTimeSecret" | "replayed" | "chunks" | "streamTooLarge">>;

/**
 * The handler's answer as a Response: a Response of this package, or an object
 * of the same shape (another copy of the package, a plain object).
 */
export function asResponse(value: unknown): Response {
  if (value instanceof Response) return value;
  const v = value as Partial<Response> | null;
  if (!v || typeof v !== "object" || typeof v.status !== "number") {
    throw new TypeError("the handler must return a Response");
  }
  const body = v.body ?? Buffer.alloc(0);
  if (!Buffer.isBuffer(body) && typeof body !== "string") throw new TypeError("Response.body must be a Buffer or a string");
  return new Response(v.status, Array.isArray(v.headers) ? v.headers : [], body, {
    resourceId: v.resourceId ?? null,
    oneTimeSecret: v.oneTimeSecret ?? false,
  });
}

/** A piece a route wrote (a Buffer, bytes, or text in `encoding`, default UTF-8) as a Buffer. */
export function toBuffer(chunk: unknown, encoding?: unknown): Buffer {
  if (Buffer.isBuffer(chunk)) return chunk;
  if (chunk instanceof Uint8Array) return Buffer.from(chunk);
  return Buffer.from(String(chunk), typeof encoding === "string" ? (encoding as BufferEncoding) : "utf8");
}

/**
 * The STREAM_CHUNKS_ENTRY's lengths, or null unless they are positive decimals that add
 * up to the body's length (a row this client did not write is replayed whole).
 */
export function chunkLengths(value: string, bodyLength: number): number[] | null {
  if (value === "") return bodyLength === 0 ? [] : null;
  const parts = value.split(",");
  if (!parts.every((part) => /^[0-9]+$/.test(part) && Number(part) > 0)) return null;
  const lengths = parts.map(Number);
  return lengths.reduce((a, b) => a + b, 0) === bodyLength ? lengths : null;
}

/**
 * The answer of idempotency.http_answer as a Response: its status, its headers (the
 * server's JSON text of [name, value] pairs, in order) and its body. A stored stream's
 * STREAM_CHUNKS_ENTRY is the client's instruction, never sent: it sets `chunks`.
 * `resourceId`: the key row's, for a replay.
 */
export function answerResponse(
  status: string,
  headersJson: string | null,
  body: Buffer | null,
  resourceId: string | null = null,
): Response {
  const response = new Response(Number(status), [], body ?? Buffer.alloc(0), { resourceId });
  const pairs: unknown = headersJson === null ? [] : JSON.parse(headersJson);
  for (const pair of Array.isArray(pairs) ? pairs : []) {
    if (!Array.isArray(pair) || typeof pair[0] !== "string" || typeof pair[1] !== "string") continue;
    if (pair[0] === STREAM_CHUNKS_ENTRY) response.chunks = chunkLengths(pair[1], response.body.length);
    else if (!pair[0].startsWith(":")) response.headers.push([pair[0], pair[1]]);
  }
  response.replayed = response.header(REPLAY_HEADER) !== undefined;
  return response;
}

/**
 * Serializes an RFC 9457 problem object as idempotency.http_answer does: sorted
 * members, no whitespace, raw UTF-8 (JSON.stringify escapes what the server's
 * to_json escapes for valid strings: ", \ and control characters).
 */
export function problemBody(status: number, typeUri: string, title: string, detail: string): Buffer {
  return Buffer.from(JSON.stringify({ detail, status, title, type: typeUri }), "utf8");
}

/** An application/problem+json response with type = typeBase + slug. */
export function problemResponse(problem: ProblemType, detail: string, typeBase = PROBLEM_TYPE_BASE): Response {
  const body = problemBody(problem.status, typeBase + problem.slug, problem.title, detail);
  return new Response(problem.status, [["Content-Type", PROBLEM_CONTENT_TYPE]], body);
}

/**
 * The one answer to a database fault (client/protocol.json database_fault): the
 * connection died, the server shut down or refused connections, the statement was
 * cancelled, or the commit's outcome is unknown. 503 database-unavailable with
 * Retry-After; a retry with the same key runs the request once or replays it.
 */
export function databaseFaultResponse(retryAfter = 1, typeBase = PROBLEM_TYPE_BASE): Response {
  const response = problemResponse(Problem.DATABASE_UNAVAILABLE, DATABASE_FAULT_DETAIL, typeBase);
  response.setHeader("Retry-After", String(Math.max(1, retryAfter)));
  return response;
}

/** A streamed response's chunks as they are sent, kept up to `maxBytes` in all. */
export class StreamCapture {
  /** Bytes streamed so far, kept or not. */
  size = 0;
  /** True once the stream went past maxBytes: nothing of it is kept. */
  tooLarge = false;
  private chunks: Buffer[] = [];

  /** A capture that keeps at most maxBytes (a non-negative integer). */
  constructor(readonly maxBytes: number = DEFAULT_MAX_STREAM_BYTES) {
    checkMaxStreamBytes(maxBytes);
  }

  /** Records one chunk as sent (an empty one is no chunk: it is never sent). */
  add(chunk: Buffer): void {
    if (chunk.length === 0) return;
    this.size += chunk.length;
    if (this.tooLarge) return;
    if (this.size > this.maxBytes) {
      this.tooLarge = true;
      this.chunks = []; // the memory goes back now, not at the end of the stream
      return;
    }
    this.chunks.push(Buffer.from(chunk));
  }

  /** What the key is completed with: the chunks and their lengths, or the marker alone. */
  response(status: number, headers: Headers): Response {
    if (this.tooLarge) return new Response(status, headers, Buffer.alloc(0), { streamTooLarge: true });
    const chunks = this.chunks.map((c) => c.length);
    return new Response(status, headers, Buffer.concat(this.chunks), { chunks });
  }
}

/** Throws RangeError unless `value` is a byte count (a safe integer >= 0); `name` says which. */
export function checkMaxStreamBytes(value: number, name = "maxStreamBytes"): void {
  if (!Number.isSafeInteger(value) || value < 0) {
    throw new RangeError(`${name} must be an integer >= 0, not ${value}`);
  }
}

/** Throws RangeError unless `mode` is a duplicate mode (or, for an adapter, a function or absent). */
export function checkDuplicates(mode: unknown, functionAllowed = true): void {
  if (functionAllowed && (mode === undefined || mode === null || typeof mode === "function")) return;
  if (!DUPLICATE_MODES.includes(mode as DuplicateMode)) {
    const choices = functionAllowed ? '"wait", "reject" or a function' : '"wait" or "reject"';
    throw new RangeError(`duplicates must be ${choices}, not ${String(mode)}`);
  }
}

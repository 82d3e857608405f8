/**
 * The HTTP side of the client: responses, header lists and RFC 9457 problem bodies.
 *
 * No database here. Problem bodies are byte-identical to the C++ client's
 * (client/cpp/src/http.cpp) and the Python client's: the members detail, status,
 * title, type in that (sorted) order, no whitespace, non-ASCII characters as raw UTF-8.
 */

/** HTTP header fields in order; names compare case-insensitively. */
export type Headers = Array<[string, string]>;

/**
 * The response header that tells until when the request's key counts: an RFC 9110
 * IMF-fixdate, the key row's expires_at rounded down to the second. Never stored as
 * a kept header; every answer to a keyed request gets the stored row's value.
 */
export const EXPIRES_HEADER = "Idempotency-Expires";
/** The format of EXPIRES_HEADER's value (client/protocol.json expires_format). */
export const EXPIRES_FORMAT = "IMF-fixdate";
/** What a duplicate of a running request does: wait for it and replay, or get 409 at once. */
export type DuplicateMode = "wait" | "reject";
/** The duplicate modes, the documented default first. */
export const DUPLICATE_MODES: readonly DuplicateMode[] = ["wait", "reject"];
/** The duplicate mode of a client or call that names none. */
export const DEFAULT_DUPLICATE_MODE: DuplicateMode = "wait";

let lastDate: [number, string] = [NaN, ""];

/** Seconds since the Unix epoch as an IMF-fixdate ("Sun, 06 Nov 1994 08:49:37 GMT"). */
export function httpDate(epochSeconds: number): string {
  // Most answers in one second share an expiry: the last one is kept.
  if (lastDate[0] !== epochSeconds) lastDate = [epochSeconds, new Date(epochSeconds * 1000).toUTCString()];
  return lastDate[1];
}

/** The media type of problem bodies. */
export const PROBLEM_CONTENT_TYPE = "application/problem+json";

/**
 * The reserved entry of the stored headers that keeps a streamed response's chunk
 * lengths ("5,5,3": decimal, comma-separated, in the order written). No HTTP header
 * can have this name: it is never sent.
 */
export const STREAM_CHUNKS_ENTRY = ":chunks";
/**
 * The reserved entry of the stored headers of a streamed response larger than the
 * middleware keeps (value NOT_KEPT_VALUE): no body stored, a retry gets 409 response-not-kept.
 */
export const NOT_KEPT_ENTRY = ":not_kept";
/** The value of NOT_KEPT_ENTRY. */
export const NOT_KEPT_VALUE = "stream-too-large";
/** The largest streamed response a middleware keeps for replay, unless configured otherwise. */
export const DEFAULT_MAX_STREAM_BYTES = 1048576;

/** True when two header names are equal ignoring ASCII case. */
export function headerNameEqual(a: string, b: string): boolean {
  return a.length === b.length && a.toLowerCase() === b.toLowerCase();
}

/** Optional parts of a Response. */
export interface ResponseExtras {
  /** Id of what the request created, stored with the key. */
  resourceId?: string | null;
  /** The response carries a secret (a new API key, say): sent once, never stored. */
  oneTimeSecret?: boolean;
  /** True when this is a stored response played back for a retry. */
  replayed?: boolean;
  /** A streamed response: the byte lengths of its chunks, in the order written. */
  chunks?: number[] | null;
  /** A streamed response larger than the middleware keeps (stored as a marker only). */
  streamTooLarge?: boolean;
}

/** An HTTP response produced by a handler or by the client. */
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

/** A problem type of the RFC 9457 bodies the client produces. */
export interface ProblemType {
  /** Appended to the type base URI ("idempotency-key-reuse"). */
  readonly slug: string;
  /** The HTTP status of this problem type. */
  readonly status: number;
  /** The fixed, human-readable title. */
  readonly title: string;
}

/** The problem types, with the C++ client's slugs, statuses and titles. */
export const Problem = {
  KEY_MISSING: { slug: "idempotency-key-missing", status: 400, title: "Idempotency-Key header is missing" },
  KEY_MALFORMED: { slug: "idempotency-key-malformed", status: 400, title: "Idempotency-Key header is malformed" },
  BODY_INVALID: { slug: "request-body-invalid", status: 400, title: "Request body cannot be fingerprinted" },
  KEY_REUSE: { slug: "idempotency-key-reuse", status: 422, title: "Idempotency-Key was used for another request" },
  REQUEST_IN_PROGRESS: {
    slug: "request-in-progress",
    status: 409,
    title: "A request with this Idempotency-Key is in progress",
  },
  ONE_TIME_SECRET: {
    slug: "one-time-secret",
    status: 409,
    title: "The response to this request was sent once and not kept",
  },
  ALREADY_PROCESSED: { slug: "request-already-processed", status: 409, title: "This request was already processed" },
  RESPONSE_NOT_KEPT: {
    slug: "response-not-kept",
    status: 409,
    title: "The response to this request was too large to keep",
  },
  KEY_EXPIRED: { slug: "idempotency-key-expired", status: 410, title: "Idempotency-Key has expired" },
  DATABASE_UNAVAILABLE: {
    slug: "database-unavailable",
    status: 503,
    title: "The database is unavailable",
  },
} as const satisfies Record<string, ProblemType>;

/**
 * Serializes an RFC 9457 problem object the way the C++ client (nlohmann_json)
 * does: sorted members, no whitespace, raw UTF-8. JSON.stringify escapes exactly
 * the characters nlohmann_json escapes (", \, control characters) for valid strings.
 */
export function problemBody(status: number, typeUri: string, title: string, detail: string): Buffer {
  return Buffer.from(JSON.stringify({ detail, status, title, type: typeUri }), "utf8");
}

/** An application/problem+json response with type = typeBase + slug. */
export function problemResponse(problem: ProblemType, detail: string, typeBase = "/problems/"): Response {
  const body = problemBody(problem.status, typeBase + problem.slug, problem.title, detail);
  return new Response(problem.status, [["Content-Type", PROBLEM_CONTENT_TYPE]], body);
}

/** The problem details the clients (C++, Python, Node) write, word for word. */
export const DETAILS = {
  keyReuse: "This Idempotency-Key was used for a different request; use a new key for a new request.",
  oneTimeSecret:
    "The first response to this request carried a secret and was not kept; create a new one with a new key.",
  inProgress: "A request with this Idempotency-Key is still being processed; retry later.",
  alreadyProcessed: "A request with this Idempotency-Key was already processed; its result is not kept.",
  keyRefused: "The Idempotency-Key was refused by the server.",
  responseNotKept:
    "The first response to this request was streamed and was larger than this service keeps;" +
    " it was sent once and not stored. Use a new key for a new request.",
  keyExpired:
    "This Idempotency-Key expired and its response is no longer kept; the request was not run again." +
    " Use a new key for a new request.",
  databaseFault:
    "The database failed or could not be reached while this request was processed." +
    " Retry it with the same Idempotency-Key: it runs once, or its stored response is replayed.",
} as const;

/** The outcomes of begin()/acquire() that are answered with a problem, and its detail. */
export const OUTCOME_PROBLEMS: Readonly<Record<string, readonly [ProblemType, string]>> = {
  mismatch: [Problem.KEY_REUSE, DETAILS.keyReuse],
  in_progress: [Problem.REQUEST_IN_PROGRESS, DETAILS.inProgress],
  secret_replay: [Problem.ONE_TIME_SECRET, DETAILS.oneTimeSecret],
  expired: [Problem.KEY_EXPIRED, DETAILS.keyExpired],
};

/**
 * The one mapping from an outcome of begin()/acquire() to an HTTP problem response:
 * mismatch 422; in_progress 409 with Retry-After (the rest of the lease when known,
 * else `retryAfter`, at least 1); secret_replay 409 with Idempotent-Replay; expired
 * 410 (the caller adds Idempotency-Expires, the past expiry begin/acquire returned).
 * null for the outcomes that are not problems.
 */
export function problemForOutcome(
  outcome: string,
  leaseSeconds: string | number | null | undefined,
  retryAfter: number,
  typeBase = "/problems/",
): Response | null {
  const entry = Object.prototype.hasOwnProperty.call(OUTCOME_PROBLEMS, outcome) ? OUTCOME_PROBLEMS[outcome] : null;
  if (entry === null) return null;
  const response = problemResponse(entry[0], entry[1], typeBase);
  if (outcome === "in_progress") {
    const retry = leaseSeconds === null || leaseSeconds === undefined ? retryAfter : Number(leaseSeconds);
    response.setHeader("Retry-After", String(Math.max(1, retry)));
  }
  if (outcome === "secret_replay") {
    response.replayed = true;
    response.setHeader("Idempotent-Replay", "true");
  }
  return response;
}

/**
 * The answer to a retry whose first response was a stream too large to keep (stored
 * with the NOT_KEPT_ENTRY): 409 response-not-kept with Idempotent-Replay, as a
 * one-time secret's retry is answered (the request was processed once; its answer is gone).
 */
export function notKeptResponse(typeBase = "/problems/"): Response {
  const response = problemResponse(Problem.RESPONSE_NOT_KEPT, DETAILS.responseNotKept, typeBase);
  response.replayed = true;
  response.setHeader("Idempotent-Replay", "true");
  return response;
}

/**
 * The one answer to a database fault (client/protocol.json database_fault): the
 * connection died, the server shut down or refused connections, the statement was
 * cancelled, or the commit's outcome is unknown. 503 database-unavailable with
 * Retry-After; a retry with the same key runs the request once or replays it.
 */
export function databaseFaultResponse(retryAfter = 1, typeBase = "/problems/"): Response {
  const response = problemResponse(Problem.DATABASE_UNAVAILABLE, DETAILS.databaseFault, typeBase);
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

/** Throws RangeError unless `duplicates` is a mode, a function or absent (an adapter's option). */
export function checkDuplicates(duplicates: unknown): void {
  if (duplicates === undefined || duplicates === null || typeof duplicates === "function") return;
  if (!DUPLICATE_MODES.includes(duplicates as DuplicateMode)) {
    throw new RangeError(`duplicates must be "wait", "reject" or a function, not ${String(duplicates)}`);
  }
}

/**
 * The bytes of a readable stream (a request body), or null once they pass `limit` (the
 * stream is then left paused). Rejects when the stream fails or closes before its end.
 * Events rather than `for await`: a request's body is read on every keyed request.
 */
export function readStream(stream: NodeJS.ReadableStream, limit: number): Promise<Buffer | null> {
  const readable = stream as NodeJS.ReadableStream & { readableEnded?: boolean };
  if (readable.readableEnded) return Promise.resolve(Buffer.alloc(0));
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const stop = () => {
      stream.off("data", onData);
      stream.off("end", onEnd);
      stream.off("error", onError);
      stream.off("close", onClose);
    };
    const onData = (chunk: Buffer | string) => {
      const bytes = typeof chunk === "string" ? Buffer.from(chunk, "utf8") : chunk;
      size += bytes.length;
      if (size > limit) {
        stop();
        stream.pause();
        resolve(null);
        return;
      }
      chunks.push(bytes);
    };
    const onEnd = () => {
      stop();
      resolve(chunks.length === 1 ? chunks[0] : Buffer.concat(chunks, size));
    };
    const onError = (error: Error) => {
      stop();
      reject(error);
    };
    const onClose = () => onError(new Error("the request closed before its body ended"));
    stream.on("data", onData);
    stream.on("end", onEnd);
    stream.on("error", onError);
    stream.on("close", onClose);
  });
}

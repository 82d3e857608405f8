/**
 * Express-style middleware: Idempotency-Key semantics for the routes after it.
 *
 *     app.use(idempotency({ pool, client: new Client(), principal: (req) => userOf(req) }));
 *     app.post("/orders", async (req, res) => {
 *       const { db } = req.idempotency;                 // in the transaction that holds the key
 *       const order = JSON.parse(req.body.toString());  // req.body: the raw body (Buffer)
 *       ...
 *       res.status(201).json(...);
 *     });
 *
 * For each request with a principal the middleware reads the body, takes a
 * connection from the pool, runs the transactional protocol around the rest of
 * the chain (next()), captures what the route writes, and sends it once the key
 * is settled (or answers replays, 400, 409 and 422 itself). A route that writes
 * pieces (res.write, a piped stream) streams: the pieces go out as written, inside
 * the transaction, and the key is completed when the route ends the response (the
 * response's end goes out after the commit); up to maxStreamBytes the pieces are
 * kept and replayed as the same chunks, past it a retry gets 409 response-not-kept.
 * With `router` (a Router, under Citus) instead of `pool`, the connection comes from
 * the node that holds the principal's shard: the whole request runs there. When a
 * statement there answers that the shard is not on that node (isStalePlacement), the
 * principal's placement is reported (dropped); when that statement is the key's begin,
 * the request runs once more on the node looked up again (the route had not run).
 * A database fault (no connection, a backend terminated or cancelled, a server shut
 * down, a commit whose outcome is unknown) is answered 503 database-unavailable with
 * Retry-After (databaseFaultResponse), also when the route had turned it into an
 * answer that is not stored (its own 500); the connection is then discarded.
 * Written against node's http.ServerResponse, so it needs no import of express;
 * works with Express 4 and 5 and with plain `(req, res, next)` chains.
 */

import type { IncomingMessage, ServerResponse } from "http";
import type { Pool, PoolClient } from "pg";

import type { Db, Request, RequestContext } from "./common";
import { isDatabaseFault, watchConnection, type ConnectionWatch } from "./fault";
import { readStream } from "./adapter";
import {
  Response,
  StreamCapture,
  checkDuplicates,
  checkMaxStreamBytes,
  databaseFaultResponse,
  httpDate,
  type Headers,
} from "./http";
import { DEFAULT_MAX_STREAM_BYTES, EXPIRES_HEADER, type DuplicateMode } from "./protocol_gen";
import { isStalePlacement, type Router } from "./router";
import type { Client } from "./transactional";

declare global {
  // eslint-disable-next-line @typescript-eslint/no-namespace
  namespace Express {
    /** What the middleware adds to Express's request (typed for TypeScript users of Express). */
    interface Request {
      /** Set by the middleware for the requests it handles. */
      idempotency?: RequestContext;
      /** The raw request body, as fingerprinted. */
      rawBody?: Buffer;
    }
  }
}

/** The request object the middleware sees (an Express request is one). */
export type MiddlewareRequest = IncomingMessage & {
  body?: unknown;
  rawBody?: Buffer;
  idempotency?: RequestContext;
  originalUrl?: string;
  path?: string;
};

/** The next() of a middleware chain. */
export type Next = (error?: unknown) => void;

/** Settings of the middleware. */
export interface MiddlewareOptions {
  /** A node-pg Pool; each handled request takes one connection for its duration. */
  pool?: Pick<Pool, "connect">;
  /**
   * Instead of `pool`: a Router (Citus), whose connection for the request's principal
   * (the node that holds its shard) carries the whole request, the route's writes included.
   * A stale placement is reported to it (reportStalePlacement); a begin refused for one
   * is run once more on a new connection.
   */
  router?: Pick<Router, "connect" | "reportStalePlacement">;
  /** The protocol client (its options: kept headers, ttl, wait, problem URIs). */
  client: Client;
  /**
   * The authenticated principal, or null: such requests pass straight to the
   * next handler, which must refuse unauthenticated writes itself.
   */
  principal: (req: MiddlewareRequest) => string | null | undefined;
  /** Which requests the middleware handles (default: all). */
  applies?: (req: MiddlewareRequest) => boolean;
  /** The path that is fingerprinted (default: the URL path without the query string). */
  path?: (req: MiddlewareRequest) => string;
  /** Body size limit in bytes (default 1 MiB); a larger body is answered 413. */
  limit?: number;
  /**
   * "wait" (default: a duplicate of a running request waits for it, then replays)
   * or "reject" (409 with Retry-After at once), or a function of the request
   * returning either (null: the client's option), to choose per route.
   */
  duplicates?: DuplicateMode | ((req: MiddlewareRequest) => DuplicateMode | null | undefined);
  /**
   * The largest streamed response kept for replay, in bytes (default 1048576). A route
   * that calls res.write() (or pipes a stream into res) streams: its pieces go out as
   * written and are captured; past this size the stream goes on but is not kept, and a
   * retry gets 409 response-not-kept.
   */
  maxStreamBytes?: number;
}

function pathOf(req: MiddlewareRequest): string {
  const url = req.originalUrl ?? req.url ?? "/";
  const end = url.indexOf("?");
  return end < 0 ? url : url.slice(0, end);
}

async function readBody(req: MiddlewareRequest, limit: number): Promise<Buffer | null> {
  if (Buffer.isBuffer(req.body)) return req.body; // express.raw() ran first
  if (req.rawBody) return req.rawBody;
  if ((req as { _body?: boolean })._body === true) {
    // A body parser (express.json, urlencoded) consumed the stream: the bytes are gone.
    throw new Error("pg-idempotency: the middleware needs the raw body; put it before body parsers or use express.raw()");
  }
  return readStream(req, limit);
}

/** What capture() hands back: the answer, and whether it went out as a stream. */
interface Captured {
  /** Resolves when the route ends the response. */
  done: Promise<Response>;
  /** Puts res's own write/end/writeHead back. */
  restore: () => void;
  /** True once the route wrote a piece: the status, headers and pieces went out as it wrote. */
  streaming: () => boolean;
}

/**
 * Captures what the rest of the chain writes to `res` until it ends the response.
 * res.end(body) alone is one answer, sent once the key is settled; a res.write()
 * (a route that writes pieces, a piped stream) is a stream: `onStream` runs, then the
 * status, the headers and every piece go out as written (chunked), captured up to
 * maxBytes, and the response's end is left to the middleware (after the commit).
 */
function capture(res: ServerResponse, maxBytes: number, onStream: (status: number) => void): Captured {
  const original = { write: res.write, end: res.end, writeHead: res.writeHead };
  const chunks: Buffer[] = [];
  const stream = new StreamCapture(maxBytes);
  let streaming = false;
  const toBuffer = (chunk: unknown, encoding?: unknown): Buffer =>
    Buffer.isBuffer(chunk)
      ? chunk
      : chunk instanceof Uint8Array
        ? Buffer.from(chunk)
        : Buffer.from(String(chunk), typeof encoding === "string" ? (encoding as BufferEncoding) : "utf8");
  let resolve!: (response: Response) => void;
  let reject!: (error: Error) => void;
  const done = new Promise<Response>((yes, no) => {
    resolve = yes;
    reject = no;
  });
  let ended = false;
  // The client went away mid-stream: what the route did is rolled back, nothing kept.
  const gone = () => {
    if (!ended) {
      ended = true;
      reject(new Error("the client went away before the stream ended"));
    }
  };
  const self = res as unknown as Record<string, unknown>;
  self.writeHead = function (status: number, ...rest: unknown[]) {
    res.statusCode = status;
    let headers = rest[rest.length - 1];
    if (typeof rest[0] === "string") res.statusMessage = rest[0];
    if (Array.isArray(headers)) {
      for (let i = 0; i + 1 < headers.length; i += 2) res.setHeader(String(headers[i]), String(headers[i + 1]));
    } else if (headers && typeof headers === "object") {
      for (const [name, value] of Object.entries(headers)) {
        if (value !== undefined) res.setHeader(name, value as string | string[]);
      }
    }
    headers = undefined;
    return res;
  };
  const headersOf = (): Headers => {
    const headers: Headers = [];
    for (const name of rawHeaderNames(res)) {
      const value = res.getHeader(name);
      if (value === undefined) continue;
      for (const v of Array.isArray(value) ? value : [value]) headers.push([name, String(v)]);
    }
    return headers;
  };
  // A piece of a stream: sent now (an empty one would end a chunked body) and captured.
  let streamStatus = 200; // the status that went out with the first piece
  const piece = (data: Buffer, cb?: unknown): boolean => {
    if (!streaming) {
      streaming = true;
      if (res.destroyed) gone();
      else res.once("close", gone); // only a stream needs it: a whole answer commits anyway
      streamStatus = res.statusCode;
      onStream(streamStatus);
      // node's write() sends the head through res.writeHead (_implicitHeader): the real one now.
      self.writeHead = original.writeHead;
    }
    stream.add(data);
    if (data.length === 0) {
      if (typeof cb === "function") process.nextTick(cb as () => void);
      return true;
    }
    return (original.write as (d: Buffer, c?: unknown) => boolean).call(res, data, cb);
  };
  self.write = function (chunk: unknown, encoding?: unknown, callback?: unknown) {
    const cb = typeof encoding === "function" ? encoding : callback;
    const data = chunk === undefined || chunk === null ? Buffer.alloc(0) : toBuffer(chunk, encoding);
    if (ended) return false;
    return piece(data, cb);
  };
  self.end = function (chunk?: unknown, encoding?: unknown, callback?: unknown) {
    if (typeof chunk === "function") {
      callback = chunk;
      chunk = undefined;
    }
    const data = chunk !== undefined && chunk !== null ? toBuffer(chunk, encoding) : null;
    const cb = typeof encoding === "function" ? encoding : callback;
    if (!ended) {
      ended = true;
      if (streaming) {
        if (data !== null) piece(data); // the last piece; the response ends after the commit
        resolve(stream.response(streamStatus, headersOf()));
      } else {
        if (data !== null) chunks.push(data);
        resolve(new Response(res.statusCode, headersOf(), Buffer.concat(chunks)));
      }
    }
    if (typeof cb === "function") res.once("finish", cb as () => void);
    return res;
  };
  const restore = () => {
    self.write = original.write;
    self.end = original.end;
    self.writeHead = original.writeHead;
  };
  return { done, restore, streaming: () => streaming };
}

function rawHeaderNames(res: ServerResponse): string[] {
  const raw = (res as unknown as { getRawHeaderNames?: () => string[] }).getRawHeaderNames;
  return raw ? raw.call(res) : res.getHeaderNames();
}

/** Sends a Response on `res`, replacing whatever headers the route had set. */
function send(res: ServerResponse, response: Response): void {
  // Headers set before the chain reached the route (X-Powered-By, CORS) stay.
  for (const [name] of response.headers) res.removeHeader(name);
  for (const [name, value] of response.headers) {
    const previous = res.getHeader(name); // a repeated name (Set-Cookie, Link): one list
    if (previous === undefined) res.setHeader(name, value);
    else res.setHeader(name, [...(Array.isArray(previous) ? previous : [String(previous)]), value]);
  }
  res.statusCode = response.status;
  if (response.chunks !== null) {
    // A stored stream: the same chunks again, chunked.
    res.removeHeader("Content-Length");
    for (const piece of response.pieces()) res.write(piece);
    res.end();
    return;
  }
  res.setHeader("Content-Length", String(response.body.length));
  res.end(response.body);
}

/**
 * Sends the route's own answer: its status and headers are on `res` already, the
 * protocol added at most the key's expiry.
 */
function sendOwn(res: ServerResponse, response: Response): void {
  const expires = response.header(EXPIRES_HEADER);
  if (expires !== undefined) res.setHeader(EXPIRES_HEADER, expires);
  res.setHeader("Content-Length", String(response.body.length));
  res.end(response.body);
}

/**
 * The middleware. The route finds the connection, already inside the transaction
 * that holds the key, in `req.idempotency.db`; it must do its writes there and
 * neither commit nor roll back. It may set `oneTimeSecret` and `resourceId` on
 * `req.idempotency`. `req.body` (and `req.rawBody`) is the raw body as a Buffer.
 *
 * The rest of the chain runs once per request: Express cannot run it again, so
 * a serialization failure or deadlock is not retried here (it goes to next(err));
 * use Client.handle in the route for retries. The one exception: with `router`, a
 * begin refused for a stale placement (the route has not run) is run once more.
 */
export function idempotency(options: MiddlewareOptions): (req: MiddlewareRequest, res: ServerResponse, next: Next) => void {
  const limit = options.limit ?? 1024 * 1024;
  const maxStreamBytes = options.maxStreamBytes ?? DEFAULT_MAX_STREAM_BYTES;
  checkMaxStreamBytes(maxStreamBytes);
  checkMaxStreamBytes(limit, "limit");
  checkDuplicates(options.duplicates);
  const { pool, router } = options;
  if ((pool === undefined) === (router === undefined)) {
    throw new TypeError("idempotency() needs either pool or router");
  }
  if (!options.client || typeof options.client.handle !== "function") throw new TypeError("idempotency() needs a client");
  if (typeof options.principal !== "function") throw new TypeError("principal must be a function");
  const connect = async (principal: string): Promise<PoolClient> =>
    router !== undefined
      ? (await router.connect(principal)).client
      : ((await (pool as Pick<Pool, "connect">).connect()) as PoolClient);
  return (req, res, next) => {
    const principal = !options.applies || options.applies(req) ? options.principal(req) : null;
    if (principal === null || principal === undefined) {
      next();
      return;
    }
    void (async () => {
      let conn: PoolClient | null = null;
      let watch: ConnectionWatch | null = null;
      let restore: (() => void) | null = null;
      let streamed = () => false;
      let routeAnswer: Response | null = null;
      let broken = false;
      const client = options.client;
      const fault = () =>
        databaseFaultResponse(client.options.retryAfter, client.options.problemTypeBase);
      try {
        const body = await readBody(req, limit);
        if (body === null) {
          res.statusCode = 413;
          res.setHeader("Connection", "close");
          res.end();
          return;
        }
        req.body = body;
        req.rawBody = body;
        const header = req.headers["idempotency-key"];
        const request: Request = {
          principal,
          key: Array.isArray(header) ? header[0] : header,
          method: req.method ?? "GET",
          path: options.path ? options.path(req) : pathOf(req),
          body: body.length > 0 ? body : null,
          duplicates: typeof options.duplicates === "function" ? options.duplicates(req) : options.duplicates,
        };
        const handler = async (db: Db, expiresEpoch?: string | null): Promise<Response> => {
          if (restore !== null) throw new Error("the middleware cannot run the route twice");
          const context: RequestContext = { db, request, oneTimeSecret: false, resourceId: null };
          req.idempotency = context;
          const captured = capture(res, maxStreamBytes, (status) => {
            // The key's expiry goes with a stream that will be kept (a final 2xx/3xx); the
            // final-status table was read before begin(), so the check needs no query.
            if (status < 400 && expiresEpoch != null && client["storage"].isFinal(status)) {
              res.setHeader(EXPIRES_HEADER, httpDate(Number(expiresEpoch)));
            }
          });
          restore = captured.restore;
          streamed = captured.streaming;
          // The route's errors reach Express's error handlers, whose answer (a 500)
          // is captured like any other: not final, rolled back, not stored.
          next();
          const answer = await captured.done;
          answer.oneTimeSecret = context.oneTimeSecret;
          answer.resourceId = context.resourceId;
          routeAnswer = answer;
          return answer;
        };
        let response: Response;
        for (let attempt = 1; ; attempt++) {
          conn = await connect(principal);
          watch = watchConnection(conn);
          let stale = false;
          // A query that answers the shard is not on this node: the placement is reported.
          if (router !== undefined) watch.onQueryError = (error) => (stale ||= isStalePlacement(error));
          try {
            response = await client.handle(conn, request, handler);
            break;
          } catch (error) {
            // Refused before the route ran (the key's begin): rolled back, nothing written.
            if (!stale || restore !== null || attempt > 1 || !isStalePlacement(error)) throw error;
          } finally {
            watch.onQueryError = null;
            if (stale) (router as Pick<Router, "reportStalePlacement">).reportStalePlacement(principal);
          }
          watch.stop();
          watch = null;
          conn.release(); // and once more, on the connection for the placement looked up again
          conn = null;
        }
        const faulted = (watch as ConnectionWatch | null)?.faulted() ?? false;
        if (faulted && !streamed() && !client["storage"].isFinal(response.status)) {
          // The database failed under the route, which answered for itself (its own 500):
          // nothing was kept, the fault answer says to retry with the same key.
          response = fault();
        }
        if (restore !== null) (restore as () => void)();
        restore = null;
        if (streamed()) res.end(); // streamed and committed: the response ends now
        else if (response === routeAnswer) sendOwn(res, response);
        else send(res, response);
      } catch (error) {
        if (restore !== null) (restore as () => void)();
        if (restore !== null && !res.headersSent) {
          for (const name of res.getHeaderNames()) res.removeHeader(name); // the route's, not sent
        }
        const faulted = isDatabaseFault(error) || (watch !== null && watch.faulted());
        broken = true; // never back to the pool after an error of the request: it may be dead
        // A stream cut short: the client never sees it end as if it had worked.
        if (res.headersSent) res.destroy();
        else if (faulted) send(res, fault()); // in doubt or rolled back: a retry is safe
        else next(error);
      } finally {
        if (watch !== null) {
          broken ||= watch.faulted() || watch.dead();
          watch.stop();
        }
        if (conn !== null) conn.release(broken ? true : undefined);
      }
    })();
  };
}

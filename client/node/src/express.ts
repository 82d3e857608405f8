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
 * is settled (or answers replays, 400, 409 and 422 itself). Written against
 * node's http.ServerResponse, so it needs no import of express; works with
 * Express 4 and 5 and with plain `(req, res, next)` chains.
 */

import type { IncomingMessage, ServerResponse } from "http";
import type { Pool, PoolClient } from "pg";

import { sqlstate, type Db, type Request } from "./common";
import { Response, type DuplicateMode, type Headers } from "./http";
import type { Client } from "./transactional";

/** What the middleware hands the route in `req.idempotency`. */
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
  pool: Pick<Pool, "connect">;
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
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > limit) return null;
    chunks.push(chunk);
  }
  return Buffer.concat(chunks);
}

/** Captures what the rest of the chain writes to `res` until it ends the response. */
function capture(res: ServerResponse): { done: Promise<Response>; restore: () => void } {
  const original = { write: res.write, end: res.end, writeHead: res.writeHead };
  const chunks: Buffer[] = [];
  const toBuffer = (chunk: unknown, encoding?: unknown): Buffer =>
    Buffer.isBuffer(chunk)
      ? chunk
      : chunk instanceof Uint8Array
        ? Buffer.from(chunk)
        : Buffer.from(String(chunk), typeof encoding === "string" ? (encoding as BufferEncoding) : "utf8");
  let resolve!: (response: Response) => void;
  const done = new Promise<Response>((r) => (resolve = r));
  let ended = false;
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
  self.write = function (chunk: unknown, encoding?: unknown, callback?: unknown) {
    if (chunk !== undefined && chunk !== null) chunks.push(toBuffer(chunk, encoding));
    const cb = typeof encoding === "function" ? encoding : callback;
    if (typeof cb === "function") process.nextTick(cb as () => void);
    return true;
  };
  self.end = function (chunk?: unknown, encoding?: unknown, callback?: unknown) {
    if (typeof chunk === "function") {
      callback = chunk;
      chunk = undefined;
    }
    if (chunk !== undefined && chunk !== null) chunks.push(toBuffer(chunk, encoding));
    const cb = typeof encoding === "function" ? encoding : callback;
    if (!ended) {
      ended = true;
      const headers: Headers = [];
      for (const name of rawHeaderNames(res)) {
        const value = res.getHeader(name);
        if (value === undefined) continue;
        for (const v of Array.isArray(value) ? value : [value]) headers.push([name, String(v)]);
      }
      resolve(new Response(res.statusCode, headers, Buffer.concat(chunks)));
    }
    if (typeof cb === "function") res.once("finish", cb as () => void);
    return res;
  };
  const restore = () => {
    self.write = original.write;
    self.end = original.end;
    self.writeHead = original.writeHead;
  };
  return { done, restore };
}

function rawHeaderNames(res: ServerResponse): string[] {
  const raw = (res as unknown as { getRawHeaderNames?: () => string[] }).getRawHeaderNames;
  return raw ? raw.call(res) : res.getHeaderNames();
}

/** Sends a Response on `res`, replacing whatever headers the route had set. */
function send(res: ServerResponse, response: Response): void {
  for (const name of res.getHeaderNames()) {
    // Headers set before the chain reached the route (X-Powered-By, CORS) stay.
    if (response.header(name) !== undefined) res.removeHeader(name);
  }
  const grouped = new Map<string, string[]>();
  for (const [name, value] of response.headers) {
    const key = [...grouped.keys()].find((k) => k.toLowerCase() === name.toLowerCase()) ?? name;
    grouped.set(key, [...(grouped.get(key) ?? []), value]);
  }
  for (const [name, values] of grouped) res.setHeader(name, values.length === 1 ? values[0] : values);
  res.setHeader("Content-Length", String(response.body.length));
  res.statusCode = response.status;
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
 * use Client.handle in the route for retries.
 */
export function idempotency(options: MiddlewareOptions): (req: MiddlewareRequest, res: ServerResponse, next: Next) => void {
  const limit = options.limit ?? 1024 * 1024;
  return (req, res, next) => {
    const principal = !options.applies || options.applies(req) ? options.principal(req) : null;
    if (principal === null || principal === undefined) {
      next();
      return;
    }
    void (async () => {
      let conn: PoolClient | null = null;
      let restore: (() => void) | null = null;
      let broken = false;
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
        conn = (await options.pool.connect()) as PoolClient;
        const client = options.client;
        const response = await client.handle(conn, request, async (db) => {
          if (restore !== null) throw new Error("the middleware cannot run the route twice");
          const context: RequestContext = { db, request, oneTimeSecret: false, resourceId: null };
          req.idempotency = context;
          const captured = capture(res);
          restore = captured.restore;
          // The route's errors reach Express's error handlers, whose answer (a 500)
          // is captured like any other: not final, rolled back, not stored.
          next();
          const answer = await captured.done;
          answer.oneTimeSecret = context.oneTimeSecret;
          answer.resourceId = context.resourceId;
          return answer;
        });
        if (restore !== null) (restore as () => void)();
        restore = null;
        send(res, response);
      } catch (error) {
        if (restore !== null) {
          (restore as () => void)();
          for (const name of res.getHeaderNames()) res.removeHeader(name); // the route's, not sent
        }
        broken = sqlstate(error) === undefined;
        if (!res.headersSent) next(error);
      } finally {
        if (conn !== null) conn.release(broken ? true : undefined);
      }
    })();
  };
}

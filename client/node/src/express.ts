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
 * For each request with a principal the middleware reads the body and runs the rest
 * of the chain (next()) through the request runner (adapter.ts: a connection of the
 * pool or the router, the protocol, the database fault's 503), captures what the
 * route writes, and sends it once the key is settled (or the extension's answer to a
 * replay, 409, 410 or 422). A route that writes pieces (res.write, a piped stream)
 * streams: the pieces go out as written, inside the transaction, and the key is
 * completed when the route ends the response (the response's end goes out after the
 * commit); up to maxStreamBytes the pieces are kept and replayed as the same chunks,
 * past it a retry gets 409 response-not-kept. Written against node's
 * http.ServerResponse, so it needs no import of express; works with Express 4 and 5
 * and with plain `(req, res, next)` chains.
 */

import type { IncomingMessage, ServerResponse } from "http";

import { Adapter, headerList, putHeaders, readStream, type AdapterOptions } from "./adapter";
import type { RequestContext } from "./common";
import { Response, StreamCapture, toBuffer } from "./http";
import { EXPIRES_HEADER, KEY_HEADER } from "./protocol_gen";

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

/** Settings of the middleware (adapter.ts has each member's meaning). */
export type MiddlewareOptions = AdapterOptions<MiddlewareRequest>;

// Not async: a body already read is awaited as it is, without a promise of its own.
function readBody(req: MiddlewareRequest, limit: number): Buffer | Promise<Buffer | null> {
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
 * (a route that writes pieces, a piped stream) is a stream: `startStream` gives its
 * capture, then the status, the headers and every piece go out as written (chunked),
 * captured, and the response's end is left to the middleware (after the commit).
 */
function capture(res: ServerResponse, startStream: (status: number) => StreamCapture): Captured {
  const original = { write: res.write, end: res.end, writeHead: res.writeHead };
  let stream: StreamCapture | null = null;
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
    const headers = rest[rest.length - 1];
    if (typeof rest[0] === "string") res.statusMessage = rest[0];
    if (Array.isArray(headers)) {
      for (let i = 0; i + 1 < headers.length; i += 2) res.setHeader(String(headers[i]), String(headers[i + 1]));
    } else if (headers && typeof headers === "object") {
      for (const [name, value] of Object.entries(headers)) {
        if (value !== undefined) res.setHeader(name, value as string | string[]);
      }
    }
    return res;
  };
  const headersOf = () => headerList(rawHeaderNames(res).map((name): [string, unknown] => [name, res.getHeader(name)]));
  // A piece of a stream: sent now (an empty one would end a chunked body) and captured.
  let streamStatus = 200; // the status that went out with the first piece
  const piece = (data: Buffer, cb?: unknown): boolean => {
    if (stream === null) {
      if (res.destroyed) gone();
      else res.once("close", gone); // only a stream needs it: a whole answer commits anyway
      streamStatus = res.statusCode;
      stream = startStream(streamStatus);
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
      if (stream !== null) {
        if (data !== null) piece(data); // the last piece; the response ends after the commit
        resolve(stream.response(streamStatus, headersOf()));
      } else {
        resolve(new Response(res.statusCode, headersOf(), data ?? Buffer.alloc(0)));
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
  return { done, restore, streaming: () => stream !== null };
}

function rawHeaderNames(res: ServerResponse): string[] {
  const raw = (res as unknown as { getRawHeaderNames?: () => string[] }).getRawHeaderNames;
  return raw ? raw.call(res) : res.getHeaderNames();
}

/** Sends a Response on `res`, replacing whatever headers the route had set. */
function send(res: ServerResponse, response: Response): void {
  putHeaders(response, (name) => res.removeHeader(name), (name, value) => res.setHeader(name, value));
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
 * begin refused for a stale placement (the route has not run) is run once more. A
 * database fault is answered 503 database-unavailable with Retry-After, also when the
 * route had answered it itself (its own 500); the connection is then discarded.
 */
export function idempotency(options: MiddlewareOptions): (req: MiddlewareRequest, res: ServerResponse, next: Next) => void {
  const adapter = new Adapter(options, "idempotency()");
  return (req, res, next) => {
    const principal = adapter.principal(req);
    if (principal === null) {
      next();
      return;
    }
    let restore: (() => void) | null = null;
    let streamed = () => false;
    /**
     * The route's answer is not what is sent: its own headers go (unless sent), a stream
     * under way is cut (never seen to end as if it had worked), else `answer` runs.
     */
    const cut = (answer: () => void) => {
      if (restore !== null) {
        restore();
        restore = null;
        if (!res.headersSent) for (const name of res.getHeaderNames()) res.removeHeader(name);
      }
      if (res.headersSent) res.destroy();
      else answer();
    };
    void (async () => {
      try {
        const body = await readBody(req, adapter.limit);
        if (body === null) {
          res.statusCode = 413;
          res.setHeader("Connection", "close");
          res.end();
          return;
        }
        req.body = body;
        req.rawBody = body;
        const url = req.originalUrl ?? req.url ?? "/";
        const key = req.headers[KEY_HEADER.toLowerCase()];
        const request = adapter.request(req, principal, key, req.method ?? "GET", url, body);
        let routeAnswer: Response | null = null;
        const ran = await adapter.run(request, async (context, expiresEpoch) => {
          req.idempotency = context;
          const captured = capture(res, (status) => adapter.startStream(status, expiresEpoch, (n, v) => res.setHeader(n, v)));
          restore = captured.restore;
          streamed = captured.streaming;
          // The route's errors reach Express's error handlers, whose answer (a 500)
          // is captured like any other: not final, rolled back, not stored.
          next();
          routeAnswer = await captured.done;
          return routeAnswer;
        });
        // In doubt or rolled back: a retry is safe.
        if (ran.failed) return cut(() => send(res, ran.response));
        (restore as (() => void) | null)?.();
        restore = null;
        if (streamed()) res.end(); // streamed and committed: the response ends now
        else if (ran.response === routeAnswer) sendOwn(res, ran.response);
        else send(res, ran.response);
      } catch (error) {
        cut(() => next(error));
      }
    })();
  };
}

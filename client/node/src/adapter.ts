/**
 * The request runner under the framework adapters (express.ts, fastify.ts): their
 * options, the request body read once, and the run of one keyed request on a
 * connection of the pool or the router: connect, the protocol (Client.handle) around
 * the route, a second try on the node looked up again when the key's begin met a stale
 * placement, the database fault's answer, the connection back (discarded when it may
 * be dead). The adapters add their framework's glue: hooks, the capture of what the
 * route writes, sending.
 */

import type { Pool, PoolClient } from "pg";

import type { Db, Request, RequestContext } from "./common";
import { isDatabaseFault, watchConnection, watchPool } from "./fault";
import { Response, StreamCapture, checkDuplicates, checkMaxStreamBytes, databaseFaultResponse, httpDate, type Headers } from "./http";
import { DEFAULT_MAX_STREAM_BYTES, EXPIRES_HEADER, type DuplicateMode } from "./protocol_gen";
import { isStalePlacement, type Router } from "./router";
import type { Client } from "./transactional";

/** Settings of the Express middleware and of the Fastify plugin; `R` is the framework's request. */
export interface AdapterOptions<R> {
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
   * The authenticated principal, or null: such requests pass on untouched, and the
   * route must refuse unauthenticated writes itself.
   */
  principal: (req: R) => string | null | undefined;
  /** Which requests are handled (default: all). */
  applies?: (req: R) => boolean;
  /** The path that is fingerprinted (default: the URL path without the query string). */
  path?: (req: R) => string;
  /** Body size limit in bytes (default 1 MiB); a larger body is answered 413. */
  limit?: number;
  /**
   * "wait" (default: a duplicate of a running request waits for it, then replays)
   * or "reject" (409 with Retry-After at once), or a function of the request
   * returning either (null: the client's option), to choose per route.
   */
  duplicates?: DuplicateMode | ((req: R) => DuplicateMode | null | undefined);
  /**
   * The largest streamed response kept for replay, in bytes (default 1048576). A route
   * that streams (res.write, a piped stream, a stream payload) sends its pieces as they
   * come, captured; past this size the stream goes on but is not kept, and a retry gets
   * 409 response-not-kept.
   */
  maxStreamBytes?: number;
}

/** The route, run inside the key's transaction: it answers with what it wrote. */
export type Route = (context: RequestContext, expiresEpoch: string | null | undefined) => Promise<Response>;

/** What a run answers. */
export interface Ran {
  /** The answer to send: the route's, the extension's, or the database fault's. */
  response: Response;
  /**
   * True when the request failed with a database fault (rolled back or in doubt) and
   * `response` is the fault's answer; a stream already under way is cut instead.
   */
  failed: boolean;
}

/** The URL's path, without the query string. */
export function pathOf(url: string): string {
  const end = url.indexOf("?");
  return end < 0 ? url : url.slice(0, end);
}

/** Header fields as a list from (name, value) pairs of a framework's reply, a repeated header's values one by one. */
export function headerList(entries: Iterable<[string, unknown]>): Headers {
  const headers: Headers = [];
  for (const [name, value] of entries) {
    if (value === undefined) continue;
    for (const v of Array.isArray(value) ? value : [value]) headers.push([name, String(v)]);
  }
  return headers;
}

/**
 * Puts a Response's headers on a framework's reply: each of its names removed first
 * (headers set before the chain reached the route, X-Powered-By or CORS, stay), then
 * set once, a repeated name (Set-Cookie, Link) as one list under its last spelling.
 */
export function putHeaders(
  response: Response,
  remove: (name: string) => void,
  set: (name: string, value: string | string[]) => void,
): void {
  for (const [name] of response.headers) remove(name);
  const grouped = new Map<string, [string, string[]]>();
  for (const [name, value] of response.headers) {
    const values = grouped.get(name.toLowerCase())?.[1] ?? [];
    grouped.set(name.toLowerCase(), [name, [...values, value]]);
  }
  for (const [name, values] of grouped.values()) set(name, values.length === 1 ? values[0] : values);
}

/** An adapter's options, checked, with the defaults filled in, and the run of a request. */
export class Adapter<R> {
  /** The body size limit in bytes. */
  readonly limit: number;
  /** The largest streamed response kept, in bytes. */
  readonly maxStreamBytes: number;

  /** Checks `options`; `name` names the adapter in the errors. */
  constructor(readonly options: AdapterOptions<R>, name: string) {
    if ((options.pool === undefined) === (options.router === undefined)) {
      throw new TypeError(`${name} needs either pool or router`);
    }
    if (!options.client || typeof options.client.handle !== "function") throw new TypeError(`${name} needs a client`);
    if (typeof options.principal !== "function") throw new TypeError("principal must be a function");
    this.limit = options.limit ?? 1024 * 1024;
    this.maxStreamBytes = options.maxStreamBytes ?? DEFAULT_MAX_STREAM_BYTES;
    checkMaxStreamBytes(this.maxStreamBytes);
    checkMaxStreamBytes(this.limit, "limit");
    checkDuplicates(options.duplicates);
    if (options.pool !== undefined) watchPool(options.pool);
  }

  /** The principal of a request the adapter handles; null: the request passes on. */
  principal(req: R): string | null {
    const options = this.options;
    const principal = !options.applies || options.applies(req) ? options.principal(req) : null;
    return principal ?? null;
  }

  /** The request as the protocol sees it: its key header, method, URL and raw body. */
  request(req: R, principal: string, key: string | string[] | undefined, method: string, url: string, body: Buffer): Request {
    const duplicates = this.options.duplicates;
    return {
      principal,
      key: Array.isArray(key) ? key[0] : key,
      method,
      path: this.options.path ? this.options.path(req) : pathOf(url),
      body: body.length > 0 ? body : null,
      duplicates: typeof duplicates === "function" ? duplicates(req) : duplicates,
    };
  }

  /** The database fault's answer with the client's Retry-After and type base. */
  fault(): Response {
    const options = this.options.client.options;
    return databaseFaultResponse(options.retryAfter, options.problemTypeBase);
  }

  /**
   * The capture of a stream of this status that starts now. When the stream is committed
   * with the key (idempotency.http_storage; the table was read before begin(), so the
   * check needs no query), the key's expiry goes out with its head: `setHeader` gets it.
   */
  startStream(status: number, expiresEpoch: string | null | undefined, setHeader: (name: string, value: string) => void): StreamCapture {
    const known = expiresEpoch !== null && expiresEpoch !== undefined;
    if (known && this.options.client["storage"].of(status) === "committed_with_key") {
      setHeader(EXPIRES_HEADER, httpDate(Number(expiresEpoch)));
    }
    return new StreamCapture(this.maxStreamBytes);
  }

  /**
   * Runs `request` through the protocol on a connection of its own, `route` inside the
   * key's transaction (at most once), and gives the connection back. A database fault
   * is answered with fault() (also when the route had answered it itself with a status
   * that is not stored); any other error propagates. With a router, a begin refused for
   * a stale placement (the route has not run) runs once more on the node looked up again.
   */
  async run(request: Request, route: Route): Promise<Ran> {
    const { client, router } = this.options;
    let ran = false;
    let answer: Response | null = null;
    const handler = async (db: Db, expiresEpoch?: string | null): Promise<Response> => {
      if (ran) throw new Error("the route cannot run twice");
      ran = true;
      const context: RequestContext = { db, request, oneTimeSecret: false, resourceId: null };
      const response = await route(context, expiresEpoch);
      response.oneTimeSecret = context.oneTimeSecret;
      response.resourceId = context.resourceId;
      answer = response;
      return response;
    };
    for (let attempt = 1; ; attempt++) {
      let conn: PoolClient;
      try {
        conn = await this.connect(request.principal);
      } catch (error) {
        if (!isDatabaseFault(error)) throw error;
        return { response: this.fault(), failed: true };
      }
      const watch = watchConnection(conn);
      let stale = false;
      // A query that answers the shard is not on this node: the placement is reported.
      if (router !== undefined) watch.onQueryError = (error) => (stale ||= isStalePlacement(error));
      let broken = false;
      try {
        const response = await client.handle(conn, request, handler);
        const routed = answer as Response | null;
        const streamed = routed !== null && (routed.chunks !== null || routed.streamTooLarge);
        // The database failed under the route, which answered for itself (its own 500):
        // nothing was kept, the fault's answer says to retry with the same key.
        if (watch.faulted && !streamed && !client["storage"].isFinal(response.status)) {
          return { response: this.fault(), failed: false };
        }
        return { response, failed: false };
      } catch (error) {
        // Refused before the route ran (the key's begin): rolled back, nothing written.
        if (stale && !ran && attempt === 1 && isStalePlacement(error)) continue;
        broken = true; // never back to the pool after an error of the request: it may be dead
        if (isDatabaseFault(error) || watch.faulted) return { response: this.fault(), failed: true };
        throw error;
      } finally {
        watch.watching = false;
        watch.onQueryError = null;
        if (stale) router?.reportStalePlacement(request.principal);
        broken ||= watch.faulted || watch.dead;
        conn.release(broken ? true : undefined);
      }
    }
  }

  /** A connection for the principal's request: the router's, or the pool's. */
  private async connect(principal: string): Promise<PoolClient> {
    const { pool, router } = this.options;
    if (router !== undefined) return (await router.connect(principal)).client;
    return (await (pool as Pick<Pool, "connect">).connect()) as PoolClient;
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
      stream.off("data", onData).off("end", onEnd).off("error", onError).off("close", onClose);
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
    stream.on("data", onData).on("end", onEnd).on("error", onError).on("close", onClose);
  });
}

/**
 * Fastify (5) plugin: Idempotency-Key semantics for the routes of the instance it is
 * registered on, with the Express middleware's behaviour (express.ts).
 *
 *     const { idempotency } = require("pg-idempotency/fastify");
 *     await app.register(idempotency, { pool, client: new Client(), principal: (req) => userOf(req) });
 *     app.post("/orders", async (request, reply) => {
 *       const { db } = request.idempotency!;    // in the transaction that holds the key
 *       ...
 *       return reply.code(201).send({ ... });
 *     });
 *
 * Hooks, for each request with a principal: preParsing keeps the raw body
 * (request.rawBody, fingerprinted; Fastify's parsers still see it), preHandler takes a
 * connection and runs begin() (a replay, 400, 409 or 422 is answered there and the
 * route does not run), onSend hands the route's answer (the error handler's too) to the
 * protocol, which commits it with the key or rolls back, and sends what it returns. A
 * payload that is a stream goes out as it comes, captured up to maxStreamBytes, and
 * ends after the commit. A database fault is answered 503 database-unavailable with
 * Retry-After (databaseFaultResponse); the connection is then discarded.
 */

import { PassThrough, Readable } from "stream";

import type { FastifyPluginAsync, FastifyReply, FastifyRequest } from "fastify";
import fp from "fastify-plugin";
import type { Pool, PoolClient } from "pg";

import type { Request, RequestContext } from "./common";
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

declare module "fastify" {
  interface FastifyRequest {
    /** Set by the plugin for the requests it handles. */
    idempotency: RequestContext | null;
    /** The raw request body, as fingerprinted (null when the plugin does not handle the request). */
    rawBody: Buffer | null;
  }
}

/** Settings of the plugin. */
export interface FastifyIdempotencyOptions {
  /** A node-pg Pool; each handled request takes one connection for its duration. */
  pool?: Pick<Pool, "connect">;
  /**
   * Instead of `pool`: a Router (Citus), whose connection for the request's principal
   * carries the whole request; a stale placement is reported to it, and a begin refused
   * for one runs once more on a new connection (as the Express middleware's `router`).
   */
  router?: Pick<Router, "connect" | "reportStalePlacement">;
  /** The protocol client (its options: kept headers, ttl, wait, problem URIs). */
  client: Client;
  /** The authenticated principal, or null: such requests pass through untouched. */
  principal: (request: FastifyRequest) => string | null | undefined;
  /** Which requests the plugin handles (default: all). */
  applies?: (request: FastifyRequest) => boolean;
  /** The path that is fingerprinted (default: the URL path without the query string). */
  path?: (request: FastifyRequest) => string;
  /** Body size limit in bytes (default 1 MiB); a larger body is answered 413. */
  limit?: number;
  /** "wait" (default) or "reject" for a duplicate of a running request, or a function of the request. */
  duplicates?: DuplicateMode | ((request: FastifyRequest) => DuplicateMode | null | undefined);
  /** The largest streamed payload kept for replay, in bytes (default 1048576). */
  maxStreamBytes?: number;
}

/** One handled request, from preParsing to the end of its transaction. */
interface State {
  request: Request;
  conn: PoolClient | null;
  watch: ConnectionWatch | null;
  expiresEpoch: string | null | undefined;
  /** Hands the route's answer to the protocol (resolves the handler of Client.handle). */
  answer: ((response: Response) => void) | null;
  /** Ends the handler with an error: the transaction rolls back. */
  fail: (error: Error) => void;
  /** What Client.handle returns (the answer to send), once the route answered. */
  outcome: Promise<Response> | null;
  settled: boolean;
  /** A query answered that the principal's shard is not on the node (router only). */
  stale: boolean;
}

const states = new WeakMap<FastifyRequest, State>();

function pathOf(url: string): string {
  const end = url.indexOf("?");
  return end < 0 ? url : url.slice(0, end);
}

/** The reply's headers as a list (values of repeated headers one by one). */
function headersOf(reply: FastifyReply): Headers {
  const headers: Headers = [];
  for (const [name, value] of Object.entries(reply.getHeaders())) {
    if (value === undefined) continue;
    for (const v of Array.isArray(value) ? value : [value]) headers.push([name, String(v)]);
  }
  return headers;
}

/** Puts a Response on the reply; returns the payload to send. */
function apply(reply: FastifyReply, response: Response): Buffer | Readable {
  for (const [name] of response.headers) reply.removeHeader(name);
  const grouped = new Map<string, string[]>();
  for (const [name, value] of response.headers) {
    const key = name.toLowerCase();
    grouped.set(key, [...(grouped.get(key) ?? []), value]);
  }
  for (const [name, values] of grouped) reply.header(name, values.length === 1 ? values[0] : values);
  reply.code(response.status);
  if (response.chunks === null) return response.body;
  reply.removeHeader("content-length"); // a stored stream: the same chunks again, chunked
  return Readable.from(response.pieces());
}

function isStream(payload: unknown): payload is Readable {
  return payload !== null && typeof payload === "object" && typeof (payload as Readable).pipe === "function";
}

function toBuffer(chunk: unknown): Buffer {
  if (Buffer.isBuffer(chunk)) return chunk;
  if (chunk instanceof Uint8Array) return Buffer.from(chunk);
  return Buffer.from(String(chunk), "utf8");
}

const plugin: FastifyPluginAsync<FastifyIdempotencyOptions> = async (app, options) => {
  const { pool, router, client } = options;
  if ((pool === undefined) === (router === undefined)) {
    throw new TypeError("the idempotency plugin needs either pool or router");
  }
  const connect = async (principal: string): Promise<PoolClient> =>
    router !== undefined
      ? (await router.connect(principal)).client
      : ((await (pool as Pick<Pool, "connect">).connect()) as PoolClient);
  if (!client || typeof client.handle !== "function") throw new TypeError("the idempotency plugin needs a client");
  if (typeof options.principal !== "function") throw new TypeError("principal must be a function");
  const limit = options.limit ?? 1024 * 1024;
  const maxStreamBytes = options.maxStreamBytes ?? DEFAULT_MAX_STREAM_BYTES;
  checkMaxStreamBytes(maxStreamBytes);
  checkMaxStreamBytes(limit, "limit");
  checkDuplicates(options.duplicates);
  const final = client["storage"];
  const fault = () => databaseFaultResponse(client.options.retryAfter, client.options.problemTypeBase);

  app.decorateRequest("idempotency", null);
  if (!app.hasRequestDecorator("rawBody")) app.decorateRequest("rawBody", null);

  /** Gives the connection back (discarded when broken or the watch saw it fail). */
  const finish = (state: State, broken: boolean) => {
    if (state.stale) router?.reportStalePlacement(state.request.principal);
    state.stale = false;
    if (state.watch !== null) {
      broken ||= state.watch.faulted() || state.watch.dead();
      state.watch.stop();
      state.watch = null;
    }
    if (state.conn !== null) state.conn.release(broken ? true : undefined);
    state.conn = null;
  };

  /** The protocol's answer once the route's is in: fault handling, the connection back. */
  const settle = async (state: State): Promise<Response> => {
    let broken = false;
    try {
      const response = await (state.outcome as Promise<Response>);
      const faulted = state.watch?.faulted() ?? false;
      // The database failed under the route, which answered for itself (its own 500).
      return faulted && !final.isFinal(response.status) ? fault() : response;
    } catch (error) {
      broken = true;
      if (isDatabaseFault(error) || (state.watch?.faulted() ?? false)) return fault();
      throw error;
    } finally {
      finish(state, broken);
    }
  };

  app.addHook("preParsing", async (request, reply, payload) => {
    const principal = !options.applies || options.applies(request) ? options.principal(request) : null;
    if (principal === null || principal === undefined) return payload;
    const body = await readStream(payload as unknown as NodeJS.ReadableStream, limit);
    if (body === null) {
      throw Object.assign(new Error("the request body is larger than the limit"), { statusCode: 413 });
    }
    request.rawBody = body;
    const header = request.headers["idempotency-key"];
    const duplicates = typeof options.duplicates === "function" ? options.duplicates(request) : options.duplicates;
    const state: State = {
      request: {
        principal,
        key: Array.isArray(header) ? header[0] : header,
        method: request.method,
        path: options.path ? options.path(request) : pathOf(request.url),
        body: body.length > 0 ? body : null,
        duplicates,
      },
      conn: null,
      watch: null,
      expiresEpoch: null,
      answer: null,
      fail: () => undefined,
      outcome: null,
      settled: false,
      stale: false,
    };
    states.set(request, state);
    // The same bytes again for Fastify's content-type parsers.
    const again = Readable.from(body.length > 0 ? [body] : []) as Readable & { receivedEncodedLength?: number };
    again.receivedEncodedLength = body.length;
    return again;
  });

  app.addHook("preHandler", async (request, reply) => {
    const state = states.get(request);
    if (state === undefined) return;
    let ran = false;
    let early: Response | null = null;
    for (let attempt = 1; ; attempt++) {
      try {
        state.conn = await connect(state.request.principal);
      } catch (error) {
        state.settled = true;
        if (!isDatabaseFault(error)) throw error;
        return reply.send(apply(reply, fault()));
      }
      const watch = (state.watch = watchConnection(state.conn));
      // A query that answers the shard is not on this node: the placement is reported.
      if (router !== undefined) watch.onQueryError = (error) => (state.stale ||= isStalePlacement(error));
      let started!: () => void;
      const ready = new Promise<null>((resolve) => (started = () => resolve(null)));
      const routeAnswer = new Promise<Response>((resolve, reject) => {
        state.answer = resolve;
        state.fail = reject;
      });
      state.outcome = client.handle(state.conn, state.request, async (db, expiresEpoch) => {
        if (ran) throw new Error("the plugin cannot run the route twice");
        ran = true;
        const context: RequestContext = { db, request: state.request, oneTimeSecret: false, resourceId: null };
        request.idempotency = context;
        state.expiresEpoch = expiresEpoch;
        started();
        const answer = await routeAnswer;
        answer.oneTimeSecret = context.oneTimeSecret;
        answer.resourceId = context.resourceId;
        return answer;
      });
      state.outcome.catch(() => undefined); // awaited in onSend; never an unhandled rejection
      try {
        early = await Promise.race([ready, state.outcome]);
        break;
      } catch (error) {
        const faulted = isDatabaseFault(error) || watch.faulted();
        // A begin refused for a stale placement (the route has not run): once more, on
        // the node looked up again.
        const again = state.stale && !ran && attempt === 1 && isStalePlacement(error);
        finish(state, !again);
        if (again) continue;
        state.settled = true;
        if (!faulted) throw error;
        return reply.send(apply(reply, fault()));
      }
    }
    if (early === null) return; // begin said started: the route runs in the transaction
    state.settled = true; // a replay or a problem: answered here, the route does not run
    finish(state, false);
    return reply.send(apply(reply, early));
  });

  app.addHook("onSend", async (request, reply, payload) => {
    const state = states.get(request);
    if (state === undefined || state.answer === null || state.settled) return payload;
    state.settled = true;
    if (isStream(payload)) return stream(state, reply, payload);
    const body = payload === null || payload === undefined ? Buffer.alloc(0) : toBuffer(payload);
    state.answer(new Response(reply.statusCode, headersOf(reply), body));
    return apply(reply, await settle(state));
  });

  /** A streamed payload: each piece sent as it comes and captured; the end after the commit. */
  const stream = (state: State, reply: FastifyReply, payload: Readable): PassThrough => {
    const status = reply.statusCode;
    if (status < 400 && state.expiresEpoch != null && final.isFinal(status)) {
      reply.header(EXPIRES_HEADER, httpDate(Number(state.expiresEpoch)));
    }
    reply.removeHeader("content-length");
    const headers = headersOf(reply);
    const capture = new StreamCapture(maxStreamBytes);
    const out = new PassThrough();
    let ending = false;
    // The client went away: the loop below stops at its next piece (no wait on a drain).
    reply.raw.once("close", () => {
      if (!ending) out.destroy();
    });
    const room = () =>
      new Promise<void>((resolve) => {
        const done = () => {
          out.off("drain", done);
          out.off("close", done);
          resolve();
        };
        out.on("drain", done);
        out.on("close", done);
      });
    void (async () => {
      let broken = false;
      try {
        for await (const chunk of payload) {
          if (out.destroyed) break;
          const piece = toBuffer(chunk);
          if (piece.length === 0) continue; // an empty piece would end a chunked body
          capture.add(piece);
          if (!out.write(piece)) await room();
        }
        // The client went away mid-stream: what the route did is rolled back, nothing kept.
        if (out.destroyed) throw new Error("the client went away before the stream ended");
        (state.answer as (r: Response) => void)(capture.response(status, headers));
        await state.outcome;
        ending = true;
        out.end(); // committed: the response ends now
      } catch (error) {
        // Cut short (never seen to end as if it had worked); rolled back or in doubt.
        broken = true;
        state.fail(error as Error);
        await (state.outcome as Promise<Response>).catch(() => undefined);
        out.destroy();
      } finally {
        finish(state, broken);
      }
    })();
    return out;
  };

  // A request whose route never answered (the client went away, an error before onSend).
  app.addHook("onResponse", async (request) => {
    const state = states.get(request);
    if (state === undefined || state.settled || state.answer === null) return;
    state.settled = true;
    state.fail(new Error("the request ended before the route answered"));
    await settle(state).catch(() => undefined);
  });
};

/**
 * The plugin (wrapped with fastify-plugin, so its hooks and request decorators
 * apply to the instance it is registered on, not a child context). The route finds
 * the connection, already inside the transaction that holds the key, in
 * `request.idempotency.db`: it does its writes there and neither commits nor rolls
 * back; it may set `oneTimeSecret` and `resourceId` there. `request.rawBody` is the
 * raw body; Fastify's parsers fill `request.body` as usual.
 *
 * The route runs once per request: a serialization failure or deadlock is not
 * retried here (it goes to Fastify's error handler); use Client.handle in the route
 * for retries.
 */
export const idempotency = fp(plugin, { fastify: "5.x", name: "pg-idempotency" });

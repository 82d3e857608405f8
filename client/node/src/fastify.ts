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
 * (request.rawBody, fingerprinted; Fastify's parsers still see it), preHandler starts
 * the request runner (adapter.ts: a connection, begin; the extension's answer to a
 * replay, 409, 410 or 422 is sent there and the route does not run), onSend hands the
 * route's answer (the error handler's too) to the protocol, which commits it with the
 * key or rolls back, and sends what it returns. A payload that is a stream goes out as
 * it comes, captured up to maxStreamBytes, and ends after the commit.
 */

import { Readable, Transform, pipeline } from "stream";

import type { FastifyPluginAsync, FastifyReply, FastifyRequest } from "fastify";
import fp from "fastify-plugin";

import { Adapter, headerList, putHeaders, readStream, type AdapterOptions, type Ran } from "./adapter";
import type { Request, RequestContext } from "./common";
import { Response, toBuffer } from "./http";
import { KEY_HEADER } from "./protocol_gen";

declare module "fastify" {
  interface FastifyRequest {
    /** Set by the plugin for the requests it handles. */
    idempotency: RequestContext | null;
    /** The raw request body, as fingerprinted (null when the plugin does not handle the request). */
    rawBody: Buffer | null;
  }
}

/** Settings of the plugin (adapter.ts has each member's meaning). */
export type FastifyIdempotencyOptions = AdapterOptions<FastifyRequest>;

/** One handled request, from preParsing to the end of its transaction. */
interface State {
  request: Request;
  expiresEpoch: string | null | undefined;
  /** Hands the route's answer to the protocol (resolves the route of the runner). */
  answer: ((response: Response) => void) | null;
  /** Ends the route with an error: the transaction rolls back. */
  fail: (error: Error) => void;
  /** What the runner answers, once the route answered. */
  outcome: Promise<Ran> | null;
  settled: boolean;
}

const states = new WeakMap<FastifyRequest, State>();

/** Puts a Response on the reply; returns the payload to send. */
function apply(reply: FastifyReply, response: Response): Buffer | Readable {
  putHeaders(response, (name) => reply.removeHeader(name), (name, value) => reply.header(name, value));
  reply.code(response.status);
  if (response.chunks === null) return response.body;
  reply.removeHeader("content-length"); // a stored stream: the same chunks again, chunked
  return Readable.from(response.pieces());
}

function isStream(payload: unknown): payload is Readable {
  return payload !== null && typeof payload === "object" && typeof (payload as Readable).pipe === "function";
}

const plugin: FastifyPluginAsync<FastifyIdempotencyOptions> = async (app, options) => {
  const adapter = new Adapter(options, "the idempotency plugin");
  app.decorateRequest("idempotency", null);
  if (!app.hasRequestDecorator("rawBody")) app.decorateRequest("rawBody", null);

  app.addHook("preParsing", async (request, reply, payload) => {
    const principal = adapter.principal(request);
    if (principal === null) return payload;
    const body = await readStream(payload as unknown as NodeJS.ReadableStream, adapter.limit);
    if (body === null) {
      throw Object.assign(new Error("the request body is larger than the limit"), { statusCode: 413 });
    }
    request.rawBody = body;
    const key = request.headers[KEY_HEADER.toLowerCase()];
    states.set(request, {
      request: adapter.request(request, principal, key, request.method, request.url, body),
      expiresEpoch: null,
      answer: null,
      fail: () => undefined,
      outcome: null,
      settled: false,
    });
    // The same bytes again for Fastify's content-type parsers.
    const again = Readable.from(body.length > 0 ? [body] : []) as Readable & { receivedEncodedLength?: number };
    again.receivedEncodedLength = body.length;
    return again;
  });

  app.addHook("preHandler", async (request, reply) => {
    const state = states.get(request);
    if (state === undefined) return;
    let started!: () => void;
    const ready = new Promise<null>((resolve) => (started = () => resolve(null)));
    const routeAnswer = new Promise<Response>((resolve, reject) => {
      state.answer = resolve;
      state.fail = reject;
    });
    state.outcome = adapter.run(state.request, async (context, expiresEpoch) => {
      request.idempotency = context;
      state.expiresEpoch = expiresEpoch;
      started();
      return routeAnswer;
    });
    state.outcome.catch(() => undefined); // awaited in onSend; never an unhandled rejection
    let early: Ran | null;
    try {
      early = await Promise.race([ready, state.outcome]);
    } catch (error) {
      state.settled = true;
      throw error;
    }
    if (early === null) return; // begin said started: the route runs in the transaction
    state.settled = true; // the extension's answer or a fault's: the route does not run
    return reply.send(apply(reply, early.response));
  });

  app.addHook("onSend", async (request, reply, payload) => {
    const state = states.get(request);
    if (state === undefined || state.answer === null || state.settled) return payload;
    state.settled = true;
    if (isStream(payload)) return stream(state, reply, payload);
    const body = payload === null || payload === undefined ? Buffer.alloc(0) : toBuffer(payload);
    state.answer(new Response(reply.statusCode, headerList(Object.entries(reply.getHeaders())), body));
    return apply(reply, (await (state.outcome as Promise<Ran>)).response);
  });

  /**
   * A streamed payload: each piece sent as it comes (an empty one would end a chunked
   * body) and captured; the end after the commit. Cut short (the source failed, the
   * client went away and Fastify destroyed what it pipes, the commit failed), it is
   * rolled back or in doubt before the response is seen to fail, never seen to end as
   * if it had worked.
   */
  const stream = (state: State, reply: FastifyReply, payload: Readable): Transform => {
    const status = reply.statusCode;
    const capture = adapter.startStream(status, state.expiresEpoch, (name, value) => reply.header(name, value));
    reply.removeHeader("content-length");
    const headers = headerList(Object.entries(reply.getHeaders()));
    const outcome = state.outcome as Promise<Ran>;
    const out = new Transform({
      writableObjectMode: true,
      transform(chunk: unknown, _encoding, done) {
        const piece = toBuffer(chunk);
        capture.add(piece);
        done(null, piece.length > 0 ? piece : undefined);
      },
      flush(done) {
        (state.answer as (r: Response) => void)(capture.response(status, headers));
        const failed = (ran: Ran) => (ran.failed ? new Error("the database failed under the stream") : null);
        outcome.then((ran) => done(failed(ran)), done); // committed: the response ends now
      },
      destroy(error, done) {
        state.fail(error ?? new Error("the stream was cut short before it ended"));
        void outcome.catch(() => undefined).then(() => done(error));
      },
    });
    pipeline(payload, out, () => undefined);
    return out;
  };

  // A request whose route never answered (the client went away, an error before onSend).
  app.addHook("onResponse", async (request) => {
    const state = states.get(request);
    if (state === undefined || state.settled || state.answer === null) return;
    state.settled = true;
    state.fail(new Error("the request ended before the route answered"));
    await state.outcome?.catch(() => undefined);
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

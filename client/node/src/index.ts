/**
 * pg-idempotency: Idempotency-Key semantics for HTTP APIs, kept in PostgreSQL by
 * the idempotency extension, for node-pg.
 *
 * - Client: the transactional protocol around the caller's own connection;
 * - LeaseRunner: the lease protocol for effects outside the database;
 * - Response: a handler's answer, or the extension's (idempotency.http_answer) for the
 *   outcomes that do not run the handler; Problem, problemResponse: the problems the
 *   client answers itself (constants generated from client/protocol.json);
 * - idempotency(): an Express-style middleware;
 * - Router: each principal's transaction sent to the Citus node that holds its shard
 *   (isStalePlacement: a call's answer that the shard moved);
 * - beginBatch, completeBatch, claimBatch, pushUnique: many keys in one call,
 *   a job enqueued at most once.
 */

export {
  Response,
  asResponse,
  answerResponse,
  StreamCapture,
  headerNameEqual,
  httpDate,
  databaseFaultResponse,
  problemBody,
  problemResponse,
  type Headers,
  type ResponseExtras,
} from "./http";
// The constants generated from client/protocol.json: all of them are public.
export * from "./protocol_gen";
export {
  IdempotencyError,
  type KeyOptions,
  keptHeadersJson,
  actionName,
  sqlstate,
  validKey,
  fingerprint,
  type Db,
  type Request,
  type RequestContext,
  type Storage,
} from "./common";
export { Client, type Counters, type Handler, type Options } from "./transactional";
export {
  beginBatch,
  claimBatch,
  completeBatch,
  pushUnique,
  type BatchClaim,
  type BatchCompletion,
  type BatchOutcome,
} from "./batch";
export { LeaseRunner, type Body, type LeaseOptions, type LeaseOutcome, type LeaseResult, type Policy } from "./lease";
export {
  idempotency,
  type MiddlewareOptions,
  type MiddlewareRequest,
  type Next,
} from "./express";
export {
  DEFAULT_LOOKUP_TIMEOUT_MS,
  Router,
  isStalePlacement,
  routedPoolConfig,
  type Route,
  type RouterCounters,
  type RouterOptions,
  type RouterPool,
} from "./router";
export { isDatabaseFault } from "./fault";

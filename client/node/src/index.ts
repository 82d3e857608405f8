/**
 * pg-idempotency: Idempotency-Key semantics for HTTP APIs, kept in PostgreSQL by
 * the idempotency extension, for node-pg.
 *
 * - Client: the transactional protocol around the caller's own connection;
 * - LeaseRunner: the lease protocol for effects outside the database;
 * - Response, Problem, problemResponse: the HTTP mapping (RFC 9457 bodies
 *   byte-identical to the C++ and Python clients');
 * - idempotency(): an Express-style middleware;
 * - Router: each principal's transaction sent to the Citus node that holds its shard
 *   (isStalePlacement: a call's answer that the shard moved);
 * - beginBatch, completeBatch, claimBatch, pushUnique: many keys in one call,
 *   a job enqueued at most once.
 */

export {
  Response,
  Problem,
  asResponse,
  DETAILS,
  DEFAULT_DUPLICATE_MODE,
  DEFAULT_MAX_STREAM_BYTES,
  DUPLICATE_MODES,
  EXPIRES_FORMAT,
  EXPIRES_HEADER,
  NOT_KEPT_ENTRY,
  NOT_KEPT_VALUE,
  PROBLEM_CONTENT_TYPE,
  StreamCapture,
  STREAM_CHUNKS_ENTRY,
  headerNameEqual,
  httpDate,
  notKeptResponse,
  databaseFaultResponse,
  type DuplicateMode,
  problemBody,
  problemForOutcome,
  problemResponse,
  OUTCOME_PROBLEMS,
  type Headers,
  type ProblemType,
  type ResponseExtras,
} from "./http";
export {
  DEFAULT_KEPT_HEADERS,
  IdempotencyError,
  keptHeadersJson,
  storedResponse,
  actionName,
  sqlstate,
  validKey,
  type Db,
  type Request,
  type RequestContext,
} from "./common";
export { Client, type Counters, type Handler, type Options } from "./transactional";
export { fingerprint } from "./common";
export {
  beginBatch,
  claimBatch,
  completeBatch,
  pushUnique,
  type BatchClaim,
  type BatchCompletion,
  type BatchOutcome,
  type KeyOutcome,
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
  ROUTING,
  Router,
  isStalePlacement,
  type Route,
  type RouterCounters,
  type RouterOptions,
  type RouterPool,
} from "./router";
export {
  FAULT_SQLSTATE_CLASSES,
  FAULT_SQLSTATES,
  isDatabaseFault,
} from "./fault";

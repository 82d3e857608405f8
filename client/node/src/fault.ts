/**
 * Database faults: which errors mean the database failed under a request (not the
 * request's own error), and a watch on a checked-out connection that keeps its
 * 'error' events from crashing the process and remembers whether one came. The
 * watch's listeners go on every new connection of a pool the adapters use as the
 * pool makes it (watchPool), not at its first checkout: node-pg parses a chunk's
 * messages in one go, so a FATAL (57P01, a terminate or a restart) that arrives with
 * a new connection's ready-for-query is emitted after pg-pool took its idle
 * listener off and before the checkout's promise resumes anyone, which ended the
 * process on an 'error' nobody listened to.
 *
 * A fault is answered with databaseFaultResponse() (client/protocol.json
 * database_fault): 503, Retry-After, retry with the same key.
 */

import type { PoolClient } from "pg";

import { sqlstate } from "./common";
import { FAULT_SQLSTATE_CLASSES, FAULT_SQLSTATES } from "./protocol_gen";

// node's socket errors, and node-pg's own for a connection that went away.
const SOCKET_CODES = ["ECONNRESET", "ECONNREFUSED", "ECONNABORTED", "EPIPE", "ENOTCONN",
  "ETIMEDOUT", "EHOSTUNREACH", "ENETUNREACH", "ENOENT"];
const LOST_MESSAGES = [
  "Connection terminated",
  "Client has encountered a connection error and is not queryable",
  "Client was closed and is not queryable",
  "timeout exceeded when trying to connect",
];

/**
 * True when `error` says the database failed or could not be reached: a fault
 * SQLSTATE (08xxx, 57xxx such as 57P01 admin shutdown, 57P02/57P03 crash and
 * restart, 57014 cancel; 53300), a socket error, or node-pg's word for a lost
 * connection. Anything else (the route's own errors, constraint violations) is not.
 */
export function isDatabaseFault(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  if (typeof code === "string" && SOCKET_CODES.includes(code)) return true; // EPIPE looks like an SQLSTATE
  const state = sqlstate(error);
  if (state !== undefined) {
    return FAULT_SQLSTATE_CLASSES.includes(state.slice(0, 2)) || FAULT_SQLSTATES.includes(state);
  }
  if (!(error instanceof Error)) return false;
  return LOST_MESSAGES.some((m) => error.message.startsWith(m));
}

/** The watch of one connection, installed once (a pool's 'connect', or its first checkout) and kept for its life. */
export interface ConnectionWatch {
  /** True while the connection is checked out by an adapter: its queries' errors are seen. */
  watching: boolean;
  /** True once a query failed with a database fault or the connection reported an error. */
  faulted: boolean;
  /** True once the connection reported an error or ended: it must not go back to a pool. */
  dead: boolean;
  /** Called with each query's error while watching (the router's stale placements); or null. */
  onQueryError: ((error: unknown) => void) | null;
}

const states = new WeakMap<object, ConnectionWatch>();

/**
 * Installs, once per connection: listeners on its 'error' and 'end' events (a pool
 * listens only to idle ones, and an 'error' nobody listens to ends the process) and a
 * query() that sees the errors of its queries (promise and callback forms). Installed
 * once and never removed: putting query back (a delete) would leave node-pg's client
 * object in V8's slow dictionary mode, on every query of its life.
 */
function install(conn: PoolClient): ConnectionWatch {
  const state: ConnectionWatch = { watching: false, faulted: false, dead: false, onQueryError: null };
  conn.on("error", () => {
    state.faulted = true;
    state.dead = true;
  });
  conn.on("end", () => {
    state.dead = true;
  });
  const query = conn.query as (...args: unknown[]) => unknown;
  const see = (error: unknown) => {
    if (!state.watching) return;
    if (isDatabaseFault(error)) state.faulted = true;
    state.onQueryError?.(error);
  };
  (conn as unknown as { query: unknown }).query = function (this: unknown, ...args: unknown[]) {
    if (!state.watching) return query.apply(this, args); // not checked out by us
    const last = args[args.length - 1];
    if (typeof last === "function") {
      args[args.length - 1] = function (this: unknown, error: unknown, ...rest: unknown[]) {
        see(error);
        return (last as (...a: unknown[]) => unknown).call(this, error, ...rest);
      };
    }
    const result = query.apply(this, args) as { then?: unknown; submit?: unknown } | undefined;
    if (result && typeof result.then === "function" && typeof result.submit !== "function") {
      // The caller's promise rejects as the original does (same error, unhandled if ignored).
      return (result as Promise<unknown>).then(undefined, (error: unknown) => {
        see(error);
        throw error;
      });
    }
    return result;
  };
  states.set(conn, state);
  return state;
}

const watchedPools = new WeakSet<object>();

/**
 * Puts the watch's listeners on each new connection of `pool` as soon as the pool
 * has made it (its 'connect' event, emitted before the checkout is handed over), so
 * that no 'error' of a connection of this pool goes unheard, checked out or not.
 * Once per pool; a pool without events (a stand-in with connect only) is left alone.
 */
export function watchPool(pool: unknown): void {
  const events = pool as { on?: (event: string, listener: (client: PoolClient) => void) => unknown };
  if (pool === null || typeof pool !== "object" || typeof events.on !== "function") return;
  if (watchedPools.has(pool)) return;
  watchedPools.add(pool);
  events.on.call(pool, "connect", (client: PoolClient) => {
    if (!states.has(client)) install(client);
  });
}

/**
 * Watches a checked-out connection until `watching` is set back to false (before it goes
 * back to its pool): whether it failed (faulted) or died (dead), and, through
 * onQueryError, each of its queries' errors.
 */
export function watchConnection(conn: PoolClient): ConnectionWatch {
  const watch = states.get(conn) ?? install(conn);
  watch.faulted = watch.dead; // a dead connection stays faulted; a live one starts clean
  watch.watching = true;
  watch.onQueryError = null;
  return watch;
}

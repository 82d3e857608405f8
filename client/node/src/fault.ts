/**
 * Database faults: which errors mean the database failed under a request (not the
 * request's own error), and a watch on a checked-out connection that keeps its
 * 'error' events from crashing the process and remembers whether one came.
 *
 * A fault is answered with databaseFaultResponse() (client/protocol.json
 * database_fault): 503, Retry-After, retry with the same key.
 */

import type { PoolClient } from "pg";

import { sqlstate } from "./common";

/** SQLSTATE classes of a database fault: connection exception, operator intervention. */
export const FAULT_SQLSTATE_CLASSES: readonly string[] = ["08", "57"];
/** SQLSTATEs of a database fault outside those classes: too many connections. */
export const FAULT_SQLSTATES: readonly string[] = ["53300"];

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
  const state = sqlstate(error);
  if (state !== undefined) {
    return FAULT_SQLSTATE_CLASSES.includes(state.slice(0, 2)) || FAULT_SQLSTATES.includes(state);
  }
  if (!(error instanceof Error)) return false;
  const code = (error as { code?: unknown }).code;
  if (typeof code === "string" && SOCKET_CODES.includes(code)) return true;
  return LOST_MESSAGES.some((m) => error.message.startsWith(m));
}

/** What a watch saw on a connection while it was checked out. */
export interface ConnectionWatch {
  /** True once a query failed with a database fault or the connection reported an error. */
  faulted: () => boolean;
  /** True once the connection reported an error or ended: it must not go back to a pool. */
  dead: () => boolean;
  /** Puts conn.query back; the error listener stays when the connection is dead. */
  stop: () => void;
}

/**
 * Watches a checked-out connection: its 'error' and 'end' events (a pool listens
 * only to idle ones, and an 'error' nobody listens to ends the process) and the
 * errors of its queries (promise and callback forms), until stop().
 */
export function watchConnection(conn: PoolClient): ConnectionWatch {
  let faulted = false;
  let dead = false;
  const onError = () => {
    faulted = true;
    dead = true;
  };
  const onEnd = () => {
    dead = true;
  };
  conn.on("error", onError);
  conn.on("end", onEnd);
  const own = Object.getOwnPropertyDescriptor(conn, "query");
  const query = conn.query as (...args: unknown[]) => unknown;
  const see = (error: unknown) => {
    if (isDatabaseFault(error)) faulted = true;
  };
  (conn as unknown as { query: unknown }).query = function (this: unknown, ...args: unknown[]) {
    const last = args[args.length - 1];
    if (typeof last === "function") {
      args[args.length - 1] = function (this: unknown, error: unknown, ...rest: unknown[]) {
        see(error);
        return (last as (...a: unknown[]) => unknown).call(this, error, ...rest);
      };
    }
    const result = query.apply(this, args) as { then?: unknown; submit?: unknown } | undefined;
    if (result && typeof result.then === "function" && typeof result.submit !== "function") {
      return (result as Promise<unknown>).then(undefined, (error: unknown) => {
        see(error);
        throw error;
      });
    }
    return result;
  };
  return {
    faulted: () => faulted,
    dead: () => dead,
    stop: () => {
      if (own !== undefined) Object.defineProperty(conn, "query", own);
      else delete (conn as unknown as { query?: unknown }).query;
      conn.off("end", onEnd);
      // A dead connection may still emit: keep listening, it is never used again.
      if (!dead) conn.off("error", onError);
    },
  };
}

/**
 * Routing by principal under Citus: a request's whole transaction (the application's
 * writes and the key's begin/complete) goes to the node that holds the principal's shard.
 *
 *     const nodes = { "10.0.0.5:5432": workerA, "10.0.0.6:5432": workerB }; // node-pg Pools
 *     const router = new Router(coordinator, nodes);
 *     app.use(idempotency({ router, client: new Client(), principal: (req) => userOf(req) }));
 *
 * The placement of a principal is looked up on the default target (placementSql, the
 * principal as $1: zero or one row (nodename, nodeport)) and cached for `refreshMs`;
 * the cache holds at most `maxPrincipals` principals (least recently used out first).
 * A principal with no placement, a node the router has no pool for, a node marked
 * down and a lookup that failed all go to the default target (counter `defaulted`).
 *
 * Correctness never depends on the router: under Citus every node runs any principal's
 * calls (Citus delegates them); routing saves that hop. After a shard move a stale cache
 * sends requests to the old node until `refreshMs`, or until a call there answers that
 * the shard is not on this node (isStalePlacement): reportStalePlacement drops the
 * placement, and the middleware reruns the request on the new route. A node that cannot
 * be reached is skipped for `nodeDownMs`. Single-threaded: the cache needs no lock.
 */

import type { Pool, PoolClient, QueryArrayConfig } from "pg";

import { sqlstate } from "./common";
import { watchPool } from "./fault";
import { ROUTING } from "./protocol_gen";

/**
 * Whether `error` is the extension's answer that the principal's shard is not on the
 * node the call ran on (ROUTING.stalePlacement: SQLSTATE 0A000 and that primary
 * message, as node-pg's DatabaseError has them): the caller's placement is stale, see
 * Router.reportStalePlacement. Any other error, 0A000 with another message included,
 * is not.
 */
export function isStalePlacement(error: unknown): boolean {
  if (sqlstate(error) !== ROUTING.stalePlacement.sqlstate) return false;
  return (error as { message?: unknown }).message === ROUTING.stalePlacement.message;
}

/**
 * `config` (a node-pg Pool's, for a node of a Router, not the default target's) with
 * `-c idempotency.routed=on` first in its `options` (yours after it, not in
 * connectionString, which would replace them): Citus then plans a protocol call once.
 */
export function routedPoolConfig<T extends { options?: string }>(config: T): T {
  return { ...config, options: `-c idempotency.routed=on ${config.options ?? ""}`.trim() };
}

/** How long a placement lookup may take before it counts as failed (ms), by default. */
export const DEFAULT_LOOKUP_TIMEOUT_MS = 1000;

/** A target of the router: a node-pg Pool (or anything with its connect and query). */
export type RouterPool = Pick<Pool, "connect" | "query">;

/** Settings of a Router; every member is optional. */
export interface RouterOptions {
  /** The placement query, run on the default target, principal as $1 (ROUTING.placementSql). */
  placementSql?: string;
  /** How long a principal's placement is cached, in ms (default 60000). */
  refreshMs?: number;
  /** How long a node that could not be connected to is skipped, in ms (default 5000). */
  nodeDownMs?: number;
  /** The most principals cached (default 10000); the least recently used go first. */
  maxPrincipals?: number;
  /** How long a lookup may take before it counts as failed, in ms (default 1000). */
  lookupTimeoutMs?: number;
}

/** What a Router did, for metrics. */
export interface RouterCounters {
  /** Placement lookups run (cache misses). */
  lookups: number;
  /** Lookups that failed (error, timeout): those requests went to the default target. */
  lookupFailures: number;
  /** Requests routed to a named node. */
  routed: number;
  /**
   * Requests sent to the default target: no placement, a node without a pool, a node
   * down, a failed lookup, or a connect failure on the routed node (counted in routed too).
   */
  defaulted: number;
  /** Connect failures of a node not already down (each marks it down for nodeDownMs). */
  nodesMarkedDown: number;
  /** reportStalePlacement calls (the principal's shard moved; its placement dropped). */
  stalePlacements: number;
}

/** Where a principal goes: the node's name ("host:port") and pool, or null and the default pool. */
export interface Route {
  node: string | null;
  pool: RouterPool;
}

interface Cached {
  node: string | null;
  until: number;
}

function checkDuration(name: string, value: number): void {
  if (!Number.isFinite(value) || value < 0) {
    throw new RangeError(`${name} must be a number >= 0, not ${value}`);
  }
}

/** Sends each principal's transaction to the node that holds its shard (see the module comment). */
export class Router {
  /** The settings, defaults filled in. */
  readonly options: Required<RouterOptions>;
  /** What this router did. */
  readonly counters: RouterCounters = {
    lookups: 0,
    lookupFailures: 0,
    routed: 0,
    defaulted: 0,
    nodesMarkedDown: 0,
    stalePlacements: 0,
  };
  private readonly nodes: Map<string, RouterPool>;
  private readonly cache = new Map<string, Cached>(); // in use order: the first is the oldest
  private readonly pending = new Map<string, Promise<string | null | undefined>>();
  private readonly downUntil = new Map<string, number>();

  /**
   * A router whose principals without a known placement go to `defaultPool` (the
   * coordinator, or any node), and whose nodes are `nodes`: Citus's node name
   * "nodename:nodeport" (as in pg_dist_node) to the pool that connects to it.
   */
  constructor(
    readonly defaultPool: RouterPool,
    nodes: Record<string, RouterPool> | Map<string, RouterPool>,
    options: RouterOptions = {},
  ) {
    this.options = {
      placementSql: options.placementSql ?? ROUTING.placementSql,
      refreshMs: options.refreshMs ?? ROUTING.defaultRefreshSeconds * 1000,
      nodeDownMs: options.nodeDownMs ?? ROUTING.defaultNodeDownSeconds * 1000,
      maxPrincipals: options.maxPrincipals ?? ROUTING.defaultMaxPrincipals,
      lookupTimeoutMs: options.lookupTimeoutMs ?? DEFAULT_LOOKUP_TIMEOUT_MS,
    };
    if (typeof this.options.placementSql !== "string" || this.options.placementSql.trim() === "") {
      throw new RangeError("placementSql must be a non-empty SQL string");
    }
    checkDuration("refreshMs", this.options.refreshMs);
    checkDuration("nodeDownMs", this.options.nodeDownMs);
    checkDuration("lookupTimeoutMs", this.options.lookupTimeoutMs);
    if (!Number.isSafeInteger(this.options.maxPrincipals) || this.options.maxPrincipals < 1) {
      const value = this.options.maxPrincipals;
      throw new RangeError(`maxPrincipals must be an integer >= 1, not ${value}`);
    }
    this.nodes = new Map(nodes instanceof Map ? nodes : Object.entries(nodes));
    watchPool(defaultPool);
    for (const pool of this.nodes.values()) watchPool(pool);
    for (const name of this.nodes.keys()) {
      if (!/^.+:\d+$/.test(name)) {
        throw new RangeError(`a node is named "host:port" as Citus names it, not "${name}"`);
      }
    }
  }

  /**
   * Where `principal`'s request goes, counted in `routed` or `defaulted`. Looks the
   * placement up when it is not cached (or older than refreshMs); never throws for a
   * failed lookup (the default target, counted in lookupFailures).
   */
  async route(principal: string): Promise<Route> {
    const node = await this.placement(principal);
    if (node === null || node === undefined) return this.toDefault();
    const pool = this.nodes.get(node);
    if (pool === undefined) return this.toDefault(); // a node this router was not given
    const down = this.downUntil.get(node);
    if (down !== undefined) {
      if (Date.now() < down) return this.toDefault();
      this.downUntil.delete(node); // tried again
    }
    this.counters.routed++;
    return { node, pool };
  }

  /**
   * A connection for `principal`'s request, from the routed node's pool; when that
   * connect fails, the failure is reported (the node is down for nodeDownMs) and the
   * connection comes from the default pool. Release it with `client.release()`.
   */
  async connect(principal: string): Promise<{ client: PoolClient; node: string | null }> {
    const route = await this.route(principal);
    if (route.node !== null) {
      try {
        return { client: (await route.pool.connect()) as PoolClient, node: route.node };
      } catch {
        this.reportConnectFailure(route.node, principal);
        this.counters.defaulted++;
      }
    }
    return { client: (await this.defaultPool.connect()) as PoolClient, node: null };
  }

  /**
   * Tells the router that connecting to `node` failed (refused, DNS, timeout): the node
   * is skipped for nodeDownMs, and `principal`'s cached placement (if given) is dropped.
   */
  reportConnectFailure(node: string, principal?: string): void {
    const now = Date.now();
    if ((this.downUntil.get(node) ?? 0) <= now) this.counters.nodesMarkedDown++; // not already down
    this.downUntil.set(node, now + this.options.nodeDownMs);
    if (principal !== undefined) this.cache.delete(principal);
  }

  /**
   * Tells the router that a call for `principal` answered that its shard is not on the
   * node it ran on (isStalePlacement: the shard moved): the principal's cached placement
   * is dropped, so its next route() looks it up again, and the report is counted in
   * stalePlacements. No node is marked down: the node answered, and holds other shards.
   * The middleware reports by itself; with your own connection code, call it when a
   * statement on a routed connection fails with isStalePlacement(error), roll back,
   * release, and connect() again (once: the handler had not run) or fail the request.
   */
  reportStalePlacement(principal: string): void {
    this.counters.stalePlacements++;
    this.cache.delete(principal);
  }

  /** Forgets every cached placement and every node marked down. */
  clear(): void {
    this.cache.clear();
    this.downUntil.clear();
  }

  /** The number of principals cached. */
  get size(): number {
    return this.cache.size;
  }

  private toDefault(): Route {
    this.counters.defaulted++;
    return { node: null, pool: this.defaultPool };
  }

  /** The cached node name (null: no placement) or a fresh lookup's; undefined: lookup failed. */
  private placement(principal: string): Promise<string | null | undefined> {
    const cached = this.cache.get(principal);
    if (cached !== undefined) {
      this.cache.delete(principal); // re-inserted last: the most recently used
      if (Date.now() < cached.until) {
        this.cache.set(principal, cached);
        return Promise.resolve(cached.node);
      }
    }
    let running = this.pending.get(principal); // concurrent requests share one lookup
    if (running === undefined) {
      running = this.lookup(principal).finally(() => this.pending.delete(principal));
      this.pending.set(principal, running);
    }
    return running;
  }

  private async lookup(principal: string): Promise<string | null | undefined> {
    this.counters.lookups++;
    let node: string | null;
    try {
      // query_timeout: node-pg's own (per query); the pool discards a connection that hit it.
      const query: QueryArrayConfig & { query_timeout?: number } = {
        text: this.options.placementSql,
        values: [principal],
        rowMode: "array",
        query_timeout: this.options.lookupTimeoutMs || undefined,
      };
      const result = await this.defaultPool.query(query);
      const row = result.rows[0] as unknown[] | undefined;
      const found = row !== undefined && row[0] !== null && row[0] !== undefined;
      node = found ? `${row[0]}:${row[1]}` : null;
    } catch {
      this.counters.lookupFailures++; // not cached: the next request looks again
      return undefined;
    }
    this.cache.set(principal, { node, until: Date.now() + this.options.refreshMs });
    while (this.cache.size > this.options.maxPrincipals) {
      this.cache.delete(this.cache.keys().next().value as string); // the least recently used
    }
    return node;
  }
}

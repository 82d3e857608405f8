"""Routing by principal under Citus: the router of this module's I/O model (async
or sync).

    router = AsyncRouter(
        "host=coordinator dbname=shop",
        {"worker-1:5432": "host=worker-1 dbname=shop", "worker-2:5432": worker_2_pool.connection},
    )
    async with router.connection(principal) as conn:
        await client.handle(conn, request, handler)

``_router_core`` has the design (the placements cache, nodes marked down, stale
placements); docs/scale-out.md ("Routing by principal") the why. A target is a libpq
connection string (a connection is opened per request) or a function returning a
context manager that yields a connection (a pool's ``connection`` method; for the
async router an async context manager, an ``AsyncConnectionPool``'s). A node's string
gets ``-c idempotency.routed=on`` in its options; give a node's pool that option itself
(``kwargs={"options": "-c idempotency.routed=on"}``), never the default target's.

The async and the sync router are one text: the sync module is generated from the
async one by client/python/tools/async_to_sync.py.
"""

from __future__ import annotations

import asyncio  # async only
import threading
import time
from collections import OrderedDict
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from typing import Any, AsyncIterator, Callable, Dict, Mapping, Optional, Tuple

import psycopg

# The routing defaults of client/protocol.json (``routing``), generated; public here as before.
from ._protocol import (  # noqa: F401
    DEFAULT_MAX_PRINCIPALS,
    DEFAULT_NODE_DOWN_SECONDS,
    DEFAULT_REFRESH_SECONDS,
    PLACEMENT_SQL,
    STALE_PLACEMENT_MESSAGE,
    STALE_PLACEMENT_SQLSTATE,
)
from ._router_core import Route, RouterCounters, Target, _node_of, _positional, _routed, is_stale_placement

__all__ = ["AsyncRouter", "Route", "RouterCounters", "is_stale_placement"]


class AsyncRouter:
    """Routes a principal's requests to the node that holds its shard (thread-safe for
    the sync router; the async one is used from one event loop).

    ``default``: the coordinator (or any node): where placements are looked up and
    where a principal without a usable node goes. ``nodes``: Citus node name
    ``"nodename:nodeport"`` -> target. ``placement_sql`` runs on the default target
    with the principal as ``$1`` and returns zero or one row (node name, node port).
    ``refresh``: seconds a placement (or "none") is kept. ``node_down``: seconds a
    node that could not be connected to gets nothing. ``max_principals``: most
    placements kept. A lookup that fails is not cached: the request goes to the
    default target and the failure is counted. A call refused because the
    principal's shard is not on its node (``is_stale_placement``) drops the
    placement (``report_stale_placement``; ``connection`` does it for errors leaving
    its block).
    """

    def __init__(self, default: Target, nodes: Mapping[str, Target], *,
                 placement_sql: str = PLACEMENT_SQL, refresh: float = DEFAULT_REFRESH_SECONDS,
                 node_down: float = DEFAULT_NODE_DOWN_SECONDS,
                 max_principals: int = DEFAULT_MAX_PRINCIPALS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not placement_sql:
            raise ValueError("placement_sql is empty")
        if max_principals < 1:
            raise ValueError("max_principals must be at least 1")
        if refresh < 0 or node_down < 0:
            raise ValueError("refresh and node_down must not be negative")
        self._default = default
        self._nodes: Dict[str, Target] = dict(nodes)
        self._query = _positional(placement_sql)
        self._refresh, self._node_down, self._max_principals = refresh, node_down, max_principals
        self._clock = clock
        # The cache (least recently used out first), the nodes marked down and the counters,
        # under self._lock (never held across an await: uncontended on one event loop).
        self._cache: "OrderedDict[str, Tuple[Optional[str], float]]" = OrderedDict()
        self._down_until: Dict[str, float] = {}
        self._counters = RouterCounters()
        self._lock = threading.Lock()
        # The lock of the lookups' connection to the default target (the async router's is
        # made on the loop that uses it, by _lookup_guard).
        self._lookup_lock: Any = None  # sync: self._lookup_lock = threading.Lock()
        self._lookup_conn: Any = None

    @property
    def counters(self) -> RouterCounters:
        """A copy of the counts so far."""
        with self._lock:
            return replace(self._counters)

    def report_connect_failure(self, principal: str, node: Optional[str]) -> None:
        """Connecting to ``node`` for ``principal`` failed: the node gets nothing for
        ``node_down`` seconds and the principal's placement is looked up again."""
        if node is None:
            return
        with self._lock:
            now = self._clock()
            if self._down_until.get(node, 0.0) <= now:
                self._counters.nodes_marked_down += 1
            self._down_until[node] = now + self._node_down
            self._cache.pop(principal, None)

    def report_stale_placement(self, principal: str) -> None:
        """A call for ``principal`` failed with ``is_stale_placement``: its cached placement
        is dropped, so its next route looks it up again, and ``stale_placements`` counts
        it. No node is marked down (the node is up; the shard moved)."""
        with self._lock:
            self._counters.stale_placements += 1
            self._cache.pop(principal, None)

    async def route(self, principal: str) -> Route:
        """The route of ``principal``: its cached placement, else one looked up now."""
        with self._lock:
            entry = self._cache.get(principal)
            known = entry is not None and self._clock() - entry[1] < self._refresh
            if known:
                self._cache.move_to_end(principal)
        node = entry[0] if entry is not None and known else None
        failed = False
        if not known:
            try:  # outside the lock: a slow lookup holds up no cached route
                node = await self._lookup(principal)
            except Exception:  # any failure: the default target serves, correctly
                failed = True
        with self._lock:
            if not known:
                self._looked_up(principal, node, failed)
            up = node is not None and self._clock() >= self._down_until.get(node, 0.0)
            if node is not None and node in self._nodes and up:
                self._counters.routed += 1
                return Route(self._nodes[node], node)
            self._counters.defaulted += 1
            return Route(self._default, None)

    def _looked_up(self, principal: str, node: Optional[str], failed: bool) -> None:
        """Counts a lookup and caches its placement (a failed one is not cached); the
        caller holds the lock."""
        self._counters.lookups += 1
        if failed:
            self._counters.lookup_failures += 1
            return
        self._cache[principal] = (node, self._clock())
        self._cache.move_to_end(principal)
        while len(self._cache) > self._max_principals:
            self._cache.popitem(last=False)

    async def target(self, principal: str) -> Target:
        """The target of route(principal)."""
        return (await self.route(principal)).target

    @asynccontextmanager
    async def connection(self, principal: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection on route(principal), as the target's context manager gives it
        (a connection string's is closed at the end, committed unless an exception
        left). When the node cannot be connected to (psycopg.OperationalError while
        connecting), reports it and connects to the default target instead. An error
        leaving the block that ``is_stale_placement`` is reported
        (``report_stale_placement``) and propagates: run the request again on a new
        ``connection(principal)`` if nothing of it ran yet."""
        route = await self.route(principal)
        async with AsyncExitStack() as stack:
            try:
                conn = await stack.enter_async_context(await _open(_routed(route)))
            except psycopg.OperationalError:
                if route.node is None:
                    raise
                self.report_connect_failure(principal, route.node)  # the request goes to the default
                with self._lock:
                    self._counters.defaulted += 1
                conn = await stack.enter_async_context(await _open(self._default))
            try:
                yield conn
            except psycopg.Error as error:
                if is_stale_placement(error):
                    self.report_stale_placement(principal)
                raise

    async def close(self) -> None:
        """Closes the connection the lookups use (a new one opens when needed)."""
        async with self._lookup_guard():
            if self._lookup_conn is not None:
                await self._lookup_conn.close()
                self._lookup_conn = None

    def _lookup_guard(self) -> Any:
        """The lock of the lookups' connection."""
        if self._lookup_lock is None:  # async only
            self._lookup_lock = asyncio.Lock()  # async only
        return self._lookup_lock

    async def _lookup(self, principal: str) -> Optional[str]:
        default = self._default
        if not isinstance(default, str):
            async with default() as conn:
                cursor = await conn.execute(self._query, (principal,))
                return _node_of(await cursor.fetchone())
        async with self._lookup_guard():
            if self._lookup_conn is None or self._lookup_conn.closed:
                self._lookup_conn = await psycopg.AsyncConnection.connect(default, autocommit=True)
            try:
                cursor = await self._lookup_conn.execute(self._query, (principal,))
                return _node_of(await cursor.fetchone())
            except psycopg.OperationalError:
                await self._lookup_conn.close()  # connect again next time
                self._lookup_conn = None
                raise


async def _open(target: Target) -> Any:
    """A connection string's new connection, or the target's context manager."""
    if isinstance(target, str):
        return await psycopg.AsyncConnection.connect(target)
    return target()

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
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, AsyncIterator, Optional

import psycopg

from ._router_core import (  # noqa: F401 (the routing defaults, public here as before)
    DEFAULT_MAX_PRINCIPALS,
    DEFAULT_NODE_DOWN_SECONDS,
    DEFAULT_REFRESH_SECONDS,
    PLACEMENT_SQL,
    STALE_PLACEMENT_MESSAGE,
    STALE_PLACEMENT_SQLSTATE,
    Route,
    RouterCounters,
    Target,
    _node_of,
    _routed,
    _RouterBase,
    is_stale_placement,
)

__all__ = ["AsyncRouter", "Route", "RouterCounters", "is_stale_placement"]


class AsyncRouter(_RouterBase):
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

    async def route(self, principal: str) -> Route:
        """The route of ``principal``: its cached placement, else one looked up now."""
        with self._lock:
            known, node = self._state.cached(principal)
        failed = False
        if not known:
            try:  # outside the lock: a slow lookup holds up no cached route
                node = await self._lookup(principal)
            except Exception:  # any failure: the default target serves, correctly
                failed = True
        with self._lock:
            if not known:
                self._state.looked_up(principal, node, failed)
            return self._state.choose(node)

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
                default = self._fall_back(principal, route.node)
                conn = await stack.enter_async_context(await _open(default))
            try:
                yield conn
            except psycopg.Error as error:
                self._report_if_stale(principal, error)
                raise

    async def close(self) -> None:
        """Closes the connection the lookups use (a new one opens when needed)."""
        async with self._lookup_guard():
            if self._lookup_conn is not None:
                await self._lookup_conn.close()
                self._lookup_conn = None

    def _lookup_guard(self) -> Any:
        """The lock of the lookups' connection."""
        if self._async_lookup_lock is None:  # async only
            self._async_lookup_lock = asyncio.Lock()  # async only
        return self._async_lookup_lock  # sync: return self._lookup_lock

    async def _lookup(self, principal: str) -> Optional[str]:
        default = self._state.default
        if not isinstance(default, str):
            async with default() as conn:
                cursor = await conn.execute(self._state.query, (principal,))
                return _node_of(await cursor.fetchone())
        async with self._lookup_guard():
            if self._lookup_conn is None or self._lookup_conn.closed:
                self._lookup_conn = await psycopg.AsyncConnection.connect(default, autocommit=True)
            try:
                cursor = await self._lookup_conn.execute(self._state.query, (principal,))
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

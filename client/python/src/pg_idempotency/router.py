"""Routing by principal under Citus: ``Router`` (sync) and ``AsyncRouter`` (asyncio).

    router = Router("host=coordinator dbname=shop",
                    {"worker-1:5432": "host=worker-1 dbname=shop",
                     "worker-2:5432": worker_2_pool.connection})
    with router.connection(principal) as conn:
        client.handle(conn, request, handler)

A router sends a principal's whole request transaction (the application's writes
and the key's begin/complete) to the Citus node that holds the principal's shard,
found with ``placement_sql`` on the default target and kept for ``refresh``
seconds. Correctness never depends on it: under Citus any node runs any
principal's calls (Citus delegates them to the shard's node), so a stale
placement after a shard move, a node marked down or a failed lookup only costs
the hop that routing saves. docs/scale-out.md ("Routing by principal") has the
design; the WSGI and ASGI middlewares take a router as their ``router`` option.

A call that Citus did not delegate to a moved shard's node is refused by the
extension (``is_stale_placement``: SQLSTATE 0A000 "the key's shard is not on this
node"). ``report_stale_placement`` drops the principal's placement so that its next
request looks it up again; ``connection`` reports such an error escaping its block,
and the middlewares run a request refused so at its ``begin`` once more on the new
route.

A target is a libpq connection string (a connection is opened per request) or a
function returning a context manager that yields a connection (a pool's
``connection`` method; for AsyncRouter an async context manager).
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections import OrderedDict
from contextlib import AsyncExitStack, ExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, replace
from typing import Any, AsyncIterator, Callable, Dict, Iterator, Mapping, Optional, Tuple, Union

import psycopg

# The routing defaults of client/protocol.json (`routing`); tests/test_protocol_table.py
# compares them with the file.
PLACEMENT_SQL = (
    "SELECT n.nodename, n.nodeport FROM pg_catalog.pg_dist_placement p"
    " JOIN pg_catalog.pg_dist_node n ON n.groupid OPERATOR(pg_catalog.=) p.groupid"
    " WHERE p.shardid OPERATOR(pg_catalog.=)"
    " pg_catalog.get_shard_id_for_distribution_column('idempotency.keys'::pg_catalog.regclass,"
    " $1::pg_catalog.text) AND n.isactive AND n.noderole OPERATOR(pg_catalog.=) 'primary'"
    " ORDER BY n.nodeid LIMIT 1"
)
DEFAULT_REFRESH_SECONDS = 60
DEFAULT_NODE_DOWN_SECONDS = 5
DEFAULT_MAX_PRINCIPALS = 10000
STALE_PLACEMENT_SQLSTATE = "0A000"
"""SQLSTATE of the extension's refusal of a call whose principal's shard is elsewhere."""
STALE_PLACEMENT_MESSAGE = "the key's shard is not on this node"
"""Primary message of that refusal (0A000 alone also means other unsupported features)."""

Target = Union[str, Callable[[], Any]]


@dataclass
class RouterCounters:
    """Counts since the router was created (for metrics)."""

    lookups: int = 0
    """Placement queries run."""
    lookup_failures: int = 0
    """Placement queries that failed (error, timeout, no connection): not cached."""
    routed: int = 0
    """Routes to a named node."""
    defaulted: int = 0
    """Routes to the default target: no placement, a node without a target, a node marked
    down, a failed lookup, or the fallback after a failed connect."""
    nodes_marked_down: int = 0
    """Connect failures reported while the node was not already marked down."""
    stale_placements: int = 0
    """Calls that answered the principal's shard is not on their node; its placement
    was dropped."""


@dataclass(frozen=True)
class Route:
    """Where one principal's request goes."""

    target: Target
    """What to connect with."""
    node: Optional[str]
    """The Citus node name ("host:port") it stands for; None for the default target."""


def is_stale_placement(error: BaseException) -> bool:
    """Whether ``error`` is the extension's "the key's shard is not on this node"
    refusal: a database error with SQLSTATE ``STALE_PLACEMENT_SQLSTATE`` whose primary
    message is ``STALE_PLACEMENT_MESSAGE`` (a locking call run on a node that does not
    hold the principal's shard, e.g. after a shard move, that Citus did not delegate).
    The principal's placement is stale: report it (``report_stale_placement``)."""
    if getattr(error, "sqlstate", None) != STALE_PLACEMENT_SQLSTATE:
        return False
    diag = getattr(error, "diag", None)
    return getattr(diag, "message_primary", None) == STALE_PLACEMENT_MESSAGE


def _positional(sql: str) -> str:
    """placement_sql ($1 for the principal) in psycopg's spelling (%s, and %% for %)."""
    return re.sub(r"\$1(?![0-9])", "%s", sql.replace("%", "%%"))


class _Placements:
    """The cache (least recently used out first), the nodes marked down and the counters;
    the callers hold the lock (Router) or run on one event loop (AsyncRouter)."""

    def __init__(self, default: Target, nodes: Mapping[str, Target], placement_sql: str,
                 refresh: float, node_down: float, max_principals: int,
                 clock: Callable[[], float]) -> None:
        if not placement_sql:
            raise ValueError("placement_sql is empty")
        if max_principals < 1:
            raise ValueError("max_principals must be at least 1")
        if refresh < 0 or node_down < 0:
            raise ValueError("refresh and node_down must not be negative")
        self.default = default
        self.nodes: Dict[str, Target] = dict(nodes)
        self.query = _positional(placement_sql)
        self.refresh, self.node_down, self.max_principals = refresh, node_down, max_principals
        self.clock = clock
        self.cache: "OrderedDict[str, Tuple[Optional[str], float]]" = OrderedDict()
        self.down_until: Dict[str, float] = {}
        self.counters = RouterCounters()

    def cached(self, principal: str) -> Tuple[bool, Optional[str]]:
        entry = self.cache.get(principal)
        if entry is None or self.clock() - entry[1] >= self.refresh:
            return False, None
        self.cache.move_to_end(principal)
        return True, entry[0]

    def looked_up(self, principal: str, node: Optional[str], failed: bool) -> None:
        self.counters.lookups += 1
        if failed:
            self.counters.lookup_failures += 1
            return
        self.cache[principal] = (node, self.clock())
        self.cache.move_to_end(principal)
        while len(self.cache) > self.max_principals:
            self.cache.popitem(last=False)

    def choose(self, node: Optional[str]) -> Route:
        up = node is not None and self.clock() >= self.down_until.get(node, 0.0)
        if node is not None and node in self.nodes and up:
            self.counters.routed += 1
            return Route(self.nodes[node], node)
        self.counters.defaulted += 1
        return Route(self.default, None)

    def mark_down(self, principal: str, node: Optional[str]) -> None:
        if node is None:
            return
        now = self.clock()
        if self.down_until.get(node, 0.0) <= now:
            self.counters.nodes_marked_down += 1
        self.down_until[node] = now + self.node_down
        self.cache.pop(principal, None)

    def drop(self, principal: str) -> None:
        """A call said the principal's shard is not on its node: looked up again next."""
        self.counters.stale_placements += 1
        self.cache.pop(principal, None)

    def fall_back(self, principal: str, node: str) -> None:
        """Connecting to ``node`` failed and the request goes to the default target."""
        self.mark_down(principal, node)
        self.counters.defaulted += 1


def _node_of(row: Optional[Tuple[Any, ...]]) -> Optional[str]:
    if row is None or len(row) < 2 or row[0] is None or row[1] is None:
        return None
    return f"{row[0]}:{row[1]}"


class _RouterBase:
    """What Router and AsyncRouter share: the options, the placements and the counters."""

    def __init__(self, default: Target, nodes: Mapping[str, Target], *,
                 placement_sql: str = PLACEMENT_SQL, refresh: float = DEFAULT_REFRESH_SECONDS,
                 node_down: float = DEFAULT_NODE_DOWN_SECONDS,
                 max_principals: int = DEFAULT_MAX_PRINCIPALS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._state = _Placements(default, nodes, placement_sql, refresh, node_down,
                                  max_principals, clock)
        self._lock = threading.Lock()  # uncontended under AsyncRouter's one event loop
        self._lookup_lock = threading.Lock()  # Router's lookups on their connection
        self._lookup_conn: Any = None  # the lookups' connection to the default target

    @property
    def counters(self) -> RouterCounters:
        """A copy of the counts so far."""
        with self._lock:
            return replace(self._state.counters)

    def report_connect_failure(self, principal: str, node: Optional[str]) -> None:
        """Connecting to ``node`` for ``principal`` failed: the node gets nothing for
        ``node_down`` seconds and the principal's placement is looked up again."""
        with self._lock:
            self._state.mark_down(principal, node)

    def report_stale_placement(self, principal: str) -> None:
        """A call for ``principal`` failed with ``is_stale_placement``: its cached placement
        is dropped, so its next route looks it up again, and ``stale_placements`` counts
        it. No node is marked down (the node is up; the shard moved)."""
        with self._lock:
            self._state.drop(principal)

    def _report_if_stale(self, principal: str, error: BaseException) -> None:
        """report_stale_placement(principal) when ``error`` is a stale placement."""
        if is_stale_placement(error):
            self.report_stale_placement(principal)

    def _fall_back(self, principal: str, node: str) -> Target:
        with self._lock:
            self._state.fall_back(principal, node)
        return self._state.default


class Router(_RouterBase):
    """Routes a principal's requests to the node that holds its shard (thread-safe).

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

    def route(self, principal: str) -> Route:
        """The route of ``principal``: its cached placement, else one looked up now."""
        with self._lock:
            known, node = self._state.cached(principal)
        failed = False
        if not known:
            try:  # outside the lock: a slow lookup holds up no cached route
                node = self._lookup(principal)
            except Exception:  # any failure: the default target serves, correctly
                failed = True
        with self._lock:
            if not known:
                self._state.looked_up(principal, node, failed)
            return self._state.choose(node)

    def target(self, principal: str) -> Target:
        """The target of route(principal)."""
        return self.route(principal).target

    @contextmanager
    def connection(self, principal: str) -> Iterator[psycopg.Connection[Any]]:
        """A connection on route(principal), as the target's context manager gives it
        (a connection string's is closed at the end, committed unless an exception
        left). When the node cannot be connected to (psycopg.OperationalError while
        connecting), reports it and connects to the default target instead. An error
        leaving the block that ``is_stale_placement`` is reported
        (``report_stale_placement``) and propagates: run the request again on a new
        ``connection(principal)`` if nothing of it ran yet."""
        route = self.route(principal)
        with ExitStack() as stack:
            try:
                conn = stack.enter_context(_open(route.target))
            except psycopg.OperationalError:
                if route.node is None:
                    raise
                conn = stack.enter_context(_open(self._fall_back(principal, route.node)))
            try:
                yield conn
            except psycopg.Error as error:
                self._report_if_stale(principal, error)
                raise

    def close(self) -> None:
        """Closes the connection the lookups use (a new one opens when needed)."""
        with self._lookup_lock:
            if self._lookup_conn is not None:
                self._lookup_conn.close()
                self._lookup_conn = None

    def _lookup(self, principal: str) -> Optional[str]:
        default = self._state.default
        if not isinstance(default, str):
            with default() as conn:
                return _node_of(conn.execute(self._state.query, (principal,)).fetchone())
        with self._lookup_lock:
            if self._lookup_conn is None or self._lookup_conn.closed:
                self._lookup_conn = psycopg.connect(default, autocommit=True)
            try:
                cursor = self._lookup_conn.execute(self._state.query, (principal,))
                return _node_of(cursor.fetchone())
            except psycopg.OperationalError:
                self._lookup_conn.close()  # connect again next time
                self._lookup_conn = None
                raise


def _open(target: Target) -> Any:
    return psycopg.connect(target) if isinstance(target, str) else target()


class AsyncRouter(_RouterBase):
    """Router for ``psycopg.AsyncConnection``: the same options and behaviour; a target is
    a connection string or a function returning an async context manager (an
    ``AsyncConnectionPool``'s ``connection``). Use it from one event loop."""

    _async_lookup_lock: Optional[asyncio.Lock] = None  # made on the loop that uses it

    async def route(self, principal: str) -> Route:
        """The route of ``principal``: its cached placement, else one looked up now."""
        known, node = self._state.cached(principal)
        if not known:
            failed = False
            try:
                node = await self._lookup(principal)
            except Exception:  # any failure: the default target serves, correctly
                failed = True
            self._state.looked_up(principal, node, failed)
        return self._state.choose(node)

    async def target(self, principal: str) -> Target:
        """The target of route(principal)."""
        return (await self.route(principal)).target

    @asynccontextmanager
    async def connection(self, principal: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """An async connection on route(principal); as Router.connection (a stale
        placement escaping the block is reported)."""
        route = await self.route(principal)
        async with AsyncExitStack() as stack:
            try:
                conn = await stack.enter_async_context(await _open_async(route.target))
            except psycopg.OperationalError:
                if route.node is None:
                    raise
                default = self._fall_back(principal, route.node)
                conn = await stack.enter_async_context(await _open_async(default))
            try:
                yield conn
            except psycopg.Error as error:
                self._report_if_stale(principal, error)
                raise

    async def close(self) -> None:
        """Closes the connection the lookups use."""
        if self._lookup_conn is not None:
            await self._lookup_conn.close()
            self._lookup_conn = None

    async def _lookup(self, principal: str) -> Optional[str]:
        default = self._state.default
        if not isinstance(default, str):
            async with default() as conn:
                cursor = await conn.execute(self._state.query, (principal,))
                return _node_of(await cursor.fetchone())
        if self._async_lookup_lock is None:
            self._async_lookup_lock = asyncio.Lock()
        async with self._async_lookup_lock:
            if self._lookup_conn is None or self._lookup_conn.closed:
                self._lookup_conn = await psycopg.AsyncConnection.connect(default,
                                                                         autocommit=True)
            try:
                cursor = await self._lookup_conn.execute(self._state.query, (principal,))
                return _node_of(await cursor.fetchone())
            except psycopg.OperationalError:
                await self._lookup_conn.close()
                self._lookup_conn = None
                raise


async def _open_async(target: Target) -> Any:
    if isinstance(target, str):
        return await psycopg.AsyncConnection.connect(target)
    return target()


__all__ = [
    "AsyncRouter",
    "DEFAULT_MAX_PRINCIPALS",
    "DEFAULT_NODE_DOWN_SECONDS",
    "DEFAULT_REFRESH_SECONDS",
    "PLACEMENT_SQL",
    "Route",
    "Router",
    "RouterCounters",
    "STALE_PLACEMENT_MESSAGE",
    "STALE_PLACEMENT_SQLSTATE",
    "is_stale_placement",
]

"""Routing by principal under Citus, without its I/O: the placements cache, the nodes
marked down, the counters and the options that ``Router`` and ``AsyncRouter``
(``async_router``, and ``router`` generated from it, which show their use) share.

A router sends a principal's whole request transaction (the application's writes and the
key's begin/complete) to the Citus node that holds the principal's shard, found with
``placement_sql`` on the default target and kept for ``refresh`` seconds. Correctness
never depends on it: under Citus any node runs any principal's calls (Citus delegates them
to the shard's node), so a stale placement after a shard move, a node marked down or a
failed lookup only costs the hop that routing saves. docs/scale-out.md ("Routing by
principal") has the design; the WSGI and ASGI middlewares take a router as their
``router`` option.

A call that Citus did not delegate to a moved shard's node is refused by the extension
(``is_stale_placement``: SQLSTATE 0A000 "the key's shard is not on this node").
``report_stale_placement`` drops the principal's placement so that its next request looks
it up again; ``connection`` reports such an error escaping its block, and the middlewares
run a request refused so at its ``begin`` once more on the new route.

A target is a libpq connection string or a connection factory (``async_router``).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Union

from psycopg.conninfo import conninfo_to_dict, make_conninfo

# The routing defaults of client/protocol.json (``routing``), generated.
from ._protocol import (  # noqa: F401
    DEFAULT_MAX_PRINCIPALS,
    DEFAULT_NODE_DOWN_SECONDS,
    DEFAULT_REFRESH_SECONDS,
    PLACEMENT_SQL,
    STALE_PLACEMENT_MESSAGE,
    STALE_PLACEMENT_SQLSTATE,
)

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
    the callers hold the router's lock (never across an await)."""

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


def _routed(route: Route) -> Target:
    """A node's connection string with ``-c idempotency.routed=on`` first in its options (its
    own, else PGOPTIONS, after: a later -c wins); the default or a factory as it is."""
    if route.node is None or not isinstance(route.target, str):
        return route.target
    own = conninfo_to_dict(route.target).get("options", os.environ.get("PGOPTIONS", ""))
    return make_conninfo(route.target, options=f"-c idempotency.routed=on {own}".rstrip())


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
        self._lock = threading.Lock()  # never held across an await: uncontended on one event loop
        self._lookup_lock = threading.Lock()  # Router's lookups on their connection
        self._async_lookup_lock: Any = None  # AsyncRouter's, made on the loop that uses it
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


__all__ = [
    "DEFAULT_MAX_PRINCIPALS", "DEFAULT_NODE_DOWN_SECONDS", "DEFAULT_REFRESH_SECONDS",
    "PLACEMENT_SQL", "Route", "RouterCounters", "STALE_PLACEMENT_MESSAGE",
    "STALE_PLACEMENT_SQLSTATE", "Target", "is_stale_placement",
]

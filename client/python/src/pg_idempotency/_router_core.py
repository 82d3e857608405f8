"""Routing by principal under Citus, without its I/O: the route, the counters, the stale
placement and the connection strings that ``Router`` and ``AsyncRouter`` (``async_router``,
and ``router`` generated from it, which keep the placements cache and the nodes marked
down) share.

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
from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple, Union

from psycopg.conninfo import conninfo_to_dict, make_conninfo

# The stale placement refusal of client/protocol.json (``routing``), generated.
from ._protocol import STALE_PLACEMENT_MESSAGE, STALE_PLACEMENT_SQLSTATE

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


__all__ = ["Route", "RouterCounters", "Target", "is_stale_placement"]

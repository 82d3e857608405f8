"""Counts round trips from libpq's protocol trace: a round trip starts each time
the client sends after having received something."""

from __future__ import annotations

import tempfile
from typing import Callable

import psycopg
from psycopg import pq


def count_round_trips(conn: psycopg.Connection, action: Callable[[], object]) -> int:
    with tempfile.TemporaryFile() as trace:
        conn.pgconn.trace(trace.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            action()
        finally:
            conn.pgconn.untrace()
        trace.seek(0)
        lines = trace.read().decode("utf-8", "replace").splitlines()
    return _trips(lines)


def _trips(lines) -> int:
    trips, previous = 0, "B"
    for line in lines:
        direction = line.split("\t", 1)[0]
        if direction == "F" and previous == "B":
            trips += 1
        if direction in ("F", "B"):
            previous = direction
    return trips


async def count_round_trips_async(conn, action) -> int:
    """count_round_trips for an async connection: action() returns an awaitable."""
    with tempfile.TemporaryFile() as trace:
        conn.pgconn.trace(trace.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            await action()
        finally:
            conn.pgconn.untrace()
        trace.seek(0)
        lines = trace.read().decode("utf-8", "replace").splitlines()
    return _trips(lines)

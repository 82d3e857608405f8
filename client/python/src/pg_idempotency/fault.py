"""Database faults: the errors that mean the database failed under a request (the
connection died, the server shut down, crashed or refused connections, the
statement was cancelled, the commit's outcome is unknown), not the request's own.
A middleware answers them with ``http.database_fault_response()``
(protocol.json ``database_fault``)."""

from __future__ import annotations

from typing import Optional

import psycopg

# From client/protocol.json: the classes 08 (connection exception) and 57 (operator
# intervention: 57P01 admin shutdown, 57P02 crash shutdown, 57P03 cannot connect now,
# 57014 cancel), and 53300 (too many connections).
from ._protocol import FAULT_SQLSTATE_CLASSES, FAULT_SQLSTATES


def is_database_fault(error: Optional[BaseException]) -> bool:
    """True for an error with a fault SQLSTATE, and for psycopg's own errors of a
    connection that failed or is gone (an OperationalError without SQLSTATE); False
    for everything else (the application's errors, constraint violations)."""
    if not isinstance(error, psycopg.Error):
        return False
    state = error.sqlstate
    if state is not None:
        return state[:2] in FAULT_SQLSTATE_CLASSES or state in FAULT_SQLSTATES
    return isinstance(error, psycopg.OperationalError)


__all__ = ["FAULT_SQLSTATES", "FAULT_SQLSTATE_CLASSES", "is_database_fault"]

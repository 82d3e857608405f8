"""Many keys in one call: the statements of the extension's batch functions and
what their rows become, shared by ``Client`` and ``AsyncClient`` (each runs them
on its own kind of connection, so the two cannot drift apart).

A batch is one round trip (the clients' methods build the parameters): ``begin_batch`` answers one ``BatchOutcome`` per key,
in input order, each the outcome ``idempotency.begin`` gives that key alone;
``complete_batch`` stores the responses of the started keys;
``claim_batch`` claims each key at most once. ``push_unique`` enqueues a job at
most once: ``idempotency.claim`` and the caller's insert of the job row, in the
caller's transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, List, Optional, Sequence, Tuple

import psycopg
from psycopg.pq import TransactionStatus

from ._common import answer_response
from .http import Response

__all__ = ["BatchFlag", "BatchOutcome"]

# Each row's answer from idempotency.http_answer in the same statement, in the form
# Citus delegates (see _transactional_core.BEGIN_SQL); type base and Retry-After are
# the first six parameters.
BEGIN_BATCH = (
    "SELECT b.ord, b.key, b.outcome, b.response_status, b.response_headers, b.response_body,"
    " b.resource_id, b.created_at, b.expires_at, b.fence, b.lease_until,"
    " CASE WHEN b.outcome <> 'started' THEN (idempotency.http_answer(b, %s::text, %s::integer)).status END,"
    " CASE WHEN b.outcome <> 'started' THEN (idempotency.http_answer(b, %s::text, %s::integer)).headers::text END,"
    " CASE WHEN b.outcome <> 'started' THEN (idempotency.http_answer(b, %s::text, %s::integer)).body END"
    " FROM idempotency.begin_batch(%s, %s::text[], %s, %s::bytea[], %s::interval, %s::interval) AS b"
    " ORDER BY b.ord"
)
COMPLETE_BATCH = (
    "SELECT ord, key, completed FROM idempotency.complete_batch("
    "%s, %s::text[], %s::integer[], %s::bytea[], %s::jsonb[], %s::text[])"
)
CLAIM_BATCH = "SELECT ord, key, claimed FROM idempotency.claim_batch(%s, %s::text[], %s::interval)"
CLAIM = "SELECT idempotency.claim(%s, %s, %s::interval)"


@dataclass(frozen=True)
class BatchOutcome:
    """One row of ``idempotency.begin_batch``: a key's outcome, as ``begin`` gives it."""

    ord: int
    """1-based position of the key in the call's keys."""
    key: str
    outcome: str
    """started, replay, mismatch, in_progress, secret_replay (or an outcome a newer server adds)."""
    response_status: Optional[int]
    response_headers: Any
    """The stored headers (replay): a dict, or a list of [name, value] pairs."""
    response_body: Optional[bytes]
    resource_id: Optional[str]
    created_at: Optional[datetime]
    expires_at: Optional[datetime]
    fence: Optional[int]
    lease_until: Optional[datetime]
    answer: Optional[Response] = None
    """The HTTP answer of an outcome that does not run the work (idempotency.http_answer:
    a replay, 409, 410, 422), None when started."""

    @property
    def started(self) -> bool:
        """The key is held by this transaction: do the work, then complete it."""
        return self.outcome == "started"


@dataclass(frozen=True)
class BatchFlag:
    """One row of ``complete_batch`` (``value``: completed) or ``claim_batch`` (claimed by this call)."""

    ord: int
    key: str
    value: bool


def outcomes(rows: Sequence[Tuple[Any, ...]]) -> List[BatchOutcome]:
    """The rows of BEGIN_BATCH, each with its answer."""
    result = []
    for row in rows:
        status, headers, body = row[11:]
        answer = None if status is None else answer_response(status, headers, body, row[6])
        result.append(BatchOutcome(*row[:11], answer=answer))
    return result


def flags(rows: Sequence[Tuple[Any, ...]]) -> List[BatchFlag]:
    return [BatchFlag(*row) for row in rows]


def require_transaction(conn: Any) -> None:
    """push_unique's claim and the job row must commit together: refuse an
    autocommit connection outside a transaction block, where each would commit alone."""
    if conn.autocommit and conn.pgconn.transaction_status == TransactionStatus.IDLE:
        raise psycopg.ProgrammingError(
            "push_unique needs the caller's transaction: call it inside conn.transaction() "
            "or on a connection that is not in autocommit mode"
        )

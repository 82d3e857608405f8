"""The transactional protocol: the key row and the application's writes commit together.

    client = Client()
    with client.transaction(conn, request) as attempt:
        if attempt.started:
            order_id = conn.execute("INSERT ... RETURNING id", ...).fetchone()[0]
            attempt.respond(Response(201, [("Content-Type", "application/json")], body))
    send(attempt.response)

The attempt owns the transaction on the caller's connection: it sends ``BEGIN``
with ``idempotency.begin(...)`` (the fingerprint computed by
``idempotency.fingerprint`` in the same statement) and ``idempotency.complete(...)``
with ``COMMIT``, so a keyed request takes as many round trips as the same
handler in a plain ``with conn.transaction()`` block. The statements are
prepared once per connection. ``AsyncClient`` (``async_transactional``) is the
same protocol on ``psycopg.AsyncConnection``: both run the steps written once
in ``_transactional_core``.
"""

from __future__ import annotations

import functools
from types import TracebackType
from datetime import timedelta
from typing import Any, Callable, List, Optional, Sequence, Type

import psycopg
from psycopg import errors

from . import _batch
from ._batch import BatchFlag, BatchOutcome
from ._common import Request
from ._transactional_core import AttemptBase, ClientBase, Counters, Options, fingerprint_gen
from .http import Response

__all__ = ["Attempt", "Client", "Counters", "Handler", "Options", "fingerprint"]

Handler = Callable[[psycopg.Connection[Any]], Response]
"""The application's work: runs inside the transaction that holds the key."""


class Attempt(AttemptBase):
    """One pass of a request through the protocol; a context manager (see Client.transaction).

    After ``__enter__``: ``started`` is True when the handler must run (and call
    ``respond``); otherwise ``response`` is ready (replay, 400, 409, 422) and the
    transaction has already ended. After ``__exit__``: ``response`` is what to send.
    """

    def __enter__(self) -> "Attempt":
        self.client._check_idle(self.conn)
        with self.conn.lock:
            self.conn.wait(self.client._enter_gen(self))
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if self.started:
            with self.conn.lock:
                self.conn.wait(self.client._exit_gen(self, exc))


class Client(ClientBase):
    """Runs handlers through the transactional protocol and maps outcomes to HTTP.

    Thread-safe; connections are not (psycopg's rule): one connection per thread
    at a time, passed to each call.
    """

    def is_final(self, conn: psycopg.Connection[Any], status: int) -> bool:
        """Whether a response with this status is stored (idempotency.final_statuses)."""
        self._final.load(conn)
        return self._final(status)

    def transaction(self, conn: psycopg.Connection[Any], request: Request) -> Attempt:
        """A context manager that runs one attempt of ``request`` on ``conn``.

        ``conn`` must be idle (not in a transaction): the attempt opens the
        transaction, and ends it on exit (commit with the stored key, or
        rollback). An exception in the block rolls back, stores nothing and
        propagates. Serialization failures are not retried here; see handle().
        """
        return Attempt(self, conn, request)

    def handle(self, conn: psycopg.Connection[Any], request: Request, handler: Handler) -> Response:
        """Runs ``handler`` through the protocol and returns the response to send.

        Serialization failures (40001) and deadlocks (40P01) rerun the whole
        attempt, handler included, up to ``max_attempts``; then the error
        propagates (map it to 503 with Retry-After). A commit whose outcome is
        unknown (a lost connection) is never retried.
        """
        attempt_number = 1
        while True:
            try:
                with self.transaction(conn, request) as attempt:
                    if attempt.started:
                        attempt.respond(handler(conn))
                assert attempt.response is not None
                return attempt.response
            except (errors.SerializationFailure, errors.DeadlockDetected):
                if attempt_number >= self.options.max_attempts:
                    raise
            attempt_number += 1
            self._count("retries")

    def begin_batch(
        self,
        conn: psycopg.Connection[Any],
        principal: str,
        keys: Sequence[str],
        action: str,
        fingerprints: Sequence[bytes],
        ttl: Optional[timedelta] = None,
        wait: Optional[timedelta] = None,
    ) -> List[BatchOutcome]:
        """``idempotency.begin_batch`` in the caller's transaction: one ``BatchOutcome``
        per key in input order (``fingerprints[i]`` is the request of ``keys[i]``).
        ``ttl`` and ``wait`` default to the client's options. Complete every
        started key (``complete_batch``) before the transaction commits."""
        params = _batch.begin_params(principal, keys, action, fingerprints,
                                     ttl if ttl is not None else self.options.ttl,
                                     wait if wait is not None else self.options.wait)
        return _batch.outcomes(conn.execute(_batch.BEGIN_BATCH, params).fetchall())

    def complete_batch(
        self,
        conn: psycopg.Connection[Any],
        principal: str,
        keys: Sequence[str],
        statuses: Sequence[int],
        bodies: Optional[Sequence[Optional[bytes]]] = None,
        headers: Optional[Sequence[Any]] = None,
        resource_ids: Optional[Sequence[Optional[str]]] = None,
    ) -> List[BatchFlag]:
        """``idempotency.complete_batch``: stores the i-th status, body, headers (a dict
        or [name, value] pairs) and resource id for ``keys[i]``, each begun in this
        transaction. A key that cannot be completed fails the call before anything is stored."""
        params = _batch.complete_params(principal, keys, statuses, bodies, headers, resource_ids)
        return _batch.flags(conn.execute(_batch.COMPLETE_BATCH, params).fetchall())

    def claim_batch(
        self,
        conn: psycopg.Connection[Any],
        principal: str,
        keys: Sequence[str],
        ttl: Optional[timedelta] = None,
    ) -> List[BatchFlag]:
        """``idempotency.claim_batch``: ``value`` is True for the keys this call claimed
        (for ``ttl``, default the client's); the claims commit with the caller's transaction."""
        params = _batch.claim_params(principal, keys, ttl if ttl is not None else self.options.ttl)
        return _batch.flags(conn.execute(_batch.CLAIM_BATCH, params).fetchall())

    def push_unique(
        self,
        conn: psycopg.Connection[Any],
        principal: str,
        key: str,
        ttl: Optional[timedelta],
        enqueue: Callable[[psycopg.Connection[Any]], None],
    ) -> bool:
        """Enqueues a job at most once per key, in the caller's transaction:
        ``idempotency.claim(principal, key, ttl)``; when it is true, runs
        ``enqueue(conn)`` (the caller's insert of the job row) and returns True;
        otherwise returns False without running it. The claim and the job row
        commit together; an exception from ``enqueue`` propagates (roll back then).
        ProgrammingError on an autocommit connection outside a transaction block."""
        _batch.require_transaction(conn)
        row = conn.execute(_batch.CLAIM, (principal, key, ttl)).fetchone()
        if row is None or not row[0]:
            return False
        enqueue(conn)
        return True

    def idempotent(self, handler: Handler) -> Callable[[psycopg.Connection[Any], Request], Response]:
        """Decorator: ``handler(conn)`` becomes ``f(conn, request)`` run through handle()."""

        @functools.wraps(handler)
        def run(conn: psycopg.Connection[Any], request: Request) -> Response:
            return self.handle(conn, request, handler)

        return run


def fingerprint(
    conn: psycopg.Connection[Any],
    method: str,
    path: str,
    body: Optional[bytes] = None,
    exclude: Sequence[str] = (),
) -> bytes:
    """The 32-byte request fingerprint, computed by the server's
    ``idempotency.fingerprint`` with the parameters exactly as ``begin`` sends them
    (one round trip; the protocol itself never needs this call)."""
    with conn.lock:
        return conn.wait(fingerprint_gen(conn, method, path, body, exclude))

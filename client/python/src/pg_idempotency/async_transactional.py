"""The transactional protocol: the key row and the application's writes commit together.

    client = AsyncClient()
    async with client.transaction(conn, request) as attempt:
        if attempt.started:
            cur = await conn.execute("INSERT ... RETURNING id", ...)
            attempt.respond(Response(201, [("Content-Type", "application/json")], body))
    send(attempt.response)

The attempt owns the transaction on the caller's connection: it sends ``BEGIN``
with ``idempotency.begin(...)`` (the fingerprint computed by
``idempotency.fingerprint``, an outcome that does not run the handler answered by
``idempotency.http_answer``, all in the same statement) and
``idempotency.complete(...)`` with ``COMMIT``, so a keyed request takes as many
round trips as the same handler in a plain transaction block. The statements are
prepared once per connection.

The async and the sync client are one text: the sync module is generated from the
async one by client/python/tools/async_to_sync.py. Both run the steps of
``_transactional_core``, which does no I/O of its own.
"""

from __future__ import annotations

import functools
from types import TracebackType
from datetime import timedelta
from typing import Any, Awaitable, Callable, List, Optional, Sequence, Type  # async only
# sync only: from typing import Any, Callable, List, Optional, Sequence, Type

import psycopg
from psycopg import errors
from psycopg.types.json import Jsonb

from . import _batch
from ._batch import BatchFlag, BatchOutcome
from ._common import NOT_STORED, Request
from ._transactional_core import AttemptBase, ClientBase, Counters, Options, fingerprint_gen
from .http import Response

__all__ = ["AsyncAttempt", "AsyncClient", "AsyncHandler", "Counters", "Options", "fingerprint_async"]

AsyncHandler = Callable[[psycopg.AsyncConnection[Any]], Awaitable[Response]]
"""The application's work: runs inside the transaction that holds the key."""


class AsyncAttempt(AttemptBase):
    """One pass of a request through the protocol; a context manager (see AsyncClient.transaction).

    After ``__aenter__``: ``started`` is True when the handler must run (and call
    ``respond``); otherwise ``response`` is ready (replay, 400, 409, 410, 422) and the
    transaction has already ended. After ``__aexit__``: ``response`` is what to send.
    """

    async def __aenter__(self) -> "AsyncAttempt":
        self.client._check_idle(self.conn)
        async with self.conn.lock:
            await self.conn.wait(self.client._enter_gen(self))
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if self.started:
            async with self.conn.lock:
                await self.conn.wait(self.client._exit_gen(self, exc))


class AsyncClient(ClientBase):
    """Runs handlers through the transactional protocol and answers with HTTP.

    One client serves every thread or task; a connection serves one request at a
    time (psycopg's rule), passed to each call.
    """

    async def storage(self, conn: psycopg.AsyncConnection[Any], status: int) -> str:
        """What a handler's response with this status does, as idempotency.http_storage
        says (read once per client): "committed_with_key", "saved_after_rollback" or
        "not_stored"."""
        async with conn.lock:
            await conn.wait(self._final.load_gen(conn))
        return self._final.meaning(status)

    async def is_final(self, conn: psycopg.AsyncConnection[Any], status: int) -> bool:
        """Whether a response with this status is stored (idempotency.http_storage)."""
        return await self.storage(conn, status) != NOT_STORED

    def transaction(self, conn: psycopg.AsyncConnection[Any], request: Request) -> AsyncAttempt:
        """A context manager that runs one attempt of ``request`` on ``conn``.

        ``conn`` must be idle (not in a transaction): the attempt opens the
        transaction, and ends it on exit (commit with the stored key, or
        rollback). An exception in the block rolls back, stores nothing and
        propagates; so does a cancellation (nothing is stored).
        Serialization failures are not retried here; see handle().
        """
        return AsyncAttempt(self, conn, request)

    async def handle(
        self, conn: psycopg.AsyncConnection[Any], request: Request, handler: AsyncHandler
    ) -> Response:
        """Runs ``handler`` through the protocol and returns the response to send.

        Serialization failures (40001) and deadlocks (40P01) rerun the whole
        attempt, handler included, up to ``max_attempts``; then the error
        propagates (map it to 503 with Retry-After). A commit whose outcome is
        unknown (a lost connection) is never retried.
        """
        attempt_number = 1
        while True:
            try:
                async with self.transaction(conn, request) as attempt:
                    if attempt.started:
                        attempt.respond(await handler(conn))
                assert attempt.response is not None
                return attempt.response
            except (errors.SerializationFailure, errors.DeadlockDetected):
                if attempt_number >= self.options.max_attempts:
                    raise
            attempt_number += 1
            self._count("retries")

    async def begin_batch(
        self,
        conn: psycopg.AsyncConnection[Any],
        principal: str,
        keys: Sequence[str],
        action: str,
        fingerprints: Sequence[bytes],
        ttl: Optional[timedelta] = None,
        wait: Optional[timedelta] = None,
    ) -> List[BatchOutcome]:
        """``idempotency.begin_batch`` in the caller's transaction: one ``BatchOutcome``
        per key in input order (``fingerprints[i]`` is the request of ``keys[i]``), with
        the HTTP answer of each key that does not start (``answer``, from the extension).
        ``ttl`` and ``wait`` default to the client's options. Complete every
        started key (``complete_batch``) before the transaction commits."""
        if len(fingerprints) != len(keys):
            raise ValueError("begin_batch: one fingerprint per key")
        options = self.options
        # Type base and Retry-After thrice (the three http_answer columns), then begin_batch's.
        params = (options.problem_type_base, options.retry_after) * 3 + (
            principal, list(keys), action, [bytes(f) for f in fingerprints],
            ttl if ttl is not None else options.ttl, wait if wait is not None else options.wait)
        return _batch.outcomes(await (await conn.execute(_batch.BEGIN_BATCH, params)).fetchall())

    async def complete_batch(
        self,
        conn: psycopg.AsyncConnection[Any],
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
        for name, values in (("statuses", statuses), ("bodies", bodies), ("headers", headers),
                             ("resource_ids", resource_ids)):
            if values is not None and len(values) != len(keys):
                raise ValueError(f"complete_batch: {name} must have one element per key")
        params = (
            principal,
            list(keys),
            list(statuses),
            None if bodies is None else [None if b is None else bytes(b) for b in bodies],
            None if headers is None else [None if h is None else Jsonb(h) for h in headers],
            None if resource_ids is None else list(resource_ids),
        )
        return _batch.flags(await (await conn.execute(_batch.COMPLETE_BATCH, params)).fetchall())

    async def claim_batch(
        self,
        conn: psycopg.AsyncConnection[Any],
        principal: str,
        keys: Sequence[str],
        ttl: Optional[timedelta] = None,
    ) -> List[BatchFlag]:
        """``idempotency.claim_batch``: ``value`` is True for the keys this call claimed
        (for ``ttl``, default the client's); the claims commit with the caller's transaction."""
        params = (principal, list(keys), ttl if ttl is not None else self.options.ttl)
        return _batch.flags(await (await conn.execute(_batch.CLAIM_BATCH, params)).fetchall())

    async def push_unique(
        self,
        conn: psycopg.AsyncConnection[Any],
        principal: str,
        key: str,
        ttl: Optional[timedelta],
        enqueue: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]],
    ) -> bool:
        """Enqueues a job at most once per key, in the caller's transaction:
        ``idempotency.claim(principal, key, ttl)``; when it is true, runs
        ``enqueue(conn)`` (the caller's insert of the job row) and returns True;
        otherwise returns False without running it. The claim and the job row
        commit together; an exception from ``enqueue`` propagates (roll back then).
        ProgrammingError on an autocommit connection outside a transaction block."""
        _batch.require_transaction(conn)
        row = await (await conn.execute(_batch.CLAIM, (principal, key, ttl))).fetchone()
        if row is None or not row[0]:
            return False
        await enqueue(conn)
        return True

    def idempotent(
        self, handler: AsyncHandler
    ) -> Callable[[psycopg.AsyncConnection[Any], Request], Awaitable[Response]]:
        """Decorator: ``handler(conn)`` becomes ``f(conn, request)`` run through handle()."""

        @functools.wraps(handler)
        async def run(conn: psycopg.AsyncConnection[Any], request: Request) -> Response:
            return await self.handle(conn, request, handler)

        return run


async def fingerprint_async(
    conn: psycopg.AsyncConnection[Any],
    method: str,
    path: str,
    body: Optional[bytes] = None,
    exclude: Sequence[str] = (),
) -> bytes:
    """The 32-byte request fingerprint, computed by the server's
    ``idempotency.fingerprint`` with the parameters exactly as ``begin`` sends them
    (one round trip; the protocol itself never needs this call)."""
    async with conn.lock:
        return await conn.wait(fingerprint_gen(conn, method, path, body, exclude))

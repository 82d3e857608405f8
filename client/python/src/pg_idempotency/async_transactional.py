"""The transactional protocol on ``psycopg.AsyncConnection``: ``AsyncClient``.

    client = AsyncClient()
    async with client.transaction(conn, request) as attempt:
        if attempt.started:
            cur = await conn.execute("INSERT ... RETURNING id", ...)
            attempt.respond(Response(201, [("Content-Type", "application/json")], body))
    send(attempt.response)

The twin of ``Client`` (``transactional``): the same options, outcomes,
statements and round trips, run with ``await conn.wait`` instead of
``conn.wait`` (both shells run the steps of ``_transactional_core``).
tests/test_async.py compares the two public APIs name by name.
"""

from __future__ import annotations

import functools
from types import TracebackType
from typing import Any, Awaitable, Callable, Optional, Sequence, Type

import psycopg
from psycopg import errors

from ._common import Request
from ._transactional_core import AttemptBase, ClientBase, Counters, Options, fingerprint_gen
from .http import Response

__all__ = ["AsyncAttempt", "AsyncClient", "AsyncHandler", "Counters", "Options", "fingerprint_async"]

AsyncHandler = Callable[[psycopg.AsyncConnection[Any]], Awaitable[Response]]
"""The application's work: a coroutine that runs inside the transaction that holds the key."""


class AsyncAttempt(AttemptBase):
    """One pass of a request through the protocol; an async context manager
    (see AsyncClient.transaction). Same members as ``Attempt``."""

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
    """Runs coroutine handlers through the transactional protocol and maps
    outcomes to HTTP. One client serves every task; a connection serves one
    request at a time."""

    async def is_final(self, conn: psycopg.AsyncConnection[Any], status: int) -> bool:
        """Whether a response with this status is stored (idempotency.final_statuses)."""
        await self._final.load_async(conn)
        return self._final(status)

    def transaction(self, conn: psycopg.AsyncConnection[Any], request: Request) -> AsyncAttempt:
        """An async context manager that runs one attempt of ``request`` on ``conn``.

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
        """Awaits ``handler`` through the protocol and returns the response to send.

        Serialization failures (40001) and deadlocks (40P01) rerun the whole
        attempt, handler included, up to ``max_attempts``; then the error
        propagates (map it to 503 with Retry-After).
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

    def idempotent(
        self, handler: AsyncHandler
    ) -> Callable[[psycopg.AsyncConnection[Any], Request], Awaitable[Response]]:
        """Decorator: ``async handler(conn)`` becomes ``async f(conn, request)`` run through handle()."""

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
    """``fingerprint`` on an async connection."""
    async with conn.lock:
        return await conn.wait(fingerprint_gen(conn, method, path, body, exclude))

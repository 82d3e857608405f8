"""The lease protocol on asyncio: ``AsyncLeaseRunner``.

    runner = AsyncLeaseRunner("dbname=shop", LeaseOptions(policy=Policy.REMEMBER))
    result = await runner.run(request, lambda: call_payment_provider(...))
    send(result.response)

The twin of ``LeaseRunner`` (``lease``): the same options, outcomes and
statements (the decisions live in ``LeaseRunnerBase``); the body is a
coroutine function, and the lease is renewed by a task on its own
``psycopg.AsyncConnection`` while the body runs. A cancelled body keeps the
key as the policy says for a failure (``ONCE``: done; the others: released),
then the cancellation propagates.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Optional

import psycopg

from ._common import Request, interval
from .http import Response
from .lease import (
    ACQUIRE_SQL,
    RENEW_SQL,
    STORED_EXPIRY_SQL,
    LeaseOptions,
    LeaseResult,
    LeaseRunnerBase,
    Policy,
)

__all__ = ["AsyncBody", "AsyncLeaseRunner"]

AsyncBody = Callable[[], Awaitable[Response]]
"""The effect: a coroutine function, run outside any database transaction."""


class _AsyncRenewer:
    """Renews a lease from a task on its own connection until stopped (see _Renewer)."""

    def __init__(self, conninfo: str, principal: str, key: str, fence: int, options: LeaseOptions):
        self._args = (principal, key, fence, interval(options.lease))
        self._conninfo = conninfo
        self._period = max(0.05, options.lease.total_seconds() / 3)
        self._max_failures = options.max_renew_failures
        self.lost = False
        self.renewals = 0
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass

    async def _loop(self) -> None:
        conn: Optional[psycopg.AsyncConnection[Any]] = None
        failures = 0
        try:
            while True:
                await asyncio.sleep(self._period)
                try:
                    if conn is None or conn.closed:
                        conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
                    row = await (await conn.execute(RENEW_SQL, self._args)).fetchone()
                    failures = 0
                    if row is not None and row[0]:
                        self.renewals += 1
                    else:
                        self.lost = True
                        return
                except psycopg.Error:
                    if conn is not None:
                        await conn.close()
                    conn = None
                    failures += 1
                    if failures >= self._max_failures:
                        return
        finally:
            if conn is not None:
                await conn.close()


class AsyncLeaseRunner(LeaseRunnerBase):
    """Runs external effects under leases. Not task-safe: one runner per task
    (or a lock around run)."""

    def __init__(self, conninfo: str, options: Optional[LeaseOptions] = None) -> None:
        """``conninfo`` opens the runner's own connection (acquire, complete,
        release, autocommit) and one per run for the renewal task."""
        super().__init__(conninfo, options)
        self._conn: Optional[psycopg.AsyncConnection[Any]] = None

    async def connection(self) -> psycopg.AsyncConnection[Any]:
        """The runner's own autocommit connection, reopened when it was lost."""
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True)
        return self._conn

    async def close(self) -> None:
        """Closes the runner's connection."""
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    async def run(self, request: Request, body: AsyncBody) -> LeaseResult:
        """Acquires the key, awaits ``body`` while renewing the lease, and settles
        the key by the policy. The body's exception (or cancellation) propagates
        after the key was settled (once: marked done; the other policies: released)."""
        rejected = self._rejected(request)
        if rejected is not None:
            return rejected
        conn = await self.connection()
        if self.options.policy == Policy.REMEMBER:
            await self._final.load_async(conn)  # known before holding anything
        try:
            row = await (await conn.execute(ACQUIRE_SQL, self._acquire_params(request))).fetchone()
        except psycopg.Error as error:
            return self._refused(error)
        assert row is not None
        answered = self._answer(row)
        if answered is not None:
            return answered
        fence = row[1]
        renewer = None
        if self.options.renew:
            renewer = _AsyncRenewer(self.conninfo, request.principal, request.key or "", fence, self.options)
        failure: Optional[BaseException] = None
        response = Response()
        try:
            response = await body()
        except BaseException as error:  # settled by the policy, then re-raised
            failure = error
        if renewer is not None:
            await renewer.stop()
        sql, params = self._settlement(request, fence, failure is not None, response)
        # The settlement must not be lost to a second cancellation: shielded.
        settled = await asyncio.shield(self._settle(sql, params))
        if failure is not None:
            raise failure
        expires, read = self._settled_expiry(sql, settled, row[7])
        if read:
            conn = await self.connection()
            stored = await (await conn.execute(STORED_EXPIRY_SQL, (request.principal, request.key))).fetchone()
            expires = None if stored is None or stored[0] is None else int(stored[0])
        lost, renewals = (renewer.lost, renewer.renewals) if renewer is not None else (False, 0)
        return self._fresh(row, settled, lost, renewals, response, expires)

    async def _settle(self, sql: str, params: tuple) -> bool:
        conn = await self.connection()
        row = await (await conn.execute(sql, params)).fetchone()
        return bool(row[0]) if row is not None else False

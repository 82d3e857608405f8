"""The lease protocol: an effect outside the database (an upstream HTTP call, a
payment provider, a broker) at most once per key.

    runner = AsyncLeaseRunner("dbname=shop", LeaseOptions(policy=Policy.REMEMBER))
    result = await runner.run(request, lambda: call_payment_provider(...))
    send(result.response)

The key is held by a lease that is renewed in the background at a third of its
length while the body runs (a thread with its own connection for the sync runner,
a task with its own async connection for the async one); every statement that
settles the key is fenced. A cancelled body keeps the key as the policy says for a
failure (``ONCE``: done; the others: released), then the cancellation propagates.

The async and the sync runner are one text: the sync module is generated from the
async one by client/python/tools/async_to_sync.py. Both make every decision in
``_lease_core``, which does no I/O of its own.
"""

from __future__ import annotations

import asyncio  # sync: import threading
from typing import Any, Awaitable, Callable, Optional  # async only
# sync only: from typing import Any, Callable, Optional

import psycopg

from ._common import Request, interval
from ._lease_core import (
    ACQUIRE_SQL,
    RENEW_SQL,
    STORED_EXPIRY_SQL,
    LeaseOptions,
    LeaseOutcome,
    LeaseResult,
    LeaseRunnerBase,
    Policy,
)
from .http import Response

__all__ = ["AsyncBody", "AsyncLeaseRunner", "LeaseOptions", "LeaseOutcome", "LeaseResult", "Policy"]

AsyncBody = Callable[[], Awaitable[Response]]
"""The effect: runs outside any database transaction."""


class AsyncRenewer:
    """Renews a lease on its own connection until stopped, in the background: a task
    on the event loop (the sync runner's: a thread).

    renew() returning false means the fence lost the key: renewing stops and the
    lease counts as lost. An error (network, restart) is retried at the next
    tick; after max_failures in a row renewing stops without declaring it lost.
    """

    def __init__(self, conninfo: str, principal: str, key: str, fence: int, options: LeaseOptions):
        """Starts renewing ``key``'s lease held with ``fence`` every third of its length."""
        self._args = (principal, key, fence, interval(options.lease))
        self._conninfo = conninfo
        self._period = max(0.05, options.lease.total_seconds() / 3)
        self._max_failures = options.max_renew_failures
        self.lost = False
        self.renewals = 0
        self._stop = asyncio.Event()  # sync: self._stop = threading.Event()
        self._worker = asyncio.get_running_loop().create_task(self._loop())  # async only
        # sync only: self._worker = threading.Thread(target=self._loop, name="pg_idempotency-renew", daemon=True)
        # sync only: self._worker.start()

    async def stop(self) -> None:
        """Stops renewing; returns once the renewal ended (the task's renewal in flight
        is cancelled, the thread's finishes)."""
        self._stop.set()
        self._worker.cancel()  # async only
        await asyncio.gather(self._worker, return_exceptions=True)  # sync: self._worker.join()

    async def _loop(self) -> None:
        conn: Optional[psycopg.AsyncConnection[Any]] = None
        failures = 0
        try:
            while not await _stopped(self._stop, self._period):  # async only
            # sync only: while not self._stop.wait(self._period):
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


# async only: begin
async def _stopped(stop: asyncio.Event, period: float) -> bool:
    """Waits up to ``period`` seconds for ``stop``; True when it was set."""
    try:
        await asyncio.wait_for(stop.wait(), period)
    except asyncio.TimeoutError:
        return False
    return True


# async only: end
class AsyncLeaseRunner(LeaseRunnerBase):
    """Runs external effects under leases. Not safe to share: one runner per thread
    or task (or a lock around run)."""

    def __init__(self, conninfo: str, options: Optional[LeaseOptions] = None) -> None:
        """``conninfo`` opens the runner's own connection (acquire, complete,
        release, autocommit) and one per run for the renewal."""
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
        """Acquires the key, runs ``body`` while renewing the lease, and settles
        the key by the policy. The body's exception (or cancellation) propagates
        after the key was settled (once: marked done; the other policies: released)."""
        rejected = self._rejected(request)
        if rejected is not None:
            return rejected
        conn = await self.connection()
        if self.options.policy == Policy.REMEMBER:
            async with conn.lock:  # known before holding anything
                await conn.wait(self._final.load_gen(conn))
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
            renewer = AsyncRenewer(self.conninfo, request.principal, request.key or "", fence, self.options)
        failure: Optional[BaseException] = None
        response = Response()
        try:
            response = await body()
        except BaseException as error:  # settled by the policy, then re-raised
            failure = error
        if renewer is not None:
            await renewer.stop()
        sql, params = self._settlement(request, fence, failure is not None, response)
        # The settlement must not be lost to a second cancellation: shielded (async).
        settled = await asyncio.shield(self._settle(sql, params))  # async only
        # sync only: settled = self._settle(sql, params)
        if failure is not None:
            raise failure
        expires, read = self._settled_expiry(sql, settled, row[3])
        if read:
            conn = await self.connection()
            stored = await (await conn.execute(STORED_EXPIRY_SQL, (request.principal, request.key))).fetchone()
            expires = None if stored is None or stored[0] is None else int(stored[0])
        lost, renewals = (renewer.lost, renewer.renewals) if renewer is not None else (False, 0)
        return self._fresh(row, settled, lost, renewals, response, expires)

    async def _settle(self, sql: str, params: tuple) -> bool:
        """Runs the fenced settlement; True when it settled the key."""
        conn = await self.connection()
        row = await (await conn.execute(sql, params)).fetchone()
        return bool(row[0]) if row is not None else False

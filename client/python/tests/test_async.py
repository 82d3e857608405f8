"""The asyncio twins (AsyncClient, AsyncLeaseRunner) against a live database,
driven with asyncio.run (no pytest plugin), and their public API compared with
the sync classes name by name so the two cannot drift apart."""

from __future__ import annotations

import asyncio
import inspect
import uuid
from datetime import timedelta

import psycopg
import pytest
from roundtrips import count_round_trips_async

import pg_idempotency
from pg_idempotency import (
    AsyncAttempt,
    AsyncClient,
    AsyncLeaseRunner,
    Attempt,
    Client,
    LeaseOptions,
    LeaseOutcome,
    LeaseRunner,
    Policy,
    Request,
    Response,
)
from pg_idempotency._transactional_core import BEGIN_NAME

INSERT = "INSERT INTO orders (principal, item, quantity) VALUES (%s, 'async', 1) RETURNING id"
TWINS = [(Client, AsyncClient), (Attempt, AsyncAttempt), (LeaseRunner, AsyncLeaseRunner)]
SYNC_ONLY_TO_ASYNC = {"__enter__": "__aenter__", "__exit__": "__aexit__"}


def public(cls):
    return {
        name: member
        for name, member in inspect.getmembers(cls)
        if (not name.startswith("_") or name in SYNC_ONLY_TO_ASYNC or name in ("__aenter__", "__aexit__"))
        and callable(member)
    }


@pytest.mark.parametrize("sync_cls, async_cls", TWINS, ids=lambda c: c.__name__)
def test_the_async_twin_has_the_same_api(sync_cls, async_cls):
    sync_api, async_api = public(sync_cls), public(async_cls)
    expected = {SYNC_ONLY_TO_ASYNC.get(name, name) for name in sync_api}
    assert set(async_api) == expected
    for name, member in sync_api.items():
        twin = async_api[SYNC_ONLY_TO_ASYNC.get(name, name)]
        sync_params = list(inspect.signature(member).parameters)
        assert list(inspect.signature(twin).parameters) == sync_params, name
        # What waits on the database is a coroutine in the twin; what does not stays
        # plain; what the shared base defines is one function for both.
        if twin is member:
            continue
        if name in ("transaction", "idempotent"):
            assert not inspect.iscoroutinefunction(twin), name
        elif name not in ("__init__",):
            assert inspect.iscoroutinefunction(twin), name


def test_every_sync_name_of_the_package_has_its_async_twin():
    assert inspect.signature(pg_idempotency.fingerprint).parameters.keys() == (
        inspect.signature(pg_idempotency.fingerprint_async).parameters.keys()
    )
    for name in ("AsyncClient", "AsyncAttempt", "AsyncHandler", "AsyncLeaseRunner", "AsyncBody", "fingerprint_async"):
        assert name in pg_idempotency.__all__, name


def handler(principal, status=201):
    async def run(conn):
        cur = await conn.execute(INSERT, (principal,))
        (order_id,) = await cur.fetchone()
        return Response(status, [("Content-Type", "application/json"), ("Location", f"/o/{order_id}")],
                        b'{"id":%d}' % order_id, resource_id=str(order_id))

    return run


def orders(admin, principal):
    return admin.execute("SELECT count(*) FROM orders WHERE principal = %s", (principal,)).fetchone()[0]


def test_first_request_replay_mismatch_and_final_error(dsn, admin, principal):
    async def main():
        client = AsyncClient()
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            key = uuid.uuid4().hex
            first = await client.handle(conn, Request(principal, key, "POST", "/o", b'{"a":1}'), handler(principal))
            retry = await client.handle(conn, Request(principal, key, "POST", "/o", b'{ "a" : 1.0 }'),
                                        handler(principal))
            other = await client.handle(conn, Request(principal, key, "POST", "/o", b'{"a":2}'), handler(principal))
            refused_key = uuid.uuid4().hex
            refused = await client.handle(conn, Request(principal, refused_key, "POST", "/o", b"{}"),
                                          handler(principal, 422))
            refused_again = await client.handle(conn, Request(principal, refused_key, "POST", "/o", b"{}"),
                                                handler(principal, 422))
            missing = await client.handle(conn, Request(principal, None, "POST", "/o", b"{}"), handler(principal))
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            return first, retry, other, refused, refused_again, missing, client.counters

    first, retry, other, refused, refused_again, missing, counters = asyncio.run(main())
    assert first.status == 201 and not first.replayed
    assert retry.replayed and retry.body == first.body and retry.header("Location") == first.header("Location")
    assert retry.header("Idempotent-Replay") == "true"
    assert other.status == 422 and b"idempotency-key-reuse" in other.body
    assert refused.status == 422 and refused_again.replayed and refused_again.body == refused.body
    assert missing.status == 400
    assert orders(admin, principal) == 1  # the 422 handler's insert was rolled back
    assert (counters.started, counters.replayed, counters.mismatched, counters.stored_errors) == (2, 2, 1, 1)


def test_the_context_manager_and_an_exception(dsn, admin, principal):
    async def main():
        client = AsyncClient()
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            request = Request(principal, uuid.uuid4().hex, "POST", "/o", b"{}")
            with pytest.raises(RuntimeError):
                async with client.transaction(conn, request) as attempt:
                    assert attempt.started
                    await conn.execute(INSERT, (principal,))
                    raise RuntimeError("bug")
            async with client.transaction(conn, request) as attempt:
                assert attempt.started  # nothing was stored: the retry runs
                attempt.respond(await handler(principal)(conn))
            return attempt.response

    response = asyncio.run(main())
    assert response.status == 201
    assert orders(admin, principal) == 1


def test_a_key_held_by_another_transaction_is_409_with_retry_after(dsn, admin, principal):
    key = uuid.uuid4().hex
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT idempotency.begin(%s, %s, 'x', idempotency.fingerprint('POST', '/o', %s))",
                       (principal, key, b"{}"))

        async def main():
            options = pg_idempotency.Options(wait=timedelta(milliseconds=100))
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                return await AsyncClient(options).handle(conn, Request(principal, key, "POST", "/o", b"{}"),
                                                         handler(principal))

        busy = asyncio.run(main())
        holder.rollback()
    assert busy.status == 409 and busy.header("Retry-After") == "1"
    assert orders(admin, principal) == 0


def test_concurrent_tasks_under_one_key_have_one_effect(dsn, admin, principal):
    key = uuid.uuid4().hex

    async def one(client, delay):
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            async def slow(c):
                await c.execute("SELECT pg_sleep(%s)", (delay,))
                return await handler(principal)(c)

            return await client.handle(conn, Request(principal, key, "POST", "/o", b"{}"), slow)

    async def main():
        client = AsyncClient()
        return await asyncio.gather(one(client, 0.5), one(client, 0.5))

    a, b = asyncio.run(main())
    assert {a.replayed, b.replayed} == {False, True}
    assert a.body == b.body
    assert orders(admin, principal) == 1


def test_prepared_once_and_re_prepared_after_discard_all(dsn, principal):
    async def main():
        client = AsyncClient()
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            await client.handle(conn, Request(principal, uuid.uuid4().hex, "POST", "/o", b"{}"), handler(principal))
            cur = await conn.execute("SELECT name FROM pg_prepared_statements")
            names = {name for (name,) in await cur.fetchall()}
            await conn.rollback()
            await conn.set_autocommit(True)
            await conn.execute("DISCARD ALL")
            await conn.set_autocommit(False)
            after = await client.handle(conn, Request(principal, uuid.uuid4().hex, "POST", "/o", b"{}"),
                                        handler(principal))
            return names, after

    names, after = asyncio.run(main())
    assert BEGIN_NAME.decode() in names
    assert after.status == 201


def test_async_round_trips(dsn, principal):
    """Counted from libpq's trace around a whole coroutine run: as many as the sync client."""

    async def main():
        client = AsyncClient()
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            await client.handle(conn, Request(principal, uuid.uuid4().hex, "POST", "/o", b"{}"), handler(principal))

            async def plain():
                async with conn.transaction():
                    await handler(principal)(conn)

            request = Request(principal, uuid.uuid4().hex, "POST", "/o", b"{}")
            return (await count_round_trips_async(conn, plain),
                    await count_round_trips_async(conn, lambda: client.handle(conn, request, handler(principal))),
                    await count_round_trips_async(conn, lambda: client.handle(conn, request, handler(principal))))

    assert asyncio.run(main()) == (3, 3, 2)


def lease_request(principal, key, body=b'{"amount":1}'):
    return Request(principal, key, "POST", "/payments", body)


def test_async_lease_policies(dsn, principal):
    calls = []

    async def pay():
        calls.append(1)
        await asyncio.sleep(0)
        return Response(201, [("Content-Type", "application/json")], b'{"paid":true}')

    async def main():
        remember = AsyncLeaseRunner(dsn, LeaseOptions(policy=Policy.REMEMBER))
        once = AsyncLeaseRunner(dsn, LeaseOptions(policy=Policy.ONCE))
        key, key2 = uuid.uuid4().hex, uuid.uuid4().hex
        try:
            return (await remember.run(lease_request(principal, key), pay),
                    await remember.run(lease_request(principal, key), pay),
                    await remember.run(lease_request(principal, key, b'{"amount":2}'), pay),
                    await once.run(lease_request(principal, key2), pay),
                    await once.run(lease_request(principal, key2), pay),
                    await once.run(lease_request(principal, None), pay))
        finally:
            await remember.close()
            await once.close()

    fresh, replay, mismatch, once_fresh, duplicate, rejected = asyncio.run(main())
    assert fresh.outcome == LeaseOutcome.FRESH and fresh.fence > 0
    assert replay.outcome == LeaseOutcome.REPLAYED and replay.response.body == b'{"paid":true}'
    assert mismatch.outcome == LeaseOutcome.MISMATCH and mismatch.response.status == 422
    assert once_fresh.outcome == LeaseOutcome.FRESH
    assert duplicate.outcome == LeaseOutcome.DUPLICATE and duplicate.response.status == 409
    assert rejected.outcome == LeaseOutcome.REJECTED and rejected.response.status == 400
    assert len(calls) == 2


def test_async_lease_renews_across_a_long_body_and_a_cancel_releases(dsn, admin, principal):
    key, key2 = uuid.uuid4().hex, uuid.uuid4().hex

    async def slow():
        await asyncio.sleep(0.8)  # longer than the lease: only renewal keeps it
        return Response(201, [], b"ok")

    async def main():
        runner = AsyncLeaseRunner(dsn, LeaseOptions(policy=Policy.COMMIT_ON_SUCCESS, lease=timedelta(milliseconds=300)))
        try:
            long = await runner.run(lease_request(principal, key), slow)
            task = asyncio.ensure_future(runner.run(lease_request(principal, key2), slow))
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            again = await runner.run(lease_request(principal, key2), slow)
            return long, again
        finally:
            await runner.close()

    long, again = asyncio.run(main())
    assert long.outcome == LeaseOutcome.FRESH and long.renewals >= 1
    assert again.outcome == LeaseOutcome.FRESH  # the cancelled run released the key

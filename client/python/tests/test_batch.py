"""Many keys in one call (begin_batch, complete_batch, claim_batch) and
push_unique, on Client and on AsyncClient, against a live database."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import psycopg
import pytest
from psycopg import errors

from pg_idempotency import AsyncClient, BatchFlag, Client


def fp(text: str) -> bytes:
    return (text.encode() * 32)[:32]


def test_every_outcome_in_input_order_then_replays(conn, admin, principal):
    client = Client()
    with conn.transaction():
        conn.execute("SELECT * FROM idempotency.begin(%s, 'done', 'consume', %s)", (principal, fp("d")))
        conn.execute("SELECT idempotency.complete(%s, 'done', 200, resource_id => 'r-d')", (principal,))
    keys = ["m-3", "m-1", "done", "m-2"]
    with conn.transaction():
        rows = client.begin_batch(conn, principal, keys, "consume", [fp("3"), fp("1"), fp("x"), fp("2")],
                                  ttl=timedelta(hours=2), wait=timedelta(0))
        assert [(r.ord, r.key, r.outcome) for r in rows] == [
            (1, "m-3", "started"), (2, "m-1", "started"), (3, "done", "mismatch"), (4, "m-2", "started")]
        assert [r.started for r in rows] == [True, True, False, True]
        assert rows[2].resource_id == "r-d" and rows[2].response_status is None
        # Each row's answer from idempotency.http_answer, in the same statement.
        assert [r.answer is None for r in rows] == [True, True, False, True]
        assert rows[2].answer.status == 422 and b"idempotency-key-reuse" in rows[2].answer.body
        assert rows[0].expires_at - rows[0].created_at == timedelta(hours=2)
        assert all(r.fence is not None for r in rows)
        done = client.complete_batch(conn, principal, ["m-3", "m-1", "m-2"], [201, 200, 422],
                                     bodies=[b"three", None, b"bad"],
                                     headers=[{"Location": "/m/3"}, None, [["Link", "</a>"], ["Link", "</b>"]]],
                                     resource_ids=["3", None, None])
        assert done == [BatchFlag(1, "m-3", True), BatchFlag(2, "m-1", True), BatchFlag(3, "m-2", True)]
    rows = client.begin_batch(conn, principal, ["m-1", "m-2", "m-3"], "consume", [fp("1"), fp("2"), fp("3")])
    conn.rollback()
    assert [r.outcome for r in rows] == ["replay"] * 3
    assert (rows[0].response_status, rows[0].response_body) == (200, None)
    assert (rows[1].response_status, rows[1].response_body) == (422, b"bad")
    assert rows[1].response_headers == [["Link", "</a>"], ["Link", "</b>"]]
    assert (rows[2].response_body, rows[2].response_headers, rows[2].resource_id) == (
        b"three", {"Location": "/m/3"}, "3")
    replay = rows[1].answer
    assert replay.status == 422 and replay.body == b"bad" and replay.replayed
    assert [n for n, _ in replay.headers] == ["Link", "Link", "Idempotent-Replay", "Idempotency-Expires"]
    assert admin.execute("SELECT count(*) FROM idempotency.keys WHERE principal = %s",
                         (principal,)).fetchone()[0] == 4


def test_refusals_carry_the_sqlstate(conn, principal):
    client = Client()
    with pytest.raises(ValueError):
        client.begin_batch(conn, principal, ["a", "b"], "consume", [fp("a")])
    with pytest.raises(ValueError):
        client.complete_batch(conn, principal, ["a", "b"], [200])
    with pytest.raises(errors.InvalidParameterValue):  # 22023: a key twice
        client.begin_batch(conn, principal, ["a", "a"], "consume", [fp("a"), fp("a")])
    conn.rollback()
    with pytest.raises(errors.ProgramLimitExceeded):  # 54000: over 1000 keys
        client.claim_batch(conn, principal, [f"k{i}" for i in range(1001)])
    conn.rollback()
    with pytest.raises(errors.ObjectNotInPrerequisiteState):  # 55000: not begun here
        client.complete_batch(conn, principal, ["never"], [200])
    conn.rollback()
    assert client.begin_batch(conn, principal, [], "consume", []) == []
    assert client.claim_batch(conn, principal, []) == []
    conn.rollback()


def test_claim_batch_and_push_unique(conn, admin, principal):
    client = Client()
    admin.execute("CREATE TABLE IF NOT EXISTS jobs (principal text, key text)")
    with conn.transaction():
        assert [f.value for f in client.claim_batch(conn, principal, ["j-2", "j-1"], ttl=timedelta(hours=1))] \
            == [True, True]
        assert [f.value for f in client.claim_batch(conn, principal, ["j-1", "j-3"])] == [False, True]
    runs = []

    def enqueue(key):
        def run(c):
            runs.append(key)
            c.execute("INSERT INTO jobs VALUES (%s, %s)", (principal, key))
        return run

    with pytest.raises(RuntimeError):
        with conn.transaction():
            assert client.push_unique(conn, principal, "p-1", timedelta(hours=1), enqueue("p-1"))
            raise RuntimeError("the caller fails after enqueueing: both roll back")
    with conn.transaction():
        assert client.push_unique(conn, principal, "p-1", None, enqueue("p-1"))
        assert not client.push_unique(conn, principal, "j-3", None, enqueue("j-3"))
    with conn.transaction():
        assert not client.push_unique(conn, principal, "p-1", None, enqueue("p-1"))
    assert runs == ["p-1", "p-1"]
    assert admin.execute("SELECT count(*) FROM jobs WHERE principal = %s", (principal,)).fetchone()[0] == 1
    with psycopg.connect(conn.info.dsn, autocommit=True) as auto:
        with pytest.raises(psycopg.ProgrammingError):
            client.push_unique(auto, principal, "p-2", None, enqueue("p-2"))
    assert runs == ["p-1", "p-1"]


def test_the_async_client_does_the_same(dsn, admin, principal):
    admin.execute("CREATE TABLE IF NOT EXISTS jobs (principal text, key text)")

    async def main():
        client = AsyncClient()
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            async with conn.transaction():
                rows = await client.begin_batch(conn, principal, ["a-2", "a-1"], "consume", [fp("2"), fp("1")])
                assert [(r.key, r.outcome) for r in rows] == [("a-2", "started"), ("a-1", "started")]
                done = await client.complete_batch(conn, principal, ["a-2", "a-1"], [201, 200],
                                                   bodies=[b"two", b"one"])
                assert [f.value for f in done] == [True, True]
            async with conn.transaction():
                rows = await client.begin_batch(conn, principal, ["a-1", "a-2"], "consume", [fp("1"), fp("2")])
                assert [(r.outcome, r.response_body) for r in rows] == [("replay", b"one"), ("replay", b"two")]
            async with conn.transaction():
                flags = await client.claim_batch(conn, principal, ["a-job", "a-job-2"])
                assert [f.value for f in flags] == [True, True]

            async def enqueue(c):
                await c.execute("INSERT INTO jobs VALUES (%s, 'a-push')", (principal,))

            async with conn.transaction():
                assert await client.push_unique(conn, principal, "a-push", None, enqueue)
                assert not await client.push_unique(conn, principal, "a-job", None, enqueue)

    asyncio.run(main())
    assert admin.execute("SELECT count(*) FROM jobs WHERE principal = %s", (principal,)).fetchone()[0] == 1

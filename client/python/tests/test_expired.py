"""The outcome ``expired`` (a retry of a key that expired under the action's
on_expiry 'refuse' policy: 410 with the past Idempotency-Expires), and the lease
runners' expiry and wait/reject mode.

The mapping tests need no database. The end-to-end tests need an extension with
``idempotency.set_expiry_policy`` (0.8.0) and are skipped, saying so, on an older one.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import time
import uuid
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest

from pg_idempotency import (
    AsyncLeaseRunner,
    Client,
    LeaseOptions,
    LeaseOutcome,
    LeaseRunner,
    Policy,
    Request,
    Response,
    http,
)
from pg_idempotency.lease import LeaseRunnerBase
from pg_idempotency.transactional import Options

TABLE = json.loads((Path(__file__).resolve().parents[2] / "protocol.json").read_text(encoding="utf-8"))
ORDER = b'{"item":"book","quantity":2}'
PAST = 1_700_000_000  # Tue, 14 Nov 2023 22:13:20 GMT


def gone_body() -> dict:
    kind = TABLE["problems"]["key_expired"]
    return {
        "detail": TABLE["outcomes"]["expired"]["detail"],
        "status": 410,
        "title": kind["title"],
        "type": TABLE["problem_type_base"] + kind["type"],
    }


# An expired key's answer as idempotency.http_answer gives it (tested in sql/http_answer.sql).
GONE_HEADERS = '[["Content-Type","application/problem+json"],["Idempotency-Expires","Tue, 14 Nov 2023 22:13:20 GMT"]]'


def test_the_lease_runner_answers_expired_with_the_extensions_410_and_the_past_expiry():
    row = ("expired", None, None, PAST, 410, GONE_HEADERS, json.dumps(gone_body()).encode())
    result = LeaseRunnerBase("", LeaseOptions())._answer(row)
    assert result is not None and result.outcome == LeaseOutcome.EXPIRED
    assert result.response.status == 410 and json.loads(result.response.body) == gone_body()
    assert result.response.header(http.EXPIRES_HEADER) == "Tue, 14 Nov 2023 22:13:20 GMT"
    assert result.expires_epoch == PAST and result.expires_header() == "Tue, 14 Nov 2023 22:13:20 GMT"
    assert result.response.header(http.REPLAY_HEADER) is None and not result.response.replayed


def test_the_client_counts_expired_and_sends_the_extensions_answer():
    client = Client(Options())
    row = {"status": b"410", "headers": GONE_HEADERS.encode(), "body": b"\\x7b7d", "resource_id": None}
    response = client._answer("expired", row)
    assert response.status == 410 and response.body == b"{}"
    assert client.counters.expired == 1


@pytest.mark.parametrize("where", ["options", "request"])
def test_the_lease_runners_wait_follows_the_duplicate_mode(where):
    options = LeaseOptions(wait=timedelta(seconds=3), duplicates="reject" if where == "options" else "wait")
    runner = LeaseRunnerBase("", options)
    request = Request("p", "k", "POST", "/pay", duplicates="reject" if where == "request" else None)
    assert runner._acquire_params(request)[-1] == "0 milliseconds"  # wait, the last
    assert runner._acquire_params(Request("p", "k", "POST", "/pay", duplicates="wait"))[-1] == "3000 milliseconds"
    with pytest.raises(ValueError, match="duplicates"):
        runner._acquire_params(Request("p", "k", "POST", "/pay", duplicates="maybe"))


def stored_epoch(admin: psycopg.Connection, principal: str, key: str) -> int:
    return admin.execute(
        "SELECT floor(extract(epoch FROM expires_at))::bigint FROM idempotency.lookup(%s, %s)", (principal, key)
    ).fetchone()[0]


def test_a_lease_result_carries_the_rows_expiry(dsn, admin, principal):
    runner = LeaseRunner(dsn, LeaseOptions(policy=Policy.REMEMBER))
    try:
        key = uuid.uuid4().hex
        request = Request(principal, key, "POST", "/pay", ORDER)
        first = runner.run(request, lambda: Response(201, [], b"{}"))
        want = stored_epoch(admin, principal, key)
        assert first.outcome == LeaseOutcome.FRESH and first.expires_epoch == want > time.time()
        assert first.response.header(http.EXPIRES_HEADER) == http.http_date(want)
        again = runner.run(request, lambda: Response(201, [], b"{}"))
        assert again.outcome == LeaseOutcome.REPLAYED and again.expires_epoch == want
        assert again.response.header(http.EXPIRES_HEADER) == http.http_date(want)
        released = runner.run(Request(principal, uuid.uuid4().hex, "POST", "/pay"), lambda: Response(503))
        assert released.expires_epoch is None and released.response.header(http.EXPIRES_HEADER) is None
    finally:
        runner.close()


def test_the_async_lease_runner_carries_the_expiry_too(dsn, admin, principal):
    key = uuid.uuid4().hex

    async def go():
        runner = AsyncLeaseRunner(dsn, LeaseOptions(policy=Policy.ONCE))
        try:

            async def body() -> Response:
                return Response(200)

            return await runner.run(Request(principal, key, "POST", "/pay", ORDER), body)
        finally:
            await runner.close()

    result = asyncio.run(go())
    assert result.outcome == LeaseOutcome.FRESH and result.expires_epoch == stored_epoch(admin, principal, key)


def test_a_completion_after_the_ttl_carries_the_expiry_it_was_given(dsn, admin, principal):
    """The body outlives the ttl (its lease keeps the key): complete keeps the key one more
    ttl from its own now(), and the result tells that expiry, not acquire's past one."""

    async def go(key: str):
        runner = AsyncLeaseRunner(dsn, options)
        try:

            async def body() -> Response:
                await asyncio.sleep(1.3)
                return Response(201, [], b"{}")

            return await runner.run(Request(principal, key, "POST", "/pay", ORDER), body)
        finally:
            await runner.close()

    options = LeaseOptions(policy=Policy.REMEMBER, ttl=timedelta(seconds=1),
                           lease=timedelta(seconds=30))
    runner, key = LeaseRunner(dsn, options), uuid.uuid4().hex
    try:
        late = runner.run(Request(principal, key, "POST", "/pay", ORDER),
                          lambda: time.sleep(1.3) or Response(201, [], b"{}"))
    finally:
        runner.close()
    want = stored_epoch(admin, principal, key)
    assert late.outcome == LeaseOutcome.FRESH
    assert late.expires_epoch == want
    assert late.response.header(http.EXPIRES_HEADER) == http.http_date(want)
    key = uuid.uuid4().hex
    late = asyncio.run(go(key))
    assert late.outcome == LeaseOutcome.FRESH
    assert late.expires_epoch == stored_epoch(admin, principal, key)


@pytest.fixture
def refusing(admin):
    """The action 'POST /orders' under on_expiry 'refuse' (skipped before 0.8.0)."""
    if admin.execute("SELECT to_regproc('idempotency.set_expiry_policy')").fetchone()[0] is None:
        pytest.skip("the extension has no idempotency.set_expiry_policy (0.8.0 tombstones)")
    admin.execute("SELECT idempotency.set_expiry_policy('POST /orders', 'refuse')")
    yield
    admin.execute("SELECT idempotency.set_expiry_policy('POST /orders', 'run')")


def expire(admin: psycopg.Connection, principal: str, key: str) -> int:
    """The contract's test sequence; returns the expiry (epoch seconds) the tombstone keeps."""
    admin.execute("UPDATE idempotency.keys SET created_at = now() - interval '1 hour',"
                  " expires_at = now() - interval '1 second'"
                  " WHERE principal = %s AND key = %s", (principal, key))
    epoch = admin.execute("SELECT floor(extract(epoch FROM now() - interval '1 second'))::bigint").fetchone()[0]
    admin.execute("SELECT idempotency.cleanup_batch(1000)")
    return epoch


def test_a_retry_after_expiry_is_410_without_running(conn, admin, principal, refusing):
    client, key, runs = Client(), uuid.uuid4().hex, []

    def handler(c):
        runs.append(1)
        return Response(201, [("Content-Type", "application/json")], b'{"ok":true}')

    request = Request(principal, key, "POST", "/orders", ORDER)
    assert client.handle(conn, request, handler).status == 201
    expired = expire(admin, principal, key)
    gone = client.handle(conn, request, handler)
    assert gone.status == 410 and json.loads(gone.body) == gone_body() and len(runs) == 1
    assert gone.header(http.EXPIRES_HEADER) is not None
    told = http_epoch(gone.header(http.EXPIRES_HEADER))
    assert abs(told - expired) <= 1 and told < time.time()
    assert client.counters.expired == 1
    other = client.handle(conn, Request(principal, key, "POST", "/orders", b"{}"), handler)
    assert other.status == 422 and len(runs) == 1


def test_the_lease_runner_refuses_an_expired_key(dsn, admin, principal, refusing):
    runner, key, runs = LeaseRunner(dsn, LeaseOptions(policy=Policy.REMEMBER)), uuid.uuid4().hex, []
    try:
        request = Request(principal, key, "POST", "/orders", ORDER)
        assert runner.run(request, lambda: runs.append(1) or Response(201)).outcome == LeaseOutcome.FRESH
        expired = expire(admin, principal, key)
        gone = runner.run(request, lambda: runs.append(1) or Response(201))
        assert gone.outcome == LeaseOutcome.EXPIRED and gone.response.status == 410 and len(runs) == 1
        assert gone.expires_epoch is not None and abs(gone.expires_epoch - expired) <= 1
    finally:
        runner.close()


def http_epoch(value: str) -> int:
    return int(email.utils.parsedate_to_datetime(value).timestamp())

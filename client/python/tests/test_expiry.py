"""The key's expiry header (Idempotency-Expires) and wait-or-reject per call:
the table's values (client/protocol.json) and the behaviour against a live
database, for the sync client and the ASGI/WSGI option plumbing."""

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

from pg_idempotency import AsyncClient, Client, Options, Request, Response, http

TABLE = json.loads((Path(__file__).resolve().parents[2] / "protocol.json").read_text(encoding="utf-8"))
ORDER = b'{"item":"book","quantity":2}'


def test_http_date_is_an_imf_fixdate():
    assert http.http_date(784111777) == "Sun, 06 Nov 1994 08:49:37 GMT"  # RFC 9110's example


def stored_expiry(admin: psycopg.Connection, principal: str, key: str) -> str:
    epoch = admin.execute(
        "SELECT floor(extract(epoch FROM expires_at))::bigint FROM idempotency.lookup(%s, %s)", (principal, key)
    ).fetchone()[0]
    return email.utils.formatdate(epoch, usegmt=True)


def order(conn: psycopg.Connection, principal: str, status: int = 201) -> Response:
    conn.execute("INSERT INTO orders (principal, item, quantity) VALUES (%s, 'book', 2)", (principal,))
    # The handler sets the expiry header itself, and it is among the kept headers:
    # the client's value replaces it and it is never stored.
    headers = [("Content-Type", "application/json"), (http.EXPIRES_HEADER, "handler's own")]
    return Response(status, headers, b'{"ok":true}')


def values(response: Response) -> list:
    return [v for n, v in response.headers if http.header_name_equal(n, http.EXPIRES_HEADER)]


def test_first_answer_and_replay_carry_the_stored_rows_expiry(conn, admin, principal):
    client = Client(Options())
    client.options.kept_headers = list(http.DEFAULT_KEPT_HEADERS) + [http.EXPIRES_HEADER]
    key = uuid.uuid4().hex
    request = Request(principal, key, "POST", "/orders", ORDER)
    first = client.handle(conn, request, lambda c: order(c, principal))
    assert values(first) == [stored_expiry(admin, principal, key)]
    stored = admin.execute("SELECT response_headers::text FROM idempotency.keys WHERE key = %s", (key,)).fetchone()
    assert http.EXPIRES_HEADER.lower() not in stored[0].lower()
    time.sleep(1.1)  # a value recomputed from now() would move by a second
    retry = client.handle(conn, request, lambda c: order(c, principal))
    assert retry.replayed and values(retry) == values(first)
    other = client.handle(conn, Request(principal, key, "POST", "/orders", b"{}"), lambda c: order(c, principal))
    assert other.status == 422 and values(other) == values(first)


def test_a_stored_final_error_carries_its_own_rows_expiry(conn, admin, principal):
    client = Client()
    key = uuid.uuid4().hex
    request = Request(principal, key, "POST", "/orders", ORDER)
    first = client.handle(conn, request, lambda c: order(c, principal, 409))
    assert first.status == 409 and values(first) == [stored_expiry(admin, principal, key)]
    retry = client.handle(conn, request, lambda c: order(c, principal, 409))
    assert retry.replayed and values(retry) == values(first)


def test_an_unstored_answer_has_no_expiry(conn, principal):
    first = Client().handle(conn, Request(principal, uuid.uuid4().hex, "POST", "/o", ORDER),
                            lambda c: order(c, principal, 500))
    assert first.status == 500 and values(first) == ["handler's own"]  # the client adds none


def hold(dsn: str, principal: str, key: str) -> psycopg.Connection:
    """A transaction that holds the key with begin (as a running first request does)."""
    holder = psycopg.connect(dsn)
    outcome = holder.execute(
        "SELECT outcome FROM idempotency.begin(%s, %s, 'POST /orders',"
        " idempotency.fingerprint('POST', '/orders', %s, NULL))", (principal, key, ORDER)
    ).fetchone()[0]
    assert outcome == "started"
    return holder


@pytest.mark.parametrize("where", ["options", "request"])
def test_reject_answers_409_at_once(dsn, conn, principal, where):
    key = uuid.uuid4().hex
    holder = hold(dsn, principal, key)
    try:
        client = Client(Options())
        client.options.duplicates = "reject" if where == "options" else "wait"
        request = Request(principal, key, "POST", "/orders", ORDER, duplicates="reject" if where == "request" else None)
        started = time.monotonic()
        busy = client.handle(conn, request, lambda c: order(c, principal))
        took = time.monotonic() - started
    finally:
        holder.rollback()
        holder.close()
    assert busy.status == 409 and busy.header("Retry-After") == str(TABLE["default_retry_after_seconds"])
    assert took < 1.0, took  # the server's wait_timeout is 5 s: it did not wait


def test_wait_is_the_default_and_waits(dsn, conn, principal):
    key = uuid.uuid4().hex
    holder = hold(dsn, principal, key)
    try:
        client = Client(Options())
        client.options.wait = timedelta(milliseconds=600)
        started = time.monotonic()
        busy = client.handle(conn, Request(principal, key, "POST", "/orders", ORDER), lambda c: order(c, principal))
        took = time.monotonic() - started
    finally:
        holder.rollback()
        holder.close()
    assert busy.status == 409 and took >= 0.5, took


def test_an_unknown_mode_is_refused(conn, principal):
    with pytest.raises(ValueError, match="duplicates"):
        Client().handle(conn, Request(principal, "k", "POST", "/o", ORDER, duplicates="maybe"), lambda c: None)


def test_async_client_rejects_too(dsn, principal):
    key = uuid.uuid4().hex
    holder = hold(dsn, principal, key)

    async def go() -> Response:
        async with await psycopg.AsyncConnection.connect(dsn) as aconn:
            request = Request(principal, key, "POST", "/orders", ORDER, duplicates="reject")
            return await AsyncClient().handle(aconn, request, lambda c: None)

    try:
        started = time.monotonic()
        busy = asyncio.run(go())
        took = time.monotonic() - started
    finally:
        holder.rollback()
        holder.close()
    assert busy.status == 409 and took < 1.0

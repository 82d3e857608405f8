"""The transactional protocol against a live database."""

from __future__ import annotations

import json
import threading
import time
import uuid
from datetime import timedelta

import psycopg
import pytest
from psycopg import errors

from pg_idempotency import Client, Options, Request, Response

ORDER = b'{"item":"book","quantity":2}'


def new_key() -> str:
    return uuid.uuid4().hex


def create_order(conn: psycopg.Connection, principal: str) -> Response:
    order_id = conn.execute(
        "INSERT INTO orders (principal, item, quantity) VALUES (%s, 'book', 2) RETURNING id", (principal,)
    ).fetchone()[0]
    return Response(
        201,
        [("Content-Type", "application/json"), ("Location", f"/orders/{order_id}"), ("X-Trace", "not kept")],
        json.dumps({"id": order_id}).encode(),
        resource_id=str(order_id),
    )


def orders(admin: psycopg.Connection, principal: str) -> int:
    return admin.execute("SELECT count(*) FROM orders WHERE principal = %s", (principal,)).fetchone()[0]


def run(client: Client, conn, request: Request, handler=create_order) -> Response:
    return client.handle(conn, request, lambda c: handler(c, request.principal))


def test_first_request_runs_and_a_retry_replays_the_stored_bytes(conn, admin, principal):
    client = Client()
    key = new_key()
    first = run(client, conn, Request(principal, key, "POST", "/orders", ORDER))
    assert first.status == 201 and not first.replayed
    assert first.header("Idempotent-Replay") is None
    retry = run(client, conn, Request(principal, key, "post", "/orders", b'{ "quantity": 2.0, "item": "b\\u006fok" }'))
    assert retry.status == 201
    assert retry.replayed
    assert retry.body == first.body
    assert retry.header("Idempotent-Replay") == "true"
    assert retry.header("Location") == first.header("Location")
    assert retry.header("Content-Type") == "application/json"
    assert retry.header("X-Trace") is None  # not a kept header
    assert retry.resource_id == first.resource_id
    assert orders(admin, principal) == 1
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_context_manager_form(conn, admin, principal):
    client = Client()
    request = Request(principal, new_key(), "POST", "/orders", ORDER)
    for expected_outcome in ("started", "replay"):
        with client.transaction(conn, request) as attempt:
            assert attempt.outcome == expected_outcome
            if attempt.started:
                attempt.respond(create_order(conn, principal))
        assert attempt.response is not None and attempt.response.status == 201
    assert orders(admin, principal) == 1


def test_decorator_form(conn, admin, principal):
    client = Client()

    @client.idempotent
    def handler(connection):
        return create_order(connection, principal)

    request = Request(principal, new_key(), "POST", "/orders", ORDER)
    assert handler(conn, request).status == 201
    assert handler(conn, request).replayed
    assert orders(admin, principal) == 1


def test_another_request_under_the_same_key_is_422(conn, admin, principal):
    client = Client()
    key = new_key()
    run(client, conn, Request(principal, key, "POST", "/orders", ORDER))
    other = run(client, conn, Request(principal, key, "POST", "/orders", b'{"item":"pen"}'))
    assert other.status == 422
    assert other.header("Content-Type") == "application/problem+json"
    assert b'"type":"/problems/idempotency-key-reuse"' in other.body
    assert orders(admin, principal) == 1
    assert client.counters.mismatched == 1


def test_missing_and_malformed_keys_are_400_without_a_round_trip(conn, admin, principal):
    client = Client(Options(max_key_length=20))
    missing = run(client, conn, Request(principal, None, "POST", "/orders", ORDER))
    assert missing.status == 400
    assert missing.body == (
        b'{"detail":"POST requests need an Idempotency-Key header.","status":400,'
        b'"title":"Idempotency-Key header is missing","type":"/problems/idempotency-key-missing"}'
    )
    for key in ("", "k" * 21, "caf\u00e9", "tab\there"):
        malformed = run(client, conn, Request(principal, key, "POST", "/orders", ORDER))
        assert malformed.status == 400, key
        assert malformed.body == (
            b'{"detail":"The Idempotency-Key must be 1 to 20 visible ASCII characters.","status":400,'
            b'"title":"Idempotency-Key header is malformed","type":"/problems/idempotency-key-malformed"}'
        )
    assert orders(admin, principal) == 0


def test_a_key_the_server_refuses_is_400(conn, admin, principal):
    conn.execute("SET idempotency.key_format = 'uuid'")
    conn.commit()
    try:
        response = run(Client(), conn, Request(principal, "not-a-uuid", "POST", "/orders", ORDER))
    finally:
        conn.execute("RESET idempotency.key_format")
        conn.commit()
    assert response.status == 400
    assert b"The Idempotency-Key was refused by the server." in response.body
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert orders(admin, principal) == 0


def test_a_body_too_deep_to_fingerprint_is_400(conn, principal):
    body = b"[" * 5000 + b"]" * 5000
    response = run(Client(), conn, Request(principal, new_key(), "POST", "/orders", body))
    assert response.status == 400
    assert b'"type":"/problems/request-body-invalid"' in response.body
    assert b"nesting too deep" in response.body


def test_unkeyed_methods_run_in_a_plain_transaction(conn, admin, principal):
    client = Client()
    response = run(client, conn, Request(principal, None, "PUT", "/orders/1", ORDER))
    assert response.status == 201
    assert orders(admin, principal) == 1


def test_a_final_error_is_stored_without_its_effects_and_replayed(conn, admin, principal):
    client = Client()
    key = new_key()

    def refuse(connection, who):
        create_order(connection, who)  # an effect that must not stay
        return Response(409, [("Content-Type", "application/problem+json")], b'{"title":"out of stock"}')

    first = run(client, conn, Request(principal, key, "POST", "/orders", ORDER), refuse)
    assert first.status == 409 and not first.replayed
    retry = run(client, conn, Request(principal, key, "POST", "/orders", ORDER))
    assert retry.status == 409 and retry.replayed
    assert retry.body == b'{"title":"out of stock"}'
    assert retry.header("Content-Type") == "application/problem+json"
    assert orders(admin, principal) == 0
    assert client.counters.stored_errors == 1


def test_a_5xx_is_not_stored_and_the_retry_runs_again(conn, admin, principal):
    client = Client()
    key = new_key()

    def fail(connection, who):
        create_order(connection, who)
        return Response(500, [], b"boom")

    assert run(client, conn, Request(principal, key, "POST", "/orders", ORDER), fail).status == 500
    assert orders(admin, principal) == 0
    again = run(client, conn, Request(principal, key, "POST", "/orders", ORDER))
    assert again.status == 201 and not again.replayed
    assert orders(admin, principal) == 1


def test_an_exception_rolls_back_and_propagates(conn, admin, principal):
    client = Client()
    key = new_key()

    def explode(connection, who):
        create_order(connection, who)
        raise KeyError("handler bug")

    with pytest.raises(KeyError):
        run(client, conn, Request(principal, key, "POST", "/orders", ORDER), explode)
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert orders(admin, principal) == 0
    assert run(client, conn, Request(principal, key, "POST", "/orders", ORDER)).status == 201


def test_one_time_secret_is_sent_once(conn, admin, principal):
    client = Client()
    key = new_key()

    def secret(connection, who):
        response = create_order(connection, who)
        response.one_time_secret = True
        return response

    assert run(client, conn, Request(principal, key, "POST", "/keys", b"{}"), secret).status == 201
    retry = run(client, conn, Request(principal, key, "POST", "/keys", b"{}"))
    assert retry.status == 409
    assert retry.header("Idempotent-Replay") == "true"
    assert b'"type":"/problems/one-time-secret"' in retry.body
    stored = admin.execute(
        "SELECT response_body, one_time_secret FROM idempotency.keys WHERE principal = %s", (principal,)
    ).fetchone()
    assert stored == (None, True)


def test_a_duplicate_waits_for_the_first_and_replays(dsn, admin, principal):
    client = Client()
    key = new_key()
    results = {}

    def slow(connection, who):
        connection.execute("SELECT pg_sleep(0.5)")
        return create_order(connection, who)

    def first():
        with psycopg.connect(dsn) as c:
            results["first"] = run(client, c, Request(principal, key, "POST", "/orders", ORDER), slow)

    thread = threading.Thread(target=first)
    thread.start()
    time.sleep(0.15)
    with psycopg.connect(dsn) as c:
        second = run(client, c, Request(principal, key, "POST", "/orders", ORDER))
    thread.join()
    assert results["first"].status == 201 and not results["first"].replayed
    assert second.replayed and second.body == results["first"].body
    assert orders(admin, principal) == 1


def test_in_progress_past_the_wait_is_409_with_retry_after(dsn, conn, admin, principal):
    client = Client(Options(wait=timedelta(milliseconds=100), retry_after=7))
    key = new_key()
    request = Request(principal, key, "POST", "/orders", ORDER)
    with psycopg.connect(dsn) as holder:
        with client.transaction(holder, request) as attempt:
            assert attempt.started
            busy = run(client, conn, request)
            assert busy.status == 409
            assert busy.header("Retry-After") == "7"
            assert busy.body == (
                b'{"detail":"A request with this Idempotency-Key is still being processed; retry later.",'
                b'"status":409,"title":"A request with this Idempotency-Key is in progress",'
                b'"type":"/problems/request-in-progress"}'
            )
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            attempt.respond(create_order(holder, principal))
    assert run(client, conn, request).replayed
    assert orders(admin, principal) == 1


def test_a_live_lease_is_409_with_its_remaining_seconds(conn, admin, principal):
    key = new_key()
    fence = admin.execute(
        "SELECT fence FROM idempotency.acquire(%s, %s, 'x',"
        " idempotency.fingerprint('POST', '/orders', %s), lease => '20 seconds')",
        (principal, key, ORDER),
    ).fetchone()[0]
    busy = run(Client(), conn, Request(principal, key, "POST", "/orders", ORDER))
    assert busy.status == 409
    assert 15 <= int(busy.header("Retry-After")) <= 20
    admin.execute("SELECT idempotency.release(%s, %s, %s)", (principal, key, fence))
    assert run(Client(), conn, Request(principal, key, "POST", "/orders", ORDER)).status == 201


def test_exclude_leaves_members_out_of_the_fingerprint(conn, admin, principal):
    client = Client()
    key = new_key()
    a = Request(principal, key, "POST", "/orders", b'{"item":"x","ts":1}', exclude=["/ts"])
    b = Request(principal, key, "POST", "/orders", b'{"item":"x","ts":2}', exclude=["/ts"])
    assert run(client, conn, a).status == 201
    assert run(client, conn, b).replayed


def test_the_connection_must_be_idle(conn, principal):
    conn.execute("SELECT 1")  # psycopg opened a transaction
    with pytest.raises(psycopg.ProgrammingError):
        run(Client(), conn, Request(principal, new_key(), "POST", "/orders", ORDER))
    conn.rollback()


def test_respond_is_required_when_started(conn, admin, principal):
    request = Request(principal, new_key(), "POST", "/orders", ORDER)
    with pytest.raises(psycopg.ProgrammingError):
        with Client().transaction(conn, request) as attempt:
            assert attempt.started
            create_order(conn, principal)
    assert orders(admin, principal) == 0
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_a_failing_statement_in_the_handler_rolls_back(conn, admin, principal):
    request = Request(principal, new_key(), "POST", "/orders", ORDER)

    def bad(connection, who):
        create_order(connection, who)
        connection.execute("SELECT 1/0")
        return Response(201)

    with pytest.raises(errors.DivisionByZero):
        run(Client(), conn, request, bad)
    assert orders(admin, principal) == 0
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_serialization_failures_are_retried(dsn, admin, principal):
    """Two REPEATABLE READ transactions update one row: the loser gets 40001 and
    handle() reruns it (a fresh snapshot)."""
    admin.execute("CREATE TABLE IF NOT EXISTS counter (id int PRIMARY KEY, n int)")
    admin.execute("INSERT INTO counter VALUES (1, 0) ON CONFLICT (id) DO UPDATE SET n = 0")
    client = Client()
    calls = []
    go = threading.Event()
    done = threading.Event()

    def bump(connection, who):
        calls.append(who)
        connection.execute("SELECT n FROM counter WHERE id = 1").fetchone()  # takes the snapshot
        if len(calls) == 1:
            go.set()
            done.wait(5)
        connection.execute("UPDATE counter SET n = n + 1 WHERE id = 1")
        return Response(201, [], b"{}")

    def rival():
        go.wait(5)
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("UPDATE counter SET n = n + 1 WHERE id = 1")
        done.set()

    thread = threading.Thread(target=rival)
    thread.start()
    with psycopg.connect(dsn) as c:
        c.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        response = client.handle(c, Request(principal, new_key(), "POST", "/bump", b"{}"), lambda x: bump(x, principal))
    thread.join()
    assert response.status == 201
    assert len(calls) == 2
    assert client.counters.retries == 1
    assert admin.execute("SELECT n FROM counter WHERE id = 1").fetchone()[0] == 2


def test_a_final_error_with_a_one_time_secret_keeps_only_the_marker(conn, admin, principal):
    client = Client()
    key = new_key()

    def refuse_with_secret(connection, who):
        return Response(403, [("Content-Type", "application/json")], b'{"token":"s3cr3t"}', one_time_secret=True)

    assert run(client, conn, Request(principal, key, "POST", "/keys", b"{}"), refuse_with_secret).status == 403
    retry = run(client, conn, Request(principal, key, "POST", "/keys", b"{}"))
    assert retry.status == 409 and b"one-time-secret" in retry.body
    stored = admin.execute(
        "SELECT response_status, one_time_secret FROM idempotency.lookup(%s, %s)", (principal, key)
    ).fetchone()
    assert stored == (403, True)


def test_a_bad_ttl_is_an_error_not_a_key_problem(conn, principal):
    client = Client(Options(ttl=timedelta(days=400)))
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        run(client, conn, Request(principal, new_key(), "POST", "/orders", ORDER))
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_an_autocommit_connection_works_the_same(dsn, admin, principal):
    client = Client()
    request = Request(principal, new_key(), "POST", "/orders", ORDER)
    with psycopg.connect(dsn, autocommit=True) as c:
        assert run(client, c, request).status == 201
        assert run(client, c, request).replayed
        with c.transaction():  # the caller's own transactions still work afterwards
            create_order(c, principal)
    assert orders(admin, principal) == 2


def test_storage_is_the_extensions_http_storage_read_once(conn, admin):
    client = Client(Options())
    assert client.storage(conn, 201) == "committed_with_key"
    assert client.storage(conn, 422) == "saved_after_rollback"
    assert client.storage(conn, 500) == "not_stored" and client.storage(conn, 99) == "not_stored"
    assert client.is_final(conn, 201) and client.is_final(conn, 404) and not client.is_final(conn, 429)
    # What the server says, status by status.
    want = admin.execute("SELECT idempotency.http_storage(409)").fetchone()[0]
    assert client.storage(conn, 409) == want
    # A fixed list: final statuses below 400 commit with the key, the others are saved after the rollback.
    fixed = Client(Options(final_statuses=[200, 418]))
    assert fixed.storage(conn, 200) == "committed_with_key" and fixed.storage(conn, 418) == "saved_after_rollback"
    assert fixed.storage(conn, 201) == "not_stored"
    with pytest.raises(ValueError, match="not an HTTP status"):
        Client(Options(final_statuses=[600]))

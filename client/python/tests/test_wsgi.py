"""The WSGI middleware around a small application, called without a server."""

from __future__ import annotations

import http
import io
import json
import sys
import uuid
from contextlib import contextmanager

import psycopg
import pytest

from pg_idempotency import Client
from pg_idempotency.wsgi import IdempotencyMiddleware, status_line


def orders_app(environ, start_response):
    context = environ["pg_idempotency"]
    body = json.loads(environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0)) or b"{}")
    if environ["PATH_INFO"] == "/explode":
        context.connection.execute(
            "INSERT INTO orders (principal, item, quantity) VALUES (%s, 'x', 1)", (context.request.principal,)
        )
        raise RuntimeError("bug")
    if environ["PATH_INFO"] in ("/die", "/cancel"):
        # The request's own backend is terminated, or its statement cancelled, under it.
        insert = "INSERT INTO orders (principal, item, quantity) VALUES (%s, 'x', 1)"
        context.connection.execute(insert, (context.request.principal,))
        signal = "pg_terminate_backend" if environ["PATH_INFO"] == "/die" else "pg_cancel_backend"
        context.connection.execute(f"SELECT {signal}(pg_backend_pid()), pg_sleep(5)")
    if not body.get("item"):
        start_response("400 Bad Request", [("Content-Type", "application/problem+json")])
        return [b'{"title":"Invalid order"}']
    order_id = context.connection.execute(
        "INSERT INTO orders (principal, item, quantity) VALUES (%s, %s, 1) RETURNING id",
        (context.request.principal, body["item"]),
    ).fetchone()[0]
    context.resource_id = str(order_id)
    context.one_time_secret = environ["PATH_INFO"] == "/secret"
    start_response("201 Created", [("Content-Type", "application/json"), ("Location", f"/orders/{order_id}")])
    return [b'{"id":', str(order_id).encode(), b"}"]


@pytest.fixture
def app(dsn):
    @contextmanager
    def connection():
        with psycopg.connect(dsn) as conn:
            yield conn

    def principal(environ):
        auth = environ.get("HTTP_AUTHORIZATION", "")
        return auth[len("Bearer "):] if auth.startswith("Bearer ") else None

    return IdempotencyMiddleware(orders_app, Client(), connection=connection, principal=principal)


def call(app, path, body=b"", key=None, principal="u", method="POST"):
    environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "SCRIPT_NAME": "", "CONTENT_LENGTH": str(len(body)),
               "wsgi.input": io.BytesIO(body)}
    if key is not None:
        environ["HTTP_IDEMPOTENCY_KEY"] = key
    if principal is not None:
        environ["HTTP_AUTHORIZATION"] = f"Bearer {principal}"
    seen = {}

    def start_response(status, headers, exc_info=None):
        seen["status"], seen["headers"] = status, dict(headers)

    seen["body"] = b"".join(app(environ, start_response))
    return seen


def count(admin, principal):
    return admin.execute("SELECT count(*) FROM orders WHERE principal = %s", (principal,)).fetchone()[0]


def test_first_request_and_replay(app, admin, principal):
    key = uuid.uuid4().hex
    first = call(app, "/orders", b'{"item":"book"}', key, principal)
    assert first["status"] == "201 Created"
    retry = call(app, "/orders", b'{ "item" : "book" }', key, principal)
    assert retry["status"] == "201 Created"
    assert retry["body"] == first["body"]
    assert retry["headers"]["Idempotent-Replay"] == "true"
    assert retry["headers"]["Location"] == first["headers"]["Location"]
    assert count(admin, principal) == 1


def test_missing_key_and_reuse(app, admin, principal):
    assert call(app, "/orders", b'{"item":"a"}', None, principal)["status"] == "400 Bad Request"
    key = uuid.uuid4().hex
    call(app, "/orders", b'{"item":"a"}', key, principal)
    reuse = call(app, "/orders", b'{"item":"b"}', key, principal)
    # The reason phrase is the stdlib's: "Unprocessable Entity" up to Python 3.12, "Unprocessable Content" since.
    assert reuse["status"] == f"422 {http.HTTPStatus(422).phrase}"
    assert reuse["headers"]["Content-Type"] == "application/problem+json"
    assert count(admin, principal) == 1


def test_final_4xx_is_replayed(app, principal):
    key = uuid.uuid4().hex
    assert call(app, "/orders", b"{}", key, principal)["status"] == "400 Bad Request"
    retry = call(app, "/orders", b"{}", key, principal)
    assert retry["status"] == "400 Bad Request" and retry["headers"]["Idempotent-Replay"] == "true"
    assert retry["body"] == b'{"title":"Invalid order"}'


def test_one_time_secret_from_the_context(app, principal):
    key = uuid.uuid4().hex
    assert call(app, "/secret", b'{"item":"k"}', key, principal)["status"] == "201 Created"
    assert call(app, "/secret", b'{"item":"k"}', key, principal)["status"] == "409 Conflict"


def test_an_exception_in_the_app_rolls_back(app, admin, principal):
    with pytest.raises(RuntimeError):
        call(app, "/explode", b'{"item":"k"}', uuid.uuid4().hex, principal)
    assert count(admin, principal) == 0


def recovering_app(environ, start_response):
    """Starts a 201, then fails before any body and answers 500 instead (PEP 3333: a second
    start_response with exc_info replaces the status while no body has been sent)."""
    context = environ["pg_idempotency"]
    context.connection.execute("INSERT INTO orders (principal, item, quantity) VALUES (%s, 'r', 1)",
                               (context.request.principal,))
    start_response("201 Created", [("Content-Type", "application/json")])
    try:
        raise ValueError("late failure")
    except ValueError:
        failed = sys.exc_info()
        start_response("500 Internal Server Error", [("Content-Type", "text/plain")], failed)
    return [b"recovered"]


def test_start_response_with_exc_info_before_the_body_replaces_the_answer(dsn, admin, principal):
    @contextmanager
    def connection():
        with psycopg.connect(dsn) as conn:
            yield conn

    app = IdempotencyMiddleware(recovering_app, Client(), connection=connection,
                                principal=lambda environ: principal)
    key = uuid.uuid4().hex
    first = call(app, "/orders", b"{}", key, principal)
    assert (first["status"], first["body"]) == ("500 Internal Server Error", b"recovered")
    assert first["headers"]["Content-Type"] == "text/plain"
    assert count(admin, principal) == 0  # a 500 is not final: rolled back, not stored
    assert call(app, "/orders", b"{}", key, principal)["status"] == "500 Internal Server Error"


def test_no_principal_passes_through(dsn):
    def bare(environ, start_response):
        assert "pg_idempotency" not in environ
        start_response("401 Unauthorized", [])
        return [b""]

    app = IdempotencyMiddleware(bare, Client(), connection=lambda: psycopg.connect(dsn),
                                principal=lambda environ: None)
    assert call(app, "/orders", b"{}", "k", None)["status"] == "401 Unauthorized"


def test_status_line():
    assert status_line(201) == "201 Created"
    assert status_line(599) == "599 Unknown"


def test_a_database_fault_is_answered_503_and_the_key_stays_usable(app, admin, principal):
    from pg_idempotency.http import database_fault_response

    want = database_fault_response()
    for path in ("/die", "/cancel"):
        key = uuid.uuid4().hex
        for _ in range(2):  # nothing was kept: the retry meets the same fault
            answer = call(app, path, b'{"item":"k"}', key, principal)
            assert answer["status"] == "503 Service Unavailable", path
            assert answer["body"] == want.body
            assert answer["headers"]["Content-Type"] == "application/problem+json"
            assert answer["headers"]["Retry-After"] == "1"
    assert count(admin, principal) == 0
    key = uuid.uuid4().hex
    assert call(app, "/orders", b'{"item":"after"}', key, principal)["status"] == "201 Created"
    assert count(admin, principal) == 1


def test_an_application_error_is_not_a_database_fault(app, admin, principal):
    from pg_idempotency import is_database_fault

    assert not is_database_fault(RuntimeError("bug"))
    assert not is_database_fault(psycopg.errors.UniqueViolation("dup"))
    assert is_database_fault(psycopg.errors.AdminShutdown("57P01"))
    assert is_database_fault(psycopg.errors.QueryCanceled("57014"))
    assert is_database_fault(psycopg.OperationalError("server closed the connection unexpectedly"))

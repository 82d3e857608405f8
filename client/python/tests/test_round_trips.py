"""A keyed request takes no more round trips than the same handler in a plain
transaction (psycopg: BEGIN, the statement, COMMIT)."""

from __future__ import annotations

import io
import uuid
from contextlib import nullcontext

from roundtrips import count_round_trips

from pg_idempotency import Client, Request, Response
from pg_idempotency.wsgi import IdempotencyMiddleware

INSERT = "INSERT INTO orders (principal, item, quantity) VALUES (%s, 'rt', 1) RETURNING id"


def handler(conn, principal):
    order_id = conn.execute(INSERT, (principal,)).fetchone()[0]
    return Response(201, [("Content-Type", "application/json")], b'{"id":%d}' % order_id)


def test_keyed_request_takes_no_more_round_trips_than_the_plain_route(conn, principal):
    client = Client()
    client.handle(conn, Request(principal, uuid.uuid4().hex, "POST", "/o", b"{}"), lambda c: handler(c, principal))

    def plain():
        with conn.transaction():
            handler(conn, principal)

    plain_trips = count_round_trips(conn, plain)
    key = uuid.uuid4().hex
    request = Request(principal, key, "POST", "/o", b'{"a":1}')
    keyed = count_round_trips(conn, lambda: client.handle(conn, request, lambda c: handler(c, principal)))
    replay = count_round_trips(conn, lambda: client.handle(conn, request, lambda c: handler(c, principal)))
    assert plain_trips == 3
    assert keyed == 3
    assert replay == 2


def test_a_final_error_takes_two_more_round_trips_at_most(conn, principal):
    client = Client()
    client.handle(conn, Request(principal, uuid.uuid4().hex, "POST", "/o", b"{}"), lambda c: handler(c, principal))

    def refuse(c):
        handler(c, principal)
        return Response(422, [], b"{}")

    request = Request(principal, uuid.uuid4().hex, "POST", "/o", b"{}")
    # BEGIN + begin(), the statement, ROLLBACK + save_final() in one flight
    assert count_round_trips(conn, lambda: client.handle(conn, request, refuse)) == 3


def test_the_wsgi_middleware_adds_no_round_trip(conn, principal):
    def app(environ, start_response):
        response = handler(environ["pg_idempotency"].connection, principal)
        start_response("201 Created", response.headers)
        return [response.body]

    middleware = IdempotencyMiddleware(app, Client(), connection=lambda: nullcontext(conn),
                                       principal=lambda environ: principal)

    def call(key):
        environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/o", "CONTENT_LENGTH": "2",
                   "wsgi.input": io.BytesIO(b"{}"), "HTTP_IDEMPOTENCY_KEY": key}
        middleware(environ, lambda status, headers: None)

    call(uuid.uuid4().hex)  # warm: the final-status table is read once per client
    assert count_round_trips(conn, lambda: call(uuid.uuid4().hex)) == 3

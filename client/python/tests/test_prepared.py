"""begin/complete/save_final are prepared once per connection, and a session
that lost them (DISCARD ALL, a transaction pooler) or already has them is
handled: the attempt still runs once, in the same number of flights or one more."""

from __future__ import annotations

import tempfile
import uuid

import psycopg
from psycopg import pq

from pg_idempotency import Client, Options, Request, Response
from pg_idempotency._transactional_core import BEGIN_NAME, COMPLETE_NAME, PREPARES, SAVE_FINAL_NAME

INSERT = "INSERT INTO orders (principal, item, quantity) VALUES (%s, 'prep', 1) RETURNING id"


def handler(conn, principal, status=201):
    order_id = conn.execute(INSERT, (principal,)).fetchone()[0]
    return Response(status, [("Content-Type", "application/json")], b'{"id":%d}' % order_id)


def messages(conn, action):
    """The protocol messages the client sent (libpq trace, F lines) during action."""
    with tempfile.TemporaryFile() as trace:
        conn.pgconn.trace(trace.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            action()
        finally:
            conn.pgconn.untrace()
        trace.seek(0)
        lines = trace.read().decode("utf-8", "replace").splitlines()
    return [line.split("\t")[2] for line in lines if line.startswith("F\t")]


def prepared_names(conn):
    with conn.transaction():
        rows = conn.execute("SELECT name FROM pg_prepared_statements").fetchall()
    return {name for (name,) in rows}


def orders(admin, principal):
    return admin.execute("SELECT count(*) FROM orders WHERE principal = %s", (principal,)).fetchone()[0]


def keyed(client, conn, principal, status=201):
    request = Request(principal, uuid.uuid4().hex, "POST", "/o", b"{}")
    return client.handle(conn, request, lambda c: handler(c, principal, status))


def test_the_statements_are_parsed_once_per_connection(conn, principal):
    client = Client()
    first = messages(conn, lambda: keyed(client, conn, principal))
    assert first.count("Parse") >= 3  # the three PREPAREs ride with the first begin()
    names = prepared_names(conn)
    assert {BEGIN_NAME.decode(), COMPLETE_NAME.decode(), SAVE_FINAL_NAME.decode()} <= names
    again = messages(conn, lambda: keyed(client, conn, principal))
    stored_error = messages(conn, lambda: keyed(client, conn, principal, 422))
    # Only the handler's INSERT is parsed (psycopg sends it unnamed); BEGIN,
    # COMMIT and ROLLBACK are parameterless unnamed statements of their own.
    parsed = [m for m in again if m == "Parse"]
    assert len(parsed) == 1 + 2 + 0, again  # INSERT, BEGIN, COMMIT; begin/complete are Bind only
    assert stored_error.count("Parse") == 1 + 2, stored_error  # INSERT, BEGIN, ROLLBACK; save_final Bind only


def test_the_statements_survive_a_rollback_of_the_first_attempt(conn, admin, principal):
    client = Client()

    def explode(c):
        handler(c, principal)
        raise RuntimeError("bug")

    request = Request(principal, uuid.uuid4().hex, "POST", "/o", b"{}")
    try:
        client.handle(conn, request, explode)
    except RuntimeError:
        pass
    assert BEGIN_NAME.decode() in prepared_names(conn)
    assert keyed(client, conn, principal).status == 201
    assert orders(admin, principal) == 1


def test_discard_all_between_requests_re_prepares_and_retries_once(conn, admin, principal):
    client = Client()
    assert keyed(client, conn, principal).status == 201
    conn.autocommit = True
    conn.execute("DISCARD ALL")  # what a pooler's server_reset_query does
    conn.autocommit = False
    sent = messages(conn, lambda: keyed(client, conn, principal))
    # begin (26000), ROLLBACK + the PREPAREs and begin again (two Syncs, one flight),
    # the handler's INSERT, complete + COMMIT
    assert sent.count("Sync") == 1 + 2 + 1 + 1, sent
    assert orders(admin, principal) == 2
    assert BEGIN_NAME.decode() in prepared_names(conn)
    # And replays, final errors and the next request run on the new statements.
    assert keyed(client, conn, principal, 422).status == 422
    assert keyed(client, conn, principal).status == 201
    assert orders(admin, principal) == 3


def test_statements_already_on_the_session_are_used(dsn, admin, principal):
    """Another client on the same server session (a transaction pooler) prepared
    them: the PREPARE fails with 42P05 and the attempt runs on the existing ones."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for prepare in PREPARES:
            conn.execute(f"PREPARE {prepare.name.decode()} AS {prepare.sql.decode()}")
        conn.autocommit = False
        assert keyed(Client(), conn, principal).status == 201
        assert conn.info.transaction_status == pq.TransactionStatus.IDLE
        assert keyed(Client(), conn, principal).status == 201
    assert orders(admin, principal) == 2


def test_prepare_false_sends_the_statements_unnamed(conn, principal):
    client = Client(Options(prepare=False))
    sent = messages(conn, lambda: keyed(client, conn, principal))
    sent += messages(conn, lambda: keyed(client, conn, principal))
    assert not any(name.startswith("pg_idempotency") for name in prepared_names(conn))
    # the final-status table once; BEGIN, begin(), INSERT, complete(), COMMIT each time
    assert sent.count("Parse") == 1 + 2 * 5, sent

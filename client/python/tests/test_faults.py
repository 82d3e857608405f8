"""Database faults under the transactional protocol: a backend terminated in the
handler or in the middle of one of the client's pipelines leaves a closed
connection and the fault as the error (never "cannot exit pipeline mode"), and
the key is usable again on a new connection."""

from __future__ import annotations

import threading
import time
import uuid

import psycopg
import pytest

from pg_idempotency import Client, Request, Response, is_database_fault
from pg_idempotency import _wire


def request(principal: str, key: str) -> Request:
    return Request(principal=principal, key=key, method="POST", path="/faults", body=b"{}")


def test_a_backend_terminated_in_the_handler(dsn, admin, principal):
    key = uuid.uuid4().hex
    conn = psycopg.connect(dsn)
    with pytest.raises(psycopg.Error) as caught:
        with Client().transaction(conn, request(principal, key)) as attempt:
            assert attempt.started
            conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
    assert is_database_fault(caught.value), caught.value
    assert conn.closed
    conn.close()  # closing a closed connection is fine, as a pool does
    with psycopg.connect(dsn) as again:  # nothing was kept: the retry runs
        response = Client().handle(again, request(principal, key),
                                   lambda c: Response(201, [], b"ok"))
    assert response.status == 201 and not response.replayed


def test_a_pipeline_cut_short_closes_its_connection(dsn, admin):
    conn = psycopg.connect(dsn, autocommit=True)
    pid = conn.info.backend_pid

    def terminate() -> None:
        time.sleep(0.3)
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))

    killer = threading.Thread(target=terminate)
    killer.start()
    steps = [_wire.Statement(b"SELECT pg_sleep(5)"), _wire.Statement(b"SELECT 1"), _wire.SYNC]
    try:
        with pytest.raises(psycopg.Error) as caught:
            _wire.run(conn, steps)
    finally:
        killer.join()
    assert is_database_fault(caught.value), caught.value
    assert conn.closed  # so a pool drops it instead of calling rollback() on it
    assert conn.pgconn.pipeline_status == psycopg.pq.PipelineStatus.OFF

"""Pipelined statements on a psycopg connection's own libpq session, sync or async.

psycopg sends ``BEGIN`` as a round trip of its own, even in its pipeline mode.
The transactional protocol needs ``BEGIN`` + ``idempotency.begin(...)`` and
``idempotency.complete(...)`` + ``COMMIT`` to travel together, so this module
drives libpq's pipeline mode directly (``psycopg.pq``) and leaves the
connection idle or in a transaction exactly as libpq reports it; psycopg reads
that state from libpq, so its next statement sees the open transaction.

The work is written once, as psycopg writes its own: generators that yield
``psycopg.waiting.Wait`` whenever the socket would block (``pipeline``). The
sync client runs them with ``conn.wait(gen)`` under ``conn.lock``, the async
client with ``await conn.wait(gen)`` under the async lock, so both send the
same bytes in the same flights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generator, List, Optional, Sequence, Union

import psycopg
from psycopg import errors, generators, pq
from psycopg.waiting import Ready, Wait

TEXT = 0
BINARY = 1
BYTEA_OID = 17

Gen = Generator[Wait, Ready, Any]
"""A generator that yields what it waits for (psycopg's PQGen)."""


@dataclass
class Statement:
    """One statement of a pipeline: SQL with $n parameters (text unless bytes).

    With ``name``, the statement prepared under that name is executed (``sql``
    is then only what ``Prepare`` sends)."""

    sql: bytes
    params: Sequence[Union[str, bytes, None]] = ()
    name: Optional[bytes] = None


@dataclass
class Prepare:
    """Prepares ``sql`` as ``name`` (a Parse message; its result is not returned)."""

    name: bytes
    sql: bytes


class Sync:
    """A synchronization point: ends an implicit transaction, resets an error."""


SYNC = Sync()
Step = Union[Statement, Prepare, Sync]


@dataclass
class Result:
    """The outcome of one statement: rows (text format) or the error it raised."""

    columns: List[str]
    rows: List[List[Optional[bytes]]]
    error: Optional[psycopg.Error] = None

    def one(self) -> dict:
        """The single row as a column -> raw text value mapping."""
        if len(self.rows) != 1:
            raise psycopg.InterfaceError(f"expected one row, got {len(self.rows)}")
        return dict(zip(self.columns, self.rows[0]))


def _queue(pgconn: "pq.abc.PGconn", encoding: str, step: Step) -> None:
    if isinstance(step, Sync):
        pgconn.pipeline_sync()
        return
    if isinstance(step, Prepare):
        pgconn.send_prepare(step.name, step.sql)
        return
    # Text unless bytes (sent binary as bytea); str untyped (0): the server infers.
    params = step.params
    values = [v if v is None or isinstance(v, bytes) else v.encode(encoding) for v in params]
    formats = [BINARY if isinstance(v, bytes) else TEXT for v in params]
    if step.name is not None:
        pgconn.send_query_prepared(step.name, values, formats, TEXT)
    else:
        types = [BYTEA_OID if f == BINARY else 0 for f in formats]
        pgconn.send_query_params(step.sql, values, types, formats, TEXT)


def pipeline(conn: Any, steps: Sequence[Step]) -> Gen:
    """Sends every step in one flight and returns one Result per Statement.

    A statement that fails gives a Result with ``error``; the statements after it
    up to the next Sync are skipped (their Result has the same error). A Prepare
    that fails makes the next Statement's error. The caller must end with SYNC,
    hold the connection's lock, and run the generator with ``conn.wait``. The
    connection must not be in psycopg's pipeline mode.
    """
    pgconn = conn.pgconn
    encoding = conn.info.encoding
    if pgconn.pipeline_status != pq.PipelineStatus.OFF:
        raise psycopg.ProgrammingError("pg_idempotency cannot run inside a psycopg pipeline")
    pgconn.enter_pipeline_mode()
    try:
        for step in steps:
            _queue(pgconn, encoding, step)
        yield from generators.send(pgconn)
        results: List[Result] = []
        aborted: Optional[psycopg.Error] = None
        for step in steps:
            if isinstance(step, Sync):
                res = yield from generators.fetch(pgconn)
                while res is not None and res.status != pq.ExecStatus.PIPELINE_SYNC:
                    res = yield from generators.fetch(pgconn)
                if res is None:
                    raise psycopg.OperationalError(pgconn.error_message.decode(encoding, "replace"))
                aborted = None
                continue
            result = yield from _read_statement(pgconn, encoding)
            if aborted is not None:
                result.error = aborted  # skipped: the error that aborted the pipeline
            elif result.error is not None:
                aborted = result.error
            if isinstance(step, Statement):
                results.append(result)
        return results
    finally:
        if pgconn.pipeline_status != pq.PipelineStatus.OFF:
            try:
                pgconn.exit_pipeline_mode()
            except psycopg.Error:
                # Busy: the flight was cut short (a lost connection, an exception while
                # reading) and its results are still due, so the session's state is
                # unknown. Closed here, its owner sees a closed connection (discarded by a
                # pool) instead of one whose rollback() raises "cannot exit pipeline mode".
                pgconn.finish()


def _read_statement(pgconn: "pq.abc.PGconn", encoding: str) -> Gen:
    result = Result(columns=[], rows=[])
    while True:
        res = yield from generators.fetch(pgconn)
        if res is None:
            if pgconn.status == pq.ConnStatus.BAD:
                raise psycopg.OperationalError(pgconn.error_message.decode(encoding, "replace"))
            return result
        status = res.status
        if status == pq.ExecStatus.TUPLES_OK:
            result.columns = [(res.fname(i) or b"").decode(encoding) for i in range(res.nfields)]
            result.rows = [[res.get_value(r, c) for c in range(res.nfields)] for r in range(res.ntuples)]
        elif status == pq.ExecStatus.FATAL_ERROR:
            result.error = errors.error_from_result(res, encoding=encoding)
        elif status == pq.ExecStatus.PIPELINE_ABORTED:
            result.error = psycopg.OperationalError("statement skipped after an earlier error in the pipeline")
        elif status != pq.ExecStatus.COMMAND_OK:
            result.error = psycopg.InterfaceError(f"unexpected result status {status!r}")


def raise_first(results: Sequence[Result]) -> None:
    """Raises the first error among the results, if any."""
    for result in results:
        if result.error is not None:
            raise result.error


def run(conn: psycopg.Connection[Any], steps: Sequence[Step]) -> List[Result]:
    """``pipeline`` on a sync connection, under its lock."""
    with conn.lock:
        return conn.wait(pipeline(conn, steps))


def begin_command(conn: Any) -> bytes:
    """BEGIN with the connection's isolation level, read-only and deferrable settings,
    as psycopg itself would start the transaction."""
    parts = [b"BEGIN"]
    if conn.isolation_level is not None:
        level = psycopg.IsolationLevel(conn.isolation_level)
        parts.append(b"ISOLATION LEVEL " + level.name.replace("_", " ").encode())
    if conn.read_only is not None:
        parts.append(b"READ ONLY" if conn.read_only else b"READ WRITE")
    if conn.deferrable is not None:
        parts.append(b"DEFERRABLE" if conn.deferrable else b"NOT DEFERRABLE")
    return b" ".join(parts)


def bytea(value: Optional[bytes]) -> Optional[bytes]:
    """Decodes a bytea column sent as text (hex format)."""
    if value is None:
        return None
    if value.startswith(b"\\x"):
        return bytes.fromhex(value[2:].decode("ascii"))
    raise psycopg.InterfaceError("bytea_output must be 'hex'")

"""Pipelined statements on a psycopg connection's own libpq session.

psycopg sends ``BEGIN`` as a round trip of its own, even in its pipeline mode.
The transactional protocol needs ``BEGIN`` + ``idempotency.begin(...)`` and
``idempotency.complete(...)`` + ``COMMIT`` to travel together, so this module
drives libpq's pipeline mode directly (``psycopg.pq``), under the connection's
lock, and leaves the connection idle or in a transaction exactly as libpq
reports it; psycopg reads that state from libpq, so its next statement sees
the open transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Union

import psycopg
from psycopg import errors, pq

TEXT = 0
BINARY = 1
BYTEA_OID = 17


@dataclass
class Statement:
    """One statement of a pipeline: SQL with $n parameters (text unless bytes)."""

    sql: bytes
    params: Sequence[Union[str, bytes, None]] = ()


class Sync:
    """A synchronization point: ends an implicit transaction, resets an error."""


SYNC = Sync()


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


def _encode(conn: psycopg.Connection[Any], value: Union[str, bytes, None]):
    if value is None:
        return None, 0, TEXT
    if isinstance(value, bytes):
        return value, BYTEA_OID, BINARY
    return value.encode(conn.info.encoding), 0, TEXT  # 0: untyped, the server infers


def run(conn: psycopg.Connection[Any], steps: Sequence[Union[Statement, Sync]]) -> List[Result]:
    """Sends every step in one flight and returns one Result per Statement.

    A statement that fails gives a Result with ``error``; the statements after it
    up to the next Sync are skipped (their Result has the same error). The caller
    must end with SYNC. The connection must not be in psycopg's pipeline mode.
    """
    pgconn = conn.pgconn
    encoding = conn.info.encoding
    with conn.lock:
        if pgconn.pipeline_status != pq.PipelineStatus.OFF:
            raise psycopg.ProgrammingError("pg_idempotency cannot run inside a psycopg pipeline")
        pgconn.enter_pipeline_mode()
        try:
            for step in steps:
                if isinstance(step, Sync):
                    pgconn.pipeline_sync()
                    continue
                values, types, formats = [], [], []
                for param in step.params:
                    v, t, f = _encode(conn, param)
                    values.append(v)
                    types.append(t)
                    formats.append(f)
                pgconn.send_query_params(step.sql, values, types, formats, TEXT)
            while pgconn.flush() == 1:  # blocking connection: flush returns 0 when sent
                pass
            results: List[Result] = []
            aborted: Optional[psycopg.Error] = None
            for step in steps:
                if isinstance(step, Sync):
                    res = pgconn.get_result()
                    while res is not None and res.status != pq.ExecStatus.PIPELINE_SYNC:
                        res = pgconn.get_result()
                    if res is None:
                        raise psycopg.OperationalError(pgconn.error_message.decode(encoding, "replace"))
                    aborted = None
                    continue
                result = _read_statement(pgconn, encoding)
                if result.error is not None and aborted is None:
                    aborted = result.error
                elif aborted is not None and result.error is None:
                    result.error = aborted
                results.append(result)
            return results
        finally:
            if pgconn.pipeline_status != pq.PipelineStatus.OFF:
                try:
                    pgconn.exit_pipeline_mode()
                except psycopg.Error:
                    pass


def _read_statement(pgconn: "pq.abc.PGconn", encoding: str) -> Result:
    result = Result(columns=[], rows=[])
    while True:
        res = pgconn.get_result()
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


def begin_command(conn: psycopg.Connection[Any]) -> bytes:
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

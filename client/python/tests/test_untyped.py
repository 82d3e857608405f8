"""Every function of the extension is callable the way drivers send parameters:
psycopg's own adaptation (server-side binding: str and None go untyped, int as
the smallest integer type, bytes as bytea) and node-pg's (every parameter text,
untyped), with NULL for every optional argument. No casts, no named arguments
beyond what the call shape needs.

A failure here names the call and the SQLSTATE (42725 "function is not unique",
42P18 "could not determine data type", 42883 "function does not exist").
"""

from __future__ import annotations

import uuid
from typing import List, Optional, Sequence, Tuple

import psycopg
import pytest
from psycopg import pq

FP = bytes(range(32))
FP_TEXT = "\\x" + FP.hex()
BODY = b'{"id":1}'
BODY_TEXT = "\\x" + BODY.hex()

# (id, setup statements run first in the same transaction, the call, psycopg args, node-pg args)
Case = Tuple[str, List[str], str, Sequence[object], Sequence[Optional[str]]]


def cases() -> List[Case]:
    begin = "SELECT * FROM idempotency.begin('p', 'k', 'a', '\\x" + FP.hex() + "'::bytea)"
    acquire = "SELECT * FROM idempotency.acquire('p', 'k', 'a', '\\x" + FP.hex() + "'::bytea)"
    return [
        ("jcs", [], "SELECT idempotency.jcs($1)", ['{"b":1,"a":2}'], ['{"b":1,"a":2}']),
        ("fingerprint/2", [], "SELECT idempotency.fingerprint($1, $2)", ["POST", "/x"], ["POST", "/x"]),
        ("fingerprint/4 nulls", [], "SELECT idempotency.fingerprint($1, $2, $3, $4)",
         ["POST", "/x", None, None], ["POST", "/x", None, None]),
        ("fingerprint/4", [], "SELECT idempotency.fingerprint($1, $2, $3, $4)",
         ["POST", "/x", BODY, ["/a"]], ["POST", "/x", BODY_TEXT, "{/a}"]),
        ("begin/4", [], "SELECT * FROM idempotency.begin($1, $2, $3, $4)",
         ["p", "k", "a", FP], ["p", "k", "a", FP_TEXT]),
        ("begin/6 nulls", [], "SELECT * FROM idempotency.begin($1, $2, $3, $4, $5, $6)",
         ["p", "k", "a", FP, None, None], ["p", "k", "a", FP_TEXT, None, None]),
        ("begin/6 intervals", [], "SELECT * FROM idempotency.begin($1, $2, $3, $4, $5, $6)",
         ["p", "k", "a", FP, "1 hour", "100 ms"], ["p", "k", "a", FP_TEXT, "1 hour", "100 ms"]),
        ("complete/3", [begin], "SELECT idempotency.complete($1, $2, $3)", ["p", "k", 204], ["p", "k", "204"]),
        ("complete/4 null body", [begin], "SELECT idempotency.complete($1, $2, $3, $4)",
         ["p", "k", 204, None], ["p", "k", "204", None]),
        ("complete/4 text body", [begin], "SELECT idempotency.complete($1, $2, $3, $4)",
         ["p", "k", 200, BODY_TEXT], ["p", "k", "200", BODY_TEXT]),
        ("complete/7", [begin], "SELECT idempotency.complete($1, $2, $3, $4, $5, $6, $7)",
         ["p", "k", 201, BODY, '{"Location":"/o/1"}', "1", False],
         ["p", "k", "201", BODY_TEXT, '{"Location":"/o/1"}', "1", "false"]),
        ("complete/7 nulls", [begin], "SELECT idempotency.complete($1, $2, $3, $4, $5, $6, $7)",
         ["p", "k", 201, None, None, None, None], ["p", "k", "201", None, None, None, None]),
        ("save_final/5", [], "SELECT idempotency.save_final($1, $2, $3, $4, $5)",
         ["p", "k", "a", FP, 409], ["p", "k", "a", FP_TEXT, "409"]),
        ("save_final/8 nulls", [], "SELECT idempotency.save_final($1, $2, $3, $4, $5, $6, $7, $8)",
         ["p", "k", "a", FP, 409, None, None, None], ["p", "k", "a", FP_TEXT, "409", None, None, None]),
        ("is_final", [], "SELECT idempotency.is_final($1)", [201], ["201"]),
        ("forget", [], "SELECT idempotency.forget($1, $2)", ["p", "k"], ["p", "k"]),
        ("acquire/4", [], "SELECT * FROM idempotency.acquire($1, $2, $3, $4)",
         ["p", "k", "a", FP], ["p", "k", "a", FP_TEXT]),
        ("acquire/7 nulls", [], "SELECT * FROM idempotency.acquire($1, $2, $3, $4, $5, $6, $7)",
         ["p", "k", "a", FP, None, None, None], ["p", "k", "a", FP_TEXT, None, None, None]),
        ("renew/3", [acquire], "SELECT idempotency.renew($1, $2, $3)", ["p", "k", 1], ["p", "k", "1"]),
        ("renew/4 null", [acquire], "SELECT idempotency.renew($1, $2, $3, $4)",
         ["p", "k", 1, None], ["p", "k", "1", None]),
        ("complete with fence (named)", [acquire], "SELECT idempotency.complete($1, $2, status => $3, fence => $4)",
         ["p", "k", 200, 1], ["p", "k", "200", "1"]),
        ("release", [acquire], "SELECT idempotency.release($1, $2, $3)", ["p", "k", 1], ["p", "k", "1"]),
        ("claim/2", [], "SELECT idempotency.claim($1, $2)", ["p", "k"], ["p", "k"]),
        ("claim/3 null", [], "SELECT idempotency.claim($1, $2, $3)", ["p", "k", None], ["p", "k", None]),
        ("lookup", [], "SELECT * FROM idempotency.lookup($1, $2)", ["p", "k"], ["p", "k"]),
        ("cleanup_batch", [], "SELECT * FROM idempotency.cleanup_batch($1, $2)", [10, None], ["10", None]),
        ("bound_principal", [], "SELECT idempotency.bound_principal($1)", ["p"], ["p"]),
        ("complete/8 fence null", [begin], "SELECT idempotency.complete($1, $2, $3, $4, $5, $6, $7, $8)",
         ["p", "k", 201, None, None, None, None, None], ["p", "k", "201", None, None, None, None, None]),
        ("complete/8 fenced", [acquire], "SELECT idempotency.complete($1, $2, $3, $4, $5, $6, $7, $8)",
         ["p", "k", 200, BODY, None, None, False, 1], ["p", "k", "200", BODY_TEXT, None, None, "false", "1"]),
        ("save_final/9 nulls", [], "SELECT idempotency.save_final($1, $2, $3, $4, $5, $6, $7, $8, $9)",
         ["p", "k", "a", FP, 409, None, None, None, None], ["p", "k", "a", FP_TEXT, "409", None, None, None, None]),
    ]


CASES = cases()


def fresh(sql: str, principal: str) -> str:
    return sql.replace("'p'", f"'{principal}'")


def run_psycopg(conn: psycopg.Connection, case: Case, principal: str) -> None:
    _, setup, call, args, _ = case
    args = [principal if a == "p" else a for a in args]
    # Rolled back: only whether the call resolves and runs matters here (a begin
    # without complete could not commit).
    try:
        for statement in setup:
            conn.execute(fresh(statement, principal))
        conn.execute(call.replace("$1", "%s").replace("$2", "%s").replace("$3", "%s").replace("$4", "%s")
                     .replace("$5", "%s").replace("$6", "%s").replace("$7", "%s").replace("$8", "%s").replace("$9", "%s"), args,
                     prepare=False)
    finally:
        conn.rollback()


def run_untyped(conn: psycopg.Connection, case: Case, principal: str) -> None:
    """All parameters text with type 0 (unknown), as node-pg sends them."""
    _, setup, call, _, texts = case
    texts = [principal if t == "p" else t for t in texts]
    pgconn = conn.pgconn
    try:
        conn.execute("SELECT 1")  # opens the transaction (begin must not commit alone)
        for statement in setup:
            conn.execute(fresh(statement, principal))
        result = pgconn.exec_params(call.encode(), [t.encode() if t is not None else None for t in texts])
        if result.status not in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
            raise psycopg.errors.error_from_result(result, encoding="utf-8")
    finally:
        conn.rollback()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_callable_as_psycopg_sends_it(conn, case):
    run_psycopg(conn, case, "u-" + uuid.uuid4().hex[:8])


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_callable_with_untyped_text_parameters(conn, case):
    run_untyped(conn, case, "u-" + uuid.uuid4().hex[:8])


def test_cleanup_procedure_takes_untyped_arguments(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CALL idempotency.cleanup(%s, %s)", [100, None])
        conn.execute("CALL idempotency.cleanup(%s, %s)", ["100", "1 second"])


def test_schedule_cleanup_answers_with_a_sqlstate_not_a_type_error(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            conn.execute("SELECT idempotency.schedule_cleanup(%s)", ["*/5 * * * *"])
            conn.execute("SELECT idempotency.unschedule_cleanup()")
        except psycopg.errors.ObjectNotInPrerequisiteState:
            pass  # 55000: pg_cron is not installed in this database

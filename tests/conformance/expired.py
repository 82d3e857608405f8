"""Conformance scenario `expired`: a retry after the key expired under an on_expiry
'refuse' policy is 410 Gone, never run again (client/protocol.json outcome `expired`).

Needs --dsn as a superuser (it sets the action's policy and makes the key expire with
the test sequence of docs/sql-reference.md: expires_at moved into the past, then
idempotency.cleanup_batch, which leaves a tombstone) and an extension with
idempotency.set_expiry_policy (0.8.0): on an older one the scenario fails, saying why.
The action's policy is set back to `run` at the end, whatever happened.
"""

from __future__ import annotations

import email.utils
import math
import time
from typing import Any, Callable

import psycopg

KEY = "key-expired"


def scenario(suite: Any, problem: Callable[[int, str, str, str], bytes], protocol: dict) -> None:
    """Runs the scenario on a conformance.Suite; problem() builds an expected body."""
    who = suite.principal("expired")
    outcome = protocol["outcomes"]["expired"]
    kind = protocol["problems"][outcome["problem"]]
    gone = problem(kind["status"], suite.problem_base + kind["type"], kind["title"], outcome["detail"])
    expires_header = protocol["expires_header"]
    body, other_body = b'{"item":"book","quantity":2}', b'{"item":"pen","quantity":2}'

    first = suite.post("/orders", body, who, KEY)
    if not suite.expect("expired: the first request is 201", first, 201, replay=False):
        return
    dsn = suite.key_dsn(who)
    with psycopg.connect(dsn, autocommit=True) as conn:
        if conn.execute("SELECT to_regproc('idempotency.set_expiry_policy')").fetchone()[0] is None:
            version = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'idempotency'").fetchone()
            suite.check("expired: the extension has idempotency.set_expiry_policy (0.8.0 or later)", False,
                        f"the service's database has idempotency {version[0] if version else '?'}:"
                        " no tombstones, the scenario cannot run")
            return
        row = conn.execute("SELECT action FROM idempotency.keys WHERE principal = %s AND key = %s",
                           (who, KEY)).fetchone()
        if not suite.check("expired: the key row of the first request is in idempotency.keys", row is not None):
            return
        action = row[0]
        try:
            conn.execute("SELECT idempotency.set_expiry_policy(%s, 'refuse')", (action,))
            expired_epoch = _expire(conn, who)
            _retries(suite, who, gone, expires_header, expired_epoch, body, other_body)
        finally:
            conn.execute("SELECT idempotency.set_expiry_policy(%s, 'run')", (action,))


def _expire(conn: psycopg.Connection, who: str) -> int:
    """The contract's test sequence; returns the expiry the tombstone keeps (epoch seconds).
    created_at moves back too: the CHECK keys_expires_after_created refuses an expires_at
    before it, and the first request was made less than a second ago."""
    moved = conn.execute(
        "UPDATE idempotency.keys SET created_at = now() - interval '1 hour',"
        " expires_at = now() - interval '1 second'"
        " WHERE principal = %s AND key = %s RETURNING expires_at",  # (Citus: no function here)
        (who, KEY),
    ).fetchone()
    conn.execute("SELECT idempotency.cleanup_batch(1000)")
    return math.floor(moved[0].timestamp()) if moved else 0


def _retries(suite: Any, who: str, gone: bytes, expires_header: str, expired_epoch: int, body: bytes,
             other_body: bytes) -> None:
    retry = suite.post("/orders", body, who, KEY)
    suite.expect("expired: a retry after the key expired is 410 problem+json", retry, 410, body=gone,
                 replay=False, content_type="application/problem+json")
    values = retry.headers_named(expires_header)
    value = values[0] if len(values) == 1 else ""
    told = _epoch(value)
    suite.check(f"expired: the 410 has one {expires_header}, an IMF-fixdate in the past",
                told is not None and email.utils.formatdate(told, usegmt=True) == value and told < time.time(),
                f"{expires_header}: {values!r}")
    suite.check(f"expired: {expires_header} is when the key expired",
                told is not None and abs(told - expired_epoch) <= 1,
                f"{value!r}, the key expired at {email.utils.formatdate(expired_epoch, usegmt=True)!r}")
    suite.effects("expired: the request did not run again", "orders", who, 1)
    other = suite.post("/orders", other_body, who, KEY)
    suite.expect("expired: another body under the expired key is 422", other, 422, body=suite.reuse,
                 replay=False, content_type="application/problem+json")
    suite.effects("expired: nor did another body", "orders", who, 1)


def _epoch(value: str) -> Any:
    try:
        return int(email.utils.parsedate_to_datetime(value).timestamp())
    except (TypeError, ValueError, IndexError):
        return None

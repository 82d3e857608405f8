"""The transactional protocol: the key row and the application's writes commit together.

    client = Client()
    with client.transaction(conn, request) as attempt:
        if attempt.started:
            order_id = conn.execute("INSERT ... RETURNING id", ...).fetchone()[0]
            attempt.respond(Response(201, [("Content-Type", "application/json")], body))
    send(attempt.response)

The attempt owns the transaction on the caller's connection: it sends ``BEGIN``
with ``idempotency.begin(...)`` (the fingerprint computed by
``idempotency.fingerprint`` in the same statement) and ``idempotency.complete(...)``
with ``COMMIT``, so a keyed request takes as many round trips as the same
handler in a plain ``with conn.transaction()`` block.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from datetime import timedelta
from types import TracebackType
from typing import Any, Callable, Optional, Sequence, Type

import psycopg
from psycopg import errors
from psycopg.pq import TransactionStatus

from . import _wire
from ._common import (
    BODY_INVALID,
    DEFAULT_KEPT_HEADERS,
    KEY_REFUSED,
    FinalStatuses,
    Request,
    interval,
    kept_headers_json,
    stored_response,
    text_array,
    valid_key,
)
from .http import Problem, Response, problem_response

BEGIN_SQL = (
    b"SELECT outcome, response_status, response_headers::text AS response_headers, response_body,"
    b" resource_id, ceil(extract(epoch FROM lease_until - pg_catalog.clock_timestamp()))::integer"
    b" AS lease_seconds"
    b" FROM idempotency.begin($1, $2, $3, idempotency.fingerprint($4, $5, $6::bytea, $7::text[]),"
    b" $8::interval, $9::interval)"
)
# Named arguments: the same call works on 0.5.0 (two complete overloads) and 0.6.0.
COMPLETE_SQL = (
    b"SELECT idempotency.complete($1, $2, status => $3::integer, body => $4::bytea,"
    b" headers => $5::jsonb, resource_id => $6, one_time_secret => $7::boolean)"
)
SAVE_FINAL_SQL = (
    b"SELECT idempotency.save_final($1, $2, $3,"
    b" idempotency.fingerprint($4, $5, $6::bytea, $7::text[]), status => $8::integer,"
    b" body => $9::bytea, headers => $10::jsonb, ttl => $11::interval, one_time_secret => $12::boolean)"
)


@dataclass
class Options:
    """Settings of a Client."""

    methods_requiring_key: Sequence[str] = ("POST", "PATCH")
    """Methods answered 400 when they come without an Idempotency-Key."""
    kept_headers: Sequence[str] = DEFAULT_KEPT_HEADERS
    """Response headers stored with the key and replayed."""
    wait: Optional[timedelta] = None
    """How long begin waits for a transaction that holds the key; None: idempotency.wait_timeout."""
    ttl: Optional[timedelta] = None
    """Key lifetime; None: idempotency.key_ttl."""
    max_attempts: int = 3
    """Attempts of handle() on serialization failures and deadlocks."""
    retry_after: int = 1
    """Retry-After (seconds) of a 409 for a key held by a transaction."""
    final_statuses: Optional[Sequence[int]] = None
    """Statuses that are stored; None: ask the server once (idempotency.is_final)."""
    problem_type_base: str = "/problems/"
    """Prefix of problem ``type`` URIs."""
    max_key_length: int = 255
    """Longest key accepted before asking the server."""


@dataclass
class Counters:
    """What a Client did, for metrics."""

    started: int = 0
    replayed: int = 0
    mismatched: int = 0
    in_progress: int = 0
    secret_replayed: int = 0
    rejected_keys: int = 0
    not_stored: int = 0
    stored_errors: int = 0
    retries: int = 0


Handler = Callable[[psycopg.Connection[Any]], Response]
"""The application's work: runs inside the transaction that holds the key."""


class Attempt:
    """One pass of a request through the protocol; a context manager (see Client.transaction).

    After ``__enter__``: ``started`` is True when the handler must run (and call
    ``respond``); otherwise ``response`` is ready (replay, 400, 409, 422) and the
    transaction has already ended. After ``__exit__``: ``response`` is what to send.
    """

    def __init__(self, client: "Client", conn: psycopg.Connection[Any], request: Request) -> None:
        self.client = client
        self.conn = conn
        self.request = request
        self.started = False
        """True when the handler must run in this transaction."""
        self.outcome: Optional[str] = None
        """begin's outcome, "rejected" (no or bad key) or "unkeyed" (no key needed)."""
        self.response: Optional[Response] = None
        """What to send; set on enter unless started, and on exit."""
        self._handler_response: Optional[Response] = None

    def respond(self, response: Response) -> None:
        """The handler's response; stored on exit when it is final."""
        if not self.started:
            raise psycopg.ProgrammingError("respond() on an attempt that did not start")
        self._handler_response = response

    def __enter__(self) -> "Attempt":
        self.client._enter(self)
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.client._exit(self, exc)


def _rollback_quietly(conn: psycopg.Connection[Any]) -> None:
    if conn.closed or conn.info.transaction_status == TransactionStatus.IDLE:
        return
    try:
        _raise_first(_wire.run(conn, [_wire.Statement(b"ROLLBACK"), _wire.SYNC]))
    except psycopg.Error:
        pass  # the connection is gone; the server rolls back


def _raise_first(results: Sequence[_wire.Result]) -> None:
    for result in results:
        if result.error is not None:
            raise result.error


class Client:
    """Runs handlers through the transactional protocol and maps outcomes to HTTP.

    Thread-safe; connections are not (psycopg's rule): one connection per thread
    at a time, passed to each call.
    """

    def __init__(self, options: Optional[Options] = None) -> None:
        self.options = options or Options()
        if self.options.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.counters = Counters()
        self._counter_lock = threading.Lock()
        self._final = FinalStatuses(self.options.final_statuses)

    def _count(self, name: str) -> None:
        with self._counter_lock:
            setattr(self.counters, name, getattr(self.counters, name) + 1)

    def is_final(self, conn: psycopg.Connection[Any], status: int) -> bool:
        """Whether a response with this status is stored (idempotency.final_statuses)."""
        self._final.load(conn)
        return self._final(status)

    def transaction(self, conn: psycopg.Connection[Any], request: Request) -> Attempt:
        """A context manager that runs one attempt of ``request`` on ``conn``.

        ``conn`` must be idle (not in a transaction): the attempt opens the
        transaction, and ends it on exit (commit with the stored key, or
        rollback). An exception in the block rolls back, stores nothing and
        propagates. Serialization failures are not retried here; see handle().
        """
        return Attempt(self, conn, request)

    def handle(self, conn: psycopg.Connection[Any], request: Request, handler: Handler) -> Response:
        """Runs ``handler`` through the protocol and returns the response to send.

        Serialization failures (40001) and deadlocks (40P01) rerun the whole
        attempt, handler included, up to ``max_attempts``; then the error
        propagates (map it to 503 with Retry-After). A commit whose outcome is
        unknown (a lost connection) is never retried.
        """
        attempt_number = 1
        while True:
            try:
                with self.transaction(conn, request) as attempt:
                    if attempt.started:
                        attempt.respond(handler(conn))
                assert attempt.response is not None
                return attempt.response
            except (errors.SerializationFailure, errors.DeadlockDetected):
                if attempt_number >= self.options.max_attempts:
                    raise
            attempt_number += 1
            self._count("retries")

    def idempotent(self, handler: Handler) -> Callable[[psycopg.Connection[Any], Request], Response]:
        """Decorator: ``handler(conn)`` becomes ``f(conn, request)`` run through handle()."""

        @functools.wraps(handler)
        def run(conn: psycopg.Connection[Any], request: Request) -> Response:
            return self.handle(conn, request, handler)

        return run

    # -- the steps of an attempt ---------------------------------------------

    def _problem(self, problem: Problem, detail: str) -> Response:
        return problem_response(problem, detail, self.options.problem_type_base)

    def _enter(self, attempt: Attempt) -> None:
        conn, request, options = attempt.conn, attempt.request, self.options
        if conn.info.transaction_status != TransactionStatus.IDLE:
            raise psycopg.ProgrammingError(
                "the connection must be idle: the idempotency attempt opens and ends its own transaction"
            )
        method = request.method.upper()
        if request.key is None:
            if any(m.upper() == method for m in options.methods_requiring_key):
                self._count("rejected_keys")
                attempt.outcome = "rejected"
                attempt.response = self._problem(
                    Problem.KEY_MISSING, f"{method} requests need an Idempotency-Key header."
                )
                return
            # Not idempotent by key: just a transaction around the handler.
            _raise_first(_wire.run(conn, [_wire.Statement(_wire.begin_command(conn)), _wire.SYNC]))
            attempt.outcome = "unkeyed"
            attempt.started = True
            return
        if not valid_key(request.key, options.max_key_length):
            self._count("rejected_keys")
            attempt.outcome = "rejected"
            attempt.response = self._problem(
                Problem.KEY_MALFORMED,
                f"The Idempotency-Key must be 1 to {options.max_key_length} visible ASCII characters.",
            )
            return
        self._final.load(conn)  # known before any transaction starts

        begin = _wire.Statement(
            BEGIN_SQL,
            [
                request.principal,
                request.key,
                request.action_name(),
                request.method,
                request.path,
                request.body,
                text_array(request.exclude),
                interval(options.ttl),
                interval(options.wait),
            ],
        )
        _, result = _wire.run(conn, [_wire.Statement(_wire.begin_command(conn)), begin, _wire.SYNC])
        if result.error is not None:
            _rollback_quietly(conn)
            state = getattr(result.error, "sqlstate", None)
            if state in KEY_REFUSED:
                self._count("rejected_keys")
                attempt.outcome = "rejected"
                attempt.response = self._problem(
                    Problem.KEY_MALFORMED, "The Idempotency-Key was refused by the server."
                )
                return
            if state in BODY_INVALID:
                attempt.outcome = "rejected"
                detail = result.error.diag.message_primary or str(result.error)
                attempt.response = self._problem(Problem.BODY_INVALID, detail)
                return
            raise result.error
        row = result.one()
        outcome = (row["outcome"] or b"").decode()
        attempt.outcome = outcome
        if outcome == "started":
            self._count("started")
            attempt.started = True
            return
        try:
            attempt.response = self._answer(outcome, row)
        finally:
            commit = _wire.run(conn, [_wire.Statement(b"COMMIT"), _wire.SYNC])
        _raise_first(commit)

    def _answer(self, outcome: str, row: dict) -> Response:
        if outcome == "replay":
            self._count("replayed")
            return stored_response(
                int(row["response_status"]),
                row["response_headers"].decode() if row["response_headers"] is not None else None,
                _wire.bytea(row["response_body"]),
                row["resource_id"].decode() if row["resource_id"] is not None else None,
            )
        if outcome == "mismatch":
            self._count("mismatched")
            return self._problem(
                Problem.KEY_REUSE,
                "This Idempotency-Key was used for a different request; use a new key for a new request.",
            )
        if outcome == "secret_replay":
            self._count("secret_replayed")
            response = self._problem(
                Problem.ONE_TIME_SECRET,
                "The first response to this request carried a secret and was not kept;"
                " create a new one with a new key.",
            )
            response.replayed = True
            response.set_header("Idempotent-Replay", "true")
            return response
        if outcome == "in_progress":
            self._count("in_progress")
            retry = self.options.retry_after
            if row["lease_seconds"] is not None:
                retry = max(1, int(row["lease_seconds"]))
            response = self._problem(
                Problem.REQUEST_IN_PROGRESS,
                "A request with this Idempotency-Key is still being processed; retry later.",
            )
            response.set_header("Retry-After", str(max(1, retry)))
            return response
        raise psycopg.InterfaceError(f"idempotency.begin returned an unknown outcome: {outcome}")

    def _exit(self, attempt: Attempt, exc: Optional[BaseException]) -> None:
        if not attempt.started:
            return
        conn = attempt.conn
        if exc is not None:
            _rollback_quietly(conn)  # nothing is stored; the exception propagates
            return
        answer = attempt._handler_response
        if attempt.outcome == "unkeyed":
            _raise_first(_wire.run(conn, [_wire.Statement(b"COMMIT"), _wire.SYNC]))
            attempt.response = answer
            return
        if answer is None:
            _rollback_quietly(conn)
            raise psycopg.ProgrammingError("the attempt started but respond() was not called")
        if not 100 <= answer.status <= 599:
            _rollback_quietly(conn)
            raise ValueError(f"handler returned HTTP status {answer.status}")
        attempt.response = answer
        request = attempt.request
        if not self._final(answer.status):
            # 401, 429, 3xx, 5xx...: no effect may stay and nothing is stored, so a
            # retry after a token refresh, throttling or a crash takes effect once.
            self._count("not_stored")
            _rollback_quietly(conn)
            return
        headers = kept_headers_json(answer, self.options.kept_headers)
        if answer.status >= 400:
            # A final error has no effect to keep: roll back, then store it alone
            # (save_final runs in an implicit transaction of its own, same flight).
            save = _wire.Statement(
                SAVE_FINAL_SQL,
                [
                    request.principal,
                    request.key,
                    request.action_name(),
                    request.method,
                    request.path,
                    request.body,
                    text_array(request.exclude),
                    str(answer.status),
                    # A one-time secret is sent without its body and headers: the
                    # server would drop them anyway.
                    b"" if answer.one_time_secret else answer.body,
                    None if answer.one_time_secret else headers,
                    interval(self.options.ttl),
                    "true" if answer.one_time_secret else "false",
                ],
            )
            results = _wire.run(conn, [_wire.Statement(b"ROLLBACK"), _wire.SYNC, save, _wire.SYNC])
            _raise_first(results)
            self._count("stored_errors")
            return
        complete = _wire.Statement(
            COMPLETE_SQL,
            [
                request.principal,
                request.key,
                str(answer.status),
                answer.body,
                headers,
                answer.resource_id,
                "true" if answer.one_time_secret else "false",
            ],
        )
        results = _wire.run(conn, [complete, _wire.Statement(b"COMMIT"), _wire.SYNC])
        if results[0].error is not None:
            _rollback_quietly(conn)
            raise results[0].error
        _raise_first(results)


FINGERPRINT_SQL = b"SELECT idempotency.fingerprint($1, $2, $3::bytea, $4::text[])"


def fingerprint(
    conn: psycopg.Connection[Any],
    method: str,
    path: str,
    body: Optional[bytes] = None,
    exclude: Sequence[str] = (),
) -> bytes:
    """The 32-byte request fingerprint, computed by the server's
    ``idempotency.fingerprint`` with the parameters exactly as ``begin`` sends them
    (one round trip; the protocol itself never needs this call)."""
    (result,) = _wire.run(
        conn, [_wire.Statement(FINGERPRINT_SQL, [method, path, body, text_array(exclude)]), _wire.SYNC]
    )
    if result.error is not None:
        raise result.error
    digest = _wire.bytea(result.one()["fingerprint"])
    assert digest is not None
    return digest

"""The transactional protocol written once for the sync and the async client.

Every step that talks to the server is a generator (see ``_wire``): ``Client``
runs it with ``conn.wait`` under the connection's lock, ``AsyncClient`` with
``await conn.wait`` under the async lock. What is left to the two shells is
calling the handler and the context-manager protocol, so the two cannot send
different statements or map outcomes differently.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, List, Optional, Sequence

import psycopg
from psycopg.pq import TransactionStatus

from . import _wire
from ._common import (
    BODY_INVALID,
    KEY_REFUSED,
    NOT_STORED,
    SAVED_AFTER_ROLLBACK,
    Request,
    Storage,
    answer_response,
    duplicate_wait,
    interval,
    kept_headers_json,
    request_params,
    text_array,
    valid_key,
)
from .http import (
    DEFAULT_DUPLICATE_MODE,
    DEFAULT_KEPT_HEADERS,
    DEFAULT_RETRY_AFTER_SECONDS,
    KEY_REFUSED_DETAIL,
    PROBLEM_TYPE_BASE,
    Problem,
    Response,
    problem_response,
    stamped,
)

# idempotency.http_answer answers in the same statement every outcome but "started"
# (CASE: no call for started; one call per column otherwise). The statement is the
# one form Citus delegates, SELECT ... FROM f(...) and nothing else in FROM or WHERE:
# through a Citus coordinator the call runs on the node of the principal's shard.
BEGIN_SQL = (
    b"SELECT o.outcome, o.resource_id,"
    b" floor(extract(epoch FROM o.expires_at))::bigint AS expires_epoch,"
    b" CASE WHEN o.outcome <> 'started' THEN (idempotency.http_answer(o, $10::text, $11::integer)).status END AS status,"
    b" CASE WHEN o.outcome <> 'started' THEN (idempotency.http_answer(o, $10::text, $11::integer)).headers::text END AS headers,"
    b" CASE WHEN o.outcome <> 'started' THEN (idempotency.http_answer(o, $10::text, $11::integer)).body END AS body"
    b" FROM idempotency.begin($1::text, $2::text, $3::text,"
    b" idempotency.fingerprint($4::text, $5::text, $6::bytea, $7::text[]),"
    b" $8::interval, $9::interval) AS o"
)
# Named arguments, as the extension's reference documents them.
COMPLETE_SQL = (
    b"SELECT idempotency.complete($1::text, $2::text, status => $3::integer, body => $4::bytea,"
    b" headers => $5::jsonb, resource_id => $6::text, one_time_secret => $7::boolean)"
)
# The stored row's expiry after save_final (which starts the ttl at its own now()).
STORED_EXPIRY_SQL = b"SELECT floor(extract(epoch FROM expires_at))::bigint FROM idempotency.lookup($1::text, $2::text)"
SAVE_FINAL_SQL = (
    b"SELECT idempotency.save_final($1::text, $2::text, $3::text,"
    b" idempotency.fingerprint($4::text, $5::text, $6::bytea, $7::text[]), status => $8::integer,"
    b" body => $9::bytea, headers => $10::jsonb, ttl => $11::interval, one_time_secret => $12::boolean)"
)


def _name(sql: bytes) -> bytes:
    # Named after the text: a statement of this name on the session is this one
    # (42P05 from another client on the same server session means "already there").
    return b"pg_idempotency_" + hashlib.sha1(sql).hexdigest()[:16].encode()


PREPARES = [_wire.Prepare(_name(sql), sql) for sql in (BEGIN_SQL, COMPLETE_SQL, SAVE_FINAL_SQL, STORED_EXPIRY_SQL)]
BEGIN_NAME, COMPLETE_NAME, SAVE_FINAL_NAME, EXPIRY_NAME = (prepare.name for prepare in PREPARES)
# Lost (DISCARD ALL, a transaction pooler on another server session) or already there.
STATEMENT_GONE = "26000"
STATEMENT_EXISTS = "42P05"

# The sessions (psycopg connections) on which the statements of PREPARES are prepared.
_prepared: "weakref.WeakSet[Any]" = weakref.WeakSet()


@dataclass
class Options:
    """Settings of a Client or an AsyncClient."""

    methods_requiring_key: Sequence[str] = ("POST", "PATCH")
    """Methods answered 400 when they come without an Idempotency-Key."""
    kept_headers: Sequence[str] = DEFAULT_KEPT_HEADERS
    """Response headers stored with the key and replayed."""
    wait: Optional[timedelta] = None
    """How long begin waits for a transaction that holds the key; None: idempotency.wait_timeout."""
    duplicates: str = DEFAULT_DUPLICATE_MODE
    """"wait" (a duplicate of a running request waits for it, up to ``wait``, then replays)
    or "reject" (409 request-in-progress with Retry-After at once: begin with wait 0).
    Request.duplicates overrides it per call."""
    ttl: Optional[timedelta] = None
    """Key lifetime; None: idempotency.key_ttl."""
    max_attempts: int = 3
    """Attempts of handle() on serialization failures and deadlocks."""
    retry_after: int = DEFAULT_RETRY_AFTER_SECONDS
    """Retry-After (seconds) of a 409 for a key held by a transaction."""
    final_statuses: Optional[Sequence[int]] = None
    """Statuses that are stored; None: ask the server once (idempotency.http_storage)."""
    problem_type_base: str = PROBLEM_TYPE_BASE
    """Prefix of problem ``type`` URIs."""
    max_key_length: int = 255
    """Longest key accepted before asking the server."""
    prepare: bool = True
    """Prepare begin/complete/save_final once per connection (in the flight of the
    first request, no extra round trip). A statement lost to DISCARD ALL or to a
    transaction-mode pooler (26000) is prepared again and the attempt retried once."""


@dataclass
class Counters:
    """What a Client did, for metrics."""

    started: int = 0
    replayed: int = 0
    mismatched: int = 0
    in_progress: int = 0
    secret_replayed: int = 0
    expired: int = 0
    """Retries of a key that expired under an on_expiry 'refuse' policy (410)."""
    rejected_keys: int = 0
    not_stored: int = 0
    stored_errors: int = 0
    retries: int = 0


class AttemptBase:
    """What the sync and the async attempt share (see Client.transaction)."""

    def __init__(self, client: "ClientBase", conn: Any, request: Request) -> None:
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
        self.expires_epoch: Optional[int] = None
        """The key row's expires_at (epoch seconds) as begin() reported it, or None."""
        self._named = False  # begin ran as a prepared statement

    def respond(self, response: Response) -> None:
        """The handler's response; stored on exit when it is final."""
        if not self.started:
            raise psycopg.ProgrammingError("respond() on an attempt that did not start")
        self._handler_response = response


def _state(error: Optional[BaseException]) -> Optional[str]:
    return getattr(error, "sqlstate", None)


def rollback_quietly_gen(conn: Any) -> _wire.Gen:
    """ROLLBACK unless idle; a lost connection is ignored (the server rolls back)."""
    if conn.closed or conn.pgconn.transaction_status == TransactionStatus.IDLE:
        return
    try:
        _wire.raise_first((yield from _wire.pipeline(conn, [_wire.Statement(b"ROLLBACK"), _wire.SYNC])))
    except psycopg.Error:
        pass


class ClientBase:
    """The protocol's steps as generators; Client and AsyncClient run them."""

    def __init__(self, options: Optional[Options] = None) -> None:
        self.options = options or Options()
        if self.options.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.counters = Counters()
        self._counter_lock = threading.Lock()
        self._final = Storage(self.options.final_statuses)

    def _count(self, name: str) -> None:
        with self._counter_lock:
            setattr(self.counters, name, getattr(self.counters, name) + 1)

    def _problem(self, problem: Problem, detail: str) -> Response:
        return problem_response(problem, detail, self.options.problem_type_base)

    def _check_idle(self, conn: Any) -> None:
        if conn.pgconn.transaction_status != TransactionStatus.IDLE:
            raise psycopg.ProgrammingError(
                "the connection must be idle: the idempotency attempt opens and ends its own transaction"
            )

    def _reject(self, attempt: AttemptBase) -> bool:
        """Answers a missing or malformed key without the server; True when it did."""
        request, options = attempt.request, self.options
        method = request.method.upper()
        if request.key is None:
            if not any(m.upper() == method for m in options.methods_requiring_key):
                return False
            detail = f"{method} requests need an Idempotency-Key header."
            attempt.response = self._problem(Problem.KEY_MISSING, detail)
        elif not valid_key(request.key, options.max_key_length):
            detail = f"The Idempotency-Key must be 1 to {options.max_key_length} visible ASCII characters."
            attempt.response = self._problem(Problem.KEY_MALFORMED, detail)
        else:
            return False
        self._count("rejected_keys")
        attempt.outcome = "rejected"
        return True

    def _enter_gen(self, attempt: AttemptBase) -> _wire.Gen:
        """Opens the attempt: BEGIN + begin() in one flight (plus the final-status
        table on a client's first request). Sets ``started`` or ``response``."""
        conn, request = attempt.conn, attempt.request
        if self._reject(attempt):
            return
        if request.key is None:
            # Not idempotent by key: just a transaction around the handler.
            begin = _wire.Statement(_wire.begin_command(conn))
            _wire.raise_first((yield from _wire.pipeline(conn, [begin, _wire.SYNC])))
            attempt.outcome = "unkeyed"
            attempt.started = True
            return
        yield from self._final.load_gen(conn)  # known before any transaction starts
        result = yield from self._begin_gen(attempt)
        if result.error is not None:
            yield from rollback_quietly_gen(conn)
            state = _state(result.error)
            if state in KEY_REFUSED:
                self._count("rejected_keys")
                attempt.outcome = "rejected"
                attempt.response = self._problem(Problem.KEY_MALFORMED, KEY_REFUSED_DETAIL)
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
        if row["expires_epoch"] is not None:
            attempt.expires_epoch = int(row["expires_epoch"])
        if outcome == "started":
            self._count("started")
            attempt.started = True
            return
        try:
            attempt.response = self._answer(outcome, row)
        finally:
            commit = yield from _wire.pipeline(conn, [_wire.Statement(b"COMMIT"), _wire.SYNC])
        _wire.raise_first(commit)

    def _begin_gen(self, attempt: AttemptBase) -> _wire.Gen:
        """BEGIN + begin(): prepared (the PREPAREs in the same flight on a new
        session), re-prepared and retried once when the session lost them."""
        conn, request, options = attempt.conn, attempt.request, self.options
        params: List[Any] = request_params(request) + [
            interval(options.ttl),
            interval(duplicate_wait(request, options.duplicates, options.wait)),
            options.problem_type_base,
            str(options.retry_after),
        ]
        begin = _wire.Statement(_wire.begin_command(conn))
        if not options.prepare:
            return (yield from _wire.pipeline(conn, [begin, _wire.Statement(BEGIN_SQL, params), _wire.SYNC]))[1]
        named = _wire.Statement(BEGIN_SQL, params, BEGIN_NAME)
        known = conn in _prepared
        for tries in range(3):
            steps: List[_wire.Step] = []
            if conn.pgconn.transaction_status != TransactionStatus.IDLE:
                steps += [_wire.Statement(b"ROLLBACK"), _wire.SYNC]  # the failed try's transaction
            if tries == 2:  # a pooler keeps switching sessions: this attempt goes unnamed
                _prepared.discard(conn)
                steps += [begin, _wire.Statement(BEGIN_SQL, params), _wire.SYNC]
                return (yield from _wire.pipeline(conn, steps))[-1]
            # The PREPAREs inside the transaction: after BEGIN (its isolation level
            # must come before any snapshot), and on the session that runs begin()
            # when a transaction pooler is in between. They outlive a rollback.
            steps += [begin] + ([] if known else PREPARES) + [named, _wire.SYNC]
            result = (yield from _wire.pipeline(conn, steps))[-1]
            state = _state(result.error)
            if state == STATEMENT_GONE:
                known = False
                continue
            if state == STATEMENT_EXISTS and not known:
                known = True
                continue
            if state is None or not state.startswith("42") or known:
                _prepared.add(conn)  # the PREPAREs ran (the error, if any, is begin's own)
                attempt._named = True
            return result
        raise AssertionError("unreachable")

    def _answer(self, outcome: str, row: dict) -> Response:
        """The answer idempotency.http_answer gave in begin's row, counted."""
        if row["status"] is None:
            raise psycopg.InterfaceError(f"idempotency.begin returned an unknown outcome: {outcome}")
        counter = {"replay": "replayed", "mismatch": "mismatched", "secret_replay": "secret_replayed"}
        self._count(counter.get(outcome, outcome))
        return answer_response(
            int(row["status"]),
            row["headers"].decode(),
            _wire.bytea(row["body"]),
            row["resource_id"].decode() if row["resource_id"] is not None else None,
        )

    def _exit_gen(self, attempt: AttemptBase, exc: Optional[BaseException]) -> _wire.Gen:
        """Ends a started attempt: stores a final response with the commit (or
        alone after the rollback for a final error), rolls back anything else."""
        if not attempt.started:
            return
        conn = attempt.conn
        if exc is not None:
            yield from rollback_quietly_gen(conn)  # nothing is stored; the exception propagates
            return
        answer = attempt._handler_response
        if attempt.outcome == "unkeyed":
            _wire.raise_first((yield from _wire.pipeline(conn, [_wire.Statement(b"COMMIT"), _wire.SYNC])))
            attempt.response = answer
            return
        if answer is None:
            yield from rollback_quietly_gen(conn)
            raise psycopg.ProgrammingError("the attempt started but respond() was not called")
        if not 100 <= answer.status <= 599:
            yield from rollback_quietly_gen(conn)
            raise ValueError(f"handler returned HTTP status {answer.status}")
        attempt.response = answer
        storage = self._final.meaning(answer.status)
        if storage == NOT_STORED:
            # 401, 429, 3xx, 5xx...: no effect may stay and nothing is stored, so a
            # retry after a token refresh, throttling or a crash takes effect once.
            self._count("not_stored")
            yield from rollback_quietly_gen(conn)
            return
        if storage == SAVED_AFTER_ROLLBACK:
            stored = yield from self._save_final_gen(attempt, answer)
            attempt.response = stamped(answer, stored)
            return
        yield from self._complete_gen(attempt, answer)
        attempt.response = stamped(answer, attempt.expires_epoch)

    def _save_final_gen(self, attempt: AttemptBase, answer: Response) -> _wire.Gen:
        # A final error has no effect to keep: roll back, then store it alone
        # (save_final runs in an implicit transaction of its own, same flight).
        request, conn = attempt.request, attempt.conn
        secret = answer.one_time_secret
        params = request_params(request) + [
            str(answer.status),
            # A one-time secret is sent without its body and headers: the
            # server would drop them anyway.
            b"" if secret else answer.body,
            None if secret else kept_headers_json(answer, self.options.kept_headers),
            interval(self.options.ttl),
            "true" if secret else "false",
        ]
        name = SAVE_FINAL_NAME if attempt._named and conn in _prepared else None
        save = _wire.Statement(SAVE_FINAL_SQL, params, name)
        key = [request.principal, request.key]
        expiry = _wire.Statement(STORED_EXPIRY_SQL, key, None if name is None else EXPIRY_NAME)
        results = yield from _wire.pipeline(
            conn, [_wire.Statement(b"ROLLBACK"), _wire.SYNC, save, _wire.SYNC, expiry, _wire.SYNC]
        )
        if name is not None and _state(results[1].error) != STATEMENT_GONE and \
                _state(results[2].error) == STATEMENT_GONE:
            # save_final ran; only the expiry's statement is gone: read it unnamed.
            _prepared.discard(conn)
            _wire.raise_first(results[:2])
            results = yield from _wire.pipeline(conn, [_wire.Statement(STORED_EXPIRY_SQL, key), _wire.SYNC])
        elif name is not None and _state(results[1].error) == STATEMENT_GONE:
            # A transaction pooler may hand the implicit transaction to another session.
            _prepared.discard(conn)
            results = yield from _wire.pipeline(
                conn,
                [
                    _wire.Statement(SAVE_FINAL_SQL, params),
                    _wire.SYNC,
                    _wire.Statement(STORED_EXPIRY_SQL, key),
                    _wire.SYNC,
                ],
            )
        _wire.raise_first(results)
        self._count("stored_errors")
        rows = results[-1].rows
        return int(rows[0][0]) if rows and rows[0][0] is not None else None

    def _complete_gen(self, attempt: AttemptBase, answer: Response) -> _wire.Gen:
        request, conn = attempt.request, attempt.conn
        params = [
            request.principal,
            request.key,
            str(answer.status),
            answer.body,
            kept_headers_json(answer, self.options.kept_headers),
            answer.resource_id,
            "true" if answer.one_time_secret else "false",
        ]
        # The same transaction as begin(): the same session, its statements still there.
        name = COMPLETE_NAME if attempt._named and conn in _prepared else None
        complete = _wire.Statement(COMPLETE_SQL, params, name)
        results = yield from _wire.pipeline(conn, [complete, _wire.Statement(b"COMMIT"), _wire.SYNC])
        if results[0].error is not None:
            if _state(results[0].error) == STATEMENT_GONE:
                _prepared.discard(conn)
            yield from rollback_quietly_gen(conn)
            raise results[0].error
        _wire.raise_first(results)


FINGERPRINT_SQL = b"SELECT idempotency.fingerprint($1, $2, $3::bytea, $4::text[])"


def fingerprint_gen(conn: Any, method: str, path: str, body: Optional[bytes], exclude: Sequence[str]) -> _wire.Gen:
    """idempotency.fingerprint with the parameters exactly as begin sends them."""
    params = [method, path, body, text_array(exclude)]
    (result,) = yield from _wire.pipeline(conn, [_wire.Statement(FINGERPRINT_SQL, params), _wire.SYNC])
    if result.error is not None:
        raise result.error
    digest = _wire.bytea(result.one()["fingerprint"])
    assert digest is not None
    return digest

"""WSGI middleware: Idempotency-Key semantics for any WSGI application.

    app = IdempotencyMiddleware(app, client, connection=pool.connection,
                                principal=lambda environ: user_of(environ))

For each request with a principal the middleware takes a connection, runs the
transactional protocol around the wrapped application, and answers replays,
400, 409 and 422 itself. The application finds the connection, already inside
the transaction that holds the key, in ``environ["pg_idempotency"].connection``
and must do its writes there (and not commit). It may set ``one_time_secret``
and ``resource_id`` on the same object.
"""

from __future__ import annotations

import http
import io
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, List, Optional, Tuple, Union

import psycopg
from psycopg import errors

from ._common import Request
from ._stream import StreamCapture, check_max_stream_bytes, stream_headers
from .fault import is_database_fault
from .http import DEFAULT_MAX_STREAM_BYTES, Response, database_fault_response
from .router import Router, is_stale_placement
from .transactional import Client

ENVIRON_KEY = "pg_idempotency"

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict, StartResponse], Iterable[bytes]]


@dataclass
class RequestContext:
    """What the middleware hands the application in ``environ["pg_idempotency"]``."""

    connection: psycopg.Connection[Any]
    """The connection whose transaction holds the key: do the request's writes here."""
    request: Request
    """The request as fingerprinted."""
    one_time_secret: bool = False
    """Set to True when the response carries a secret: it is sent once and not stored."""
    resource_id: Optional[str] = None
    """Id of what the request created, stored with the key."""


def status_line(status: int) -> str:
    """"201 Created" for 201; an unknown code gets the reason "Unknown"."""
    try:
        return f"{status} {http.HTTPStatus(status).phrase}"
    except ValueError:
        return f"{status} Unknown"


def _path(environ: dict) -> str:
    # PEP 3333 hands the path over as latin-1 decoded bytes; fingerprint the real characters.
    raw = (environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")).encode("latin-1")
    return raw.decode("utf-8", "surrogateescape")


class _Answer:
    """One request's answer as the application gives it: gathered until it proves to be
    a stream (a second non-empty piece from an iterable that is not a list or a tuple),
    then sent piece by piece through the server's write() while it is captured."""

    def __init__(self, start_response: StartResponse, max_stream_bytes: int) -> None:
        self.server_start_response = start_response
        self.max_stream_bytes = max_stream_bytes
        self.expires_epoch: Optional[int] = None
        """The key's expiry as begin() told it, for the start of a stream."""
        self.write: Optional[Callable[[bytes], Any]] = None
        """The server's write(), once the answer streams."""
        self.begun = False
        """True once the key's begin answered on the request's connection: an error after
        it is not the key call's, and the request is not run again on another route."""
        self.reset()

    def reset(self) -> None:
        """Forgets a previous attempt's answer (never one that began to stream)."""
        self.status: Optional[str] = None
        self.headers: List[Tuple[str, str]] = []
        self.pending: List[bytes] = []
        self.capture = StreamCapture(self.max_stream_bytes)

    def start_response(self, status: str, headers: List[Tuple[str, str]], exc_info: Any = None) -> Callable:
        # PEP 3333: a second call (with exc_info) replaces the status and headers until
        # the body has begun (a piece gathered or sent); after that it re-raises.
        if exc_info is not None and (self.write is not None or self.pending):
            raise exc_info[1].with_traceback(exc_info[2])
        self.status, self.headers = status, list(headers)
        return self.piece

    def piece(self, data: bytes) -> None:
        """One piece of the body: sent and captured when streaming, else kept for later."""
        if self.write is None:
            if data:
                self.pending.append(bytes(data))
            return
        self.capture.add(data)
        if data:
            self.write(data)

    def start_stream(self, stamp: bool) -> None:
        """Sends the status, the headers (the key's expiry with them when ``stamp``) and
        the pieces so far; every later piece goes out as it comes."""
        assert self.status is not None
        headers = stream_headers(self.headers, self.expires_epoch if stamp else None)
        self.write = self.server_start_response(self.status, headers)
        pending, self.pending = self.pending, []
        for data in pending:
            self.piece(data)


class IdempotencyMiddleware:
    """Wraps a WSGI application in the transactional protocol.

    ``connection()`` returns a context manager that yields an idle psycopg
    connection (a pool's ``connection`` method, or a function that opens and
    closes one). ``principal(environ)`` returns the authenticated principal, or
    None: such requests pass straight to the application, which must refuse
    unauthenticated writes itself. ``applies(environ)`` selects the requests the
    middleware handles (default: all). ``duplicates`` is "wait" (the default: a
    duplicate of a running request waits for it, then replays) or "reject" (409
    with Retry-After at once), or a function of the environ returning either (or
    None: the client's option), to choose per route.

    A streamed answer (an iterable that is not a list or a tuple and yields more
    than one non-empty piece) is sent piece by piece as the application yields it,
    inside the transaction, and the key is completed once it ends: with its pieces
    (replayed as the same chunks) when it is at most ``max_stream_bytes`` long,
    else with a marker only, and a retry gets 409 response-not-kept. The
    transaction commits before the server ends the response, so a failed commit
    leaves the client with an unfinished response, never a finished one that did
    not happen. Once a piece was sent the attempt is not run again.

    Under Citus, ``router`` (a ``pg_idempotency.Router``) replaces ``connection``:
    each request's connection comes from ``router.connection(principal)``, on the
    node that holds the principal's shard, so the key and the application's writes
    run there together. Give one of ``connection`` and ``router``. When the key's
    begin is refused because the shard is not on that node (a stale placement, see
    ``router.is_stale_placement``), the placement is dropped, the connection rolled
    back and released, and the request runs once more on the principal's new route
    (the application has not run yet). A stale placement later (the application's
    statements, the completion) or on the second route is reported too and
    propagates as any database error does.

    A database fault (``pg_idempotency.fault.is_database_fault``: the connection
    lost, the server shut down or restarting, a cancelled statement, a commit whose
    outcome is unknown), wherever it comes from, is answered 503 database-unavailable
    with Retry-After (``http.database_fault_response``); other errors propagate.
    """

    def __init__(
        self,
        app: WSGIApp,
        client: Client,
        connection: Optional[Callable[[], AbstractContextManager]] = None,
        principal: Optional[Callable[[dict], Optional[str]]] = None,
        applies: Callable[[dict], bool] = lambda environ: True,
        duplicates: Union[str, Callable[[dict], Optional[str]], None] = None,
        max_stream_bytes: int = DEFAULT_MAX_STREAM_BYTES,
        router: Optional[Router] = None,
    ) -> None:
        self.router = router
        self.app = app
        self.duplicates = duplicates
        self.client = client
        self.connection = connection
        self.principal = principal
        self.applies = applies
        self.max_stream_bytes = check_max_stream_bytes(max_stream_bytes)
        if principal is None:
            raise TypeError("IdempotencyMiddleware needs principal")
        if (connection is None) == (router is None):
            raise TypeError("IdempotencyMiddleware needs one of connection and router")

    def __call__(self, environ: dict, start_response: StartResponse) -> Iterable[bytes]:
        principal = self.principal(environ) if self.applies(environ) else None
        if principal is None:
            return self.app(environ, start_response)
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        body = environ["wsgi.input"].read(length) if length > 0 else b""
        key = environ.get("HTTP_IDEMPOTENCY_KEY")
        request = Request(
            principal=principal,
            key=key,
            method=environ.get("REQUEST_METHOD", "GET"),
            path=_path(environ),
            body=body if length > 0 else None,
            duplicates=self.duplicates(environ) if callable(self.duplicates) else self.duplicates,
        )
        answer = _Answer(start_response, self.max_stream_bytes)
        try:
            if self.router is not None:
                response = self._routed(principal, request, environ, body, answer)
            else:
                assert self.connection is not None
                with self.connection() as conn:
                    response = self._handle(conn, request, environ, body, answer)
        except psycopg.Error as error:
            # A database fault (before the begin, in the application, at the commit: rolled
            # back or in doubt) is answered 503 with Retry-After: a retry with the same key
            # runs once or replays. A stream already under way is cut short instead.
            if answer.write is not None or not is_database_fault(error):
                raise
            options = self.client.options
            response = database_fault_response(options.retry_after, options.problem_type_base)
        if answer.write is not None:
            return []  # streamed and committed: the server ends the response now
        start_response(status_line(response.status), list(response.headers))
        if response.chunks is not None:
            return iter(response.pieces())  # not a list: no Content-Length, one chunk each
        return [response.body]

    def _routed(self, principal: str, request: Request, environ: dict, body: bytes,
                answer: _Answer) -> Response:
        """_handle on router.connection(principal); once more on a new route when the
        key's begin said the placement was stale (the router's connection reported it)."""
        assert self.router is not None
        for route_number in (1, 2):
            try:
                with self.router.connection(principal) as conn:
                    return self._handle(conn, request, environ, body, answer)
            except psycopg.Error as error:
                if route_number == 2 or answer.begun or not is_stale_placement(error):
                    raise
        raise AssertionError("unreachable")

    def _handle(self, conn: Any, request: Request, environ: dict, body: bytes, answer: _Answer) -> Response:
        """Client.handle's loop, with the key's expiry at hand for a stream's headers, and
        no second run once a piece of a stream was sent."""
        attempt_number = 1
        while True:
            try:
                with self.client.transaction(conn, request) as attempt:
                    answer.begun = True
                    if attempt.started:
                        answer.reset()
                        answer.expires_epoch = attempt.expires_epoch
                        context = RequestContext(conn, request)
                        attempt.respond(self._run_app(environ, body, context, answer))
                assert attempt.response is not None
                return attempt.response
            except (errors.SerializationFailure, errors.DeadlockDetected):
                if answer.write is not None or attempt_number >= self.client.options.max_attempts:
                    raise
            attempt_number += 1
            self.client._count("retries")

    def _run_app(self, environ: dict, body: bytes, context: RequestContext, answer: _Answer) -> Response:
        inner = dict(environ)
        inner["wsgi.input"] = io.BytesIO(body)  # fresh for every attempt
        inner[ENVIRON_KEY] = context
        result = self.app(inner, answer.start_response)
        try:
            streamable = not isinstance(result, (list, tuple))
            for data in result:
                answer.piece(data)
                if streamable and answer.write is None and len(answer.pending) > 1:
                    if answer.status is None:
                        break
                    status = int(answer.status.split(" ", 1)[0])
                    answer.start_stream(status < 400 and self.client.is_final(context.connection, status))
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        if answer.status is None:
            raise RuntimeError("the WSGI application did not call start_response")
        status = int(answer.status.split(" ", 1)[0])
        if answer.write is not None:
            return answer.capture.response(status, answer.headers, context.resource_id, context.one_time_secret)
        return Response(
            status=status,
            headers=list(answer.headers),
            body=b"".join(answer.pending),
            resource_id=context.resource_id,
            one_time_secret=context.one_time_secret,
        )


def connect_each_time(conninfo: str) -> Callable[[], AbstractContextManager]:
    """A ``connection`` factory for the middleware that opens a new connection
    per request (simple, slow); use a pool in production."""

    def connection() -> AbstractContextManager:
        return psycopg.connect(conninfo)

    return connection


__all__ = ["IdempotencyMiddleware", "RequestContext", "status_line", "connect_each_time", "ENVIRON_KEY"]

"""WSGI middleware: Idempotency-Key semantics for any WSGI application.

    app = IdempotencyMiddleware(app, client, connection=pool.connection,
                                principal=lambda environ: user_of(environ))

For each request with a principal the middleware takes a connection, runs the
transactional protocol around the wrapped application, and answers replays,
400, 409, 410 and 422 without running it (the answers of the extension's
``idempotency.http_answer``). The application finds the connection, already inside
the transaction that holds the key, in ``environ["pg_idempotency"].connection``
and must do its writes there (and not commit). It may set ``one_time_secret``
and ``resource_id`` on the same object.
"""

from __future__ import annotations

import http
import io
from contextlib import AbstractContextManager
from typing import Any, Callable, Iterable, List, Optional, Tuple, Union

import psycopg

from ._middleware import Answer, MiddlewareCore, RequestContext
from .http import DEFAULT_MAX_STREAM_BYTES, Headers, Response
from .router import Router
from .transactional import Client

ENVIRON_KEY = "pg_idempotency"

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict, StartResponse], Iterable[bytes]]


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


class _Answer(Answer):
    """One request's answer as the application gives it: gathered until it proves to be
    a stream (a second non-empty piece from an iterable that is not a list or a tuple),
    then sent piece by piece through the server's write() while it is captured."""

    def __init__(self, start_response: StartResponse, max_stream_bytes: int) -> None:
        self.server_start_response = start_response
        self.write: Optional[Callable[[bytes], Any]] = None
        """The server's write(), once the answer streams."""
        super().__init__(max_stream_bytes)

    def reset(self) -> None:
        """Forgets a previous attempt's answer (never one that began to stream)."""
        super().reset()
        self.status_line: Optional[str] = None

    def start_response(self, status: str, headers: List[Tuple[str, str]], exc_info: Any = None) -> Callable:
        # PEP 3333: a second call (with exc_info) replaces the status and headers until
        # the body has begun (a piece gathered or sent); after that it re-raises.
        if exc_info is not None and (self.streaming or self.pending):
            raise exc_info[1].with_traceback(exc_info[2])
        self.status_line, self.headers = status, list(headers)
        self.status = int(status.split(" ", 1)[0])
        return self.piece

    def _send_start(self, headers: Headers) -> None:
        self.write = self.server_start_response(self.status_line, headers)

    def _send(self, data: bytes) -> None:
        assert self.write is not None
        self.write(data)


class IdempotencyMiddleware(MiddlewareCore):
    """Wraps a WSGI application in the transactional protocol.

    ``connection()`` returns a context manager that yields an idle psycopg
    connection; ``principal(environ)``, ``applies(environ)`` and ``duplicates``
    (a function of the environ, or a mode) choose the requests and their modes;
    ``router`` (a ``pg_idempotency.Router``) replaces ``connection`` under Citus. The
    settings, streams, routes and database faults are ``MiddlewareCore``'s (see
    ``_async_middleware``). A streamed answer is an iterable that is not a list or a
    tuple and yields more than one non-empty piece; it goes out through the server's
    write() and the server ends the response after the commit.
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
        """Wraps ``app``; TypeError or ValueError for settings that cannot work."""
        super().__init__(client, connection, principal, applies, duplicates, max_stream_bytes, router)
        self.app = app

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
        method = environ.get("REQUEST_METHOD", "GET")
        request = self._request(environ, principal, key, method, _path(environ), body if length > 0 else None)
        answer = _Answer(start_response, self.max_stream_bytes)
        response = self._serve(request, answer, lambda context: self._run_app(environ, body, context, answer))
        if answer.streaming:
            return []  # streamed and committed: the server ends the response now
        start_response(status_line(response.status), list(response.headers))
        if response.chunks is not None:
            return iter(response.pieces())  # not a list: no Content-Length, one chunk each
        return [response.body]

    def _run_app(self, environ: dict, body: bytes, context: RequestContext, answer: _Answer) -> Response:
        inner = dict(environ)
        inner["wsgi.input"] = io.BytesIO(body)  # fresh for every attempt
        inner[ENVIRON_KEY] = context
        result = self.app(inner, answer.start_response)
        try:
            streamable = not isinstance(result, (list, tuple))
            for data in result:
                answer.piece(data)
                if streamable and not answer.streaming and len(answer.pending) > 1:
                    if answer.status is None:
                        break
                    answer.start_stream(self.client, context.connection)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        if answer.status is None:
            raise RuntimeError("the WSGI application did not call start_response")
        return answer.response(context)


def connect_each_time(conninfo: str) -> Callable[[], AbstractContextManager]:
    """A ``connection`` factory for the middleware that opens a new connection
    per request (simple, slow); use a pool in production."""

    def connection() -> AbstractContextManager:
        return psycopg.connect(conninfo)

    return connection


__all__ = ["IdempotencyMiddleware", "RequestContext", "status_line", "connect_each_time", "ENVIRON_KEY"]

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

from ._common import Request
from .http import Headers, Response
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
    """

    def __init__(
        self,
        app: WSGIApp,
        client: Client,
        connection: Callable[[], AbstractContextManager],
        principal: Callable[[dict], Optional[str]],
        applies: Callable[[dict], bool] = lambda environ: True,
        duplicates: Union[str, Callable[[dict], Optional[str]], None] = None,
    ) -> None:
        self.app = app
        self.duplicates = duplicates
        self.client = client
        self.connection = connection
        self.principal = principal
        self.applies = applies

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
        with self.connection() as conn:

            def handler(connection: psycopg.Connection[Any]) -> Response:
                return self._run_app(environ, body, RequestContext(connection, request))

            response = self.client.handle(conn, request, handler)
        start_response(status_line(response.status), list(response.headers))
        return [response.body]

    def _run_app(self, environ: dict, body: bytes, context: RequestContext) -> Response:
        inner = dict(environ)
        inner["wsgi.input"] = io.BytesIO(body)  # fresh for every attempt
        inner[ENVIRON_KEY] = context
        captured: dict = {}

        def capture(status: str, headers: List[Tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
            if exc_info is not None and captured:
                raise exc_info[1].with_traceback(exc_info[2])
            captured["status"] = status
            captured["headers"] = headers
            return chunks.append

        chunks: List[bytes] = []
        result = self.app(inner, capture)
        try:
            for chunk in result:
                chunks.append(chunk)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        if "status" not in captured:
            raise RuntimeError("the WSGI application did not call start_response")
        headers: Headers = [(name, value) for name, value in captured["headers"]]
        return Response(
            status=int(captured["status"].split(" ", 1)[0]),
            headers=headers,
            body=b"".join(chunks),
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

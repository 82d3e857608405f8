"""ASGI middleware: Idempotency-Key semantics for any ASGI application
(Starlette, FastAPI, plain ASGI), the twin of ``pg_idempotency.wsgi``.

    app = IdempotencyMiddleware(app, AsyncClient(), connection=pool.connection,
                                principal=lambda scope: user_of(scope))

For each HTTP request with a principal the middleware takes an async
connection, runs the transactional protocol around the wrapped application
(``AsyncClient.handle``), and answers replays, 400, 409 and 422 itself, with
the same statuses, headers and bodies as the WSGI middleware. The application
finds the connection, already inside the transaction that holds the key, in
``scope["pg_idempotency"].connection`` (Starlette and FastAPI:
``request.scope["pg_idempotency"]``, or ``context(request)``) and must do its
writes there (and not commit). It may set ``one_time_secret`` and
``resource_id`` on the same object.
"""

from __future__ import annotations

import inspect
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Dict, List, MutableMapping, Optional, Union

import psycopg

from ._common import Request
from .async_transactional import AsyncClient
from .http import KEY_HEADER, Headers, Response

__all__ = ["IdempotencyMiddleware", "RequestContext", "context", "SCOPE_KEY"]

SCOPE_KEY = "pg_idempotency"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
Principal = Callable[[Scope], Union[Optional[str], Awaitable[Optional[str]]]]


@dataclass
class RequestContext:
    """What the middleware hands the application in ``scope["pg_idempotency"]``."""

    connection: psycopg.AsyncConnection[Any]
    """The connection whose transaction holds the key: do the request's writes here."""
    request: Request
    """The request as fingerprinted."""
    one_time_secret: bool = False
    """Set to True when the response carries a secret: it is sent once and not stored."""
    resource_id: Optional[str] = None
    """Id of what the request created, stored with the key."""


def context(request_or_scope: Any) -> RequestContext:
    """The RequestContext of a request: from a Starlette/FastAPI ``Request`` or an
    ASGI scope. KeyError when the middleware did not handle the request."""
    scope = getattr(request_or_scope, "scope", request_or_scope)
    return scope[SCOPE_KEY]


_KEY_HEADER = KEY_HEADER.lower().encode("latin-1")


def _header(scope: Scope, name: bytes) -> Optional[str]:
    for field_name, value in scope.get("headers", ()):
        if field_name.lower() == name:
            # Header bytes as latin-1, as WSGI's environ has them: a non-ASCII
            # key stays non-ASCII and is refused as malformed.
            return value.decode("latin-1")
    return None


class IdempotencyMiddleware:
    """Wraps an ASGI application in the transactional protocol.

    ``connection()`` returns an async context manager that yields an idle
    ``psycopg.AsyncConnection`` (a pool's ``connection`` method, or one that
    opens and closes a connection). ``principal(scope)`` (plain or async)
    returns the authenticated principal, or None: such requests pass straight
    to the application, which must refuse unauthenticated writes itself.
    ``applies(scope)`` selects the requests the middleware handles (default:
    every HTTP request). Lifespan and websocket scopes pass through.
    ``duplicates``: "wait" (the default) or "reject" (409 with Retry-After at
    once for a duplicate of a running request), or a function of the scope
    returning either (None: the client's option), to choose per route.
    """

    def __init__(
        self,
        app: ASGIApp,
        client: AsyncClient,
        connection: Callable[[], AbstractAsyncContextManager],
        principal: Principal,
        applies: Callable[[Scope], bool] = lambda scope: True,
        duplicates: Union[str, Callable[[Scope], Optional[str]], None] = None,
    ) -> None:
        self.app = app
        self.duplicates = duplicates
        self.client = client
        self.connection = connection
        self.principal = principal
        self.applies = applies

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.applies(scope):
            await self.app(scope, receive, send)
            return
        principal = self.principal(scope)
        if inspect.isawaitable(principal):
            principal = await principal
        if principal is None:
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        request = Request(
            principal=principal,
            key=_header(scope, _KEY_HEADER),
            method=scope.get("method", "GET"),
            path=scope.get("root_path", "") + scope.get("path", ""),
            body=body or None,
            duplicates=self.duplicates(scope) if callable(self.duplicates) else self.duplicates,
        )
        async with self.connection() as conn:

            async def handler(connection: psycopg.AsyncConnection[Any]) -> Response:
                return await self._run_app(scope, body, RequestContext(connection, request))

            response = await self.client.handle(conn, request, handler)
        await send(
            {
                "type": "http.response.start",
                "status": response.status,
                "headers": [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in response.headers],
            }
        )
        await send({"type": "http.response.body", "body": response.body})

    async def _run_app(self, scope: Scope, body: bytes, request_context: RequestContext) -> Response:
        inner: Dict[str, Any] = dict(scope)
        inner[SCOPE_KEY] = request_context
        delivered = False

        async def replay() -> Message:  # the body again for every attempt
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return {"type": "http.disconnect"}

        start: Dict[str, Any] = {}
        chunks: List[bytes] = []

        async def capture(message: Message) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                chunks.append(bytes(message.get("body", b"")))

        await self.app(inner, replay, capture)
        if "status" not in start:
            raise RuntimeError("the ASGI application sent no http.response.start")
        headers: Headers = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in start.get("headers", ())]
        return Response(
            status=int(start["status"]),
            headers=headers,
            body=b"".join(chunks),
            resource_id=request_context.resource_id,
            one_time_secret=request_context.one_time_secret,
        )


async def _read_body(receive: Receive) -> bytes:
    chunks: List[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(bytes(message.get("body", b"")))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)

"""ASGI middleware: Idempotency-Key semantics for any ASGI application
(Starlette, FastAPI, plain ASGI), the twin of ``pg_idempotency.wsgi``.

    app = IdempotencyMiddleware(app, AsyncClient(), connection=pool.connection,
                                principal=lambda scope: user_of(scope))

For each HTTP request with a principal the middleware takes an async
connection, runs the transactional protocol around the wrapped application
(``AsyncClient.handle``), and answers replays, 400, 409, 410 and 422 without
running it, with the same statuses, headers and bodies as the WSGI middleware (the
answers of the extension's ``idempotency.http_answer``; a database fault: 503
database-unavailable). The application
finds the connection, already inside the transaction that holds the key, in
``scope["pg_idempotency"].connection`` (Starlette and FastAPI:
``request.scope["pg_idempotency"]``, or ``context(request)``) and must do its
writes there (and not commit). It may set ``one_time_secret`` and
``resource_id`` on the same object.
"""

from __future__ import annotations

import inspect
from contextlib import AbstractAsyncContextManager
from typing import Any, Awaitable, Callable, Dict, List, MutableMapping, Optional, Tuple, Union

from ._async_middleware import AsyncAnswer, AsyncMiddlewareCore, RequestContext
from .async_router import AsyncRouter
from .async_transactional import AsyncClient
from .http import DEFAULT_MAX_STREAM_BYTES, KEY_HEADER, Headers, Response

__all__ = ["IdempotencyMiddleware", "RequestContext", "context", "SCOPE_KEY"]

SCOPE_KEY = "pg_idempotency"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
Principal = Callable[[Scope], Union[Optional[str], Awaitable[Optional[str]]]]


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


class _Answer(AsyncAnswer):
    """One request's answer as the application sends it: gathered until a body message
    says more_body (a stream), then forwarded message by message while it is captured."""

    def __init__(self, send: Send, max_stream_bytes: int) -> None:
        self.send = send
        self.finished = False
        """True once the application sent its last body message (more_body false)."""
        super().__init__(max_stream_bytes)

    def reset(self) -> None:
        """Forgets a previous attempt's answer (never one that began to stream)."""
        super().reset()
        self.start: Dict[str, Any] = {}

    async def _send_start(self, headers: Headers) -> None:
        await self.send({**self.start, "headers": _encode(headers)})

    async def _send(self, data: bytes) -> None:
        await self.send({"type": "http.response.body", "body": data, "more_body": True})


class _StreamCut(Exception):
    """A stream the application stopped before its last body message: rolled back."""


def _encode(headers: Headers) -> List[Tuple[bytes, bytes]]:
    return [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in headers]


class IdempotencyMiddleware(AsyncMiddlewareCore):
    """Wraps an ASGI application in the transactional protocol.

    ``connection()`` returns an async context manager that yields an idle
    ``psycopg.AsyncConnection``; ``principal(scope)`` (plain or async),
    ``applies(scope)`` and ``duplicates`` (a function of the scope, or a mode) choose
    the requests and their modes; ``router`` (a ``pg_idempotency.AsyncRouter``)
    replaces ``connection`` under Citus. Lifespan and websocket scopes pass through.
    The settings, streams, routes and database faults are ``AsyncMiddlewareCore``'s
    (see ``_async_middleware``). A streamed answer is a ``http.response.body``
    message with ``more_body``; the last, empty body message goes out after the
    commit.
    """

    def __init__(
        self,
        app: ASGIApp,
        client: AsyncClient,
        connection: Optional[Callable[[], AbstractAsyncContextManager]] = None,
        principal: Optional[Principal] = None,
        applies: Callable[[Scope], bool] = lambda scope: True,
        duplicates: Union[str, Callable[[Scope], Optional[str]], None] = None,
        max_stream_bytes: int = DEFAULT_MAX_STREAM_BYTES,
        router: Optional[AsyncRouter] = None,
    ) -> None:
        """Wraps ``app``; TypeError or ValueError for settings that cannot work."""
        super().__init__(client, connection, principal, applies, duplicates, max_stream_bytes, router)
        self.app = app

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
        path = scope.get("root_path", "") + scope.get("path", "")
        key = _header(scope, _KEY_HEADER)
        request = self._request(scope, principal, key, scope.get("method", "GET"), path, body or None)
        answer = _Answer(send, self.max_stream_bytes)

        async def run_app(context: RequestContext) -> Response:
            return await self._run_app(scope, body, context, answer, receive)

        try:
            response = await self._serve(request, answer, run_app)
        except _StreamCut:
            return  # rolled back, nothing stored: the client went away mid-stream
        last = {"type": "http.response.body", "body": b"", "more_body": False}
        if answer.streaming:
            await send(last)  # streamed and committed: the response ends now
            return
        start = {"type": "http.response.start", "status": response.status, "headers": _encode(response.headers)}
        await send(start)
        if response.chunks is None:
            await send({"type": "http.response.body", "body": response.body})
            return
        for piece in response.pieces():  # a stored stream: the same chunks again
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send(last)

    async def _run_app(
        self, scope: Scope, body: bytes, request_context: RequestContext, answer: _Answer, receive: Receive
    ) -> Response:
        inner: Dict[str, Any] = dict(scope)
        inner[SCOPE_KEY] = request_context
        delivered = False

        async def replay() -> Message:  # the body again for every attempt
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            # Then the server's own receive: it tells when the client goes away (a
            # streaming response, Starlette's, listens for that while it streams).
            return await receive()

        async def capture(message: Message) -> None:
            if message["type"] == "http.response.start":
                answer.start.update(message)
                answer.status = int(answer.start["status"])
                answer.headers = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in answer.start.get("headers", ())]
            elif message["type"] == "http.response.body":
                await answer.piece(bytes(message.get("body", b"")))
                answer.finished = not message.get("more_body", False)
                if message.get("more_body", False) and not answer.streaming and answer.status is not None:
                    await answer.start_stream(self.client, request_context.connection)

        await self.app(inner, replay, capture)
        if answer.status is None:
            raise RuntimeError("the ASGI application sent no http.response.start")
        if answer.streaming and not answer.finished:
            # Cut short (the client went away and the application stopped): never kept.
            raise _StreamCut("the stream ended without its last body message")
        return answer.response(request_context)


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

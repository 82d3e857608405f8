"""ASGI middleware: Idempotency-Key semantics for any ASGI application
(Starlette, FastAPI, plain ASGI), the twin of ``pg_idempotency.wsgi``.

    app = IdempotencyMiddleware(app, AsyncClient(), connection=pool.connection,
                                principal=lambda scope: user_of(scope))

For each HTTP request with a principal the middleware takes an async
connection, runs the transactional protocol around the wrapped application
(``AsyncClient.handle``), and answers replays, 400, 409 and 422 itself, with
the same statuses, headers and bodies as the WSGI middleware (a database fault:
503 database-unavailable). The application
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
from typing import Any, Awaitable, Callable, Dict, List, MutableMapping, Optional, Tuple, Union

import psycopg
from psycopg import errors

from ._common import Request
from ._stream import StreamCapture, check_max_stream_bytes, stream_headers
from .async_transactional import AsyncClient
from .fault import is_database_fault
from .http import DEFAULT_MAX_STREAM_BYTES, KEY_HEADER, Headers, Response, database_fault_response
from .async_router import AsyncRouter, is_stale_placement

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


class _Answer:
    """One request's answer as the application sends it: gathered until a body message
    says more_body (a stream), then forwarded message by message while it is captured."""

    def __init__(self, send: Send, max_stream_bytes: int) -> None:
        self.send = send
        self.max_stream_bytes = max_stream_bytes
        self.expires_epoch: Optional[int] = None
        """The key's expiry as begin() told it, for the start of a stream."""
        self.streaming = False
        """True once the start and a first piece went to the client."""
        self.finished = False
        """True once the application sent its last body message (more_body false)."""
        self.begun = False
        """True once the key's begin answered on the request's connection: an error after
        it is not the key call's, and the request is not run again on another route."""
        self.reset()

    def reset(self) -> None:
        """Forgets a previous attempt's answer (never one that began to stream)."""
        self.start: Dict[str, Any] = {}
        self.pending: List[bytes] = []
        self.capture = StreamCapture(self.max_stream_bytes)

    async def piece(self, data: bytes) -> None:
        """One piece of the body: forwarded and captured when streaming, else kept."""
        if not self.streaming:
            if data:
                self.pending.append(data)
            return
        self.capture.add(data)
        if data:  # an empty chunk would end a chunked body
            await self.send({"type": "http.response.body", "body": data, "more_body": True})

    async def start_stream(self, stamp: bool) -> None:
        """Sends the start (the key's expiry with it when ``stamp``) and the pieces so far."""
        raw = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in self.start.get("headers", ())]
        headers = stream_headers(raw, self.expires_epoch if stamp else None)
        await self.send({**self.start, "headers": _encode(headers)})
        self.streaming = True
        pending, self.pending = self.pending, []
        for data in pending:
            await self.piece(data)


class _StreamCut(Exception):
    """A stream the application stopped before its last body message: rolled back."""


def _encode(headers: Headers) -> List[Tuple[bytes, bytes]]:
    return [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in headers]


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

    A streamed answer (a ``http.response.body`` message with ``more_body``) is
    forwarded message by message as the application sends it, inside the
    transaction, and the key is completed when it ends: with its chunks
    (replayed as the same chunks) when it is at most ``max_stream_bytes`` long,
    else with a marker only, and a retry gets 409 response-not-kept. The last,
    empty body message goes out after the commit, so a failed commit leaves the
    client with an unfinished response. Once a piece was sent the attempt is not
    run again.

    Under Citus, ``router`` (a ``pg_idempotency.AsyncRouter``) replaces
    ``connection``: each request's connection comes from
    ``router.connection(principal)``, on the node that holds the principal's shard,
    so the key and the application's writes run there together. Give one of
    ``connection`` and ``router``. When the key's begin is refused because the
    shard is not on that node (a stale placement, see ``router.is_stale_placement``),
    the placement is dropped, the connection rolled back and released, and the
    request runs once more on the principal's new route (the application has not
    run yet). A stale placement later (the application's statements, the
    completion) or on the second route is reported too and propagates as any
    database error does.
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
        answer = _Answer(send, self.max_stream_bytes)
        try:
            if self.router is not None:
                response = await self._routed(principal, request, scope, body, answer, receive)
            else:
                assert self.connection is not None
                async with self.connection() as conn:
                    response = await self._handle(conn, request, scope, body, answer, receive)
        except _StreamCut:
            return  # rolled back, nothing stored: the client went away mid-stream
        except psycopg.Error as error:
            # A database fault (before the begin, in the application, at the commit: rolled
            # back or in doubt) is answered 503 with Retry-After, as the WSGI middleware does.
            if answer.streaming or not is_database_fault(error):
                raise
            options = self.client.options
            response = database_fault_response(options.retry_after, options.problem_type_base)
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

    async def _routed(
        self, principal: str, request: Request, scope: Scope, body: bytes, answer: _Answer, receive: Receive
    ) -> Response:
        """_handle on router.connection(principal); once more on a new route when the
        key's begin said the placement was stale (the router's connection reported it)."""
        assert self.router is not None
        for route_number in (1, 2):
            try:
                async with self.router.connection(principal) as conn:
                    return await self._handle(conn, request, scope, body, answer, receive)
            except psycopg.Error as error:
                if route_number == 2 or answer.begun or not is_stale_placement(error):
                    raise
        raise AssertionError("unreachable")

    async def _handle(
        self, conn: Any, request: Request, scope: Scope, body: bytes, answer: _Answer, receive: Receive
    ) -> Response:
        """AsyncClient.handle's loop, with the key's expiry at hand for a stream's start,
        and no second run once a piece of a stream was sent."""
        attempt_number = 1
        while True:
            try:
                async with self.client.transaction(conn, request) as attempt:
                    answer.begun = True
                    if attempt.started:
                        answer.reset()
                        answer.expires_epoch = attempt.expires_epoch
                        context = RequestContext(conn, request)
                        attempt.respond(await self._run_app(scope, body, context, answer, receive))
                assert attempt.response is not None
                return attempt.response
            except (errors.SerializationFailure, errors.DeadlockDetected):
                if answer.streaming or attempt_number >= self.client.options.max_attempts:
                    raise
            attempt_number += 1
            self.client._count("retries")

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
            elif message["type"] == "http.response.body":
                await answer.piece(bytes(message.get("body", b"")))
                answer.finished = not message.get("more_body", False)
                if message.get("more_body", False) and not answer.streaming and "status" in answer.start:
                    status = int(answer.start["status"])
                    final = status < 400 and await self.client.is_final(request_context.connection, status)
                    await answer.start_stream(final)

        await self.app(inner, replay, capture)
        if "status" not in answer.start:
            raise RuntimeError("the ASGI application sent no http.response.start")
        status = int(answer.start["status"])
        headers: Headers = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in answer.start.get("headers", ())]
        if answer.streaming and not answer.finished:
            # Cut short (the client went away and the application stopped): never kept.
            raise _StreamCut("the stream ended without its last body message")
        if answer.streaming:
            return answer.capture.response(status, headers, request_context.resource_id,
                                           request_context.one_time_secret)
        return Response(
            status=status,
            headers=headers,
            body=b"".join(answer.pending),
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

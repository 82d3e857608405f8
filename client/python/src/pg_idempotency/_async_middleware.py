"""What the WSGI and the ASGI middleware share: their settings, the context they hand
the application, and the way a request goes through the protocol (the connection or
the principal's route, the attempts, the answer to a database fault). Each adapter
keeps only its framework's side: reading the request, running the application and
capturing its answer, sending the response.

The async and the sync form are one text: the sync module (for WSGI) is generated
from the async one (for ASGI) by client/python/tools/async_to_sync.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable, List, Optional, Union  # async only
# sync only: from typing import Any, Callable, List, Optional, Union

import psycopg
from psycopg import errors

from ._common import COMMITTED_WITH_KEY, Request
from ._stream import StreamCapture, check_max_stream_bytes, stream_headers
from .async_router import AsyncRouter, is_stale_placement
from .async_transactional import AsyncClient
from .fault import is_database_fault
from .http import Headers, Response, database_fault_response

__all__ = ["AsyncAnswer", "AsyncMiddlewareCore", "RequestContext"]


@dataclass
class RequestContext:
    """What the middleware hands the application (WSGI: ``environ["pg_idempotency"]``,
    ASGI: ``scope["pg_idempotency"]``)."""

    connection: Any
    """The connection (sync for WSGI, async for ASGI) whose transaction holds the key:
    do the request's writes here, and do not commit."""
    request: Request
    """The request as fingerprinted."""
    one_time_secret: bool = False
    """Set to True when the response carries a secret: it is sent once and not stored."""
    resource_id: Optional[str] = None
    """Id of what the request created, stored with the key."""


class AsyncAnswer:
    """One request's answer as a middleware follows it across attempts: the application's
    status and headers, its pieces gathered until it proves to be a stream, then the
    capture of the stream as it is sent. The ASGI and the WSGI adapter add how their
    framework starts a response (``_send_start``) and sends a piece (``_send``)."""

    def __init__(self, max_stream_bytes: int) -> None:
        self.max_stream_bytes = max_stream_bytes
        self.expires_epoch: Optional[int] = None
        """The key's expiry as begin() told it, for the start of a stream."""
        self.streaming = False
        """True once the start and a first piece went to the client."""
        self.begun = False
        """True once the key's begin answered on the request's connection: an error after
        it is not the key call's, and the request is not run again on another route."""
        self.reset()

    def reset(self) -> None:
        """Forgets a previous attempt's answer (never one that began to stream)."""
        self.pending: List[bytes] = []
        self.capture = StreamCapture(self.max_stream_bytes)
        self.status: Optional[int] = None
        """The application's status, once it gave one."""
        self.headers: Headers = []
        """The application's headers."""

    async def piece(self, data: bytes) -> None:
        """One piece of the body: sent and captured when streaming, else kept for later."""
        if not self.streaming:
            if data:
                self.pending.append(bytes(data))
            return
        self.capture.add(data)
        if data:  # an empty chunk would end a chunked body
            await self._send(data)

    async def start_stream(self, client: AsyncClient, connection: Any) -> None:
        """Sends the start (the key's expiry with it when the answer will be kept, as
        idempotency.http_storage says of its status) and the pieces so far; every later
        piece goes out as it comes."""
        assert self.status is not None
        kept = await client.storage(connection, self.status) == COMMITTED_WITH_KEY
        await self._send_start(stream_headers(self.headers, self.expires_epoch if kept else None))
        self.streaming = True
        pending, self.pending = self.pending, []
        for data in pending:
            await self.piece(data)

    def response(self, context: RequestContext) -> Response:
        """What the key is completed with: the stream as captured, or the gathered body."""
        assert self.status is not None
        if self.streaming:
            return self.capture.response(self.status, self.headers, context.resource_id,
                                         context.one_time_secret)
        return Response(
            status=self.status,
            headers=list(self.headers),
            body=b"".join(self.pending),
            resource_id=context.resource_id,
            one_time_secret=context.one_time_secret,
        )

    async def _send_start(self, headers: Headers) -> None:
        raise NotImplementedError  # the adapter's: the status and these headers

    async def _send(self, data: bytes) -> None:
        raise NotImplementedError  # the adapter's: one piece of a stream under way


RunApp = Callable[[RequestContext], Awaitable[Response]]
"""Runs the application once inside the attempt's transaction; returns its answer."""


class AsyncMiddlewareCore:
    """A middleware's settings and its way through the protocol (see the adapters'
    ``IdempotencyMiddleware`` for what each setting means to the application).

    ``connection()`` returns a context manager that yields an idle connection (a
    pool's ``connection`` method, or one that opens and closes a connection).
    ``principal(request)`` returns the authenticated principal, or None: such
    requests pass straight to the application, which must refuse unauthenticated
    writes itself. ``applies(request)`` selects the requests the middleware handles
    (default: all). ``duplicates`` is "wait" (the default: a duplicate of a running
    request waits for it, then replays) or "reject" (409 with Retry-After at once),
    or a function of the request returning either (or None: the client's option), to
    choose per route.

    A streamed answer is sent piece by piece as the application produces it, inside
    the transaction, and the key is completed once it ends: with its pieces
    (replayed as the same chunks) when it is at most ``max_stream_bytes`` long, else
    with a marker only, and a retry gets 409 response-not-kept. The transaction
    commits before the response ends, so a failed commit leaves the client with an
    unfinished response, never a finished one that did not happen. Once a piece was
    sent the attempt is not run again.

    Under Citus, ``router`` replaces ``connection``: each request's connection comes
    from ``router.connection(principal)``, on the node that holds the principal's
    shard, so the key and the application's writes run there together. Give one of
    ``connection`` and ``router``. When the key's begin is refused because the shard
    is not on that node (a stale placement, see ``is_stale_placement``), the
    placement is dropped, the connection rolled back and released, and the request
    runs once more on the principal's new route (the application has not run yet).
    A stale placement later (the application's statements, the completion) or on the
    second route is reported too and propagates as any database error does.

    A database fault (``pg_idempotency.fault.is_database_fault``: the connection
    lost, the server shut down or restarting, a cancelled statement, a commit whose
    outcome is unknown), wherever it comes from, is answered 503 database-unavailable
    with Retry-After (``http.database_fault_response``); other errors propagate.
    """

    def __init__(
        self,
        client: AsyncClient,
        connection: Optional[Callable[[], Any]],
        principal: Optional[Callable[[Any], Any]],
        applies: Callable[[Any], bool],
        duplicates: Union[str, Callable[[Any], Optional[str]], None],
        max_stream_bytes: int,
        router: Optional[AsyncRouter],
    ) -> None:
        """Checks and keeps the settings (TypeError or ValueError for bad ones)."""
        self.max_stream_bytes = check_max_stream_bytes(max_stream_bytes)
        if principal is None:
            raise TypeError("IdempotencyMiddleware needs principal")
        if (connection is None) == (router is None):
            raise TypeError("IdempotencyMiddleware needs one of connection and router")
        self.client = client
        self.connection = connection
        self.principal = principal
        self.applies = applies
        self.duplicates = duplicates
        self.router = router

    def _request(self, source: Any, principal: str, key: Optional[str], method: str, path: str,
                 body: Optional[bytes]) -> Request:
        """The keyed request of ``source`` (an environ or a scope), its duplicate mode chosen."""
        duplicates = self.duplicates(source) if callable(self.duplicates) else self.duplicates
        return Request(principal=principal, key=key, method=method, path=path, body=body,
                       duplicates=duplicates)

    async def _serve(self, request: Request, answer: AsyncAnswer, run_app: RunApp) -> Response:
        """The request through the protocol on its connection or route; a database
        fault before anything of a stream was sent: the 503 answer."""
        try:
            if self.router is not None:
                return await self._routed(request, answer, run_app)
            assert self.connection is not None
            async with self.connection() as conn:
                return await self._attempts(conn, request, answer, run_app)
        except psycopg.Error as error:
            # Before the begin, in the application, at the commit (rolled back or in
            # doubt): a retry with the same key runs once or replays. A stream already
            # under way is cut short instead.
            if answer.streaming or not is_database_fault(error):
                raise
            options = self.client.options
            return database_fault_response(options.retry_after, options.problem_type_base)

    async def _routed(self, request: Request, answer: AsyncAnswer, run_app: RunApp) -> Response:
        """_attempts on router.connection(principal); once more on a new route when the
        key's begin said the placement was stale (the router's connection reported it)."""
        assert self.router is not None
        for route_number in (1, 2):
            try:
                async with self.router.connection(request.principal) as conn:
                    return await self._attempts(conn, request, answer, run_app)
            except psycopg.Error as error:
                if route_number == 2 or answer.begun or not is_stale_placement(error):
                    raise
        raise AssertionError("unreachable")

    async def _attempts(self, conn: Any, request: Request, answer: AsyncAnswer, run_app: RunApp) -> Response:
        """Client.handle's loop, with the key's expiry at hand for a stream's start, and
        no second run once a piece of a stream was sent."""
        attempt_number = 1
        while True:
            try:
                async with self.client.transaction(conn, request) as attempt:
                    answer.begun = True
                    if attempt.started:
                        answer.reset()
                        answer.expires_epoch = attempt.expires_epoch
                        attempt.respond(await run_app(RequestContext(conn, request)))
                assert attempt.response is not None
                return attempt.response
            except (errors.SerializationFailure, errors.DeadlockDetected):
                if answer.streaming or attempt_number >= self.client.options.max_attempts:
                    raise
            attempt_number += 1
            self.client._count("retries")

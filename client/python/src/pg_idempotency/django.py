"""Django middleware: Idempotency-Key semantics for Django views, in Django's own transaction.

    MIDDLEWARE = [
        ...,
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "pg_idempotency.django.IdempotencyMiddleware",
        ...,
    ]
    PG_IDEMPOTENCY = {"PRINCIPAL": "shop.auth.principal_of"}   # optional, see below

For each request with a principal the middleware opens ``transaction.atomic()`` on
the database alias it is given, sends ``BEGIN`` with ``idempotency.begin(...)`` on
that alias's own psycopg connection, and runs the rest of the chain (the view)
inside that transaction: the view's ORM writes and the key row commit together
(``idempotency.complete(...)`` and ``COMMIT`` in one flight), or roll back together.
Replays, 400, 409 and 422 are answered without calling the view. A final 4xx is
rolled back and stored alone after the rollback; any other status (401, 429, 3xx,
5xx) rolls back and stores nothing. ``transaction.on_commit`` callbacks of the view
run only when its writes committed.

Settings (``PG_IDEMPOTENCY``, every entry optional):

- ``PRINCIPAL``: a function ``f(request) -> str | None`` or its dotted path; the
  default is the authenticated user's primary key (``request.user``). None: the
  request passes straight to the view (which must refuse unauthenticated writes).
- ``DATABASE``: the alias (default ``"default"``); its ENGINE must be Django's
  PostgreSQL backend on psycopg 3.
- ``APPLIES``: ``f(request) -> bool`` (or dotted path) selecting the requests the
  middleware handles (default: all).
- ``DUPLICATES``: ``"wait"`` or ``"reject"``, or ``f(request)`` returning either (or
  None: the client's option); see ``Options.duplicates``.
- ``OPTIONS``: keyword arguments of ``pg_idempotency.Options``.
- ``MAX_STREAM_BYTES``: the longest streamed answer kept for replay (default 1 MiB).

A ``StreamingHttpResponse`` is read to its end inside the transaction, then sent
chunk by chunk after the commit (replayed as the same chunks when it was at most
``MAX_STREAM_BYTES``; past that a retry gets 409 response-not-kept). A view that
raises a serialization failure or a deadlock runs again, up to
``Options.max_attempts``; a database fault (``pg_idempotency.is_database_fault``)
is answered 503 with Retry-After.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Union

import psycopg
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.http.request import RawPostDataException
from django.utils.module_loading import import_string
from psycopg import errors

from ._common import COMMITTED_WITH_KEY, Request
from ._stream import StreamCapture, check_max_stream_bytes
from .fault import is_database_fault
from .http import DEFAULT_MAX_STREAM_BYTES, EXPIRES_HEADER, Response, database_fault_response
from .transactional import Client, Options

__all__ = ["IdempotencyContext", "IdempotencyMiddleware", "user_principal"]

SETTINGS_NAME = "PG_IDEMPOTENCY"
KNOWN_SETTINGS = ("PRINCIPAL", "DATABASE", "APPLIES", "DUPLICATES", "OPTIONS", "MAX_STREAM_BYTES")
RETRIED = (errors.SerializationFailure, errors.DeadlockDetected)
# Where the view's exception waits for the middleware (process_exception -> __call__).
_RAISED = "_pg_idempotency_raised"


@dataclass
class IdempotencyContext:
    """What the middleware hands the view in ``request.idempotency``."""

    request: Request
    """The request as fingerprinted (principal, key, method, path, body)."""
    one_time_secret: bool = False
    """Set to True when the response carries a secret: it is sent once and not stored."""
    resource_id: Optional[str] = None
    """Id of what the request created, stored with the key."""


def user_principal(request: HttpRequest) -> Optional[str]:
    """The default principal: the authenticated user's primary key, or None."""
    user = getattr(request, "user", None)
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    return str(user.pk)


def _callable(value: Any, name: str) -> Optional[Callable]:
    if value is None or callable(value):
        return value
    if isinstance(value, str):
        return import_string(value)
    raise ImproperlyConfigured(f"{SETTINGS_NAME}['{name}'] must be a callable or its dotted path")


def _psycopg_error(error: Optional[BaseException]) -> Optional[BaseException]:
    """The psycopg error behind a Django database error (Django re-raises it as the cause)."""
    while error is not None and not isinstance(error, psycopg.Error):
        error = error.__cause__
    return error


class IdempotencyMiddleware:
    """Runs each view with a principal through the transactional protocol (see the module)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        config = dict(getattr(settings, SETTINGS_NAME, None) or {})
        unknown = sorted(set(config) - set(KNOWN_SETTINGS))
        if unknown:
            raise ImproperlyConfigured(f"{SETTINGS_NAME}: unknown settings {unknown}; known: {list(KNOWN_SETTINGS)}")
        self.get_response = get_response
        self.database: str = config.get("DATABASE", DEFAULT_DB_ALIAS)
        if self.database not in settings.DATABASES:
            raise ImproperlyConfigured(f"{SETTINGS_NAME}['DATABASE']: no database alias {self.database!r}")
        options = config.get("OPTIONS") or {}
        if not isinstance(options, dict):
            raise ImproperlyConfigured(f"{SETTINGS_NAME}['OPTIONS'] must be a dict of pg_idempotency.Options fields")
        self.client = Client(Options(**options))
        self.principal = _callable(config.get("PRINCIPAL"), "PRINCIPAL") or user_principal
        self.applies = _callable(config.get("APPLIES"), "APPLIES") or (lambda request: True)
        duplicates = config.get("DUPLICATES")
        self.duplicates: Union[str, Callable, None] = (
            duplicates if duplicates in (None, "wait", "reject") else _callable(duplicates, "DUPLICATES")
        )
        try:
            self.max_stream_bytes = check_max_stream_bytes(config.get("MAX_STREAM_BYTES", DEFAULT_MAX_STREAM_BYTES))
        except ValueError as error:
            raise ImproperlyConfigured(f"{SETTINGS_NAME}['MAX_STREAM_BYTES']: {error}") from None

    def process_exception(self, request: HttpRequest, exception: Exception) -> None:
        """Django's hook for an exception of the view: kept for ``__call__`` (which
        retries serialization failures and answers database faults 503); Django then
        makes its usual 500 response, which is never stored."""
        setattr(request, _RAISED, exception)

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        principal = self.principal(request) if self.applies(request) else None
        if principal is None:
            return self.get_response(request)
        connection = connections[self.database]
        if connection.vendor != "postgresql":
            raise ImproperlyConfigured(f"pg_idempotency needs PostgreSQL; database {self.database!r} is "
                                       f"{connection.vendor}")
        if connection.in_atomic_block:
            raise ImproperlyConfigured("pg_idempotency's middleware opens the request's transaction: put it "
                                       "before any middleware that opens transaction.atomic()")
        try:
            body = request.body
        except RawPostDataException as error:
            raise ImproperlyConfigured("pg_idempotency's middleware must read the request body first: put it "
                                       "before any middleware that reads request.POST or the body") from error
        duplicates = self.duplicates(request) if callable(self.duplicates) else self.duplicates
        keyed = Request(principal=str(principal), key=request.headers.get("Idempotency-Key"),
                        method=request.method or "GET", path=request.path, body=body or None,
                        duplicates=duplicates)
        try:
            return self._handle(request, keyed)
        except Exception as error:
            fault = _psycopg_error(error)
            if not is_database_fault(fault):
                raise
            connections[self.database].errors_occurred = True  # Django checks it before reuse
            options = self.client.options
            return _django_response(database_fault_response(options.retry_after, options.problem_type_base))

    def _handle(self, request: HttpRequest, keyed: Request) -> HttpResponseBase:
        """Client.handle's loop on the alias's connection, inside transaction.atomic."""
        for attempt_number in itertools.count(1):
            try:
                return self._attempt(request, keyed)
            except Exception as error:
                if attempt_number >= self.client.options.max_attempts or \
                        not isinstance(_psycopg_error(error), RETRIED):
                    raise
            self.client._count("retries")
        raise AssertionError("unreachable")

    def _attempt(self, request: HttpRequest, keyed: Request) -> HttpResponseBase:
        """One attempt: the view's exception that a retry or a 503 answers is raised
        inside the attempt (rolled back), the others are Django's 500, not stored."""
        setattr(request, _RAISED, None)
        view_response: Optional[HttpResponseBase] = None
        with transaction.atomic(using=self.database):
            raw = connections[self.database].connection
            if not isinstance(raw, psycopg.Connection):
                raise ImproperlyConfigured("pg_idempotency needs Django's PostgreSQL backend on psycopg 3")
            with self.client.transaction(raw, keyed) as attempt:
                if attempt.started:
                    context = IdempotencyContext(keyed)
                    request.idempotency = context  # type: ignore[attr-defined]
                    view_response = self.get_response(request)
                    raised = _psycopg_error(getattr(request, _RAISED, None))
                    if isinstance(raised, RETRIED) or is_database_fault(raised):
                        raise getattr(request, _RAISED)
                    attempt.respond(self._captured(view_response, context))
            # The attempt ended the transaction itself (commit or rollback); Django's
            # atomic must not run on_commit callbacks of writes that were rolled back.
            response = attempt.response
            assert response is not None
            kept = attempt.outcome == "unkeyed" or (
                self.client.storage(raw, response.status) == COMMITTED_WITH_KEY)
            if not (attempt.started and kept):
                transaction.set_rollback(True, using=self.database)
        if view_response is None:
            return _django_response(response)
        return _stamped(view_response, response)

    def _captured(self, answer: HttpResponseBase, context: IdempotencyContext) -> Response:
        """The view's answer as the client stores it; a stream is read to its end here
        (inside the transaction) and handed back to Django as the same chunks."""
        headers = [(name, value) for name, value in answer.items()]
        if not isinstance(answer, StreamingHttpResponse):
            body = answer.content if isinstance(answer, HttpResponse) else b""
            return Response(status=answer.status_code, headers=headers, body=body,
                            resource_id=context.resource_id, one_time_secret=context.one_time_secret)
        if answer.is_async:
            raise TypeError("pg_idempotency's Django middleware reads streams synchronously: "
                            "give StreamingHttpResponse a sync iterator")
        capture = StreamCapture(self.max_stream_bytes)
        pieces: List[bytes] = []
        # Not answer.close() here: it sends request_finished, and Django would hand the
        # connection back (rolled back) in the middle of the transaction. The server
        # closes the response (and the view's iterator with it) once it is sent.
        for piece in answer.streaming_content:
            if piece:
                pieces.append(bytes(piece))
                capture.add(piece)
        answer.streaming_content = iter(pieces)
        return capture.response(answer.status_code, headers, context.resource_id, context.one_time_secret)


def _stamped(view_response: HttpResponseBase, response: Response) -> HttpResponseBase:
    """The view's own response with the key's expiry header, when the client set one."""
    expires = response.header(EXPIRES_HEADER)
    if expires is not None:
        view_response[EXPIRES_HEADER] = expires
    return view_response


def _django_response(response: Response) -> HttpResponseBase:
    """A Django response for one the client made (a replay, a problem, a 503)."""
    if response.chunks is not None:
        answer: HttpResponseBase = StreamingHttpResponse(iter(response.pieces()), status=response.status)
    else:
        answer = HttpResponse(response.body, status=response.status)
    del answer["Content-Type"]  # Django's default; the client's headers say what it is
    for name, value in response.headers:
        # Django keeps one value per name: repeated fields are joined (RFC 9110 5.3).
        answer[name] = f"{answer[name]}, {value}" if answer.has_header(name) else value
    return answer

"""The HTTP side of the client: responses, header lists and the RFC 9457 bodies of
the problems the client answers itself (a missing, malformed or refused key, a body
that cannot be fingerprinted, a duplicate under a lease policy that keeps nothing,
a database fault).

No database here. The answers of the outcomes that do not run the handler (a
replay, 409, 410, 422) come whole from ``idempotency.http_answer``; the names and
problem types below are generated from client/protocol.json (``_protocol``). Problem
bodies are byte-identical to the extension's: the members ``detail``, ``status``,
``title``, ``type`` in that (sorted) order, no whitespace, non-ASCII as raw UTF-8.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

# The names, defaults and problem types of client/protocol.json, generated
# (tools/protocol_gen.py): every name of _protocol.__all__, public here.
from ._protocol import *  # noqa: F401,F403
from ._protocol import (DATABASE_FAULT_DETAIL, DEFAULT_RETRY_AFTER_SECONDS, EXPIRES_HEADER,
                        PROBLEM_CONTENT_TYPE, PROBLEM_TYPE_BASE, Problem)

Headers = List[Tuple[str, str]]
"""HTTP header fields in order; names compare case-insensitively."""

NOT_KEPT_VALUE = "stream-too-large"
"""The value stored with NOT_KEPT_ENTRY (the server reads only the name)."""

_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def http_date(epoch_seconds: int) -> str:
    """Seconds since the Unix epoch as an RFC 9110 IMF-fixdate ("Sun, 06 Nov 1994 08:49:37 GMT")."""
    # What email.utils.formatdate(usegmt=True) writes, at a quarter of its cost (every
    # keyed answer carries one); English names whatever the locale.
    t = time.gmtime(epoch_seconds)
    return (f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {t.tm_year:04d}"
            f" {t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT")


def header_name_equal(a: str, b: str) -> bool:
    """True when two header names are equal ignoring ASCII case."""
    return len(a) == len(b) and a.lower() == b.lower()


@dataclass
class Response:
    """An HTTP response produced by a handler or by the client."""

    status: int = 200
    """HTTP status code (100..599)."""
    headers: Headers = field(default_factory=list)
    """Header fields to send, in order."""
    body: bytes = b""
    """Body bytes, sent and stored as they are."""
    replayed: bool = False
    """True when this is a stored response played back for a retry."""
    resource_id: Optional[str] = None
    """Id of what the request created, stored with the key (support, mismatch reports)."""
    one_time_secret: bool = False
    """The response carries a secret (a new API key, say): sent once, never stored."""
    chunks: Optional[List[int]] = None
    """A streamed response: the byte lengths of its chunks, in the order written (their
    concatenation is ``body``); stored as the STREAM_CHUNKS_ENTRY and replayed chunk by
    chunk. None: not streamed."""
    stream_too_large: bool = False
    """A streamed response larger than the middleware keeps: stored without its body,
    marked NOT_KEPT_ENTRY; a retry gets 409 response-not-kept."""

    def pieces(self) -> List[bytes]:
        """The body cut at ``chunks`` (one piece per chunk), or [body] when not streamed."""
        if self.chunks is None:
            return [self.body]
        out, start = [], 0
        for length in self.chunks:
            out.append(self.body[start:start + length])
            start += length
        return out

    def header(self, name: str) -> Optional[str]:
        """The value of the first header with this name, or None."""
        for field_name, value in self.headers:
            if header_name_equal(field_name, name):
                return value
        return None

    def set_header(self, name: str, value: str) -> None:
        """Replaces every header with this name by one with ``value`` (appended last)."""
        self.headers = [(n, v) for n, v in self.headers if not header_name_equal(n, name)]
        self.headers.append((name, value))


def problem_body(status: int, type_uri: str, title: str, detail: str) -> bytes:
    """Serializes an RFC 9457 problem object the way idempotency.http_answer does."""
    document = {"detail": detail, "status": status, "title": title, "type": type_uri}
    return json.dumps(document, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode()


def problem_response(problem: Problem, detail: str, type_base: str = PROBLEM_TYPE_BASE) -> Response:
    """An ``application/problem+json`` response with ``type`` = type_base + slug."""
    body = problem_body(problem.status, type_base + problem.slug, problem.title, detail)
    return Response(status=problem.status, headers=[("Content-Type", PROBLEM_CONTENT_TYPE)], body=body)


def stamped(response: Response, expires_epoch: Optional[int]) -> Response:
    """Adds the key's expiry header (when known), replacing any value the handler set."""
    if expires_epoch is not None:
        response.set_header(EXPIRES_HEADER, http_date(expires_epoch))
    return response


KEY_REFUSED_DETAIL = "The Idempotency-Key was refused by the server."
"""The detail of the 400 for a key the server refused (22P02)."""


def database_fault_response(retry_after: int = DEFAULT_RETRY_AFTER_SECONDS,
                            type_base: str = PROBLEM_TYPE_BASE) -> Response:
    """The one answer to a database fault (protocol.json ``database_fault``; see
    ``pg_idempotency.fault``): 503 database-unavailable with Retry-After. A retry with
    the same key runs the request once or replays its stored response."""
    response = problem_response(Problem.DATABASE_UNAVAILABLE, DATABASE_FAULT_DETAIL, type_base)
    response.set_header("Retry-After", str(max(1, int(retry_after))))
    return response

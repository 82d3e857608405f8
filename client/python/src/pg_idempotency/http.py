"""The HTTP side of the client: responses, header lists and RFC 9457 problem bodies.

No database here. Problem bodies are byte-identical to the C++ client's
(``client/cpp/src/http.cpp``): the members ``detail``, ``status``, ``title``, ``type``
in that (sorted) order, no whitespace, non-ASCII characters as raw UTF-8.
"""

from __future__ import annotations

import time
import enum
import json
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

Headers = List[Tuple[str, str]]
"""HTTP header fields in order; names compare case-insensitively."""

# The protocol table (client/protocol.json is its one source; tests/test_protocol_table.py
# compares every field of it with the values below).
PROBLEM_CONTENT_TYPE = "application/problem+json"
"""The media type of problem bodies."""
PROBLEM_TYPE_BASE = "/problems/"
"""The default prefix of problem ``type`` URIs."""
REPLAY_HEADER = "Idempotent-Replay"
"""The header (value ``true``) that marks a replayed response."""
KEY_HEADER = "Idempotency-Key"
"""The request header that carries the key."""
EXPIRES_HEADER = "Idempotency-Expires"
"""The response header that tells until when the request's key counts: an IMF-fixdate
(RFC 9110), the key row's expires_at rounded down to the second. Never stored as a kept
header; every answer to a keyed request adds the stored row's value."""
EXPIRES_FORMAT = "IMF-fixdate"
"""The format of EXPIRES_HEADER's value."""
DUPLICATE_MODES = ("wait", "reject")
"""What a duplicate of a running request does: wait for it and replay (up to the wait), or
get 409 request-in-progress with Retry-After at once."""
DEFAULT_DUPLICATE_MODE = "wait"
"""The duplicate mode of a middleware or call that names none."""
DEFAULT_RETRY_AFTER_SECONDS = 1
"""Retry-After of a 409 when the key's holder has no lease end to tell."""
DEFAULT_KEPT_HEADERS = ("Content-Type", "Location", "ETag", "Content-Location", "Last-Modified")
"""Response headers stored with the key and replayed, unless configured otherwise."""
STREAM_CHUNKS_ENTRY = ":chunks"
"""The reserved entry of the stored headers that keeps a streamed response's chunk lengths
("5,5,3": decimal, comma-separated, in the order written). No HTTP header can have this
name: it is never sent."""
NOT_KEPT_ENTRY = ":not_kept"
"""The reserved entry of the stored headers of a streamed response that was larger than the
middleware keeps (value "stream-too-large"): no body is stored, a retry gets 409
response-not-kept."""
NOT_KEPT_VALUE = "stream-too-large"
"""The value of NOT_KEPT_ENTRY."""
DEFAULT_MAX_STREAM_BYTES = 1048576
"""The largest streamed response a middleware keeps for replay, unless configured otherwise."""


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


class Problem(enum.Enum):
    """The problem types of the RFC 9457 bodies the client produces: (slug, status, title)."""

    KEY_MISSING = ("idempotency-key-missing", 400, "Idempotency-Key header is missing")
    KEY_MALFORMED = ("idempotency-key-malformed", 400, "Idempotency-Key header is malformed")
    BODY_INVALID = ("request-body-invalid", 400, "Request body cannot be fingerprinted")
    KEY_REUSE = ("idempotency-key-reuse", 422, "Idempotency-Key was used for another request")
    REQUEST_IN_PROGRESS = (
        "request-in-progress",
        409,
        "A request with this Idempotency-Key is in progress",
    )
    ONE_TIME_SECRET = (
        "one-time-secret",
        409,
        "The response to this request was sent once and not kept",
    )
    ALREADY_PROCESSED = ("request-already-processed", 409, "This request was already processed")
    RESPONSE_NOT_KEPT = (
        "response-not-kept",
        409,
        "The response to this request was too large to keep",
    )
    KEY_EXPIRED = ("idempotency-key-expired", 410, "Idempotency-Key has expired")
    DATABASE_UNAVAILABLE = ("database-unavailable", 503, "The database is unavailable")

    @property
    def slug(self) -> str:
        """The slug appended to the type base URI ("idempotency-key-reuse")."""
        return self.value[0]

    @property
    def status(self) -> int:
        """The HTTP status of this problem type."""
        return self.value[1]

    @property
    def title(self) -> str:
        """The fixed, human-readable title."""
        return self.value[2]


def problem_body(status: int, type_uri: str, title: str, detail: str) -> bytes:
    """Serializes an RFC 9457 problem object the way the C++ client (nlohmann_json) does."""
    document = {"detail": detail, "status": status, "title": title, "type": type_uri}
    return json.dumps(document, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode()


def problem_response(problem: Problem, detail: str, type_base: str = PROBLEM_TYPE_BASE) -> Response:
    """An ``application/problem+json`` response with ``type`` = type_base + slug."""
    body = problem_body(problem.status, type_base + problem.slug, problem.title, detail)
    return Response(status=problem.status, headers=[("Content-Type", PROBLEM_CONTENT_TYPE)], body=body)


DETAILS = {
    "key_reuse": "This Idempotency-Key was used for a different request; use a new key for a new request.",
    "one_time_secret": "The first response to this request carried a secret and was not kept;"
    " create a new one with a new key.",
    "in_progress": "A request with this Idempotency-Key is still being processed; retry later.",
    "already_processed": "A request with this Idempotency-Key was already processed; its result is not kept.",
    "key_refused": "The Idempotency-Key was refused by the server.",
    "response_not_kept": "The first response to this request was streamed and was larger than this"
    " service keeps; it was sent once and not stored. Use a new key for a new request.",
    "key_expired": "This Idempotency-Key expired and its response is no longer kept; the request was not run"
    " again. Use a new key for a new request.",
    "database_fault": "The database failed or could not be reached while this request was"
    " processed. Retry it with the same Idempotency-Key: it runs once, or its stored response is"
    " replayed.",
}
"""The problem details the clients (C++, Python, Node) write, word for word."""

OUTCOME_PROBLEMS = {
    "mismatch": (Problem.KEY_REUSE, DETAILS["key_reuse"]),
    "in_progress": (Problem.REQUEST_IN_PROGRESS, DETAILS["in_progress"]),
    "secret_replay": (Problem.ONE_TIME_SECRET, DETAILS["one_time_secret"]),
    "expired": (Problem.KEY_EXPIRED, DETAILS["key_expired"]),
}
"""The outcomes of begin()/acquire() that are answered with a problem, and its detail."""


def problem_for_outcome(
    outcome: str, lease_seconds: Optional[int], retry_after: int, type_base: str = PROBLEM_TYPE_BASE
) -> Optional[Response]:
    """The one mapping from an outcome of begin()/acquire() to an HTTP problem
    response: mismatch 422; in_progress 409 with Retry-After (the rest of the
    lease when known, else ``retry_after``, at least 1); secret_replay 409 with
    Idempotent-Replay; expired 410 (the caller adds Idempotency-Expires, the past
    expiry begin/acquire returned). None for the outcomes that are not problems."""
    entry = OUTCOME_PROBLEMS.get(outcome)
    if entry is None:
        return None
    problem, detail = entry
    response = problem_response(problem, detail, type_base)
    if outcome == "in_progress":
        retry = retry_after if lease_seconds is None else lease_seconds
        response.set_header("Retry-After", str(max(1, int(retry))))
    if outcome == "secret_replay":
        response.replayed = True
        response.set_header(REPLAY_HEADER, "true")
    return response


def not_kept_response(type_base: str = PROBLEM_TYPE_BASE) -> Response:
    """The answer to a retry whose first response was a stream too large to keep (stored
    with the NOT_KEPT_ENTRY): 409 response-not-kept with Idempotent-Replay, as a one-time
    secret's retry is answered (the request was processed once; its answer is gone)."""
    response = problem_response(Problem.RESPONSE_NOT_KEPT, DETAILS["response_not_kept"], type_base)
    response.replayed = True
    response.set_header(REPLAY_HEADER, "true")
    return response


def database_fault_response(retry_after: int = DEFAULT_RETRY_AFTER_SECONDS,
                            type_base: str = PROBLEM_TYPE_BASE) -> Response:
    """The one answer to a database fault (protocol.json ``database_fault``; see
    ``pg_idempotency.fault``): 503 database-unavailable with Retry-After. A retry with
    the same key runs the request once or replays its stored response."""
    response = problem_response(Problem.DATABASE_UNAVAILABLE, DETAILS["database_fault"], type_base)
    response.set_header("Retry-After", str(max(1, int(retry_after))))
    return response

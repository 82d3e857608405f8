"""What the transactional and the lease protocol share: requests, options, SQL pieces."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, List, Optional, Sequence

from . import _wire
from .http import (
    DUPLICATE_MODES,
    EXPIRES_HEADER,
    NOT_KEPT_ENTRY,
    NOT_KEPT_VALUE,
    REPLAY_HEADER,
    STREAM_CHUNKS_ENTRY,
    Response,
)

# The server refuses a key it cannot accept (empty, too long, bad characters,
# not a UUID when idempotency.key_format asks) with 22P02 (since 0.6.0; other
# bad arguments, such as a ttl out of range, stay 22023 and propagate).
KEY_REFUSED = ("22P02",)
# The body cannot be fingerprinted (JSON nested deeper than idempotency.max_json_depth).
BODY_INVALID = ("54000", "54001")


@dataclass
class Request:
    """One HTTP request as the protocol sees it."""

    principal: str
    """Whoever the key belongs to (user, API key, tenant), from authentication."""
    key: Optional[str]
    """The Idempotency-Key header, or None when the request had none."""
    method: str
    """HTTP method; compared in upper case."""
    path: str
    """Request path (without the query string, unless the API wants it fingerprinted)."""
    body: Optional[bytes] = None
    """Request body; fingerprinted as RFC 8785 JSON when it is JSON, as raw bytes otherwise."""
    exclude: Sequence[str] = ()
    """RFC 6901 pointers of members left out of the fingerprint (timestamps, nonces)."""
    action: str = ""
    """Operation name stored with the key; defaults to "METHOD path"."""
    duplicates: Optional[str] = None
    """"wait" or "reject" for a duplicate of a running request; None: the client's option."""

    def action_name(self) -> str:
        """The action stored with the key."""
        return self.action or f"{self.method.upper()} {self.path}"


def valid_key(key: str, max_length: int) -> bool:
    """1 to max_length visible ASCII characters (space included), as the C++ client checks."""
    # isprintable() on ASCII is exactly 0x20..0x7E (space in, DEL and controls out).
    return 0 < len(key) <= max_length and key.isascii() and key.isprintable()


def duplicate_wait(request: Request, duplicates: str, wait: Optional[timedelta]) -> Optional[timedelta]:
    """The wait of begin or acquire: 0 in reject mode (409 at once), else ``wait``; the
    request's mode first, then the client's (``duplicates``)."""
    mode = request.duplicates or duplicates
    if mode not in DUPLICATE_MODES:
        raise ValueError(f"duplicates must be one of {DUPLICATE_MODES}, not {mode!r}")
    return timedelta(0) if mode == "reject" else wait


def interval(value: Optional[timedelta]) -> Optional[str]:
    """A timedelta as a PostgreSQL interval literal ("1500 milliseconds"), None stays None."""
    if value is None:
        return None
    return f"{int(value / timedelta(milliseconds=1))} milliseconds"


def text_array(values: Sequence[str]) -> Optional[str]:
    """A text[] literal for the exclude pointers, or None when there are none."""
    if not values:
        return None
    quoted = ('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values)
    return "{" + ",".join(quoted) + "}"


def request_params(request: Request) -> List[Any]:
    """The principal, the key, the action and what the fingerprint is made of (method, path,
    body, the excluded pointers as a text[] literal): the first parameters of begin,
    save_final and acquire."""
    return [
        request.principal,
        request.key,
        request.action_name(),
        request.method,
        request.path,
        request.body,
        text_array(request.exclude),
    ]


def kept_headers_json(response: Response, kept: Sequence[str]) -> str:
    """The kept headers of a response as a JSON array of [name, value] pairs, in
    their order, repeated names (Set-Cookie, Link) included."""
    # A stream too large to keep is stored as its marker alone (contract: no body, no header).
    if response.stream_too_large:
        return json.dumps({NOT_KEPT_ENTRY: NOT_KEPT_VALUE}, separators=(",", ":"))
    # The expiry header belongs to the key, added to every answer: never stored. Names
    # starting with ":" are the reserved entries, written below only.
    wanted = {name.lower() for name in kept}
    wanted.discard(EXPIRES_HEADER.lower())
    chosen: List[List[str]] = [
        [name, value] for name, value in response.headers if name.lower() in wanted and not name.startswith(":")
    ]
    if response.chunks is not None:
        chosen.append([STREAM_CHUNKS_ENTRY, ",".join(str(length) for length in response.chunks)])
    return json.dumps(chosen, ensure_ascii=False, separators=(",", ":"))


def chunk_lengths(value: str, body_length: int) -> Optional[List[int]]:
    """The STREAM_CHUNKS_ENTRY's lengths, or None unless they are positive decimals that add
    up to the body's length (a row this client did not write is replayed whole)."""
    if value == "":
        return [] if body_length == 0 else None
    parts = value.split(",")
    if not all(part.isdigit() and part.isascii() and int(part) > 0 for part in parts):
        return None
    lengths = [int(part) for part in parts]
    return lengths if sum(lengths) == body_length else None


def answer_response(
    status: int, headers_json: Optional[str], body: Optional[bytes], resource_id: Optional[str]
) -> Response:
    """The answer ``idempotency.http_answer`` gave (status, headers as [name, value]
    pairs, body) as a Response. Its STREAM_CHUNKS_ENTRY (a stored stream's chunk
    lengths, the client's instruction, never a header) sets ``chunks``; the
    ``replayed`` flag follows the answer's REPLAY_HEADER."""
    response = Response(status=status, body=body or b"", resource_id=resource_id)
    for name, value in json.loads(headers_json or "[]"):
        if name == STREAM_CHUNKS_ENTRY:
            response.chunks = chunk_lengths(value, len(response.body))
        elif not name.startswith(":"):
            response.headers.append((name, value))
    response.replayed = response.header(REPLAY_HEADER) is not None
    return response


# What idempotency.http_storage says a handler's response with a status does.
COMMITTED_WITH_KEY = "committed_with_key"
SAVED_AFTER_ROLLBACK = "saved_after_rollback"
NOT_STORED = "not_stored"

STORAGE_SQL = (
    b"SELECT s, idempotency.http_storage(s) FROM pg_catalog.generate_series(100, 599) AS s"
)


class Storage:
    """What a status means for storage: idempotency.http_storage for every status,
    read once, or the meanings of a fixed list of final statuses."""

    def __init__(self, statuses: Optional[Sequence[int]] = None) -> None:
        self._table: Optional[List[str]] = None
        if statuses is not None:
            self._table = [NOT_STORED] * 500
            for status in statuses:
                if not 100 <= status <= 599:
                    raise ValueError(f"not an HTTP status: {status}")
                # http_storage's reading of a final status, for a list the server never saw.
                meaning = COMMITTED_WITH_KEY if status < 400 else SAVED_AFTER_ROLLBACK
                self._table[status - 100] = meaning

    def load_gen(self, conn: Any) -> Any:
        """Reads idempotency.http_storage of every status (one round trip, once); a
        generator for ``conn.wait`` (see _wire); the connection must be idle."""
        if self._table is not None:
            return
        (result,) = yield from _wire.pipeline(conn, [_wire.Statement(STORAGE_SQL), _wire.SYNC])
        if result.error is not None:
            raise result.error
        table = [NOT_STORED] * 500
        for status, meaning in result.rows:
            table[int(status or b"0") - 100] = (meaning or b"").decode()
        self._table = table

    def meaning(self, status: int) -> str:
        """COMMITTED_WITH_KEY, SAVED_AFTER_ROLLBACK or NOT_STORED."""
        if self._table is None:
            raise RuntimeError("the storage table is not loaded")
        if not 100 <= status <= 599:
            return NOT_STORED
        return self._table[status - 100]

    def __call__(self, status: int) -> bool:
        """Whether a response with this status is stored (final)."""
        return self.meaning(status) != NOT_STORED

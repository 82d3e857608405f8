"""What the transactional and the lease protocol share: requests, options, SQL pieces."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Dict, List, Optional, Sequence

import psycopg

from .http import (  # noqa: F401
    DEFAULT_KEPT_HEADERS,
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


def stored_response(
    status: int, headers_json: Optional[str], body: Optional[bytes], resource_id: Optional[str]
) -> Response:
    """A stored response as it is replayed: kept headers, Idempotent-Replay: true; the
    reserved entries (names starting with ":") set ``chunks`` or ``stream_too_large``
    and are never sent as headers."""
    response = Response(status=status, body=body or b"", resource_id=resource_id, replayed=True)
    if headers_json:
        stored = json.loads(headers_json)
        # An array of [name, value] pairs (order and repeated names kept), or
        # the object form of name -> value.
        pairs = stored if isinstance(stored, list) else list(stored.items())
        for pair in pairs:
            if not (len(pair) == 2 and isinstance(pair[0], str) and isinstance(pair[1], str)):
                continue
            if pair[0] == STREAM_CHUNKS_ENTRY:
                response.chunks = chunk_lengths(pair[1], len(response.body))
            elif pair[0] == NOT_KEPT_ENTRY:
                response.stream_too_large = True
            elif not pair[0].startswith(":"):
                response.headers.append((pair[0], pair[1]))
    response.set_header(REPLAY_HEADER, "true")
    return response


FINAL_STATUSES_SQL = (
    b"SELECT s FROM pg_catalog.generate_series(100, 599) AS s WHERE idempotency.is_final(s)"
)


class FinalStatuses:
    """Which statuses are stored: idempotency.is_final, read once, or a fixed list."""

    def __init__(self, statuses: Optional[Sequence[int]] = None) -> None:
        self._table: Optional[List[bool]] = None
        if statuses is not None:
            self._table = [False] * 500
            for status in statuses:
                if not 100 <= status <= 599:
                    raise ValueError(f"not an HTTP status: {status}")
                self._table[status - 100] = True

    @property
    def known(self) -> bool:
        """True once the table has been read (or was given)."""
        return self._table is not None

    def load_gen(self, conn: Any) -> Any:
        """Reads the server's idempotency.final_statuses through idempotency.is_final
        (one round trip, once); a generator for ``conn.wait`` (see _wire); the
        connection must be idle."""
        if self._table is not None:
            return
        from . import _wire

        (result,) = yield from _wire.pipeline(conn, [_wire.Statement(FINAL_STATUSES_SQL), _wire.SYNC])
        if result.error is not None:
            raise result.error
        table = [False] * 500
        for (status,) in result.rows:
            table[int(status or b"0") - 100] = True
        self._table = table

    def load(self, conn: psycopg.Connection[Any]) -> None:
        """load_gen on a sync connection."""
        if self._table is None:
            with conn.lock:
                conn.wait(self.load_gen(conn))

    async def load_async(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """load_gen on an async connection."""
        if self._table is None:
            async with conn.lock:
                await conn.wait(self.load_gen(conn))

    def __call__(self, status: int) -> bool:
        if self._table is None:
            raise RuntimeError("final statuses not loaded")
        return 100 <= status <= 599 and self._table[status - 100]

"""What the middlewares (WSGI, ASGI, Django) share for streamed responses.

A streamed response is sent to the client as the application produces it and
captured chunk by chunk. When it ends within ``max_stream_bytes`` the key is
completed with the concatenation as body and the chunk lengths in the reserved
STREAM_CHUNKS_ENTRY of the stored headers; a replay sends the same chunks. Past
the limit the stream goes on to the client, the captured chunks are dropped,
and the key is completed with the NOT_KEPT_ENTRY alone: a retry gets 409
response-not-kept, never a truncated body. docs/http.md, "Streamed responses".
"""

from __future__ import annotations

from typing import List, Optional

from .http import DEFAULT_MAX_STREAM_BYTES, Headers, Response, stamped

__all__ = ["StreamCapture", "check_max_stream_bytes", "stream_headers"]


def check_max_stream_bytes(value: int) -> int:
    """``value`` when it is a byte count (an int, 0 or more); ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"max_stream_bytes must be an integer >= 0, not {value!r}")
    return value


class StreamCapture:
    """The chunks of one streamed response, kept up to ``max_bytes`` in all."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_STREAM_BYTES) -> None:
        self.max_bytes = check_max_stream_bytes(max_bytes)
        self.size = 0
        """Bytes streamed so far, kept or not."""
        self.too_large = False
        """True once the stream went past max_bytes: nothing of it is kept."""
        self._chunks: List[bytes] = []

    def add(self, chunk: bytes) -> None:
        """Records one chunk as sent (an empty one is no chunk: it is never sent)."""
        if not chunk:
            return
        self.size += len(chunk)
        if self.too_large:
            return
        if self.size > self.max_bytes:
            self.too_large = True
            self._chunks = []  # the memory goes back now, not at the end of the stream
            return
        self._chunks.append(bytes(chunk))

    def response(
        self, status: int, headers: Headers, resource_id: Optional[str], one_time_secret: bool
    ) -> Response:
        """What the key is completed with: the chunks and their lengths, or the marker alone."""
        if self.too_large:
            return Response(status=status, headers=list(headers), resource_id=resource_id,
                            one_time_secret=one_time_secret, stream_too_large=True)
        return Response(status=status, headers=list(headers), body=b"".join(self._chunks),
                        resource_id=resource_id, one_time_secret=one_time_secret,
                        chunks=[len(chunk) for chunk in self._chunks])


def stream_headers(headers: Headers, expires_epoch: Optional[int]) -> Headers:
    """The application's headers for the start of a stream: the key's expiry header (when
    the answer will be kept) replaces any the application set, as on every other answer."""
    return stamped(Response(headers=list(headers)), expires_epoch).headers

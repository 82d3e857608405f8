"""Scenario `stream` of the conformance suite: streamed responses (client/protocol.json's
stream entries; docs/http.md, "Streamed responses").

POST /orders/stream with {"chunks": n, "chunk_bytes": m} inserts one order and answers
200 text/plain as n chunks of m bytes, chunk i being the digit i % 10; the example
services keep streams up to 65536 bytes. The replies are read from a raw socket and
their chunked framing parsed, so the chunk boundaries are checked, not only the bytes.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

import psycopg

STREAM_PATH = "/orders/stream"


@dataclass
class ChunkedReply:
    """A reply as it came over the wire: ``chunks`` is None unless the body was chunked."""

    status: int
    headers: List[Tuple[str, str]]
    chunks: Optional[List[bytes]]
    body: bytes

    def header(self, name: str) -> Optional[str]:
        for field_name, value in self.headers:
            if field_name.lower() == name.lower():
                return value
        return None

    def describe(self) -> str:
        heads = ", ".join(f"{n}: {v}" for n, v in self.headers if n.lower() not in ("date", "server"))
        if self.chunks is None:
            shape = f"not chunked, {len(self.body)} bytes"
        else:
            shape = f"{len(self.chunks)} chunks of {[len(c) for c in self.chunks][:12]} bytes"
        return f"{self.status} [{heads}] {shape}: {self.body[:80]!r}"


def parse_reply(data: bytes) -> ChunkedReply:
    """One HTTP/1.x response; a chunked body must end with its last (empty) chunk."""
    head, separator, rest = data.partition(b"\r\n\r\n")
    if not separator:
        raise ValueError(f"no end of the header section in {data[:200]!r}")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = [(name.strip(), value.strip()) for name, _, value in (line.partition(":") for line in lines[1:])]
    reply = ChunkedReply(status, headers, None, rest)
    if "chunked" not in (reply.header("Transfer-Encoding") or "").lower():
        length = reply.header("Content-Length")
        reply.body = rest[: int(length)] if length is not None else rest
        return reply
    chunks: List[bytes] = []
    position = 0
    while True:
        end = rest.index(b"\r\n", position)  # ValueError: cut short
        size = int(rest[position:end].split(b";")[0], 16)
        position = end + 2
        if size == 0:
            break
        if rest[position + size:position + size + 2] != b"\r\n" or len(rest) < position + size:
            raise ValueError(f"chunk of {size} bytes cut short at offset {position}")
        chunks.append(rest[position:position + size])
        position += size + 2
    reply.chunks, reply.body = chunks, b"".join(chunks)
    return reply


def raw_post(host: str, port: int, body: bytes, principal: str, key: str) -> ChunkedReply:
    """POST /orders/stream over HTTP/1.1 (Connection: close), read to the end of the connection."""
    head = (
        f"POST {STREAM_PATH} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nAuthorization: Bearer {principal}\r\n"
        f"Idempotency-Key: {key}\r\nConnection: close\r\n\r\n"
    )
    received = bytearray()
    with socket.create_connection((host, port), timeout=60) as connection:
        connection.sendall(head.encode("latin-1") + body)
        while True:
            data = connection.recv(65536)
            if not data:
                break
            received += data
    return parse_reply(bytes(received))


def stored_entry(headers: Any, name: str) -> Optional[str]:
    """A reserved entry of stored response headers (an object, or [name, value] pairs)."""
    if isinstance(headers, dict):
        value = headers.get(name)
        return value if isinstance(value, str) else None
    for pair in headers or []:
        if isinstance(pair, list) and len(pair) == 2 and pair[0] == name:
            return pair[1]
    return None


def digits(chunks: int, chunk_bytes: int) -> List[bytes]:
    """The chunks POST /orders/stream answers."""
    return [str(i % 10).encode() * chunk_bytes for i in range(chunks)]


def stream_scenario(suite: Any, problem: Callable[[int, str, str, str], bytes]) -> None:
    """Contract C: the chunks of a first answer, the replay's identical chunks, an
    over-limit stream sent whole and answered 409 response-not-kept on retry.
    problem() builds an expected problem body (conformance.problem)."""
    protocol = suite.protocol
    replay_header = protocol["replay_header"]
    chunks_entry, not_kept_entry = protocol["stream_chunks_entry"], protocol["not_kept_entry"]
    who = suite.principal("stream")

    def stored(key: str) -> Optional[tuple]:
        with psycopg.connect(suite.key_dsn(who), autocommit=True) as conn:
            return conn.execute("SELECT response_status, response_headers, response_body FROM idempotency.keys"
                                " WHERE principal = %s AND key = %s", (who, key)).fetchone()

    def post(body: bytes, key: str) -> ChunkedReply:
        return raw_post(suite.host, suite.port, body, who, key)

    # Within the limit: 5 chunks of 1000 bytes.
    want = digits(5, 1000)
    first = post(b'{"chunks":5,"chunk_bytes":1000}', "key-stream")
    media = (first.header("Content-Type") or "").split(";")[0].strip()
    suite.check("stream: the first answer is 200 text/plain, chunked", first.status == 200 and media == "text/plain"
                and first.chunks is not None, first.describe())
    suite.check("stream: it is 5 chunks of 1000 bytes, chunk i the digit i % 10", first.chunks == want,
                first.describe())
    suite.check("stream: the first answer is not a replay", first.header(replay_header) is None,
                first.describe())
    row = stored("key-stream")
    suite.check(f"stream: the key keeps the body and {chunks_entry} = 1000,1000,1000,1000,1000",
                row is not None and row[0] == 200 and bytes(row[2] or b"") == b"".join(want)
                and stored_entry(row[1], chunks_entry) == "1000,1000,1000,1000,1000",
                repr(row and (row[0], row[1], bytes(row[2] or b"")[:40])))
    retry = post(b'{ "chunk_bytes" : 1000, "chunks" : 5.0 }', "key-stream")
    suite.check("stream: the retry replays the same chunks, chunked, Idempotent-Replay: true",
                retry.status == 200 and retry.chunks == want and retry.header(replay_header) == "true",
                retry.describe())
    suite.check(f"stream: the replay sends no {chunks_entry} header and the same Content-Type",
                not any(n.startswith(":") or "chunks" in n.lower() for n, _ in retry.headers)
                and retry.header("Content-Type") == first.header("Content-Type"), retry.describe())
    suite.effects("stream: one key, two requests", "orders", who, 1)

    # Past the limit (65536 bytes in the example services): 3 chunks of 40000 bytes.
    large = digits(3, 40000)
    whole = post(b'{"chunks":3,"chunk_bytes":40000}', "key-stream-large")
    suite.check("stream: an over-limit stream is sent whole, chunk by chunk", whole.status == 200
                and whole.chunks == large, whole.describe())
    row = stored("key-stream-large")
    suite.check(f"stream: its key keeps no body, only {not_kept_entry}",
                row is not None and not bytes(row[2] or b"")
                and stored_entry(row[1], not_kept_entry) == "stream-too-large",
                repr(row and (row[0], row[1], bytes(row[2] or b"")[:40])))
    kind = protocol["problems"]["response_not_kept"]
    expected = problem(kind["status"], suite.problem_base + kind["type"], kind["title"],
                       protocol["not_kept_detail"])
    again = post(b'{"chunks":3,"chunk_bytes":40000}', "key-stream-large")
    suite.check("stream: its retry is 409 response-not-kept problem+json, Idempotent-Replay: true",
                again.status == kind["status"] and again.body == expected
                and again.header("Content-Type") == protocol["problem_content_type"]
                and again.header(replay_header) == "true",
                f"expected {expected!r}\ngot {again.describe()}")
    suite.effects("stream: an over-limit stream and its retry", "orders", who, 2)

    invalid = post(b'{"chunks":0,"chunk_bytes":10}', "key-stream-invalid")
    suite.check("stream: chunks 0 is a 400", invalid.status == 400, invalid.describe())
    suite.effects("stream: the invalid request has no effect", "orders", who, 2)

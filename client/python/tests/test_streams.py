"""Streamed responses in the WSGI and the ASGI middleware: sent as produced, kept with their
chunk lengths up to max_stream_bytes and replayed as the same chunks; past the limit sent
whole, kept as a marker only, and a retry gets 409 response-not-kept; non-final statuses and
streams cut short are not kept. Also the stored form (kept_headers_json) and how an
answer of idempotency.http_answer with a stored stream's chunk lengths is read (answer_response)."""

from __future__ import annotations

import asyncio
import io
import json
import uuid
from contextlib import asynccontextmanager, contextmanager

import psycopg
import pytest
from psycopg import errors

from pg_idempotency import AsyncClient, Client, Response
from pg_idempotency import asgi, wsgi
from pathlib import Path

from pg_idempotency._common import answer_response, kept_headers_json

TABLE = json.loads((Path(__file__).resolve().parents[2] / "protocol.json").read_text(encoding="utf-8"))

INSERT = "INSERT INTO orders (principal, item, quantity) VALUES (%s, 'stream', 1)"


def row(admin, principal, key):
    return admin.execute("SELECT response_status, response_headers, response_body FROM idempotency.keys"
                         " WHERE principal = %s AND key = %s", (principal, key)).fetchone()


def count(admin, principal):
    return admin.execute("SELECT count(*) FROM orders WHERE principal = %s", (principal,)).fetchone()[0]


def not_kept_body() -> bytes:
    problem = TABLE["problems"]["response_not_kept"]
    return json.dumps({"detail": TABLE["not_kept_detail"], "status": 409,
                       "title": problem["title"], "type": "/problems/" + problem["type"]},
                      separators=(",", ":"), sort_keys=True).encode()


# -- the stored form ------------------------------------------------------------------


def test_kept_headers_carry_the_chunks_or_the_marker_alone():
    streamed = Response(200, [("Content-Type", "text/plain"), (":chunks", "forged")], b"aabbb", chunks=[2, 3])
    assert kept_headers_json(streamed, ["Content-Type", ":chunks"]) == \
        '[["Content-Type","text/plain"],[":chunks","2,3"]]'
    too_large = Response(200, [("Content-Type", "text/plain")], b"", stream_too_large=True)
    assert kept_headers_json(too_large, ["Content-Type"]) == '{":not_kept":"stream-too-large"}'
    assert kept_headers_json(Response(201, [("Location", "/o/1")], b"x"), ["Location"]) == '[["Location","/o/1"]]'


def test_a_stored_stream_is_cut_at_its_chunks_and_the_entries_are_never_sent():
    # As idempotency.http_answer gives a kept stream: ":chunks" in its place.
    answer = '[["Content-Type","text/plain"],[":chunks","2,3"],["Idempotent-Replay","true"]]'
    replay = answer_response(200, answer, b"aabbb", None)
    assert replay.chunks == [2, 3] and replay.pieces() == [b"aa", b"bbb"]
    assert [n for n, _ in replay.headers] == ["Content-Type", "Idempotent-Replay"] and replay.replayed
    # Lengths that do not add up, or are not positive decimals: replayed whole.
    for bad in ("2,2", "2,-3", "0,5", "2, 3", "x"):
        assert answer_response(200, json.dumps([[":chunks", bad]]), b"aabbb", None).chunks is None, bad
    assert answer_response(200, '[[":chunks",""]]', b"", None).chunks == []
    assert not answer_response(409, '[["Content-Type","application/problem+json"]]', b"{}", None).replayed


# -- WSGI -----------------------------------------------------------------------------


def wsgi_app(environ, start_response):
    """/stream?n=N&size=S&status=C: one order, then N pieces of S bytes from a generator."""
    context = environ["pg_idempotency"]
    query = dict(part.split("=") for part in environ.get("QUERY_STRING", "").split("&") if part)
    n, size, code = int(query.get("n", 3)), int(query.get("size", 3)), query.get("status", "200")
    context.connection.execute(INSERT, (context.request.principal,))

    def pieces():
        for i in range(n):
            if query.get("explode") == str(i):
                raise RuntimeError("bug mid-stream")
            yield str(i % 10).encode() * size

    start_response(wsgi.status_line(int(code)), [("Content-Type", "text/plain")])
    return [b"a", b"b", b"c"] if query.get("list") else pieces()


def wsgi_middleware(dsn, max_stream_bytes=1048576):
    @contextmanager
    def connection():
        with psycopg.connect(dsn) as conn:
            yield conn

    return wsgi.IdempotencyMiddleware(wsgi_app, Client(), connection=connection,
                                      principal=lambda environ: environ["who"], max_stream_bytes=max_stream_bytes)


def wsgi_call(app, query, key, principal, during=None):
    """Calls the middleware as a server does; ``during(piece)`` runs at each write()."""
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/stream", "SCRIPT_NAME": "", "QUERY_STRING": query,
               "CONTENT_LENGTH": "2", "wsgi.input": io.BytesIO(b"{}"), "HTTP_IDEMPOTENCY_KEY": key,
               "who": principal}
    seen = {"written": [], "starts": 0}

    def write(piece):
        if during is not None:
            during(piece)
        seen["written"].append(piece)

    def start_response(status, headers, exc_info=None):
        seen["starts"] += 1
        seen["status"], seen["headers"] = status, dict(headers)
        return write

    result = app(environ, start_response)
    seen["returned"] = list(result)
    seen["list"] = isinstance(result, list)
    return seen


def test_wsgi_stream_is_sent_as_produced_kept_and_replayed_as_the_same_chunks(dsn, admin, principal):
    app, key = wsgi_middleware(dsn), uuid.uuid4().hex
    during = []
    first = wsgi_call(app, "n=3&size=4", key, principal, lambda piece: during.append(row(admin, principal, key)))
    assert first["starts"] == 1 and first["status"] == "200 OK"
    assert first["written"] == [b"0000", b"1111", b"2222"] and first["returned"] == []
    assert "Idempotency-Expires" in first["headers"] and "Idempotent-Replay" not in first["headers"]
    assert during == [None, None, None]  # nothing committed while the stream is under way
    status, headers, body = row(admin, principal, key)
    assert (status, bytes(body)) == (200, b"000011112222")
    assert headers == [["Content-Type", "text/plain"], [":chunks", "4,4,4"]]
    retry = wsgi_call(app, "n=3&size=4", key, principal)
    assert retry["status"] == "200 OK" and retry["headers"]["Idempotent-Replay"] == "true"
    assert retry["returned"] == [b"0000", b"1111", b"2222"] and not retry["list"]  # no Content-Length
    assert ":chunks" not in retry["headers"] and retry["written"] == []
    assert count(admin, principal) == 1


def test_wsgi_stream_past_the_limit_is_sent_whole_and_its_retry_is_409(dsn, admin, principal):
    app, key = wsgi_middleware(dsn, max_stream_bytes=10), uuid.uuid4().hex
    first = wsgi_call(app, "n=3&size=4", key, principal)
    assert first["written"] == [b"0000", b"1111", b"2222"]
    status, headers, body = row(admin, principal, key)
    assert (status, headers, bytes(body or b"")) == (200, {":not_kept": "stream-too-large"}, b"")
    retry = wsgi_call(app, "n=3&size=4", key, principal)
    assert retry["status"] == "409 Conflict" and retry["returned"] == [not_kept_body()]
    assert retry["headers"]["Content-Type"] == "application/problem+json"
    assert count(admin, principal) == 1
    exact = uuid.uuid4().hex  # exactly at the limit is kept
    wsgi_call(wsgi_middleware(dsn, max_stream_bytes=12), "n=3&size=4", exact, principal)
    assert row(admin, principal, exact)[1] == [["Content-Type", "text/plain"], [":chunks", "4,4,4"]]


def test_wsgi_non_final_stream_is_not_kept_and_rolled_back(dsn, admin, principal):
    app, key = wsgi_middleware(dsn), uuid.uuid4().hex
    failed = wsgi_call(app, "n=2&size=2&status=503", key, principal)
    assert failed["written"] == [b"00", b"11"] and "Idempotency-Expires" not in failed["headers"]
    assert row(admin, principal, key) is None and count(admin, principal) == 0
    assert wsgi_call(app, "n=2&size=2", key, principal)["written"] == [b"00", b"11"]  # runs again
    assert count(admin, principal) == 1


def test_wsgi_stream_that_fails_midway_keeps_nothing(dsn, admin, principal):
    app, key = wsgi_middleware(dsn), uuid.uuid4().hex
    with pytest.raises(RuntimeError):
        wsgi_call(app, "n=3&size=2&explode=2", key, principal)
    assert row(admin, principal, key) is None and count(admin, principal) == 0


def test_wsgi_list_of_pieces_is_not_a_stream(dsn, admin, principal):
    app, key = wsgi_middleware(dsn), uuid.uuid4().hex
    first = wsgi_call(app, "list=1", key, principal)
    assert first["returned"] == [b"abc"] and first["written"] == [] and first["list"]
    assert row(admin, principal, key)[1] == [["Content-Type", "text/plain"]]


def test_max_stream_bytes_must_be_a_byte_count(dsn):
    for bad in (-1, 1.5, True, "10"):
        with pytest.raises(ValueError):
            wsgi_middleware(dsn, max_stream_bytes=bad)
        with pytest.raises(ValueError):
            asgi.IdempotencyMiddleware(None, AsyncClient(), connection=None, principal=None,
                                       max_stream_bytes=bad)


def conflicting_wsgi_app(runs, fail_before_body):
    """Fails its first run with a serialization failure: before any piece when
    ``fail_before_body`` (the attempt may run again), else after two streamed pieces."""

    def app(environ, start_response):
        context = environ["pg_idempotency"]
        runs.append(1)
        context.connection.execute(INSERT, (context.request.principal,))
        start_response("200 OK", [("Content-Type", "text/plain")])
        if fail_before_body and len(runs) == 1:
            raise errors.SerializationFailure("conflict before the body")

        def pieces():
            yield b"aa"
            yield b"bb"
            if len(runs) == 1:
                raise errors.SerializationFailure("conflict mid-stream")
            yield b"cc"

        return pieces()

    return app


def test_wsgi_attempt_runs_again_only_while_nothing_was_sent(dsn, admin, principal):
    @contextmanager
    def connection():
        with psycopg.connect(dsn) as conn:
            yield conn

    def middleware(app):
        return wsgi.IdempotencyMiddleware(app, Client(), connection=connection,
                                          principal=lambda environ: environ["who"])

    runs, key = [], uuid.uuid4().hex
    again = wsgi_call(middleware(conflicting_wsgi_app(runs, True)), "", key, principal)
    assert len(runs) == 2 and again["starts"] == 1 and again["written"] == [b"aa", b"bb", b"cc"]
    assert count(admin, principal) == 1
    runs, key = [], uuid.uuid4().hex
    with pytest.raises(errors.SerializationFailure):
        wsgi_call(middleware(conflicting_wsgi_app(runs, False)), "", key, principal)
    assert len(runs) == 1  # two pieces went out: never a second run, a second stream
    assert row(admin, principal, key) is None and count(admin, principal) == 1


# -- ASGI -----------------------------------------------------------------------------


def asgi_app(pieces, status=200, finish=True):
    async def app(scope, receive, send):
        ctx = asgi.context(scope)
        await receive()
        await ctx.connection.execute(INSERT, (ctx.request.principal,))
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"text/plain")]})
        for piece in pieces:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        if finish:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


def asgi_middleware(dsn, app, max_stream_bytes=1048576):
    @asynccontextmanager
    async def connection():
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            yield conn

    return asgi.IdempotencyMiddleware(app, AsyncClient(), connection=connection,
                                      principal=lambda scope: scope["who"], max_stream_bytes=max_stream_bytes)


def asgi_call(app, key, principal, during=None, wait_after_body=False):
    scope = {"type": "http", "method": "POST", "path": "/stream", "root_path": "", "query_string": b"",
             "headers": [(b"idempotency-key", key.encode())], "who": principal}
    body = [{"type": "http.request", "body": b"{}", "more_body": False}]
    sent = []

    async def receive():
        if body:
            return body.pop()
        if wait_after_body:
            await asyncio.Event().wait()  # a client that stays: only cancellation ends this
        return {"type": "http.disconnect"}

    async def send(message):
        if during is not None:
            during(message)
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent


def test_asgi_stream_is_forwarded_kept_and_replayed_as_the_same_chunks(dsn, admin, principal):
    key = uuid.uuid4().hex
    app = asgi_middleware(dsn, asgi_app([b"ab", b"", b"cde"]))
    seen_rows = []
    first = asgi_call(app, key, principal, lambda message: seen_rows.append(row(admin, principal, key)))
    assert [m["type"] for m in first] == ["http.response.start"] + ["http.response.body"] * 3
    assert [(m["body"], m["more_body"]) for m in first[1:]] == [(b"ab", True), (b"cde", True), (b"", False)]
    assert b"idempotency-expires" in dict(first[0]["headers"])
    assert seen_rows[:3] == [None, None, None] and seen_rows[3] is not None  # the end goes after the commit
    status, headers, body = row(admin, principal, key)
    assert (status, bytes(body), headers) == (200, b"abcde", [["content-type", "text/plain"], [":chunks", "2,3"]])
    retry = asgi_call(app, key, principal)
    assert dict(retry[0]["headers"])[b"idempotent-replay"] == b"true"
    assert all(not name.startswith(b":") for name, _ in retry[0]["headers"])
    assert [(m["body"], m.get("more_body")) for m in retry[1:]] == [(b"ab", True), (b"cde", True), (b"", False)]
    assert count(admin, principal) == 1


def test_asgi_stream_past_the_limit_and_non_final_and_cut_short(dsn, admin, principal):
    large, failed, cut = uuid.uuid4().hex, uuid.uuid4().hex, uuid.uuid4().hex
    app = asgi_middleware(dsn, asgi_app([b"123", b"456"]), max_stream_bytes=5)
    first = asgi_call(app, large, principal)
    assert b"".join(m.get("body", b"") for m in first[1:]) == b"123456"
    assert row(admin, principal, large)[1] == {":not_kept": "stream-too-large"}
    retry = asgi_call(app, large, principal)
    assert retry[0]["status"] == 409 and retry[1]["body"] == not_kept_body()
    asgi_call(asgi_middleware(dsn, asgi_app([b"1", b"2"], status=500)), failed, principal)
    assert row(admin, principal, failed) is None
    sent = asgi_call(asgi_middleware(dsn, asgi_app([b"1", b"2"], finish=False)), cut, principal)
    assert sent[-1].get("more_body") is True  # never ended as if complete
    assert row(admin, principal, cut) is None
    assert count(admin, principal) == 1  # the over-limit stream's only


def test_asgi_attempt_runs_again_only_while_nothing_was_sent(dsn, admin, principal):
    def conflicting(runs, fail_before_body):
        async def app(scope, receive, send):
            ctx = asgi.context(scope)
            runs.append(1)
            await ctx.connection.execute(INSERT, (ctx.request.principal,))
            await send({"type": "http.response.start", "status": 200, "headers": []})
            if fail_before_body and len(runs) == 1:
                raise errors.SerializationFailure("conflict before the body")
            for piece in (b"aa", b"bb"):
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            if len(runs) == 1:
                raise errors.SerializationFailure("conflict mid-stream")
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        return asgi_middleware(dsn, app)

    runs, key = [], uuid.uuid4().hex
    sent = asgi_call(conflicting(runs, True), key, principal)
    assert len(runs) == 2 and [m["type"] for m in sent].count("http.response.start") == 1
    assert count(admin, principal) == 1
    runs, key = [], uuid.uuid4().hex
    with pytest.raises(errors.SerializationFailure):
        asgi_call(conflicting(runs, False), key, principal)
    assert len(runs) == 1  # two pieces went out: never a second run, a second stream
    assert row(admin, principal, key) is None and count(admin, principal) == 1


def test_asgi_starlette_streaming_response(dsn, admin, principal):
    from starlette.responses import StreamingResponse

    async def app(scope, receive, send):
        ctx = asgi.context(scope)
        await ctx.connection.execute(INSERT, (ctx.request.principal,))

        async def pieces():
            for piece in (b"x" * 3, b"y" * 4):
                yield piece

        await StreamingResponse(pieces(), headers={"Content-Type": "text/plain"})(scope, receive, send)

    key = uuid.uuid4().hex
    sent = asgi_call(asgi_middleware(dsn, app), key, principal, wait_after_body=True)
    assert [m.get("body") for m in sent[1:]] == [b"xxx", b"yyyy", b""]
    assert row(admin, principal, key)[1][-1] == [":chunks", "3,4"]

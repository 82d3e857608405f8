"""The ASGI middleware: called directly (asyncio.run) and under Starlette's and
FastAPI's TestClient, with the same answers as the WSGI middleware."""

from __future__ import annotations

import asyncio
import json
import uuid
from contextlib import asynccontextmanager

import psycopg
import pytest
from fastapi import Request as FastAPIRequest  # module level: FastAPI resolves the annotation here
from roundtrips import count_round_trips_async

from pg_idempotency import AsyncClient
from pg_idempotency.asgi import IdempotencyMiddleware, context

INSERT = "INSERT INTO orders (principal, item, quantity) VALUES (%s, %s, 1) RETURNING id"


async def orders_app(scope, receive, send):
    """A bare ASGI application: /explode fails after a write, {} is a final 400."""
    ctx = context(scope)
    message = await receive()
    data = json.loads(message.get("body") or b"{}")
    if scope["path"] == "/explode":
        await ctx.connection.execute(INSERT, (ctx.request.principal, "x"))
        raise RuntimeError("bug")
    if not data.get("item"):
        await send({"type": "http.response.start", "status": 400,
                    "headers": [(b"content-type", b"application/problem+json")]})
        await send({"type": "http.response.body", "body": b'{"title":"Invalid order"}'})
        return
    cur = await ctx.connection.execute(INSERT, (ctx.request.principal, data["item"]))
    (order_id,) = await cur.fetchone()
    ctx.resource_id = str(order_id)
    ctx.one_time_secret = scope["path"] == "/secret"
    await send({"type": "http.response.start", "status": 201,
                "headers": [(b"content-type", b"application/json"), (b"location", b"/orders/%d" % order_id),
                            (b"x-trace", b"not kept")]})
    await send({"type": "http.response.body", "body": b'{"id":%d' % order_id, "more_body": True})
    await send({"type": "http.response.body", "body": b"}"})


def principal_of(scope):
    for name, value in scope["headers"]:
        if name == b"authorization" and value.startswith(b"Bearer "):
            return value[7:].decode()
    return None


def middleware(dsn, app=orders_app):
    @asynccontextmanager
    async def connection():
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            yield conn

    return IdempotencyMiddleware(app, AsyncClient(), connection=connection, principal=principal_of)


async def call(app, path, body=b"", key=None, principal="u"):
    headers = [(b"content-type", b"application/json")]
    if key is not None:
        headers.append((b"idempotency-key", key.encode("latin-1") if isinstance(key, str) else key))
    if principal is not None:
        headers.append((b"authorization", f"Bearer {principal}".encode()))
    scope = {"type": "http", "method": "POST", "path": path, "root_path": "", "headers": headers,
             "query_string": b""}
    chunks = [{"type": "http.request", "body": body[:3], "more_body": True},
              {"type": "http.request", "body": body[3:], "more_body": False}]

    async def receive():
        return chunks.pop(0) if chunks else {"type": "http.disconnect"}

    sent = []

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    start = sent[0]
    headers_out = {n.decode().lower(): v.decode() for n, v in start["headers"]}
    return start["status"], headers_out, b"".join(m.get("body", b"") for m in sent[1:])


def count(admin, principal):
    return admin.execute("SELECT count(*) FROM orders WHERE principal = %s", (principal,)).fetchone()[0]


def test_first_request_replay_reuse_and_final_400(dsn, admin, principal):
    app = middleware(dsn)
    key, bad_key = uuid.uuid4().hex, uuid.uuid4().hex

    async def main():
        return [await call(app, "/orders", b'{"item":"book"}', key, principal),
                await call(app, "/orders", b'{ "item" : "book" }', key, principal),
                await call(app, "/orders", b'{"item":"pen"}', key, principal),
                await call(app, "/orders", b"{}", bad_key, principal),
                await call(app, "/orders", b"{ }", bad_key, principal),
                await call(app, "/orders", b'{"item":"a"}', None, principal),
                await call(app, "/orders", b'{"item":"a"}', "cl\u00e9".encode(), principal)]

    first, retry, reuse, invalid, invalid_again, missing, non_ascii = asyncio.run(main())
    assert first[0] == 201 and "idempotent-replay" not in first[1]
    assert retry[0] == 201 and retry[2] == first[2] and retry[1]["idempotent-replay"] == "true"
    assert retry[1]["location"] == first[1]["location"] and "x-trace" not in retry[1]
    assert reuse[0] == 422 and reuse[1]["content-type"] == "application/problem+json"
    assert invalid[0] == 400 and invalid_again[1]["idempotent-replay"] == "true"
    assert invalid_again[2] == b'{"title":"Invalid order"}'
    assert missing[0] == 400 and b"idempotency-key-missing" in missing[2]
    assert non_ascii[0] == 400 and b"idempotency-key-malformed" in non_ascii[2]
    assert count(admin, principal) == 1


def test_one_time_secret_exception_and_pass_through(dsn, admin, principal):
    app = middleware(dsn)
    key = uuid.uuid4().hex

    async def bare(scope, receive, send):
        assert "pg_idempotency" not in scope
        await send({"type": "http.response.start", "status": 401, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def main():
        secret = [await call(app, "/secret", b'{"item":"k"}', key, principal),
                  await call(app, "/secret", b'{"item":"k"}', key, principal)]
        with pytest.raises(RuntimeError):
            await call(app, "/explode", b'{"item":"k"}', uuid.uuid4().hex, principal)
        anonymous = await call(middleware(dsn, bare), "/orders", b"{}", "k", None)
        return secret, anonymous

    (first, retry), anonymous = asyncio.run(main())
    assert first[0] == 201 and retry[0] == 409 and retry[1]["idempotent-replay"] == "true"
    assert anonymous[0] == 401
    assert count(admin, principal) == 1  # the secret's; /explode rolled back


def test_the_asgi_middleware_adds_no_round_trip(dsn, principal):
    async def main():
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            @asynccontextmanager
            async def same():
                yield conn

            app = IdempotencyMiddleware(orders_app, AsyncClient(), connection=same, principal=principal_of)
            await call(app, "/orders", b'{"item":"w"}', uuid.uuid4().hex, principal)  # warm: final statuses
            key = uuid.uuid4().hex
            return await count_round_trips_async(conn, lambda: call(app, "/orders", b'{"item":"r"}', key, principal))

    assert asyncio.run(main()) == 3


def starlette_app(dsn):
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def create(request):
        ctx = context(request)
        item = (await request.json())["item"]
        cur = await ctx.connection.execute(INSERT, (ctx.request.principal, item))
        (order_id,) = await cur.fetchone()
        return JSONResponse({"id": order_id}, status_code=201, headers={"Location": f"/orders/{order_id}"})

    return middleware(dsn, Starlette(routes=[Route("/orders", create, methods=["POST"])]))


def fastapi_app(dsn):
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    api = FastAPI()

    @api.post("/orders", status_code=201)
    async def create(request: FastAPIRequest):
        ctx = context(request)
        item = (await request.json())["item"]
        cur = await ctx.connection.execute(INSERT, (ctx.request.principal, item))
        (order_id,) = await cur.fetchone()
        return JSONResponse({"id": order_id}, status_code=201, headers={"Location": f"/orders/{order_id}"})

    return middleware(dsn, api)


@pytest.mark.parametrize("make", [starlette_app, fastapi_app], ids=["starlette", "fastapi"])
def test_under_the_frameworks_test_client(make, dsn, admin, principal):
    from starlette.testclient import TestClient

    key = uuid.uuid4().hex
    headers = {"Idempotency-Key": key, "Authorization": f"Bearer {principal}"}
    with TestClient(make(dsn)) as http:
        first = http.post("/orders", content=b'{"item":"book"}', headers=headers)
        retry = http.post("/orders", content=b'{"item": "book"}', headers=headers)
        other = http.post("/orders", content=b'{"item":"pen"}', headers=headers)
    assert first.status_code == 201 and "idempotent-replay" not in first.headers
    assert retry.status_code == 201 and retry.content == first.content
    assert retry.headers["idempotent-replay"] == "true" and retry.headers["location"] == first.headers["location"]
    assert other.status_code == 422
    assert count(admin, principal) == 1

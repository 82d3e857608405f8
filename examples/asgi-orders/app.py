#!/usr/bin/env python3
"""asgi-orders: the orders service of examples/orders-service on Starlette and
uvicorn (psycopg 3 AsyncConnection), idempotent through pg_idempotency's ASGI
middleware.

    python3 app.py --port 8080 --dsn "host=... dbname=..." [--threads 8]

Same routes, bodies and headers as the C++ and the WSGI service:

    POST /orders          {"item": "...", "quantity": n}; Idempotency-Key;
                          Authorization: Bearer <principal>; ?delay_ms=N slows the handler
    POST /reject/orders   the same in reject mode: a duplicate of a running request
                          gets 409 with Retry-After at once instead of waiting
    POST /plain/orders    the same handler without the middleware (baseline)
    POST /flaky/orders    the first run for each (principal, key) inserts the order,
                          then answers 500: rolled back, not stored, the retry runs again
    POST /api-keys        {"name": "..."}: the secret is answered once (one_time_secret)
    POST /orders/stream   {"chunks": n, "chunk_bytes": m}: inserts one order, then streams
                          n chunks of m bytes (chunk i is the digit i % 10), chunked;
                          kept for replay up to 65536 bytes (max_stream_bytes)
    GET  /orders/count    {"orders": n}
    GET  /health          ok
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
import uuid
from contextlib import asynccontextmanager
from typing import AsyncIterator, List, Optional, Tuple

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "client", "python", "src"))

import psycopg  # noqa: E402
import uvicorn  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import PlainTextResponse, Response, StreamingResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402

from pg_idempotency import AsyncClient, is_database_fault  # noqa: E402
from pg_idempotency.asgi import IdempotencyMiddleware, context  # noqa: E402

Headers = List[Tuple[str, str]]
Result = Tuple[int, Headers, bytes]


def dumps(document: dict) -> bytes:
    """Compact JSON with sorted members: the bytes nlohmann_json writes in the C++ service."""
    return json.dumps(document, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode()


def problem(status: int, title: str, detail: str) -> Result:
    body = dumps({"type": "about:blank", "title": title, "status": status, "detail": detail})
    return status, [("Content-Type", "application/problem+json")], body


class Pool:
    """A few async connections shared by the requests (one request at a time each).

    A connection is checked before it is handed out (closed, broken or not idle: closed
    and replaced); one that failed or whose rollback fails is closed, never put back;
    after a database fault every idle connection is closed as well (a restart ended
    them all), so that the next requests connect afresh instead of failing once each."""

    def __init__(self, conninfo: str, size: int) -> None:
        self.conninfo = conninfo
        self.idle: "asyncio.LifoQueue[psycopg.AsyncConnection]" = asyncio.LifoQueue()
        self.size = size
        self.slots: Optional[asyncio.Semaphore] = None

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection]:
        if self.slots is None:  # made in the server's event loop
            self.slots = asyncio.Semaphore(self.size)
        async with self.slots:
            conn = await self._take()
            try:
                yield conn
            except BaseException as error:
                await self._give_back(conn, error)
                raise
            await self._give_back(conn, None)

    async def _take(self) -> psycopg.AsyncConnection:
        while not self.idle.empty():
            conn = self.idle.get_nowait()
            if not conn.closed and not conn.broken and \
                    conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
                return conn
            await conn.close()
        return await psycopg.AsyncConnection.connect(self.conninfo)

    async def _give_back(self, conn: psycopg.AsyncConnection,
                         error: Optional[BaseException]) -> None:
        if is_database_fault(error):
            await conn.close()
            while not self.idle.empty():
                await self.idle.get_nowait().close()
            return
        if conn.closed or conn.broken:
            await conn.close()
            return
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            try:
                await conn.rollback()
            except psycopg.Error:
                await conn.close()
                return
        self.idle.put_nowait(conn)


def principal_of(scope) -> Optional[str]:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            auth = value.decode("latin-1")
            if len(auth) > len("Bearer ") and auth.startswith("Bearer "):
                return auth[len("Bearer "):]
    return None


flaky_failed: set = set()


async def create_order(conn: psycopg.AsyncConnection, principal: str, body: bytes, delay_ms: int):
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("item"), str) or not data["item"]:
        return problem(400, "Invalid order", 'The body must be a JSON object with a non-empty "item" string.'), None
    quantity = data.get("quantity", 1)
    if not isinstance(quantity, int) or isinstance(quantity, bool) or not 1 <= quantity <= 1000:
        return problem(422, "Invalid quantity", "quantity must be 1 to 1000."), None
    if delay_ms > 0:
        await conn.execute("SELECT pg_sleep(%s::float8 / 1000)", (delay_ms,))
    cur = await conn.execute(
        "INSERT INTO orders (principal, item, quantity) VALUES (%s, %s, %s) RETURNING id, created_at::text",
        (principal, data["item"], quantity),
    )
    order_id, created_at = await cur.fetchone()
    body_out = dumps({"id": order_id, "item": data["item"], "quantity": quantity, "created_at": created_at})
    return (201, [("Content-Type", "application/json"), ("Location", f"/orders/{order_id}")], body_out), str(order_id)


async def create_api_key(conn: psycopg.AsyncConnection, principal: str, body: bytes):
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
        detail = 'The body must be a JSON object with a non-empty "name" string.'
        return problem(400, "Invalid API key request", detail), None
    secret = "sk_" + uuid.uuid4().hex
    cur = await conn.execute("INSERT INTO api_keys (principal, name) VALUES (%s, %s) RETURNING id",
                             (principal, data["name"]))
    (key_id,) = await cur.fetchone()
    headers = [("Content-Type", "application/json"), ("Location", f"/api-keys/{key_id}")]
    return (201, headers, dumps({"id": key_id, "name": data["name"], "secret": secret})), str(key_id)


def stream_spec(body: bytes) -> Optional[Tuple[int, int]]:
    """(chunks, chunk_bytes) of a POST /orders/stream body, or None when it is not valid."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    n, m = data.get("chunks"), data.get("chunk_bytes")
    if any(not isinstance(v, int) or isinstance(v, bool) for v in (n, m)):
        return None
    return (n, m) if 1 <= n <= 1000 and 1 <= m <= 65536 else None


def send(result: Result) -> Response:
    status, headers, body = result
    return Response(body, status_code=status, headers=dict(headers))


def delay_of(request: Request) -> int:
    delay = request.query_params.get("delay_ms", "0")
    return int(delay) if delay.isdigit() else 0


def make_app(pool: Pool) -> IdempotencyMiddleware:
    """The service: routes, the business handlers, and the middleware around them."""

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def count(request: Request) -> Response:
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT count(*) FROM orders")
            (n,) = await cur.fetchone()
        return send((200, [("Content-Type", "application/json")], dumps({"orders": n})))

    async def plain_orders(request: Request) -> Response:
        principal = principal_of(request.scope)
        if principal is None:
            return send(problem(401, "Unauthorized", "Send Authorization: Bearer <token>."))
        body = await request.body()
        async with pool.connection() as conn:
            result, _ = await create_order(conn, principal, body, delay_of(request))
            await (conn.commit() if result[0] < 300 else conn.rollback())
        return send(result)

    async def keyed(request: Request) -> Response:
        if principal_of(request.scope) is None:
            return send(problem(401, "Unauthorized", "Send Authorization: Bearer <token>."))
        ctx = context(request)
        body = await request.body()
        who = ctx.request.principal
        if request.url.path == "/api-keys":
            result, resource_id = await create_api_key(ctx.connection, who, body)
            ctx.one_time_secret = result[0] < 300
        else:
            result, resource_id = await create_order(ctx.connection, who, body, delay_of(request))
            flaky = request.url.path == "/flaky/orders" and result[0] < 300
            if flaky and (who, ctx.request.key) not in flaky_failed:
                flaky_failed.add((who, ctx.request.key))
                result = problem(500, "Internal error", "The request failed; it is safe to retry with the same key.")
        ctx.resource_id = resource_id
        return send(result)

    async def stream_orders(request: Request) -> Response:
        """One order, then n chunks of m digits, each its own body message."""
        if principal_of(request.scope) is None:
            return send(problem(401, "Unauthorized", "Send Authorization: Bearer <token>."))
        ctx = context(request)
        spec = stream_spec(await request.body())
        if spec is None:
            detail = 'The body must be a JSON object with "chunks" 1 to 1000 and "chunk_bytes" 1 to 65536.'
            return send(problem(400, "Invalid stream request", detail))
        n, m = spec
        cur = await ctx.connection.execute(
            "INSERT INTO orders (principal, item, quantity) VALUES (%s, 'stream', %s) RETURNING id",
            (ctx.request.principal, n),
        )
        (order_id,) = await cur.fetchone()
        ctx.resource_id = str(order_id)

        async def pieces() -> AsyncIterator[bytes]:
            for i in range(n):
                yield str(i % 10).encode() * m

        return StreamingResponse(pieces(), headers={"Content-Type": "text/plain"})

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/orders/stream", stream_orders, methods=["POST"]),
        Route("/orders/count", count, methods=["GET"]),
        Route("/plain/orders", plain_orders, methods=["POST"]),
        Route("/orders", keyed, methods=["POST"]),
        Route("/reject/orders", keyed, methods=["POST"]),
        Route("/flaky/orders", keyed, methods=["POST"]),
        Route("/api-keys", keyed, methods=["POST"]),
    ]

    def applies(scope) -> bool:
        return scope["method"] == "POST" and scope["path"] != "/plain/orders"

    def duplicates(scope) -> str:
        return "reject" if scope["path"] == "/reject/orders" else "wait"

    return IdempotencyMiddleware(Starlette(routes=routes), AsyncClient(), connection=pool.connection,
                                 principal=principal_of, applies=applies, duplicates=duplicates,
                                 max_stream_bytes=65536)


SCHEMA = (
    "CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, principal text NOT NULL,"
    " item text NOT NULL, quantity int NOT NULL, created_at timestamptz NOT NULL DEFAULT now())",
    "CREATE TABLE IF NOT EXISTS api_keys (id bigserial PRIMARY KEY, principal text NOT NULL,"
    " name text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())",
)


def prepare_database(dsn: str, name: str) -> None:
    """Makes the tables once the database answers, retrying every second: the service
    starts while its database is down (or restarting) and serves when it is back."""
    while True:
        try:
            with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as setup:
                for statement in SCHEMA:
                    setup.execute(statement)
            return
        except psycopg.Error as error:
            print(f"{name}: cannot prepare the database yet ({error}); retrying", file=sys.stderr)
            time.sleep(1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--dsn", default="")
    parser.add_argument("--threads", type=int, default=8, help="database connections")
    args = parser.parse_args()
    threading.Thread(target=prepare_database, args=(args.dsn, "asgi-orders"), daemon=True).start()
    app = make_app(Pool(args.dsn, args.threads))
    print(f"asgi-orders: listening on 127.0.0.1:{args.port}", file=sys.stderr)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

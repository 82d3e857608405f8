#!/usr/bin/env python3
"""python-orders: the orders service of examples/orders-service in Python (plain
WSGI on wsgiref, psycopg 3), idempotent through pg_idempotency's middleware.

    python3 app.py --port 8080 --dsn "host=... dbname=..." [--threads 8]

Same routes, bodies and headers as the C++ service:

    POST /orders          {"item": "...", "quantity": n}; Idempotency-Key;
                          Authorization: Bearer <principal>; ?delay_ms=N slows the handler
    POST /reject/orders   the same in reject mode: a duplicate of a running request
                          gets 409 with Retry-After at once instead of waiting
    POST /plain/orders    the same handler without the middleware (baseline)
    POST /classic/orders  the same as /orders (the C++ service's five-round-trip variant)
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
import json
import os
import queue
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from socketserver import ThreadingMixIn
from typing import Iterator, List, Optional, Tuple
from urllib.parse import parse_qs
from wsgiref.simple_server import ServerHandler, WSGIRequestHandler, WSGIServer, make_server

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "client", "python", "src"))

import psycopg  # noqa: E402

from pg_idempotency import Client, is_database_fault  # noqa: E402
from pg_idempotency.wsgi import IdempotencyMiddleware, status_line  # noqa: E402

Headers = List[Tuple[str, str]]


def dumps(document: dict) -> bytes:
    """Compact JSON with sorted members: the bytes nlohmann_json writes in the C++ service."""
    return json.dumps(document, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode()


def problem(status: int, title: str, detail: str) -> Tuple[int, Headers, bytes]:
    body = dumps({"type": "about:blank", "title": title, "status": status, "detail": detail})
    return status, [("Content-Type", "application/problem+json")], body


class Pool:
    """A few psycopg connections shared by the server's threads (one at a time each);
    autocommit ones with autocommit=True (tests/scale-out/proxy_orders.py's).

    A connection is checked before it is handed out (closed, broken or not idle: closed
    and replaced); one that failed or whose rollback fails is closed, never put back;
    after a database fault every idle connection is closed as well (a restart ended
    them all), so that the next requests connect afresh instead of failing once each."""

    def __init__(self, conninfo: str, size: int, autocommit: bool = False) -> None:
        self.conninfo = conninfo
        self.autocommit = autocommit
        self.idle: "queue.LifoQueue[psycopg.Connection]" = queue.LifoQueue()
        self.slots = threading.BoundedSemaphore(size)

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        with self.slots:
            conn = self._take()
            try:
                yield conn
            except BaseException as error:
                self._give_back(conn, error)
                raise
            self._give_back(conn, None)

    def _take(self) -> psycopg.Connection:
        while True:
            try:
                conn = self.idle.get_nowait()
            except queue.Empty:
                return psycopg.connect(self.conninfo, autocommit=self.autocommit)
            if not conn.closed and not conn.broken and \
                    conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
                return conn
            conn.close()

    def _give_back(self, conn: psycopg.Connection, error: Optional[BaseException]) -> None:
        if is_database_fault(error):
            conn.close()
            while True:
                try:
                    self.idle.get_nowait().close()
                except queue.Empty:
                    return
        if conn.closed or conn.broken:
            conn.close()
            return
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            try:
                conn.rollback()
            except psycopg.Error:
                conn.close()
                return
        self.idle.put(conn)


def principal_of(environ: dict) -> Optional[str]:
    auth = environ.get("HTTP_AUTHORIZATION", "")
    prefix = "Bearer "
    if len(auth) > len(prefix) and auth.startswith(prefix):
        return auth[len(prefix):]
    return None


flaky_lock = threading.Lock()
flaky_failed: set = set()


def first_run(principal: str, key: str) -> bool:
    with flaky_lock:
        if (principal, key) in flaky_failed:
            return False
        flaky_failed.add((principal, key))
        return True


def create_order(conn: psycopg.Connection, principal: str, body: bytes, delay_ms: int):
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
        conn.execute("SELECT pg_sleep(%s::float8 / 1000)", (delay_ms,))
    order_id, created_at = conn.execute(
        "INSERT INTO orders (principal, item, quantity) VALUES (%s, %s, %s) RETURNING id, created_at::text",
        (principal, data["item"], quantity),
    ).fetchone()
    body_out = dumps({"id": order_id, "item": data["item"], "quantity": quantity, "created_at": created_at})
    headers = [("Content-Type", "application/json"), ("Location", f"/orders/{order_id}")]
    return (201, headers, body_out), str(order_id)


def create_api_key(conn: psycopg.Connection, principal: str, body: bytes):
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
        detail = 'The body must be a JSON object with a non-empty "name" string.'
        return problem(400, "Invalid API key request", detail), None
    # The secret is made here, not in RETURNING: Citus refuses volatile
    # functions there (tests/scale-out/citus.sh runs this service on Citus).
    secret = "sk_" + uuid.uuid4().hex
    (key_id,) = conn.execute(
        "INSERT INTO api_keys (principal, name) VALUES (%s, %s) RETURNING id",
        (principal, data["name"]),
    ).fetchone()
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


def stream_order(conn: psycopg.Connection, principal: str, body: bytes):
    """POST /orders/stream: one order, then n chunks of m digits, each yielded (and so
    written and flushed by the server) on its own."""
    spec = stream_spec(body)
    if spec is None:
        detail = 'The body must be a JSON object with "chunks" 1 to 1000 and "chunk_bytes" 1 to 65536.'
        return problem(400, "Invalid stream request", detail), None
    n, m = spec
    (order_id,) = conn.execute(
        "INSERT INTO orders (principal, item, quantity) VALUES (%s, 'stream', %s) RETURNING id", (principal, n)
    ).fetchone()
    pieces = (str(i % 10).encode() * m for i in range(n))
    return (200, [("Content-Type", "text/plain")], pieces), str(order_id)


def make_app(pool: Pool) -> IdempotencyMiddleware:
    """The service: routes, the business handlers, and the middleware around them."""

    def send(start_response, result):
        status, headers, body = result
        start_response(status_line(status), headers)
        return [body] if isinstance(body, bytes) else body  # a generator streams

    def business(environ: dict, start_response):
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
        if method == "GET" and path == "/health":
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"ok"]
        if method == "GET" and path == "/orders/count":
            with pool.connection() as conn:
                count = conn.execute("SELECT count(*) FROM orders").fetchone()[0]
                conn.rollback()
            return send(start_response, (200, [("Content-Type", "application/json")], dumps({"orders": count})))
        routes = ("/orders", "/reject/orders", "/plain/orders", "/classic/orders", "/flaky/orders", "/api-keys",
                  "/orders/stream")
        if method != "POST" or path not in routes:
            return send(start_response, problem(404, "Not found", "No such route."))
        principal = principal_of(environ)
        if principal is None:
            return send(start_response, problem(401, "Unauthorized", "Send Authorization: Bearer <token>."))
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        delay = parse_qs(environ.get("QUERY_STRING", "")).get("delay_ms", ["0"])[0]
        delay_ms = int(delay) if delay.isdigit() else 0
        if path == "/plain/orders":
            with pool.connection() as conn:
                result, _ = create_order(conn, principal, body, delay_ms)
                if result[0] < 300:
                    conn.commit()
                else:
                    conn.rollback()
            return send(start_response, result)
        context = environ["pg_idempotency"]
        conn = context.connection
        if path == "/api-keys":
            result, resource_id = create_api_key(conn, principal, body)
            context.one_time_secret = result[0] < 300
        elif path == "/orders/stream":
            result, resource_id = stream_order(conn, principal, body)
        else:
            result, resource_id = create_order(conn, principal, body, delay_ms)
            if path == "/flaky/orders" and result[0] < 300 and first_run(principal, context.request.key or ""):
                result = problem(500, "Internal error", "The request failed; it is safe to retry with the same key.")
        context.resource_id = resource_id
        return send(start_response, result)

    def applies(environ: dict) -> bool:
        return environ["REQUEST_METHOD"] == "POST" and environ.get("PATH_INFO") != "/plain/orders"

    def duplicates(environ: dict) -> str:
        return "reject" if environ.get("PATH_INFO") == "/reject/orders" else "wait"

    return IdempotencyMiddleware(business, Client(), connection=pool.connection, principal=principal_of,
                                 applies=applies, duplicates=duplicates, max_stream_bytes=65536)


class ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class ChunkedHandler(ServerHandler):
    """wsgiref's handler answering in HTTP/1.1: a response without Content-Length goes
    out chunked, one chunk per piece the application hands over (wsgiref itself answers
    HTTP/1.0 and ends such a body by closing, so its pieces' boundaries are lost). One
    request per connection, as wsgiref serves them: Connection: close."""

    http_version = "1.1"
    chunked = False

    def cleanup_headers(self) -> None:
        super().cleanup_headers()
        bodiless = self.environ.get("REQUEST_METHOD") == "HEAD" or self.status[:3] in ("204", "304")
        modern = self.environ.get("SERVER_PROTOCOL") == "HTTP/1.1"
        if "Content-Length" not in self.headers and modern and not bodiless:
            self.headers["Transfer-Encoding"] = "chunked"
            self.chunked = True
        self.headers["Connection"] = "close"

    def write(self, data: bytes) -> None:
        # wsgiref's write(), with each piece framed as a chunk (an empty one would end the body).
        if not self.status:
            raise AssertionError("write() before start_response()")
        if not self.headers_sent:
            self.bytes_sent = len(data)  # wsgiref's Content-Length of a one-piece answer
            self.send_headers()
        else:
            self.bytes_sent += len(data)
        if self.chunked:
            if not data:
                return
            data = b"%x\r\n%s\r\n" % (len(data), data)
        self._write(data)
        self._flush()

    def finish_content(self) -> None:
        super().finish_content()
        if self.chunked:
            self._write(b"0\r\n\r\n")
            self._flush()


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args) -> None:  # noqa: A002 - wsgiref's name
        pass

    def handle(self) -> None:
        # WSGIRequestHandler.handle with ChunkedHandler in place of wsgiref's ServerHandler.
        self.raw_requestline = self.rfile.readline(65537)
        if len(self.raw_requestline) > 65536:
            self.requestline, self.request_version, self.command = "", "", ""
            self.send_error(414)
            return
        if not self.parse_request():
            return
        handler = ChunkedHandler(self.rfile, self.wfile, self.get_stderr(), self.get_environ(),
                                 multithread=False)
        handler.request_handler = self
        handler.run(self.server.get_app())


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
    threading.Thread(target=prepare_database, args=(args.dsn, "python-orders"), daemon=True).start()
    app = make_app(Pool(args.dsn, args.threads))
    server = make_server("127.0.0.1", args.port, app, server_class=ThreadingServer, handler_class=QuietHandler)
    print(f"python-orders: listening on 127.0.0.1:{args.port}", file=sys.stderr)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""proxy_orders: the orders service of examples/python-orders/app.py in front of
a PL/Proxy cluster (plain WSGI on wsgiref, psycopg 3). It calls only the proxy
database's functions (tests/scale-out/proxy.sql), which run the whole request
(idempotency.begin, the write, idempotency.complete) on the shard that owns the
principal (tests/scale-out/shard.sql); the answers are app.py's, byte for byte.

    python3 proxy_orders.py --port 8080 --dsn "postgresql://.../shop" [--threads 8]

    POST /orders          {"item": "...", "quantity": n}; Idempotency-Key;
                          Authorization: Bearer <principal>; ?delay_ms=N slows the handler
    POST /classic/orders  the same as /orders
    POST /reject/orders   the same in reject mode: a duplicate of a running request is
                          409 with Retry-After at once (begin's wait 0)
    POST /flaky/orders    the first run for each (principal, key) that would answer
                          201 answers 500 instead: rolled back, not stored
    POST /api-keys        {"name": "..."}: the secret is answered once (one_time_secret)
    GET  /orders/count    {"orders": n}, summed over the shards
    GET  /health          ok

What the WSGI middleware of client/python answers before the database (no or
a malformed key: 400) is answered here; a key the server refuses (22P02) is
400 too, a body it cannot fingerprint (54000, 54001) 400 request-body-invalid,
and a shard that does not own the principal (SH503, a resharding under way)
503 with Retry-After. Every answer backed by a key row carries
Idempotency-Expires (the row's expires_at the shard function returns; in the
past for 410 idempotency-key-expired). /plain/orders (app.py's baseline without
keys) is not offered.
"""

from __future__ import annotations

import argparse
import email.utils
import os
import sys
import threading
from typing import List, Tuple
from urllib.parse import parse_qs

from wsgiref.simple_server import make_server

import psycopg

# The example service's pool, JSON, principal and server classes (its import
# puts client/python/src on the path, for the client's status_line).
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "python-orders"))

from app import Pool, QuietHandler, ThreadingServer, dumps, principal_of  # noqa: E402
from pg_idempotency.wsgi import status_line  # noqa: E402

Headers = List[Tuple[str, str]]
PROBLEMS = "/problems/"
MAX_KEY_LENGTH = 255


def problem(status: int, type_uri: str, title: str, detail: str) -> Tuple[int, Headers, bytes]:
    body = dumps({"type": type_uri, "title": title, "status": status, "detail": detail})
    return status, [("Content-Type", "application/problem+json")], body


def valid_key(key: str) -> bool:
    """1 to 255 visible ASCII characters (space included), as the clients check."""
    return 0 < len(key) <= MAX_KEY_LENGTH and all(0x20 <= ord(c) <= 0x7E for c in key)


flaky_lock = threading.Lock()
flaky_failed: set = set()

ORDER_SQL = ("SELECT status, headers, response_body, replayed, expires_epoch"
             " FROM shop.create_order(%s, %s, %s, %s, %s, %s, %s)")
API_KEY_SQL = "SELECT status, headers, response_body, replayed, expires_epoch FROM shop.create_api_key(%s, %s, %s)"
EXPIRES_HEADER = "Idempotency-Expires"


def make_app(pool: Pool):
    def send(start_response, result: Tuple[int, Headers, bytes]):
        status, headers, body = result
        start_response(status_line(status), headers)
        return [body]

    def call(sql: str, params: tuple) -> Tuple[int, Headers, bytes]:
        try:
            with pool.connection() as conn:
                status, headers, body, _, expires = conn.execute(sql, params).fetchone()
        except psycopg.Error as error:
            state = getattr(error, "sqlstate", None)
            if state == "22P02":
                return problem(400, PROBLEMS + "idempotency-key-malformed", "Idempotency-Key header is malformed",
                               "The Idempotency-Key was refused by the server.")
            if state in ("54000", "54001"):
                detail = error.diag.message_primary or str(error)
                return problem(400, PROBLEMS + "request-body-invalid", "Request body cannot be fingerprinted",
                               detail)
            if state == "SH503":
                status, headers, body = problem(503, PROBLEMS + "shard-moving", "The account is being moved",
                                                "Its data is moving between shards; retry shortly.")
                return status, headers + [("Retry-After", "1")], body
            raise
        fields = [(name, value) for name, value in headers]
        if expires is not None:  # the key row's expiry, never a stored header
            fields.append((EXPIRES_HEADER, email.utils.formatdate(expires, usegmt=True)))
        return status, fields, bytes(body)

    def app(environ: dict, start_response):
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
        if method == "GET" and path == "/health":
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"ok"]
        if method == "GET" and path == "/orders/count":
            with pool.connection() as conn:
                count = sum(n for (n,) in conn.execute("SELECT * FROM shop.order_count()"))
            return send(start_response, (200, [("Content-Type", "application/json")], dumps({"orders": count})))
        routes = ("/orders", "/classic/orders", "/flaky/orders", "/reject/orders", "/api-keys")
        if method != "POST" or path not in routes:
            return send(start_response, problem(404, "about:blank", "Not found", "No such route."))
        principal = principal_of(environ)
        if principal is None:
            return send(start_response, problem(401, "about:blank", "Unauthorized",
                                                "Send Authorization: Bearer <token>."))
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        body = environ["wsgi.input"].read(length) if length > 0 else None
        key = environ.get("HTTP_IDEMPOTENCY_KEY")
        if key is None:
            return send(start_response, problem(400, PROBLEMS + "idempotency-key-missing",
                                                "Idempotency-Key header is missing",
                                                f"{method} requests need an Idempotency-Key header."))
        if not valid_key(key):
            return send(start_response, problem(400, PROBLEMS + "idempotency-key-malformed",
                                                "Idempotency-Key header is malformed",
                                                f"The Idempotency-Key must be 1 to {MAX_KEY_LENGTH}"
                                                " visible ASCII characters."))
        if path == "/api-keys":
            return send(start_response, call(API_KEY_SQL, (principal, key, body)))
        delay = parse_qs(environ.get("QUERY_STRING", "")).get("delay_ms", ["0"])[0]
        delay_ms = int(delay) if delay.isdigit() else 0
        fail = False
        if path == "/flaky/orders":
            with flaky_lock:
                fail = (principal, key) not in flaky_failed
        wait_ms = 0 if path == "/reject/orders" else None  # reject: 409 at once
        result = call(ORDER_SQL, (principal, key, path, body, delay_ms, fail, wait_ms))
        if fail and result[0] == 500:
            with flaky_lock:
                flaky_failed.add((principal, key))
        return send(start_response, result)

    return app


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--dsn", default="", help="the proxy database")
    parser.add_argument("--threads", type=int, default=8, help="database connections")
    args = parser.parse_args()
    app = make_app(Pool(args.dsn, args.threads, autocommit=True))
    server = make_server("127.0.0.1", args.port, app, server_class=ThreadingServer, handler_class=QuietHandler)
    print(f"proxy_orders: listening on 127.0.0.1:{args.port}", file=sys.stderr)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())

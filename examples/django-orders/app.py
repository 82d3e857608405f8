#!/usr/bin/env python3
"""django-orders: the orders service of examples/orders-service on Django 5 (the ORM on
psycopg 3, its connection pool psycopg_pool), served by gunicorn, idempotent through
pg_idempotency's Django middleware.

    python3 app.py --port 8080 --dsn "host=... dbname=..." [--threads 8]

Same routes, bodies and headers as the C++, WSGI and ASGI services:

    POST /orders          {"item": "...", "quantity": n}; Idempotency-Key;
                          Authorization: Bearer <principal>; ?delay_ms=N slows the handler
    POST /reject/orders   the same in reject mode: a duplicate of a running request
                          gets 409 with Retry-After at once instead of waiting
    POST /plain/orders    the same handler without the middleware (baseline)
    POST /classic/orders  the same as /orders
    POST /flaky/orders    the first run for each (principal, key) inserts the order,
                          then answers 500: rolled back, not stored, the retry runs again
    POST /api-keys        {"name": "..."}: the secret is answered once (one_time_secret)
    POST /orders/stream   {"chunks": n, "chunk_bytes": m}: inserts one order, then answers
                          n chunks of m bytes (chunk i is the digit i % 10), chunked;
                          kept for replay up to 65536 bytes
    GET  /orders/count    {"orders": n}
    GET  /health          ok
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "client", "python", "src"))

import django  # noqa: E402
import psycopg  # noqa: E402
from django.conf import settings  # noqa: E402
from psycopg.conninfo import conninfo_to_dict  # noqa: E402

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, principal text NOT NULL,"
    " item text NOT NULL, quantity int NOT NULL, created_at timestamptz NOT NULL DEFAULT now())",
    "CREATE TABLE IF NOT EXISTS api_keys (id bigserial PRIMARY KEY, principal text NOT NULL,"
    " name text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())",
)


def configure(dsn: str, connections: int) -> None:
    """Django's settings for the service: one database (the DSN's, through a psycopg_pool
    of ``connections``), the shop app, pg_idempotency's middleware around every view."""
    params = conninfo_to_dict(dsn)
    names = {"dbname": "NAME", "user": "USER", "password": "PASSWORD", "host": "HOST", "port": "PORT"}
    database = {django_name: str(params.pop(name)) for name, django_name in names.items() if name in params}
    settings.configure(
        DEBUG=False,
        SECRET_KEY="django-orders: an example service, no sessions or signing",
        ALLOWED_HOSTS=["127.0.0.1", "localhost", "[::1]"],
        ROOT_URLCONF="shop.urls",
        APPEND_SLASH=False,
        USE_TZ=True,
        INSTALLED_APPS=["shop"],
        MIDDLEWARE=["pg_idempotency.django.IdempotencyMiddleware"],
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                **database,
                # The rest of --dsn goes to psycopg as it is.
                "OPTIONS": {**params, "pool": {"min_size": 0, "max_size": connections, "timeout": 30}},
            }
        },
        PG_IDEMPOTENCY={
            "PRINCIPAL": "shop.views.principal_of",
            "APPLIES": "shop.views.keyed",
            "DUPLICATES": "shop.views.duplicates",
            "MAX_STREAM_BYTES": 65536,
        },
        LOGGING_CONFIG=None,
    )
    django.setup()


def prepare_database(dsn: str) -> None:
    """Makes the tables once the database answers, retrying every second: the service
    starts while its database is down (or restarting) and serves when it is back."""
    while True:
        try:
            with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as setup:
                for statement in SCHEMA:
                    setup.execute(statement)
            return
        except psycopg.Error as error:
            print(f"django-orders: cannot prepare the database yet ({error}); retrying", file=sys.stderr)
            time.sleep(1)


def serve(port: int, threads: int) -> None:
    """gunicorn in this process's child: one worker of ``threads`` threads (gthread)."""
    from django.core.wsgi import get_wsgi_application
    from gunicorn.app.base import BaseApplication

    class Server(BaseApplication):
        """gunicorn's embedding API: the settings below, Django's WSGI application."""

        def load_config(self) -> None:
            """gunicorn's settings for the service (no configuration file, no argv)."""
            for name, value in {"bind": f"127.0.0.1:{port}", "workers": 1, "worker_class": "gthread",
                                "threads": threads, "accesslog": None, "loglevel": "warning",
                                "graceful_timeout": 5}.items():
                self.cfg.set(name, value)

        def load(self):
            """The WSGI application gunicorn serves."""
            return get_wsgi_application()

    Server().run()


def main() -> int:
    """The service: its tables in the background, Django configured, gunicorn in front."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--dsn", default="")
    parser.add_argument("--threads", type=int, default=8, help="database connections and server threads")
    args = parser.parse_args()
    if args.threads < 1:
        parser.error("--threads must be at least 1")
    threading.Thread(target=prepare_database, args=(args.dsn,), daemon=True).start()
    configure(args.dsn, args.threads)
    print(f"django-orders: listening on 127.0.0.1:{args.port}", file=sys.stderr)
    serve(args.port, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())

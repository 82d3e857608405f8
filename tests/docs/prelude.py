# Prelude of every Python block of the docs (tests/docs/check.py): the names a
# block uses without defining them (the request, the body, send...), bound to
# real values on the database "shop" of the cluster in PGHOST/PGPORT/PGUSER.
# A block may rebind any of them.
import contextlib
import json
import logging
import wsgiref.util

import psycopg
from pg_idempotency import Client, Request, Response

with psycopg.connect("dbname=shop", autocommit=True) as _setup:
    _setup.execute("CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, item text NOT NULL)")

log = logging.getLogger("doc-check")
user_id = principal = "user-42"
key = "doc-check-key-1"
headers = {"Idempotency-Key": key}
raw_body = body = b'{"item":"book"}'
item = "book"
response_body = b'{"id":1}'
fence = 1
client = Client()
conn = psycopg.connect("dbname=shop", autocommit=True)
request = Request(principal=user_id, key=key, method="POST", path="/orders", body=raw_body)
_sent = []


def send(response):
    assert isinstance(response, Response), f"send() got {response!r}"
    _sent.append(response)


def create_order(conn, item="book"):
    order_id = conn.execute("INSERT INTO orders (item) VALUES (%s) RETURNING id", [item]).fetchone()[0]
    return Response(201, [("Content-Type", "application/json")], b'{"id":%d}' % order_id)


def call_payment_provider(request):
    return Response(200, [("Content-Type", "application/json")], b'{"paid":true}')


def user_of(environ):
    return environ.get("HTTP_X_USER")


def app(environ, start_response):  # the application a middleware wraps (see _doc_check_end)
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]


class _Pool:  # psycopg_pool's shape: connection() yields an idle connection
    @contextlib.contextmanager
    def connection(self):
        with psycopg.connect("dbname=shop") as c:
            yield c


pool = _Pool()
_plain_app = app


def _doc_check_end():
    """After the block: a WSGI app it built answers one request."""
    if app is not _plain_app:
        environ = {"REQUEST_METHOD": "GET"}
        wsgiref.util.setup_testing_defaults(environ)
        list(app(environ, lambda status, headers, exc_info=None: None))

"""A stale placement: node a of the three databases (routing.py) runs the stand-in Citus
catalogs (tests/scale-out/fake_citus.sql), so the extension there refuses a principal
whose shard "moved" (a row of pg_catalog.fake_citus_shard) with the real 0A000 "the
key's shard is not on this node". The router drops that placement; the WSGI and ASGI
middlewares run a request refused at its begin once more on the new route."""

from __future__ import annotations

import asyncio
import io
import uuid
from typing import Dict, Iterator, List

import psycopg
import pytest
from psycopg import errors

from pg_idempotency import AsyncClient, AsyncRouter, Client, Router, asgi, is_stale_placement, wsgi
from pg_idempotency.router import STALE_PLACEMENT_MESSAGE
from routing import FAKE_PLACEMENT, FakeClock, databases, new_principal, nodes, place, where

RAISE_STALE = ("DO $$BEGIN RAISE EXCEPTION USING ERRCODE = '0A000',"
               " MESSAGE = 'the key''s shard is not on this node'; END$$")


@pytest.fixture(scope="module")
def dbs(cluster: dict) -> Iterator[Dict[str, str]]:
    """{"default": dsn, "a": dsn, "b": dsn}; "a" in Citus's distributed mode (fake)."""
    with databases(cluster, "idem_stale_py_" + uuid.uuid4().hex[:8], fake_citus_on="a") as dsns:
        yield dsns


def move_away_from_a(dbs: Dict[str, str], principal: str, to: str = "b.test") -> None:
    """The principal's shard leaves node a (which refuses it from now on); the placement
    query says ``to``."""
    with psycopg.connect(dbs["a"], autocommit=True) as conn:
        conn.execute("INSERT INTO pg_catalog.fake_citus_shard VALUES (%s, 2)", (principal,))
    place(dbs, principal, to)


def error_of(dsn: str, sql: str) -> psycopg.Error:
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.Error) as caught:
            conn.execute(sql)
    return caught.value


def test_is_stale_placement_needs_the_sqlstate_and_the_message(dbs):
    p = new_principal()
    move_away_from_a(dbs, p)
    refused = error_of(dbs["a"], f"SELECT idempotency.claim('{p}', 'k', interval '1 day')")
    assert refused.sqlstate == "0A000" and is_stale_placement(refused)  # the extension's own
    assert is_stale_placement(error_of(dbs["b"], RAISE_STALE))
    other_message = RAISE_STALE.replace("this node", "this one")
    assert not is_stale_placement(error_of(dbs["b"], other_message))
    assert not is_stale_placement(error_of(dbs["b"], RAISE_STALE.replace("0A000", "P0001")))
    assert not is_stale_placement(errors.FeatureNotSupported(STALE_PLACEMENT_MESSAGE))  # no diag
    assert not is_stale_placement(ValueError(STALE_PLACEMENT_MESSAGE))


def test_report_stale_placement_drops_the_entry_and_marks_no_node_down(dbs):
    clock = FakeClock()
    router = Router(dbs["default"], nodes(dbs), placement_sql=FAKE_PLACEMENT, clock=clock)
    p = new_principal()
    place(dbs, p, "a.test")
    assert router.route(p).node == "a.test:5432"
    assert router.route(p).node == "a.test:5432"
    assert router.counters.lookups == 1
    router.report_stale_placement(p)
    c = router.counters
    assert (c.stale_placements, c.nodes_marked_down, c.lookups) == (1, 0, 1)
    assert router.route(p).node == "a.test:5432"  # looked up again, the node still up
    c = router.counters
    assert (c.lookups, c.routed, c.defaulted) == (2, 3, 0)
    router.report_stale_placement(new_principal())  # nothing cached: counted all the same
    assert router.counters.stale_placements == 2
    router.close()

    async def on_a_loop():
        twin = AsyncRouter(dbs["default"], nodes(dbs), placement_sql=FAKE_PLACEMENT, clock=clock)
        await twin.route(p)
        twin.report_stale_placement(p)
        await twin.route(p)
        c = twin.counters
        assert (c.stale_placements, c.lookups, c.nodes_marked_down) == (1, 2, 0)
        await twin.close()

    asyncio.run(on_a_loop())


def counting_app(runs: List[str], extra_sql: str = ""):
    """A WSGI application that writes its row (and runs ``extra_sql``); each run noted."""

    def app(environ, start_response):
        context = environ[wsgi.ENVIRON_KEY]
        runs.append(context.request.principal)
        context.connection.execute("INSERT INTO route_effects VALUES (%s)",
                                   (context.request.principal,))
        if extra_sql:
            context.connection.execute(extra_sql)
        start_response("201 Created", [("Content-Type", "application/json")])
        return [b"{}"]

    return app


def post(app, principal: str) -> str:
    """One keyed POST of ``principal`` through ``app``: its status line."""
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/orders", "SCRIPT_NAME": "", "P": principal,
               "CONTENT_LENGTH": "2", "wsgi.input": io.BytesIO(b"{}"),
               "HTTP_IDEMPOTENCY_KEY": uuid.uuid4().hex}
    seen = {}

    def start_response(status, headers, exc_info=None):
        seen["status"] = status

    b"".join(app(environ, start_response))
    return seen["status"]


def middleware(router: Router, runs: List[str], extra_sql: str = "") -> wsgi.IdempotencyMiddleware:
    return wsgi.IdempotencyMiddleware(counting_app(runs, extra_sql), Client(),
                                      principal=lambda e: e["P"], router=router)


def test_a_request_refused_at_begin_runs_once_more_on_the_new_node(dbs):
    clock = FakeClock()  # never moves: only the stale answer can refresh the placement
    router = Router(dbs["default"], nodes(dbs), placement_sql=FAKE_PLACEMENT, clock=clock)
    runs: List[str] = []
    app = middleware(router, runs)
    p = new_principal()
    place(dbs, p, "a.test")
    assert post(app, p) == "201 Created"
    assert where(dbs, p) == (0, 1001, 0)
    move_away_from_a(dbs, p)
    assert post(app, p) == "201 Created"
    assert where(dbs, p) == (0, 1001, 1001)  # the key and the effect on b, none new on a
    assert runs == [p, p]  # the handler ran once per request
    c = router.counters
    assert (c.stale_placements, c.lookups, c.nodes_marked_down) == (1, 2, 0)
    assert router.route(p).node == "b.test:5432"
    router.close()


def test_refused_again_on_the_second_route_the_request_fails(dbs):
    router = Router(dbs["default"], nodes(dbs), placement_sql=FAKE_PLACEMENT, clock=FakeClock())
    runs: List[str] = []
    app = middleware(router, runs)
    p = new_principal()
    place(dbs, p, "a.test")
    assert post(app, p) == "201 Created"
    move_away_from_a(dbs, p, to="a.test")  # the placement query has not caught up
    with pytest.raises(errors.FeatureNotSupported) as caught:
        post(app, p)
    assert is_stale_placement(caught.value)
    assert runs == [p]
    assert where(dbs, p) == (0, 1001, 0)
    c = router.counters
    assert (c.stale_placements, c.lookups, c.nodes_marked_down) == (2, 2, 0)  # both reported
    router.route(p)
    assert router.counters.lookups == 3  # the second route's placement was dropped too
    router.close()


def test_a_stale_placement_after_begin_is_reported_and_not_run_again(dbs):
    router = Router(dbs["default"], nodes(dbs), placement_sql=FAKE_PLACEMENT, clock=FakeClock())
    runs: List[str] = []
    p = new_principal()
    place(dbs, p, "b.test")
    with pytest.raises(errors.FeatureNotSupported):
        post(middleware(router, runs, extra_sql=RAISE_STALE), p)  # from the handler
    assert runs == [p]
    assert where(dbs, p) == (0, 0, 0)
    assert (router.counters.stale_placements, router.counters.lookups) == (1, 1)
    assert post(middleware(router, runs), p) == "201 Created"
    assert router.counters.lookups == 2  # the placement was dropped
    assert where(dbs, p) == (0, 0, 1001)
    router.close()


async def post_async(router: AsyncRouter, principal: str, runs: List[str]) -> int:
    """One keyed POST through the ASGI middleware on ``router``: the status sent."""

    async def app(scope, receive, send):
        context = asgi.context(scope)
        await receive()
        runs.append(principal)
        await context.connection.execute("INSERT INTO route_effects VALUES (%s)", (principal,))
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    wrapped = asgi.IdempotencyMiddleware(app, AsyncClient(), principal=lambda s: principal,
                                         router=router)
    scope = {"type": "http", "method": "POST", "path": "/orders", "root_path": "",
             "query_string": b"", "headers": [(b"idempotency-key", uuid.uuid4().hex.encode())]}
    chunks = [{"type": "http.request", "body": b"{}", "more_body": False}]
    sent = []

    async def receive():
        return chunks.pop(0) if chunks else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    await wrapped(scope, receive, send)
    return sent[0]["status"]


def test_the_asgi_middleware_runs_a_refused_request_once_more_on_the_new_node(dbs):
    async def scenario():
        router = AsyncRouter(dbs["default"], nodes(dbs), placement_sql=FAKE_PLACEMENT,
                             clock=FakeClock())
        runs: List[str] = []
        p = new_principal()
        place(dbs, p, "a.test")
        assert await post_async(router, p, runs) == 201
        move_away_from_a(dbs, p)
        assert await post_async(router, p, runs) == 201
        assert where(dbs, p) == (0, 1001, 1001)
        assert runs == [p, p]
        c = router.counters
        assert (c.stale_placements, c.lookups, c.nodes_marked_down) == (1, 2, 0)
        await router.close()

    asyncio.run(scenario())


SESSION = ("SELECT current_database(), coalesce(current_setting('idempotency.routed', true), 'off'),"
           " current_setting('statement_timeout'), current_setting('application_name')")


def test_a_nodes_connection_is_routed_and_keeps_its_own_options(dbs, cluster):
    """A connection the router opens from a node's string (key=value or URI) has
    idempotency.routed on, before the string's own options; the default target's has not;
    a node's factory is used as it is."""
    db = {role: dsn.split("dbname=")[1] for role, dsn in dbs.items()}
    a_uri = (f"postgresql://127.0.0.1:{cluster['port']}/{db['a']}?user={cluster['user']}"
             "&application_name=it%27s%20a&options=-c%20statement_timeout%3D4321")
    b_string = dbs["b"] + " options='-c statement_timeout=1234'"
    default = dbs["default"] + " options='-c statement_timeout=777'"
    router = Router(default, {"a.test:5432": a_uri, "b.test:5432": b_string},
                    placement_sql=FAKE_PLACEMENT)
    pa, pb, pd = new_principal(), new_principal(), new_principal()
    place(dbs, pa, "a.test")
    place(dbs, pb, "b.test")
    with router.connection(pa) as conn:
        assert conn.execute(SESSION).fetchone() == (db["a"], "on", "4321ms", "it's a")
    with router.connection(pb) as conn:
        assert conn.execute(SESSION).fetchone()[:3] == (db["b"], "on", "1234ms")
    with router.connection(pd) as conn:
        assert conn.execute(SESSION).fetchone()[:3] == (db["default"], "off", "777ms")
    assert router.route(pb).target == b_string  # the route is the string given
    router.close()
    # The string's own -c idempotency.routed comes after the router's and wins; a factory
    # (a pool's connection method) is used as it is.
    b_off = dbs["b"] + " options='-c idempotency.routed=off'"
    for b in (b_off, lambda: psycopg.connect(dbs["b"])):
        other = Router(default, {"b.test:5432": b}, placement_sql=FAKE_PLACEMENT)
        with other.connection(pb) as conn:
            assert conn.execute(SESSION).fetchone()[:2] == (db["b"], "off")
        other.close()

    async def on_a_loop():
        twin = AsyncRouter(default, {"a.test:5432": a_uri}, placement_sql=FAKE_PLACEMENT)
        async with twin.connection(pa) as conn:
            row = await (await conn.execute(SESSION)).fetchone()
            assert row == (db["a"], "on", "4321ms", "it's a")
        async with twin.connection(pd) as conn:
            assert (await (await conn.execute(SESSION)).fetchone())[1] == "off"
        await twin.close()

    asyncio.run(on_a_loop())

"""Router and AsyncRouter with a fake placement on one cluster: three databases with the
extension (the default target and the "nodes" a.test and b.test), a placement query on
a table of the default database, and keyed requests through the WSGI and ASGI
middlewares' ``router`` option whose application writes a row. Connects to 127.0.0.1."""

from __future__ import annotations

import asyncio
import io
import socket
import threading
import uuid
from contextlib import contextmanager
from typing import Dict, Iterator

import psycopg
import pytest

from pg_idempotency import AsyncClient, AsyncRouter, Client, Router
from pg_idempotency import asgi, wsgi
from routing import FAKE_PLACEMENT, FakeClock, databases, new_principal, nodes, place, where


@pytest.fixture(scope="module")
def dbs(cluster: dict) -> Iterator[Dict[str, str]]:
    """{"default": dsn, "a": dsn, "b": dsn}: three databases of this module's own."""
    with databases(cluster, "idem_route_py_" + uuid.uuid4().hex[:8]) as dsns:
        yield dsns


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port on 127.0.0.1 that refuses connections: bound, never listening."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def effects_app(environ, start_response):
    context = environ[wsgi.ENVIRON_KEY]
    context.connection.execute("INSERT INTO route_effects VALUES (%s)",
                               (context.request.principal,))
    start_response("201 Created", [("Content-Type", "application/json")])
    return [b"{}"]


def serve(router: Router, principal: str) -> None:
    """One keyed POST of ``principal`` through the WSGI middleware on ``router``."""
    app = wsgi.IdempotencyMiddleware(effects_app, Client(), principal=lambda e: e["P"],
                                     router=router)
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/orders", "SCRIPT_NAME": "", "P": principal,
               "CONTENT_LENGTH": "2", "wsgi.input": io.BytesIO(b"{}"),
               "HTTP_IDEMPOTENCY_KEY": uuid.uuid4().hex}
    seen = {}

    def start_response(status, headers, exc_info=None):
        seen["status"] = status

    b"".join(app(environ, start_response))
    assert seen["status"] == "201 Created"


def test_each_principal_runs_on_its_node(dbs):
    router = Router(dbs["default"], nodes(dbs), placement_sql=FAKE_PLACEMENT)
    p1, p2, p3 = new_principal(), new_principal(), new_principal()
    place(dbs, p1, "a.test")
    place(dbs, p2, "b.test")
    for p in (p1, p2, p3):
        serve(router, p)
    assert where(dbs, p1) == (0, 1001, 0)
    assert where(dbs, p2) == (0, 0, 1001)
    assert where(dbs, p3) == (1001, 0, 0)
    c = router.counters
    assert (c.lookups, c.routed, c.defaulted, c.lookup_failures) == (3, 2, 1, 0)
    assert router.route(p1).node == "a.test:5432"
    assert router.target(p2) == dbs["b"]
    router.close()


def test_looks_up_once_per_refresh_and_follows_a_move(dbs):
    clock = FakeClock()
    router = Router(dbs["default"], nodes(dbs), placement_sql=FAKE_PLACEMENT, refresh=0.2,
                    clock=clock)
    p = new_principal()
    place(dbs, p, "a.test")
    serve(router, p)
    clock.now += 0.1
    serve(router, p)
    assert router.counters.lookups == 1
    place(dbs, p, "b.test")  # the shard moves: the cached placement is stale until refresh
    serve(router, p)
    assert where(dbs, p) == (0, 3003, 0)
    clock.now += 0.15  # 0.25 s after the lookup
    serve(router, p)
    assert where(dbs, p) == (0, 3003, 1001)
    assert (router.counters.lookups, router.counters.routed) == (2, 4)


def test_a_node_that_cannot_connect_is_marked_down_and_tried_again_later(dbs, closed_port):
    clock = FakeClock()
    targets = nodes(dbs)
    targets["a.test:5432"] = f"host=127.0.0.1 port={closed_port} dbname=x connect_timeout=5"
    router = Router(dbs["default"], targets, placement_sql=FAKE_PLACEMENT, node_down=0.3,
                    clock=clock)
    p = new_principal()
    place(dbs, p, "a.test")
    serve(router, p)  # a.test refuses: the request runs on the default target
    assert where(dbs, p) == (1001, 0, 0)
    assert router.counters.nodes_marked_down == 1
    assert router.route(p).node is None  # looked up again, and the node is down
    serve(router, p)
    assert router.counters.nodes_marked_down == 1  # not tried while down
    clock.now += 0.35
    assert router.route(p).node == "a.test:5432"
    serve(router, p)
    assert router.counters.nodes_marked_down == 2
    assert where(dbs, p) == (3003, 0, 0)


def test_a_failing_lookup_goes_to_the_default_and_is_not_cached(dbs):
    failing = "SELECT $1::text, (1 / (SELECT count(*) FROM route_fake WHERE false))::int"
    router = Router(dbs["default"], nodes(dbs), placement_sql=failing)
    p = new_principal()
    place(dbs, p, "a.test")
    serve(router, p)
    serve(router, p)
    assert where(dbs, p) == (2002, 0, 0)
    c = router.counters
    assert (c.lookups, c.lookup_failures, c.defaulted) == (2, 2, 2)


def test_an_unknown_node_goes_to_the_default(dbs):
    router = Router(dbs["default"], nodes(dbs), placement_sql=FAKE_PLACEMENT)
    p = new_principal()
    place(dbs, p, "c.test")
    serve(router, p)
    assert where(dbs, p) == (1001, 0, 0)
    assert (router.counters.defaulted, router.counters.routed) == (1, 0)


def test_targets_may_be_connection_factories(dbs, closed_port):
    """A node given as a pool-like function; one whose connect fails is marked down."""
    opened = []

    @contextmanager
    def node_b():
        opened.append("b")
        with psycopg.connect(dbs["b"]) as conn:
            yield conn

    def node_a():
        return psycopg.connect(f"host=127.0.0.1 port={closed_port} dbname=x")

    @contextmanager
    def default():
        with psycopg.connect(dbs["default"]) as conn:
            yield conn

    router = Router(default, {"a.test:5432": node_a, "b.test:5432": node_b},
                    placement_sql=FAKE_PLACEMENT)
    pa, pb = new_principal(), new_principal()
    place(dbs, pa, "a.test")
    place(dbs, pb, "b.test")
    serve(router, pb)
    serve(router, pa)
    assert opened == ["b"]
    assert where(dbs, pb) == (0, 0, 1001)
    assert where(dbs, pa) == (1001, 0, 0)
    assert router.counters.nodes_marked_down == 1


def test_the_cache_keeps_at_most_max_principals_and_options_are_checked(dbs):
    router = Router(dbs["default"], nodes(dbs), placement_sql=FAKE_PLACEMENT, max_principals=2)
    p1, p2, p3 = new_principal(), new_principal(), new_principal()
    for p in (p1, p2, p1, p3):  # p1 most recent: p2 goes when p3 comes
        router.route(p)
    assert router.counters.lookups == 3
    router.route(p1)
    assert router.counters.lookups == 3
    router.route(p2)
    assert router.counters.lookups == 4
    with pytest.raises(ValueError):
        Router(dbs["default"], {}, max_principals=0)
    with pytest.raises(ValueError):
        Router(dbs["default"], {}, placement_sql="")
    with pytest.raises(TypeError):
        wsgi.IdempotencyMiddleware(effects_app, Client(), connection=lambda: None,
                                   principal=lambda e: "p", router=router)
    with pytest.raises(TypeError):
        asgi.IdempotencyMiddleware(effects_app, AsyncClient(), principal=lambda s: "p")


def test_many_threads_share_one_router(dbs):
    router = Router(dbs["default"], nodes(dbs), placement_sql=FAKE_PLACEMENT, max_principals=5)
    principals = [new_principal() for _ in range(8)]
    for i, p in enumerate(principals):
        place(dbs, p, "a.test" if i % 2 == 0 else "b.test")
    errors = []

    def work(t: int) -> None:
        for i in range(100):
            j = (i + t) % len(principals)
            node = router.route(principals[j]).node
            if node != ("a.test:5432" if j % 2 == 0 else "b.test:5432"):
                errors.append((j, node))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert router.counters.routed == 400


# --- AsyncRouter through the ASGI middleware ---------------------------------------------

async def effects_asgi(scope, receive, send):
    context = asgi.context(scope)
    await receive()
    await context.connection.execute("INSERT INTO route_effects VALUES (%s)",
                                     (context.request.principal,))
    await send({"type": "http.response.start", "status": 201, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


async def serve_async(router: AsyncRouter, principal: str) -> None:
    app = asgi.IdempotencyMiddleware(effects_asgi, AsyncClient(), principal=lambda s: principal,
                                     router=router)
    scope = {"type": "http", "method": "POST", "path": "/orders", "root_path": "",
             "query_string": b"",
             "headers": [(b"idempotency-key", uuid.uuid4().hex.encode())]}
    chunks = [{"type": "http.request", "body": b"{}", "more_body": False}]
    sent = []

    async def receive():
        return chunks.pop(0) if chunks else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    assert sent[0]["status"] == 201


def test_async_router_routes_caches_and_falls_back(dbs, closed_port):
    window = 3.0  # refresh and node_down on the real clock: a few requests on a loaded machine

    async def scenario():
        router = AsyncRouter(dbs["default"], nodes(dbs), placement_sql=FAKE_PLACEMENT,
                             refresh=window)
        refusing = nodes(dbs)
        refusing["b.test:5432"] = f"host=127.0.0.1 port={closed_port} dbname=x"
        down = AsyncRouter(dbs["default"], refusing, placement_sql=FAKE_PLACEMENT, node_down=window)
        failing = AsyncRouter(dbs["default"], nodes(dbs), placement_sql="SELECT $1::text, 1 / 0")
        pa, pb, pn, pu = (new_principal() for _ in range(4))
        place(dbs, pa, "a.test")
        place(dbs, pb, "b.test")
        place(dbs, pu, "c.test")
        for p in (pa, pb, pn, pu, pa):
            await serve_async(router, p)
        await serve_async(down, pb)  # b refuses: the default target serves
        assert (await down.route(pb)).node is None
        await serve_async(failing, pa)
        assert where(dbs, pa) == (1001, 2002, 0)
        assert where(dbs, pb) == (1001, 0, 1001)
        assert where(dbs, pn) == (1001, 0, 0)
        assert where(dbs, pu) == (1001, 0, 0)
        c = router.counters
        assert (c.lookups, c.routed, c.defaulted) == (4, 3, 2)
        assert (failing.counters.lookup_failures, down.counters.nodes_marked_down) == (1, 1)
        place(dbs, pa, "b.test")  # a move: followed once refresh passed
        await asyncio.sleep(window + 0.1)
        await serve_async(router, pa)
        assert where(dbs, pa) == (1001, 2002, 1001)
        assert (await down.route(pb)).node == "b.test:5432"  # node_down passed: tried again
        for r in (router, down, failing):
            await r.close()

    asyncio.run(scenario())

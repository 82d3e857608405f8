"""A stale placement: node a of the three databases (routing.py) runs the stand-in Citus
catalogs (tests/scale-out/fake_citus.sql), so the extension there refuses a principal
whose shard "moved" (a row of pg_catalog.fake_citus_shard) with the real 0A000 "the
key's shard is not on this node". The router drops that placement."""

from __future__ import annotations

import asyncio
import uuid
from typing import Dict, Iterator

import psycopg
import pytest
from psycopg import errors

from pg_idempotency import AsyncRouter, Router, is_stale_placement
from pg_idempotency.router import STALE_PLACEMENT_MESSAGE
from routing import FAKE_PLACEMENT, FakeClock, databases, new_principal, nodes, place

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

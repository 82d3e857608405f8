"""What the router tests share: three databases with the extension on the session's
cluster (the default target and the "nodes" a.test and b.test), a fake placement
query on a table of the default database, and where a principal's key rows and
handler rows ended up. Connects to 127.0.0.1."""

from __future__ import annotations

import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, Optional, Tuple

import psycopg

FAKE_PLACEMENT = "SELECT node_name, node_port FROM route_fake WHERE principal = $1"

# Stand-in Citus catalogs (tests/scale-out/fake_citus.sql): in the repository the tests run in.
FAKE_CITUS = Path(__file__).resolve().parents[3] / "tests" / "scale-out" / "fake_citus.sql"


def dsn_on(cluster: dict, dbname: str) -> str:
    return f"host=127.0.0.1 port={cluster['port']} user={cluster['user']} dbname={dbname}"


@contextmanager
def databases(cluster: dict, base: str, fake_citus_on: Optional[str] = None) -> Iterator[Dict[str, str]]:
    """{"default": dsn, "a": dsn, "b": dsn}: three new databases named after ``base``,
    dropped at the end. ``fake_citus_on`` ("a" or "b"): that database gets the stand-in
    Citus catalogs right after CREATE EXTENSION, before any other session (the
    extension reads the key table's placement once per session)."""
    names = {"default": base, "a": base + "_a", "b": base + "_b"}
    with psycopg.connect(dsn_on(cluster, "postgres"), autocommit=True) as admin:
        for name in names.values():
            admin.execute(f'CREATE DATABASE "{name}"')
    dsns = {role: dsn_on(cluster, name) for role, name in names.items()}
    try:
        for role, dsn in dsns.items():
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION idempotency")
                if role == fake_citus_on:
                    conn.execute(FAKE_CITUS.read_text(encoding="utf-8"))
                conn.execute("CREATE TABLE route_effects (principal text NOT NULL)")
                if role == "default":
                    conn.execute("CREATE TABLE route_fake (principal text PRIMARY KEY,"
                                 " node_name text NOT NULL, node_port integer NOT NULL)")
        yield dsns
    finally:
        with psycopg.connect(dsn_on(cluster, "postgres"), autocommit=True) as admin:
            for name in names.values():
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def nodes(dbs: Dict[str, str]) -> Dict[str, str]:
    return {"a.test:5432": dbs["a"], "b.test:5432": dbs["b"]}


def place(dbs: Dict[str, str], principal: str, node: str) -> None:
    with psycopg.connect(dbs["default"], autocommit=True) as conn:
        conn.execute("INSERT INTO route_fake VALUES (%s, %s, 5432) ON CONFLICT (principal)"
                     " DO UPDATE SET node_name = EXCLUDED.node_name", (principal, node))


def where(dbs: Dict[str, str], principal: str) -> Tuple[int, int, int]:
    """keys * 1000 + handler rows of ``principal`` in (default, a, b)."""
    found = []
    for role in ("default", "a", "b"):
        with psycopg.connect(dbs[role], autocommit=True) as conn:
            row = conn.execute(
                "SELECT (SELECT count(*) FROM idempotency.keys WHERE principal = %s) * 1000"
                " + (SELECT count(*) FROM route_effects WHERE principal = %s)",
                (principal, principal)).fetchone()
            found.append(row[0])
    return (found[0], found[1], found[2])


def new_principal() -> str:
    return "route-" + uuid.uuid4().hex[:10]


class FakeClock:
    """A router's clock that moves only when a test moves it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

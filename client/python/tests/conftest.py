"""Test harness: a throwaway PostgreSQL cluster (scripts/pgcluster.sh) for the
whole session, a fresh database with the extension per test module.

PGBIN picks the PostgreSQL binaries (default /usr/lib/postgresql/15/bin);
IDEM_PYTEST_PORT the port (default: a random one in 30000-39999).
"""

from __future__ import annotations

import os
import random
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Iterator

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def cluster() -> Iterator[dict]:
    folder = tempfile.mkdtemp(prefix="idem-pytest.")
    port = int(os.environ.get("IDEM_PYTEST_PORT") or random.randint(30000, 39999))
    script = ROOT / "scripts" / "pgcluster.sh"
    subprocess.run(["bash", str(script), "start", f"{folder}/pg", str(port)], check=True)
    try:
        yield {"host": f"{folder}/pg", "port": port, "user": "postgres"}
    finally:
        subprocess.run(["bash", str(script), "stop", f"{folder}/pg"], check=False)
        os.rmdir(folder) if os.path.isdir(folder) and not os.listdir(folder) else None


def conninfo(cluster: dict, dbname: str) -> str:
    return f"host={cluster['host']} port={cluster['port']} user={cluster['user']} dbname={dbname}"


@pytest.fixture(scope="module")
def dsn(cluster: dict) -> Iterator[str]:
    name = "idem_py_" + uuid.uuid4().hex[:12]
    with psycopg.connect(conninfo(cluster, "postgres"), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    info = conninfo(cluster, name)
    with psycopg.connect(info, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION idempotency")
        conn.execute(
            "CREATE TABLE orders (id bigserial PRIMARY KEY, principal text NOT NULL, item text NOT NULL,"
            " quantity int NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
        )
    yield info
    with psycopg.connect(conninfo(cluster, "postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(dsn) as connection:
        yield connection


@pytest.fixture
def admin(dsn: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection for looking at the key store."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        yield connection


@pytest.fixture
def principal() -> str:
    return "user-" + uuid.uuid4().hex[:10]

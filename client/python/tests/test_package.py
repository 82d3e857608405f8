"""The package as installed: typed (PEP 561), and, under scripts/test.sh, the
installed copy rather than the source tree."""

import os
from pathlib import Path

import pytest

import pg_idempotency


def test_py_typed_ships_with_the_package():
    assert (Path(pg_idempotency.__file__).parent / "py.typed").is_file()


def test_the_installed_copy_is_under_test():
    if os.environ.get("IDEM_EXPECT_INSTALLED") != "1":
        pytest.skip("a developer run against client/python/src")
    assert "site-packages" in pg_idempotency.__file__, pg_idempotency.__file__


def test_public_names():
    for name in ("Client", "Options", "Request", "Response", "LeaseRunner", "Policy", "fingerprint"):
        assert hasattr(pg_idempotency, name), name


def test_the_version_is_the_releases():
    from importlib.metadata import version

    root = Path(__file__).resolve().parents[3]
    release = (root / "VERSION").read_text().strip()
    assert pg_idempotency.__version__ == release
    if os.environ.get("IDEM_EXPECT_INSTALLED") == "1":
        assert version("pg-idempotency") == release


def test_the_licence_is_in_the_metadata():
    if os.environ.get("IDEM_EXPECT_INSTALLED") != "1":
        pytest.skip("a developer run against client/python/src")
    from importlib.metadata import metadata

    assert metadata("pg-idempotency")["License-Expression"] == "PostgreSQL"

"""Shared fixtures for the corral test suite.

PostgreSQL tests need CORRAL_TEST_PG_URL, an admin URL for a server where
databases may be created freely (``make test`` starts a throwaway server and
sets it). Without it those tests are skipped locally, but under CI (the CI
environment variable set) a missing URL is an error, so CI can never silently
skip PostgreSQL.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

# Make `from helpers import wait_for` work regardless of how pytest is invoked.
_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

from helpers import in_ci as _in_ci  # noqa: E402
from helpers import wait_for as _wait_for  # noqa: E402

PG_URL_ENV = "CORRAL_TEST_PG_URL"


def _with_database(url: str, dbname: str) -> str:
    """Return ``url`` pointing at database ``dbname`` instead."""
    if "://" in url:
        parts = urlsplit(url)
        return urlunsplit((parts.scheme, parts.netloc, "/" + dbname, parts.query, parts.fragment))
    # key=value conninfo string
    from psycopg.conninfo import make_conninfo

    return make_conninfo(url, dbname=dbname)


@pytest.fixture(scope="session")
def pg_admin_url() -> str:
    """Admin URL of the PostgreSQL server used by the tests."""
    url = os.environ.get(PG_URL_ENV, "").strip()
    if not url:
        if _in_ci():
            pytest.fail(f"{PG_URL_ENV} not set, and CI must not skip PostgreSQL tests (run them via `make test`)")
        pytest.skip(f"{PG_URL_ENV} not set")
    return url


@pytest.fixture
def pg_url(pg_admin_url: str):
    """URL of a brand-new, empty database, dropped after the test."""
    import psycopg
    from psycopg import sql

    name = f"corral_t_{secrets.token_hex(6)}"
    ident = sql.Identifier(name)
    with psycopg.connect(pg_admin_url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(ident))
    try:
        yield _with_database(pg_admin_url, name)
    finally:
        with psycopg.connect(pg_admin_url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """URL of a fresh SQLite database file in the test's temporary directory."""
    return f"sqlite:///{tmp_path}/corral.db"


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def url(request) -> str:
    """URL of a fresh store, once per kind: memory, SQLite and PostgreSQL."""
    if request.param == "memory":
        return "memory://"
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


@pytest.fixture(params=["sqlite", "postgres"])
def handing_url(request) -> str:
    """A fresh store that hands places over (SQLite, PostgreSQL). Memory hands
    nothing over: there workers race for each freed place."""
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


@pytest.fixture
def wait_for():
    """The ``helpers.wait_for`` function, for tests that prefer a fixture."""
    return _wait_for

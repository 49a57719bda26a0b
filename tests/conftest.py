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


def _pg_admin(url: str, statement) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(statement)


def _pg_database(admin_url: str, template: str):
    """Create a database copied from ``template``; return its name and a dropper."""
    from psycopg import sql

    name = f"corral_t_{secrets.token_hex(6)}"
    ident = sql.Identifier(name)
    _pg_admin(admin_url, sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(ident, sql.Identifier(template)))

    def drop() -> None:
        _pg_admin(admin_url, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))

    return name, drop


@pytest.fixture(scope="session")
def pg_template(pg_admin_url: str):
    """Name of a database migrated once per session, which ``pg_url`` copies.

    Copying a migrated database is cheaper than migrating a new one for
    every test, and each test still gets a database of its own (no state
    left by an earlier test, not even in sequences or LISTEN channels)."""
    from psycopg import sql

    from corral.stores import open_store

    name, drop = _pg_database(pg_admin_url, "template0")
    try:
        store = open_store(_with_database(pg_admin_url, name))
        try:
            store.migrate()
        finally:
            store.close()
        # CREATE DATABASE ... TEMPLATE needs the template free of sessions
        _pg_admin(
            pg_admin_url,
            sql.SQL("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = {}").format(
                sql.Literal(name)
            ),
        )
        yield name
    finally:
        drop()


@pytest.fixture
def pg_url(pg_admin_url: str, pg_template: str):
    """URL of a new database of its own, migrated and empty, dropped after the test."""
    name, drop = _pg_database(pg_admin_url, pg_template)
    try:
        yield _with_database(pg_admin_url, name)
    finally:
        drop()


@pytest.fixture
def pg_empty_url(pg_admin_url: str):
    """URL of a brand-new database holding no corral tables (for tests of
    migrations and of commands on a database that is not a store), dropped
    after the test."""
    name, drop = _pg_database(pg_admin_url, "template0")
    try:
        yield _with_database(pg_admin_url, name)
    finally:
        drop()


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

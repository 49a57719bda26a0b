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

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist's worker processes get COLUMNS=80 and LINES=24: the CLI
    # would then draw its tables 80 columns wide, not as in a run without a
    # terminal (160), and the tests reading them would differ by how they ran.
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)


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


def _pg_admin(url: str, *statements) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        for statement in statements:
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
    """Name of a database migrated once per session, which the database
    behind ``pg_url`` and each ``pg_own_url`` copy (cheaper than migrating
    one for each test)."""
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


class _SharedDatabase:
    """One migrated database of a session, emptied between the tests that use it.

    Emptying is cheaper than copying the template for each test: a few
    DELETEs of what the test left (and TRUNCATE of a table it filled) take
    about 20 ms, a copy and its drop about 170 ms, TRUNCATE of every table
    about 300 ms (each truncated table is a new file, synced). Before a test
    it is left as the template was:

    - every connection to it is ended (threads or processes of an earlier
      test, their LISTEN channels and session locks), and the database is
      renamed, so what an earlier test leaked cannot reach the next one by
      its old URL;
    - every table holds the rows the migrated template holds, and sequences
      start again;
    - a test that changed the schema (a trigger, a constraint, a column's
      statistics target) gets a fresh copy of the template instead.
    """

    BIG = 1000  # a table that held more rows is truncated (no dead rows left behind)

    def __init__(self, admin_url: str, template: str) -> None:
        self.admin_url = admin_url
        self.template = template
        self.name, _ = _pg_database(admin_url, template)
        with _pg_connect(self.url) as conn:
            self.fingerprint = _pg_fingerprint(conn)
            self.tables = [r[0] for r in conn.execute(_PG_TABLES)]
            self.rows = {t: _pg_rows(conn, t) for t in self.tables}
            self.sequences = [r[0] for r in conn.execute(_PG_SEQUENCES)]

    @property
    def url(self) -> str:
        return _with_database(self.admin_url, self.name)

    def reset(self) -> str:
        """Empty the database (see the class) and return its new URL."""
        from psycopg import errors, sql

        new = f"corral_t_{secrets.token_hex(6)}"
        for attempt in range(50):
            try:
                _pg_admin(
                    self.admin_url,
                    # (waiting up to 5 s for each to end)
                    sql.SQL("SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE datname = {}").format(
                        sql.Literal(self.name)
                    ),
                    sql.SQL("ALTER DATABASE {} RENAME TO {}").format(sql.Identifier(self.name), sql.Identifier(new)),
                )
                break
            except errors.ObjectInUse:  # a leaked thread connected again in between
                if attempt == 49:
                    raise
        self.name = new
        with _pg_connect(self.url) as conn:
            if _pg_fingerprint(conn) != self.fingerprint:
                changed = True
            else:
                changed = False
                self._empty(conn)
        if changed:
            self.drop()
            self.name, _ = _pg_database(self.admin_url, self.template)
        return self.url

    def _empty(self, conn) -> None:
        from psycopg import sql

        with conn.transaction():
            # no triggers (a group's head refresh, foreign keys): every table is emptied
            conn.execute("SET LOCAL session_replication_role = replica")
            big = []
            for table in self.tables:
                if conn.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(table))).rowcount > self.BIG:
                    big.append(table)
            if big:
                conn.execute(sql.SQL("TRUNCATE {}").format(sql.SQL(", ").join(map(sql.Identifier, big))))
            for sequence in self.sequences:
                conn.execute(sql.SQL("ALTER SEQUENCE {} RESTART").format(sql.Identifier(sequence)))
            for table, rows in self.rows.items():
                for row in rows:
                    conn.execute(
                        sql.SQL("INSERT INTO {} VALUES ({})").format(
                            sql.Identifier(table), sql.SQL(", ").join(sql.Placeholder() * len(row))
                        ),
                        row,
                    )

    def drop(self) -> None:
        from psycopg import sql

        _pg_admin(self.admin_url, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.name)))


_PG_TABLES = "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename"
_PG_SEQUENCES = "SELECT sequencename FROM pg_sequences WHERE schemaname = 'public' ORDER BY sequencename"


def _pg_connect(url: str):
    import psycopg

    return psycopg.connect(url, autocommit=True, connect_timeout=10)


def _pg_rows(conn, table: str) -> list[tuple]:
    from psycopg import sql

    return sorted(conn.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(table))).fetchall(), key=repr)


def _pg_fingerprint(conn) -> str:
    """A digest of the public schema: relations, columns, constraints, indexes, triggers, functions."""
    return conn.execute(
        """
        SELECT md5(coalesce(string_agg(x, ',' ORDER BY x), '')) FROM (
          SELECT 'r ' || c.relname || ' ' || c.relkind::text || ' ' || coalesce(array_to_string(c.reloptions, ';'), '')
          FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace
          UNION ALL
          SELECT 'a ' || c.relname || ' ' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || ' '
                 || a.attnotnull || ' ' || a.attstattarget || ' ' || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
          FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
          LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
          WHERE c.relnamespace = 'public'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
          UNION ALL
          SELECT 'k ' || conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(oid)
          FROM pg_constraint WHERE connamespace = 'public'::regnamespace
          UNION ALL
          SELECT 'i ' || pg_get_indexdef(indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
          WHERE c.relnamespace = 'public'::regnamespace
          UNION ALL
          SELECT 't ' || pg_get_triggerdef(oid) || ' ' || tgenabled::text FROM pg_trigger WHERE NOT tgisinternal
          UNION ALL
          SELECT 'f ' || oid::regprocedure || ' ' || md5(prosrc)
          FROM pg_proc WHERE pronamespace = 'public'::regnamespace
        ) f(x)
        """
    ).fetchone()[0]


@pytest.fixture(scope="session")
def _pg_shared(pg_admin_url: str, pg_template: str):
    db = _SharedDatabase(pg_admin_url, pg_template)
    try:
        yield db
    finally:
        db.drop()


@pytest.fixture
def pg_url(_pg_shared: _SharedDatabase) -> str:
    """URL of a migrated, empty corral database, as the template left it
    (a database shared by the session's tests, emptied before each: see
    ``_SharedDatabase``). Tests of planner statistics take ``pg_own_url``."""
    return _pg_shared.reset()


@pytest.fixture
def pg_reset(_pg_shared: _SharedDatabase):
    """``pg_reset()``: empty the test's ``pg_url`` database again; returns its new URL."""
    return _pg_shared.reset


@pytest.fixture
def pg_own_url(pg_admin_url: str, pg_template: str):
    """URL of a new database of its own, copied from the migrated template and
    dropped after the test: for tests of planner statistics, which an earlier
    test's ANALYZE (or autovacuum's) would change in a shared database."""
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


# ---- the store a test runs on -----------------------------------------------------------
# A test that runs on several stores takes one of these fixtures; its runs are
# named by the store (``[memory]``, ``[sqlite]``, ``[postgres]``). The
# PostgreSQL run skips by itself without a server and is marked ``postgres``.

STORE_KINDS = ("memory", "sqlite", "postgres")


def store_url(request: pytest.FixtureRequest, kind: str) -> str:
    """URL of a fresh, empty store of ``kind`` (``memory``, ``sqlite``, ``postgres``)."""
    if kind == "memory":
        return "memory://"
    return request.getfixturevalue("sqlite_url" if kind == "sqlite" else "pg_url")


def _kinds(*kinds: str) -> list:
    return [pytest.param(k, marks=pytest.mark.postgres) if k == "postgres" else k for k in kinds]


@pytest.fixture(params=_kinds(*STORE_KINDS))
def url(request: pytest.FixtureRequest) -> str:
    """URL of a fresh store, once per kind: memory, SQLite and PostgreSQL."""
    return store_url(request, request.param)


@pytest.fixture(params=_kinds("sqlite", "postgres"))
def durable_url(request: pytest.FixtureRequest) -> str:
    """A fresh store that several processes share and that outlives them
    (SQLite, PostgreSQL); also the stores that hand places over from unit to
    unit (memory hands nothing over: there workers race for each freed place)."""
    return store_url(request, request.param)


@pytest.fixture(params=_kinds("memory", "sqlite"))
def fake_clock_url(request: pytest.FixtureRequest) -> str:
    """A fresh store whose time an app's :class:`FakeClock` moves (memory,
    SQLite; PostgreSQL keeps the database's clock)."""
    return store_url(request, request.param)


@pytest.fixture
def processes(tmp_path: Path):
    """``processes.start(argv, name=...)`` and ``processes.worker(url, history, name=...)``:
    child processes (``faults.Process``) logging to ``tmp_path/<name>.log``, killed when the test ends."""
    from faults import Processes

    started = Processes(tmp_path)
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
def wait_for():
    """The ``helpers.wait_for`` function, for tests that prefer a fixture."""
    return _wait_for


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a run in several processes (``make test``: pytest-xdist with ``--dist
    loadgroup``), the tests that start worker processes by the handful (marked
    ``slow``) run one after another in one process, beside the light tests of
    the others: two of them at once starve each other's workers of the two
    cores (10 000 tasks through eight workers took 66 s beside the leader-kill
    test, 4 s alone)."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(pytest.mark.xdist_group("processes"))

"""Checks of the test harness itself (fixtures and helpers)."""

from __future__ import annotations

import sqlite3
import time

import pytest

from helpers import wait_for


def _pg_tables(url: str) -> set[str]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT current_database()").fetchone()[0].startswith("corral_t_")
        rows = conn.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")
        return {r[0] for r in rows}


@pytest.mark.postgres
def test_pg_url_is_a_migrated_store_of_its_own_holding_no_tasks(pg_url, pg_template):
    import psycopg

    from corral.core.model import TaskFilter
    from corral.stores import open_store
    from corral.stores.postgres import SCHEMA_VERSION

    assert "corral_tasks" in _pg_tables(pg_url)
    assert not pg_url.endswith("/" + pg_template)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert conn.execute("SELECT value::int FROM corral_meta WHERE key = 'schema_version'").fetchone()[0] == (
            SCHEMA_VERSION
        )
        assert conn.execute("SELECT count(*) FROM corral_tasks").fetchone()[0] == 0
    s = open_store(pg_url)
    try:
        s.migrate()  # already done: nothing to do
        assert s.list_tasks(TaskFilter()) == []
    finally:
        s.close()


@pytest.mark.postgres
def test_pg_empty_url_is_a_fresh_database_with_no_tables(pg_empty_url):
    import psycopg

    assert _pg_tables(pg_empty_url) == set()
    with psycopg.connect(pg_empty_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE harness_probe (id int PRIMARY KEY, note text)")
        conn.execute("INSERT INTO harness_probe VALUES (1, 'hello')")
        assert conn.execute("SELECT note FROM harness_probe WHERE id = 1").fetchone()[0] == "hello"


def test_sqlite_url_points_into_tmp_path(sqlite_url, tmp_path):
    assert sqlite_url == f"sqlite:///{tmp_path}/corral.db"
    with sqlite3.connect(sqlite_url.removeprefix("sqlite:///")) as conn:
        conn.execute("CREATE TABLE t (x)")


def test_wait_for_returns_the_truthy_value():
    calls = []

    def ready():
        calls.append(1)
        return len(calls) >= 3 and "done"

    assert wait_for(ready, timeout=5) == "done"
    assert len(calls) == 3


def test_wait_for_raises_on_deadline():
    started = time.monotonic()
    with pytest.raises(AssertionError, match="never happens"):
        wait_for(lambda: False, timeout=0.05, message="never happens")
    assert time.monotonic() - started >= 0.05

"""Checks of the test harness itself (fixtures and helpers)."""

from __future__ import annotations

import sqlite3
import time

import pytest

from helpers import wait_for


@pytest.mark.postgres
def test_pg_url_is_a_fresh_database(pg_url):
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        db = conn.execute("SELECT current_database()").fetchone()[0]
        assert db.startswith("corral_t_")
        tables = conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchone()[0]
        assert tables == 0
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

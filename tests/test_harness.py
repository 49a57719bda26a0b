"""Checks of the test harness itself (fixtures and helpers)."""

from __future__ import annotations

import sqlite3
import time

import pytest

from corral.core.claims import ClaimRequest
from helpers import ARGS, wait_for


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


def _pg_contents(url: str) -> dict:
    """Everything a database holds that a test could leave behind: each
    table's rows, each sequence's state, and the schema's digest."""
    import psycopg
    from psycopg import sql

    from conftest import _PG_SEQUENCES, _PG_TABLES, _pg_fingerprint, _pg_rows

    with psycopg.connect(url, autocommit=True) as conn:
        tables = {t: _pg_rows(conn, t) for (t,) in conn.execute(_PG_TABLES).fetchall()}
        sequences = {
            seq: conn.execute(sql.SQL("SELECT last_value, is_called FROM {}").format(sql.Identifier(seq))).fetchone()
            for (seq,) in conn.execute(_PG_SEQUENCES).fetchall()
        }
        return {"tables": tables, "sequences": sequences, "schema": _pg_fingerprint(conn)}


def _leave_everything_behind(url: str) -> list:
    """What a careless test leaves: rows in every kind of table (tasks,
    events, a limit, a batch, the level row, a leader), sequences moved on,
    a LISTEN channel and an open connection, and a thread still writing."""
    import threading

    import psycopg

    from corral.core.model import LimitSpec, NewTask
    from corral.stores import open_store
    from corral.stores.base import FleetLevel

    s = open_store(url)
    s.migrate()
    ids = [r.id for r in s.submit([NewTask(name="t", args=ARGS, batch="b") for _ in range(3)])]
    s.set_limit(LimitSpec("api", concurrency=2))
    assert s.set_fleet_level(FleetLevel(1, True, None, "test"), auto=False, event="{}")
    assert s.try_lead("sweeper", "w-old", 60)
    assert s.claim("w-old", ClaimRequest(["default"], 1))
    listener = psycopg.connect(url, autocommit=True)
    listener.execute("LISTEN corral_leak")
    stop = threading.Event()

    def writer() -> None:  # a thread of the test that outlives it, on its own URL
        while not stop.is_set():
            try:
                with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
                    conn.execute("INSERT INTO corral_meta VALUES ('leak', 'x') ON CONFLICT DO NOTHING")
            except psycopg.Error:
                pass
            stop.wait(0.01)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    wait_for(lambda: _meta(url, "leak") == "x", message="the leaking thread writes")
    assert ids == [1, 2, 3]
    return [s, listener, stop, thread]


def _meta(url: str, key: str):
    import psycopg

    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
            row = conn.execute("SELECT value FROM corral_meta WHERE key = %s", (key,)).fetchone()
    except psycopg.OperationalError:
        return None
    return row and row[0]


@pytest.mark.postgres
def test_pg_url_is_left_as_the_template_was_whatever_the_test_before_did(pg_url, pg_reset, pg_template):
    import psycopg

    from conftest import _with_database

    pristine = _pg_contents(_with_database(pg_url, pg_template))
    assert _pg_contents(pg_url) == pristine
    left = _leave_everything_behind(pg_url)
    try:
        assert _pg_contents(pg_url) != pristine
        url = pg_reset()  # what the next test's pg_url does
        assert url != pg_url  # renamed: the old URL reaches nothing
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(pg_url, connect_timeout=2).close()
        assert _pg_contents(url) == pristine  # rows, sequences, the level and leaders' rows
        with psycopg.connect(url, autocommit=True) as conn:
            dbname = conn.execute("SELECT current_database()").fetchone()[0]
            others = (  # client sessions only: an autovacuum worker may visit the new database
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
                " AND backend_type = 'client backend'"
            )
            assert conn.execute(others, (dbname,)).fetchone()[0] == 0  # no listener, no thread
            conn.execute("NOTIFY corral_leak")
        with pytest.raises(psycopg.OperationalError):
            left[1].execute("SELECT 1")  # the listener's session was ended with its channel
        assert _meta(url, "leak") is None
        # a store opened on it starts as on a new database
        from corral.core.model import NewTask
        from corral.stores import open_store

        s = open_store(url)
        try:
            s.migrate()
            assert [r.id for r in s.submit([NewTask(name="t", args=ARGS)])] == [1]
            assert s.fleet_level().level == 0 and s.try_lead("sweeper", "w-new", 60)
        finally:
            s.close()
    finally:
        store, listener, stop, thread = left
        stop.set()
        thread.join(10)
        store.close()
        listener.close()


@pytest.mark.postgres
def test_a_test_that_changed_the_schema_leaves_the_next_one_a_fresh_copy(pg_url, pg_reset, pg_template):
    import psycopg

    from conftest import _with_database

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE corral_tasks DROP CONSTRAINT corral_tasks_status_known")
        conn.execute("ALTER TABLE corral_tasks ALTER COLUMN status SET STATISTICS 100")
    url = pg_reset()
    assert _pg_contents(url) == _pg_contents(_with_database(pg_url, pg_template))


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

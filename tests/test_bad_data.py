"""Bad data and damaged stores: statuses that name no state, schemas newer than
this corral, files that are not databases, and who may read a new SQLite file.
Also the sweeper a plain `corral worker` runs, and finding the stale tasks it
canceled."""

from __future__ import annotations

import os
import sqlite3
import stat
import time
from pathlib import Path
from subprocess import DEVNULL

import pytest
from click.testing import CliRunner

from corral.cli import cli
from corral.core.claims import ClaimRequest
from corral.core.clock import FakeClock
from corral.core.model import NewTask, TaskFilter, dumps
from corral.core.states import State
from corral.errors import StoreCorrupt
from corral.maintenance.recovery import sweep_once
from corral.stores import open_store
from corral.stores.sqlite import SCHEMA_VERSION, SQLiteStore
from faults import CORRAL, Process
from helpers import ARGS, wait_for

REPO = Path(__file__).resolve().parent.parent
SHOP = "examples.shop:app"


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("CORRAL_STORE", raising=False)


# ---- statuses that name no state --------------------------------------------------------
def _version_2_with_a_foreign_row(url: str) -> None:
    """A database as version 2 left it (no status rule), holding a row a
    foreign program wrote with a status no corral knows."""
    s = SQLiteStore(url)
    s.submit([NewTask("kept", ARGS)])
    con = s._con()
    con.execute("DROP TRIGGER tasks_status_insert")
    con.execute("DROP TRIGGER tasks_status_update")
    con.execute("DELETE FROM corral_schema")
    con.execute("INSERT INTO corral_schema (version) VALUES (2)")
    con.execute("INSERT INTO tasks (name, args, status, created_at, run_at) VALUES ('odd', '{}', 'PAUSED', 0, 0)")
    s.close()


def test_migration_to_version_3_keeps_foreign_rows_and_refuses_new_ones(sqlite_url):
    _version_2_with_a_foreign_row(sqlite_url)
    s = SQLiteStore(sqlite_url)
    try:
        con = s._con()
        assert con.execute("SELECT max(version) FROM corral_schema").fetchone()[0] == SCHEMA_VERSION >= 3
        rows = s.list_tasks(TaskFilter(newest_first=False))
        assert [r.name for r in rows] == ["kept", "odd"]  # listing does not fail on the odd row
        odd = rows[1]
        assert odd.status is State.FAILED and "'PAUSED'" in odd.error and "\n" not in odd.error
        assert s.counts() == {"PENDING": 1, "PAUSED": 1}
        with pytest.raises(sqlite3.IntegrityError, match="status must be one of"):
            con.execute("UPDATE tasks SET status = 'LIMBO' WHERE id = 1")
        with pytest.raises(sqlite3.IntegrityError, match="status must be one of"):
            con.execute("INSERT INTO tasks (name, args, status, created_at, run_at) VALUES ('x', '{}', 'nope', 0, 0)")
        assert s.get(1).status is State.PENDING
        assert s.retry(odd.id) and s.get(odd.id).status is State.PENDING  # the operator's way out
    finally:
        s.close()


def test_status_counts_foreign_rows_and_tasks_lists_them(sqlite_url):
    _version_2_with_a_foreign_row(sqlite_url)
    listed = run("tasks", "--store", sqlite_url)
    assert listed.exit_code == 0, listed.output
    assert "odd" in listed.output and "PAUSED" in listed.output
    import json

    status = json.loads(run("status", "--store", sqlite_url, "--json").stdout)
    assert status["counts"]["UNKNOWN"] == 1 and status["total"] == 2
    assert "unknown" in run("status", "--store", sqlite_url).stdout


def _write_past_the_status_rule(url: str, task_id: int, status: str) -> None:
    """What a foreign program that removed the status rule could write."""
    if url.startswith("sqlite"):
        con = sqlite3.connect(url.removeprefix("sqlite:///"))
        con.execute("DROP TRIGGER tasks_status_update")
        con.execute("UPDATE tasks SET status = ? WHERE id = ?", (status, task_id))
        con.commit()
        con.close()
    else:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ALTER TABLE corral_tasks DROP CONSTRAINT corral_tasks_status_known")
            conn.execute("UPDATE corral_tasks SET status = %s WHERE id = %s", (status, task_id))


def test_a_row_whose_status_names_no_state_does_not_block_its_group(durable_url):
    """It reads as FAILED, and a FAILED task (not halting its group) lets the
    group move on: the same on every store, by the next sweep at the latest."""
    s = open_store(durable_url)
    if durable_url.startswith("postgresql"):
        s.migrate()
    try:
        odd, nxt = (r.id for r in s.submit([NewTask("a", ARGS, group="g"), NewTask("b", ARGS, group="g")]))
        _write_past_the_status_rule(durable_url, odd, "PAUSED")
        sweep_once(s)
        claims = s.claim("w", ClaimRequest(["default"], 5))
        assert [[t.id for t in c.tasks] for c in claims] == [[nxt]]
        rec = s.get(odd)
        assert rec.status is State.FAILED and "'PAUSED'" in rec.error
    finally:
        s.close()


@pytest.mark.postgres
def test_postgres_migration_to_version_4_adds_the_status_rule(pg_empty_url):
    import psycopg

    from corral.stores.sql import load

    q = load("postgres")
    with psycopg.connect(pg_empty_url, autocommit=True) as conn:  # the schema as version 3 left it
        conn.execute(q["schema_version_table"])
        for n in (1, 2, 3):
            conn.execute(q[f"migration_000{n}"])
        conn.execute(q["set_schema_version"], {"v": 3})
        conn.execute(
            "INSERT INTO corral_tasks (name, args, status, created_at, run_at) VALUES"
            " ('kept', '{}', 'PENDING', 0, 0), ('odd', '{}', 'PAUSED', 0, 0)"
        )
    s = open_store(pg_empty_url)
    try:
        s.migrate()
        rows = s.list_tasks(TaskFilter(newest_first=False))
        assert [(r.name, r.status) for r in rows] == [("kept", State.PENDING), ("odd", State.FAILED)]
        assert "'PAUSED'" in rows[1].error
        with psycopg.connect(pg_empty_url, autocommit=True) as conn:
            with pytest.raises(psycopg.errors.CheckViolation):
                conn.execute("UPDATE corral_tasks SET status = 'LIMBO' WHERE name = 'kept'")
            valid = "SELECT convalidated FROM pg_constraint WHERE conname = 'corral_tasks_status_known'"
            assert conn.execute(valid).fetchone()[0] is False  # the odd row is kept, not rejected
        assert s.retry(rows[1].id)
    finally:
        s.close()


def test_a_schema_newer_than_this_corral_is_refused(sqlite_url):
    s = SQLiteStore(sqlite_url)
    s._con().execute("INSERT INTO corral_schema (version) VALUES (?)", (SCHEMA_VERSION + 1,))
    s.close()
    with pytest.raises(StoreCorrupt, match="newer than this corral"):
        SQLiteStore(sqlite_url)


# ---- file modes -------------------------------------------------------------------------
def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_sqlite_file_is_readable_by_its_owner_only(tmp_path):
    s = SQLiteStore(f"sqlite:///{tmp_path}/private.db")
    s.submit([NewTask("t", ARGS)])
    try:
        for name in ("private.db", "private.db-wal", "private.db-shm"):
            assert _mode(tmp_path / name) == 0o600, name
    finally:
        s.close()


def test_the_mode_option_and_existing_files(tmp_path):
    s = SQLiteStore(f"sqlite:///{tmp_path}/shared.db?mode=0640")
    s.close()
    assert _mode(tmp_path / "shared.db") == 0o640
    existing = tmp_path / "existing.db"
    existing.touch()
    existing.chmod(0o644)
    SQLiteStore(f"sqlite:///{existing}").close()
    assert _mode(existing) == 0o644  # an existing file's mode is the owner's choice
    result = run("status", "--store", f"sqlite:///{tmp_path}/x.db?mode=rw")
    assert result.exit_code != 0 and "mode must be octal" in result.stderr


# ---- the sweeper's stale tasks from the command line -----------------------------------
def test_stale_tasks_are_listed_and_queued_again_in_one_command(sqlite_url):
    import json

    store = open_store(sqlite_url, clock=FakeClock(start=time.time() - 2 * 86400))
    [a, b] = [r.id for r in store.submit([NewTask("sync_sku", ARGS), NewTask("sync_sku", ARGS)])]
    store.close()
    report = json.loads(run("sweep", "--store", sqlite_url, "--json").stdout)
    assert report["stale_pending_canceled"] == [a, b]
    other = json.loads(run("submit", "check_price", '["x"]', "--app", SHOP, "--store", sqlite_url, "--json").stdout)
    assert run("cancel", str(other["id"]), "--store", sqlite_url).exit_code == 0
    listed = json.loads(run("tasks", "--stale", "--store", sqlite_url, "--json").stdout)
    assert sorted(r["id"] for r in listed) == [a, b]
    assert all("no worker taking it" in r["error"] for r in listed)
    out = run("retry", "--stale", "--store", sqlite_url)
    assert out.exit_code == 0 and "2 stale task(s) queued again" in out.stdout
    assert json.loads(run("tasks", "--stale", "--store", sqlite_url, "--json").stdout) == []
    assert json.loads(run("show", str(other["id"]), "--store", sqlite_url, "--json").stdout)["status"] == "CANCELED"
    assert "--stale" in run("retry", "--help").stdout and "--stale" in run("tasks", "--help").stdout


# ---- workers ----------------------------------------------------------------------------
def _worker(processes, url: str, *args: str) -> Process:
    """`corral worker` of the example app; its log is its stderr alone."""
    return processes.start([*CORRAL, "worker", SHOP, "--store", url, *args], "worker", cwd=REPO, stdout=DEVNULL)


def _finish(proc: Process, timeout: float = 20) -> tuple[int, str]:
    return proc.wait(timeout), proc.log


@pytest.mark.slow
def test_a_worker_started_with_defaults_recovers_a_dead_claimers_lease(sqlite_url, processes):
    # Claimed an hour ago (a store whose clock is set back) by a worker that died.
    ghost = open_store(sqlite_url, clock=FakeClock(start=time.time() - 3600))
    [sub] = ghost.submit([NewTask("sync_sku", dumps({"args": ["L1", "jd"], "kwargs": {}}), max_retries=2)])
    assert ghost.claim("ghost", ClaimRequest(["default"], 1, lease_seconds=30))
    ghost.close()
    proc = _worker(processes, sqlite_url)
    store = open_store(sqlite_url)
    try:
        wait_for(lambda: store.get(sub.id).status is State.SUCCESS, timeout=20, message="recovered and run")
        rec = store.get(sub.id)
        assert (rec.attempt, rec.crashes) == (1, 1)  # a crash re-run: the lost run is counted apart
    finally:
        proc.stop()
        store.close()


@pytest.mark.slow
def test_a_worker_on_garbage_bytes_exits_with_one_line_naming_the_file(tmp_path, processes):
    junk = tmp_path / "junk.db"
    junk.write_bytes(os.urandom(8192))
    code, err = _finish(_worker(processes, f"sqlite:///{junk}"))
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and str(junk) in lines[0], err


@pytest.mark.slow
def test_a_worker_whose_database_is_damaged_under_it_stops(tmp_path, processes):
    path = tmp_path / "corral.db"
    SQLiteStore(f"sqlite:///{path}").close()
    proc = _worker(processes, f"sqlite:///{path}", "--no-sweep")
    wait_for(lambda: not proc.running() or (tmp_path / "corral.db-wal").exists(), timeout=20, message="running")
    assert proc.running()
    with open(path, "r+b") as f:  # the header and first pages overwritten by something else
        f.write(os.urandom(8192))
    code, err = _finish(proc)
    last = err.strip().splitlines()[-1]
    assert code == 1 and last.startswith("error:") and str(path) in last, err

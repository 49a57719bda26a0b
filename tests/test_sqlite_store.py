"""SQLite-specific behaviour of ``sqlite:///`` (the shared semantics live in tests/conformance)."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import random
import re
import shutil
import sqlite3
import threading
import time

import pytest

from corral.core.claims import ClaimRequest
from corral.core.model import NewTask, Outcome, TaskFilter
from corral.core.states import State
from corral.errors import ConfigError, StoreCorrupt, StoreError, StoreUnavailable
from corral.stores import open_store
from corral.stores.filewatch import open_watch
from corral.stores.sqlite import SCHEMA_VERSION, Q, SQLiteStore, parse_url
from helpers import ARGS, wait_for


def new(name: str = "t", **kw) -> NewTask:
    return NewTask(name=name, args=ARGS, **kw)


@pytest.fixture
def store(sqlite_url):
    s = SQLiteStore(sqlite_url)
    try:
        yield s
    finally:
        s.close()


def raw(store: SQLiteStore) -> sqlite3.Connection:
    return sqlite3.connect(store.path, isolation_level=None)


# ---- URL, pragmas, opening ---------------------------------------------------------


def test_url_forms(tmp_path, monkeypatch):
    assert parse_url("sqlite:////abs/dir/x.db") == ("/abs/dir/x.db", {})
    assert parse_url("sqlite:///rel/x.db") == ("rel/x.db", {})
    assert parse_url("sqlite:///x.db?synchronous=FULL") == ("x.db", {"synchronous": "FULL"})
    monkeypatch.chdir(tmp_path)
    rel = SQLiteStore("sqlite:///rel.db")
    absolute = SQLiteStore(f"sqlite:///{tmp_path}/abs.db")  # the sqlite:////absolute form
    try:
        (r,) = rel.submit([new()])
        assert rel.get(r.id).name == "t"
        assert (tmp_path / "rel.db").exists()
        absolute.submit([new()])
        assert (tmp_path / "abs.db").exists()
    finally:
        rel.close()
        absolute.close()


@pytest.mark.parametrize(
    "url", ["sqlite:///x.db?bogus=1", "sqlite:///x.db?synchronous=SOMETIMES", "sqlite://x.db", "sqlite:///:memory:"]
)
def test_bad_urls_are_config_errors(url):
    with pytest.raises(ConfigError):
        SQLiteStore(url)


def test_wal_busy_timeout_and_synchronous(store, sqlite_url):
    con = store._con()
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert con.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
    assert con.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    # WAL is a property of the file: a plain connection sees it too
    other = raw(store)
    try:
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        other.close()
    full = SQLiteStore(sqlite_url + "?synchronous=FULL")
    try:
        assert full._con().execute("PRAGMA synchronous").fetchone()[0] == 2
    finally:
        full.close()


def test_one_connection_per_thread(store):
    mine = store._con()
    assert store._con() is mine
    seen = []
    t = threading.Thread(target=lambda: seen.append(store._con()))
    t.start()
    t.join()
    assert seen and seen[0] is not mine


def test_missing_directory_is_unavailable(tmp_path):
    with pytest.raises(StoreUnavailable) as info:
        open_store(f"sqlite:///{tmp_path}/no/such/dir/x.db")
    assert "\n" not in str(info.value)


def test_unopenable_files_are_unavailable(tmp_path):
    (tmp_path / "a_dir.db").mkdir()
    with pytest.raises(StoreUnavailable):
        SQLiteStore(f"sqlite:///{tmp_path}/a_dir.db")
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database, just some bytes" * 200)
    with pytest.raises(StoreCorrupt) as info:  # permanent: no retry can cure it
        SQLiteStore(f"sqlite:///{junk}")
    assert str(junk) in str(info.value)
    assert "\n" not in str(info.value)


def test_driver_errors_are_translated(sqlite_url):
    s = SQLiteStore(sqlite_url + "?busy_timeout=50")
    s.submit([new()])
    holder = raw(s)
    try:
        holder.execute("BEGIN IMMEDIATE")  # another writer holds the lock
        with pytest.raises(StoreError) as info:
            s.claim("w", ClaimRequest(["default"], 1))
        assert not isinstance(info.value, sqlite3.Error)
        holder.execute("ROLLBACK")
        assert len(s.claim("w", ClaimRequest(["default"], 1))) == 1  # usable again afterwards
    finally:
        holder.close()
        s.close()


def test_store_pickles_as_its_url(store):
    again = pickle.loads(pickle.dumps(store))
    try:
        assert isinstance(again, SQLiteStore) and again.url == store.url
    finally:
        again.close()


# ---- migrate -----------------------------------------------------------------------


def _open_and_submit(url, barrier, q):
    barrier.wait()
    s = SQLiteStore(url)
    s.migrate()
    s.submit([new("m")])
    q.put(os.getpid())
    s.close()


def test_concurrent_migrate_from_several_processes(tmp_path):
    url = f"sqlite:///{tmp_path}/fresh.db"
    ctx = multiprocessing.get_context("spawn")
    barrier, q = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_open_and_submit, args=(url, barrier, q)) for _ in range(4)]
    for p in procs:
        p.start()
    pids = [q.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert len(set(pids)) == 4
    s = SQLiteStore(url)
    try:
        s.migrate()
        s.migrate()
        con = s._con()
        assert con.execute("SELECT version FROM corral_schema").fetchall() == [(SCHEMA_VERSION,)]
        assert s.counts() == {"PENDING": 4}
    finally:
        s.close()


def test_a_version_1_database_is_brought_up_to_date(tmp_path):
    url = f"sqlite:///{tmp_path}/old.db"
    s = SQLiteStore(url)
    s.submit([new("kept")])
    con = s._con()
    con.execute("DROP INDEX tasks_waiting")  # what a version 1 database lacks
    con.execute("DELETE FROM corral_schema")
    con.execute("INSERT INTO corral_schema (version) VALUES (1)")
    s.close()
    s = SQLiteStore(url)
    try:
        con = s._con()
        assert con.execute("SELECT max(version) FROM corral_schema").fetchone()[0] == SCHEMA_VERSION
        assert con.execute("SELECT count(*) FROM sqlite_master WHERE name = 'tasks_waiting'").fetchone()[0] == 1
        assert s.active_counts() == {"PENDING": 1}
    finally:
        s.close()


def _flow_schema_check(s: SQLiteStore, task_id: int) -> None:
    """Both flow-control schemas are there and work: rates, snoozes and
    breakers (version 4), dead letters, the fleet level and events (version 5)."""
    from corral.core.breaker import BreakerConfig, BreakerState
    from corral.core.model import LimitSpec
    from corral.stores.base import FleetLevel

    con = s._con()
    assert con.execute("SELECT max(version) FROM corral_schema").fetchone()[0] == SCHEMA_VERSION
    assert con.execute("SELECT count(*) FROM sqlite_master WHERE name = 'tasks_ready_heads_rank'").fetchone()[0] == 1
    assert con.execute("SELECT count(*) FROM sqlite_master WHERE name = 'tasks_batch_active'").fetchone()[0] == 1
    indexes = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert {"tasks_ready_plain_rank", "tasks_retry_ready_rank"} <= indexes  # claim order with ageing
    assert not {"tasks_ready", "tasks_retry_ready", "tasks_ready_rank"} & indexes  # strict priority, gone
    assert con.execute("SELECT count(*) FROM sqlite_master WHERE name LIKE 'tasks_event_%'").fetchone()[0] == 3
    dashboard = {"tasks_finished", "tasks_trace", "tasks_group_done", "tasks_batch_status"}
    assert dashboard <= indexes
    assert "tasks_group_all" not in indexes  # every grouped task's index (versions 14-21): gone
    columns = {r[1] for r in con.execute("PRAGMA table_info(tasks)")}
    assert {"snoozes", "ref", "on_upstream_failure"} <= columns
    columns = {r[1] for r in con.execute("PRAGMA table_info(named_limits)")}
    assert {"burst", "tokens", "counted_at", "paused_until"} <= columns
    names = {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
    assert {"breakers", "breaker_events", "fleet_control", "events", "tasks_dead", "batches"} <= names
    assert s.get(task_id).snoozes == 0
    assert (s.get(task_id).ref, s.get(task_id).on_upstream_failure) == (None, "cancel")
    s.set_limit(LimitSpec("api", rate="1/m", burst=1))
    s.set_breaker("t", BreakerConfig())
    assert s.force_breaker("t", BreakerState.OPEN, "test").after == "OPEN"
    assert s.claim("w", ClaimRequest(["default"], 5)) == []  # the breaker holds the task
    s.force_breaker("t", BreakerState.CLOSED, "test")
    (c,) = s.claim("w", ClaimRequest(["default"], 5))
    rec = c.tasks[0]
    assert s.complete([Outcome(rec.id, rec.lease_token, rec.version, State.FAILED, error="boom")]) == [True]
    assert [t.id for t in s.dead_letters()] == [task_id]
    assert s.set_fleet_level(FleetLevel(1, True, None, "test"), auto=False, event="{}")
    assert s.fleet_level().level == 1 and len(s.events("level")) == 1


@pytest.mark.parametrize("version", [3, 4, 5, 6, 13, 14])
def test_an_older_file_gains_both_flow_control_schemas(tmp_path, version):
    """A file as version 3 left it (before flow control), as version 4 left
    it (rates and breakers, no levels), as version 5 left it (no retry path
    index), as version 6 left it (no periodic schedules, no batch settings),
    as version 13 left it (no dashboard indexes) or as version 14 left it
    (claim order by strict priority, as every version before); none has the
    graph columns. Each is brought up to date."""
    url = f"sqlite:///{tmp_path}/old.db"
    s = SQLiteStore(url)
    (kept,) = s.submit([new("t")])
    s.close()
    con = sqlite3.connect(f"{tmp_path}/old.db")
    con.executescript("ALTER TABLE tasks DROP COLUMN ref; ALTER TABLE tasks DROP COLUMN on_upstream_failure;")
    if version < 13:
        con.executescript("DROP TABLE batches; DROP INDEX tasks_batch_active;")
        con.executescript("DROP TABLE schedules; DROP TABLE schedule_ticks;")
    con.executescript(
        "DROP INDEX tasks_retry_ready_rank; DROP INDEX tasks_ready_plain_rank; DROP INDEX tasks_ready_heads_rank;"
        " CREATE INDEX tasks_ready ON tasks (queue, priority DESC, run_at, id)"
        " WHERE status IN ('PENDING', 'RETRYING') AND (group_key IS NULL OR is_head = 1);"
    )
    if version >= 6:
        con.execute(
            "CREATE INDEX tasks_retry_ready ON tasks (queue, priority DESC, run_at, id)"
            " WHERE status = 'RETRYING' AND (group_key IS NULL OR is_head = 1)"
        )
    for trigger in ("tasks_event_insert", "tasks_event_status", "tasks_event_progress", "breaker_event_stream"):
        con.execute(f"DROP TRIGGER {trigger}")  # the event stream came in version 9
    con.execute("DROP VIEW events_read")
    con.execute("DROP INDEX tasks_group_done")  # versions before 22 had none
    if version < 14:
        for index in ("tasks_finished", "tasks_trace", "tasks_batch_status"):
            con.execute(f"DROP INDEX {index}")
    else:  # versions 14-21 indexed every grouped task
        con.execute("CREATE INDEX tasks_group_all ON tasks (group_key) WHERE group_key IS NOT NULL")
    if version < 5:
        con.executescript("DROP TABLE fleet_control; DROP TABLE events; DROP INDEX tasks_dead;")
    else:  # the events table as version 5 made it
        for column in ("task_id", "status", "prior", "attempt"):
            con.execute(f"ALTER TABLE events DROP COLUMN {column}")
    if version == 3:
        con.executescript(
            "DROP TABLE breakers; DROP TABLE breaker_events;"
            " ALTER TABLE tasks DROP COLUMN snoozes;"
            " ALTER TABLE named_limits DROP COLUMN burst; ALTER TABLE named_limits DROP COLUMN tokens;"
            " ALTER TABLE named_limits DROP COLUMN counted_at; ALTER TABLE named_limits DROP COLUMN paused_until;"
        )
    con.execute("DELETE FROM corral_schema")
    con.execute("INSERT INTO corral_schema (version) VALUES (?)", (version,))
    con.commit()
    con.close()
    s = SQLiteStore(url)
    try:
        _flow_schema_check(s, kept.id)
    finally:
        s.close()


def test_checkpoints_run_in_the_background_not_in_commits(tmp_path):
    s = SQLiteStore(f"sqlite:///{tmp_path}/ck.db")
    try:
        assert s._con().execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        s.submit([new("c") for _ in range(50)])

        def in_main_file() -> int:
            # the database file alone (no -wal): what checkpoints have copied there
            shutil.copyfile(f"{tmp_path}/ck.db", f"{tmp_path}/copy.db")
            con = sqlite3.connect(f"{tmp_path}/copy.db")
            try:
                return con.execute("SELECT count(*) FROM tasks").fetchone()[0]
            except sqlite3.DatabaseError:  # the schema not copied yet, or a page copied mid-checkpoint
                return -1
            finally:
                con.close()

        assert wait_for(lambda: in_main_file() == 50, timeout=10)
    finally:
        s.close()


def test_the_wal_is_reset_while_readers_keep_reading(tmp_path, monkeypatch):
    """Steady reads from another connection keep a PASSIVE checkpoint from ever
    restarting the WAL; past its size bound the checkpointer resets it."""
    import corral.stores.sqlite as sqlite_mod

    monkeypatch.setattr(sqlite_mod, "WAL_RESET_BYTES", 256 * 1024)
    s = SQLiteStore(f"sqlite:///{tmp_path}/wal.db")
    stop = threading.Event()

    def reader():
        con = sqlite3.connect(f"{tmp_path}/wal.db")
        while not stop.is_set():
            con.execute("SELECT count(*) FROM tasks").fetchone()
        con.close()

    readers = [threading.Thread(target=reader) for _ in range(2)]
    try:
        for t in readers:
            t.start()
        for _ in range(40):
            s.submit([NewTask(name="w", args='{"pad": "' + "x" * 2000 + '"}') for _ in range(50)])
        wal = f"{tmp_path}/wal.db-wal"
        assert wait_for(lambda: os.path.getsize(wal) < 256 * 1024, timeout=20)
    finally:
        stop.set()
        for t in readers:
            t.join()
        s.close()


def test_a_wal_reset_a_reader_outlasted_is_tried_again_without_another_write(tmp_path, monkeypatch):
    """A TRUNCATE checkpoint that waits out its time behind a reader reports
    it in its row and raises nothing: the round must ask for another, or a
    store that stops writing keeps its large WAL for good."""
    import corral.stores.sqlite as sqlite_mod

    monkeypatch.setattr(sqlite_mod, "WAL_RESET_BYTES", 64 * 1024)
    monkeypatch.setattr(sqlite_mod, "CHECKPOINT_INTERVAL", 3600.0)  # rounds by hand only
    s = SQLiteStore(f"sqlite:///{tmp_path}/wal.db")
    wal = f"{tmp_path}/wal.db-wal"
    reader = sqlite3.connect(f"{tmp_path}/wal.db", isolation_level=None)
    try:
        s.submit([NewTask(name="w", args="{}")])
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM tasks").fetchone()  # a snapshot from before the big writes
        for _ in range(10):
            s.submit([NewTask(name="w", args='{"pad": "' + "x" * 2000 + '"}') for _ in range(20)])
        s._checkpoint_once()
        assert os.path.getsize(wal) > 64 * 1024  # it could not truncate past the reader
        assert s._wrote  # so the next round tries again, though nothing is written
        reader.execute("COMMIT")
        s._checkpoint_once()
        assert os.path.getsize(wal) < 64 * 1024
        assert not s._wrote
    finally:
        reader.close()
        s.close()


# ---- claims across processes --------------------------------------------------------


def _claim_loop(url, max_units, barrier, q, cap=1600):
    """Claim until nothing is left, or until this process holds ``cap`` tasks
    (so the other process surely gets a share even if this one ran alone)."""
    s = SQLiteStore(url)
    got, calls, empty = [], [], 0
    barrier.wait()
    while empty < 3 and len(got) < cap:
        claims = s.claim(f"w{os.getpid()}", ClaimRequest(["default"], max_units, lease_seconds=600))
        calls.append(len(claims))
        if not claims:
            empty += 1
            continue
        empty = 0
        got.extend((c.token, t.id) for c in claims for t in c.tasks)
    q.put((got, calls))
    s.close()


def test_two_processes_never_claim_a_task_twice(store):
    free = [r.id for r in store.submit([new() for _ in range(3000)])]
    grouped = {g: [r.id for r in store.submit([new(group=g) for _ in range(15)])] for g in ("a", "b", "c")}
    ctx = multiprocessing.get_context("spawn")
    barrier, q = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_claim_loop, args=(store.url, 5, barrier, q)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    ids = [tid for got, _ in results for _, tid in got]
    assert len(ids) == len(set(ids)), "a task was claimed twice"
    for _, calls in results:
        assert max(calls) <= 5, "more claims than asked"
    assert all(got for got, _ in results), "both processes should have claimed"
    # every free task once, and only the head of each group (the rest waits for it)
    assert sorted(ids) == sorted(free + [ids_[0] for ids_ in grouped.values()])
    tokens = [tok for got, _ in results for tok, _ in got]
    assert len(set(tokens)) == len(tokens)
    assert store.counts() == {"RUNNING": 3003, "PENDING": 42}


# ---- query plans: claim cost does not follow finished rows ---------------------------


def _plan(con, sql, params):
    return " | ".join(r[3] for r in con.execute("EXPLAIN QUERY PLAN " + sql, params))


def test_claim_uses_partial_indexes_not_a_scan(store):
    con = store._con()
    now = time.time()
    con.execute("BEGIN IMMEDIATE")
    con.execute(
        """WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 20000)
        INSERT INTO tasks (name, args, status, queue, group_key, created_at, run_at, started_at, finished_at, version)
        SELECT 'done', '{}', 'SUCCESS', 'default', CASE WHEN i % 2 THEN 'g' END, ?, ?, ?, ?, 2 FROM c""",
        (now, now, now, now),
    )
    con.execute("COMMIT")
    store.submit([new() for _ in range(50)] + [new(group="g") for _ in range(50)])
    con.execute("ANALYZE")
    plan = _plan(con, "SELECT * FROM (" + Q["active_counts"] + ")", ())
    # backpressure and drain never read history: only partial indexes are scanned
    assert re.findall(r"SCAN tasks(?! USING (?:COVERING )?INDEX)", plan) == [], plan
    for name, index in (
        ("claim_candidates", "tasks_ready_plain_rank"),
        ("claim_head_candidates", "tasks_ready_heads_rank"),
    ):
        plan = _plan(con, Q[name], ("default", now + 10))
        assert f"USING INDEX {index}" in plan and "SCAN" not in plan, plan
        assert "TEMP B-TREE" not in plan, plan  # index order is claim order: no sort
    for name, params in (
        ("head_clear", ("g", "g")),
        ("head_set", ("g",)),
        ("group_followers", ("g", 1, 5)),
        ("heartbeat_held", ('["x"]',)),
        ("find_stale_pending", (now, 10)),
    ):
        plan = _plan(con, Q[name], params)
        assert "SCAN tasks" not in plan, (name, plan)
    # the sweep reads RUNNING rows only (a partial index), never history
    plan = _plan(con, Q["find_stuck"], {"now": now, "limit": 10})
    assert re.findall(r"SCAN tasks(?! USING (?:COVERING )?INDEX tasks_running_expiry)", plan) == [], plan
    # the ready indexes hold free tasks and queued heads only
    ready = con.execute(
        "SELECT count(*) FROM tasks INDEXED BY tasks_ready_plain_rank "
        "WHERE status IN ('PENDING', 'RETRYING') AND group_key IS NULL AND queue = 'default'"
    ).fetchone()[0]
    heads = con.execute(
        "SELECT count(*) FROM tasks INDEXED BY tasks_ready_heads_rank "
        "WHERE status IN ('PENDING', 'RETRYING') AND is_head = 1 AND group_key IS NOT NULL AND queue = 'default'"
    ).fetchone()[0]
    assert (ready, heads) == (50, 1)
    claims = store.claim("w", ClaimRequest(["default"], 200))
    assert len(claims) == 51


# ---- the group head flag stays right --------------------------------------------------


def _check_heads(store):
    con = store._con()
    wrong = con.execute(
        """SELECT g.group_key FROM (SELECT DISTINCT group_key FROM tasks WHERE group_key IS NOT NULL) AS g
        WHERE (SELECT group_concat(id) FROM tasks WHERE group_key = g.group_key AND is_head = 1)
          IS NOT (SELECT CAST(min(id) AS TEXT) FROM tasks WHERE group_key = g.group_key AND
                  (status IN ('WAITING','PENDING','RETRYING','RUNNING')
                   OR (status = 'FAILED' AND halt_group_on_failure = 1)))"""
    ).fetchall()
    assert wrong == [], f"is_head wrong for groups {wrong}"
    # a queued head's place in the round robin is never later than its turn
    # (later would pass it over): max(run_at, its group's last claim)
    late = con.execute(
        """SELECT t.id FROM tasks AS t LEFT JOIN task_groups AS g ON g.group_key = t.group_key
        WHERE t.status IN ('PENDING', 'RETRYING') AND t.is_head = 1 AND t.group_key IS NOT NULL
          AND (t.ready_at IS NULL OR t.ready_at > max(t.run_at, coalesce(g.last_claimed_at, 0)))"""
    ).fetchall()
    assert late == [], f"ready_at missing or late for heads {late}"


def test_group_head_flag_survives_a_random_workload(store):
    rng = random.Random(7)
    running = []
    for _step in range(400):
        op = rng.random()
        if op < 0.3:
            store.submit(
                [
                    new(group=rng.choice("abc"), halt_group_on_failure=rng.random() < 0.2, max_retries=1)
                    for _ in range(rng.randint(1, 4))
                ]
            )
        elif op < 0.55:
            for c in store.claim("w", ClaimRequest(["default"], rng.randint(1, 3), chunk_size=rng.randint(1, 3))):
                running.extend((c.token, t) for t in c.tasks)
        elif op < 0.8 and running:
            token, t = running.pop(rng.randrange(len(running)))
            rec = store.get(t.id)
            status = rng.choice([State.SUCCESS, State.FAILED, State.CANCELED, State.RETRYING, State.PENDING])
            store.complete([Outcome(t.id, token, rec.version, status, run_at=store.now())])
        elif op < 0.9:
            failed = store.list_tasks(TaskFilter(status=State.FAILED, limit=5))
            if failed:
                store.retry(rng.choice(failed).id)
        else:
            pending = store.list_tasks(TaskFilter(status=State.PENDING, limit=5))
            if pending:
                store.cancel(rng.choice(pending).id)
        _check_heads(store)


def test_a_claim_reads_few_heads_however_many_groups_were_claimed_before(store):
    """Once every group has been claimed once, each head's turn is its
    group's last claim; a claim still reads about as many heads as it takes
    (it used to read every queued head to find the first whose turn had come)."""
    groups = 1000
    store.submit([new(group=f"g{i % groups}") for i in range(3 * groups)])
    for _ in range(groups // 50):  # every group claimed once, its first task done
        claims = store.claim("w", ClaimRequest(["default"], 50))
        store.complete([Outcome(t.id, c.token, t.version, State.SUCCESS) for c in claims for t in c.tasks])
    _check_heads(store)
    real_con = store._con
    read = [0]

    class Counted:
        def __init__(self, cur):
            self.cur = cur

        def __iter__(self):
            return self

        def __next__(self):
            row = next(self.cur)
            read[0] += 1
            return row

        def close(self):
            self.cur.close()

    class Watch:
        def __init__(self, con):
            self.con = con

        def execute(self, sql, *a):
            cur = self.con.execute(sql, *a)
            return Counted(cur) if sql == Q["claim_head_candidates"] else cur

        def __getattr__(self, name):
            return getattr(self.con, name)

    store._con = lambda: Watch(real_con())
    claims = store.claim("w", ClaimRequest(["default"], 10))
    assert len(claims) == 10
    assert read[0] <= 20, f"read {read[0]} heads for 10 claims"
    # and in round-robin order: the groups claimed longest ago come first
    assert [c.group for c in claims] == [f"g{i}" for i in range(10)]


# ---- wait_for_work ---------------------------------------------------------------------


def _wait_while(store, sqlite_url, monkeypatch, timeout, writes, **kw) -> float:
    """How long ``store.wait_for_work(timeout, **kw)`` waits while another
    connection makes ``writes(other)`` once the wait has begun."""
    other = SQLiteStore(sqlite_url)
    snapshot = threading.Event()
    real_con = store._con

    class Watch:  # tells when the waiter has read data_version: a commit after it must wake it
        def __init__(self, con):
            self.con = con

        def execute(self, sql, *a):
            cur = self.con.execute(sql, *a)
            if sql == "PRAGMA data_version":
                snapshot.set()
            return cur

    monkeypatch.setattr(store, "_con", lambda: Watch(real_con()))
    elapsed = []

    def waiter():
        t0 = time.monotonic()
        store.wait_for_work(timeout, **kw)
        elapsed.append(time.monotonic() - t0)

    t = threading.Thread(target=waiter)
    t.start()
    try:
        assert snapshot.wait(10), "the waiter never started waiting"
        writes(other)
    finally:
        t.join(timeout + 10)
        other.close()
    assert elapsed, "the waiter did not return"
    return elapsed[0]


def test_wait_for_work_wakes_on_another_connections_commit(store, sqlite_url, monkeypatch):
    """One commit elsewhere wakes a 30 s wait within seconds (a sleeping wait would not)."""
    assert _wait_while(store, sqlite_url, monkeypatch, 30.0, lambda other: other.submit([new()])) < 5.0


def test_an_idle_wait_looks_at_the_database_only_when_its_files_are_written(store, monkeypatch):
    """An idle wait sleeps on a watch of the database's files: it reads
    data_version a few dozen times a second, not a thousand (polling every
    millisecond cost an idle worker process about 6 % of a core)."""
    if store._watch() is None:
        # inotify missing, or refused by the per-user limit on instances (a
        # browser running beside this test can take them all): the wait polls
        pytest.skip("no inotify watch for this store here: the wait polls")
    looks = []
    real_con = store._con

    class Count:
        def __init__(self, con):
            self.con = con

        def execute(self, sql, *a):
            looks.append(sql == "PRAGMA data_version")
            return self.con.execute(sql, *a)

    monkeypatch.setattr(store, "_con", lambda: Count(real_con()))
    t0 = time.monotonic()
    store.wait_for_work(0.5)
    elapsed = time.monotonic() - t0
    # one look per WATCH_SLICE (20 ms), and one per write of the files (this
    # store's own checkpoints), where polling looked every millisecond (about
    # 450 times in 0.5 s)
    assert sum(looks) < elapsed / 0.005, (sum(looks), elapsed)


def test_a_wake_whose_commit_is_not_visible_yet_looks_again_before_sleeping(store, monkeypatch):
    """A commit's WAL write wakes the watch before data_version shows the
    commit (SQLite updates its -shm index afterwards, which raises no
    event): the wait looks again a moment later instead of sleeping on the
    watch until the next write or the end of its slice."""
    monkeypatch.setattr("corral.stores.sqlite.WATCH_SLICE", 30.0)  # the old sleep: the whole wait
    done = threading.Event()

    class Watch:  # one write event, then nothing until the wait ends
        broken = False

        def __init__(self):
            self.events = 1

        def wait(self, timeout):
            if self.events:
                self.events -= 1
                return True
            done.wait(timeout)
            return False

    class Versions:  # the commit shows on the second look after the event
        def __init__(self):
            self.looks = 0
            self.con = sqlite3.connect(":memory:", check_same_thread=False)

        def execute(self, sql, *a):
            assert sql == "PRAGMA data_version"
            self.looks += 1
            return self.con.execute("SELECT ?", (1 if self.looks <= 2 else 2,))

    versions = Versions()
    monkeypatch.setattr(store, "_watch", Watch)
    monkeypatch.setattr(store, "_con", lambda: versions)
    returned = threading.Event()

    def wait():
        store.wait_for_work(30.0)
        returned.set()

    waiter = threading.Thread(target=wait)
    waiter.start()
    try:
        assert returned.wait(10.0), "the wait slept on the watch though the commit showed a moment later"
        assert versions.looks == 3
    finally:
        done.set()
        waiter.join(30.0)


def test_without_a_watch_a_wait_polls_and_still_wakes_on_a_commit(sqlite_url, monkeypatch):
    monkeypatch.setattr("corral.stores.sqlite.open_watch", lambda *a: None)
    store = SQLiteStore(sqlite_url)
    try:
        assert _wait_while(store, sqlite_url, monkeypatch, 30.0, lambda other: other.submit([new()])) < 5.0
    finally:
        store.close()


def test_a_file_watch_wakes_on_writes_to_its_files_and_no_others(tmp_path):
    watch = open_watch(str(tmp_path), ["corral.db", "corral.db-wal"])
    if watch is None:
        pytest.skip("no inotify here")
    try:
        assert watch.wait(0.01) is False
        (tmp_path / "notes.txt").write_text("x")  # another file in the directory
        assert watch.wait(0.01) is False
        (tmp_path / "corral.db-wal").write_text("x")  # made again, as SQLite does
        assert watch.wait(5.0) is True
        with open(tmp_path / "corral.db-wal", "a") as f:
            f.write("y")
        assert watch.wait(5.0) is True
        assert watch.wait(0.01) is False  # drained
    finally:
        watch.close()


def test_a_file_watch_numbered_past_1024_still_wakes(tmp_path):
    """A process with many files open (a long-lived worker, a test run) gets
    descriptors numbered past 1024, which select() refuses: the watch broke
    and its waits polled every millisecond. It waits with poll()."""
    import resource

    from corral.stores.filewatch import FileWatch

    high = 1500
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] <= high:
        pytest.skip("the descriptor limit is too low here to number one past 1024")
    watch = open_watch(str(tmp_path), ["corral.db"])
    if watch is None:
        pytest.skip("no inotify here")
    fd = os.dup2(watch._fd, high)
    watch.close()
    far = FileWatch(fd, frozenset([b"corral.db"]))
    try:
        assert far.wait(0.01) is False
        assert not far.broken
        (tmp_path / "corral.db").write_text("x")
        assert far.wait(5.0) is True
        assert not far.broken
    finally:
        far.close()


def test_a_broken_file_watch_sleeps_a_polling_slice_instead_of_spinning(tmp_path, monkeypatch):
    """A watch whose descriptor failed says "look anyway" but still sleeps,
    so a waiting loop polls rather than spinning a core until its deadline."""
    watch = open_watch(str(tmp_path), ["corral.db"])
    if watch is None:
        pytest.skip("no inotify here")
    slept = []
    monkeypatch.setattr("corral.stores.filewatch.time.sleep", slept.append)
    watch.close()  # waiting on the closed descriptor now fails
    assert watch.wait(1.0) is True
    assert watch.wait(1.0) is True
    assert watch.broken
    assert slept and all(0 < s <= 0.01 for s in slept) and len(slept) == 2


def test_a_wait_for_queues_sleeps_through_commits_that_leave_nothing_due_there(store, sqlite_url, monkeypatch):
    """Each early return costs a worker a claim under the write lock: commits
    that bring nothing due in its queues (a delayed task, another queue's
    task, a claim, a completion) do not end its wait."""

    def writes(other):
        later = other.now() + 3600
        other.submit([new(run_at=later)])
        other.submit([new(queue="other")])
        (c,) = other.claim("w", ClaimRequest(["other"], 1))
        other.complete([Outcome(c.tasks[0].id, c.token, c.tasks[0].version, State.SUCCESS)])

    assert _wait_while(store, sqlite_url, monkeypatch, 0.5, writes, queues=["default"]) >= 0.5


def test_a_wait_for_a_paused_queue_sleeps_through_its_backlog_and_wakes_on_the_resume(store, sqlite_url, monkeypatch):
    """Work due in a paused queue is not work for its worker: commits
    elsewhere do not send it to claim for nothing; the resume's commit wakes it."""
    store.submit([new()])
    store.pause("queue", "default")

    def busy(other):
        other.submit([new(queue="other")])
        (c,) = other.claim("w", ClaimRequest(["other"], 1))
        other.complete([Outcome(c.tasks[0].id, c.token, c.tasks[0].version, State.SUCCESS)])

    assert _wait_while(store, sqlite_url, monkeypatch, 0.5, busy, queues=["default"]) >= 0.5
    resume = lambda other: other.resume("queue", "default")  # noqa: E731
    assert _wait_while(store, sqlite_url, monkeypatch, 30.0, resume, queues=["default"]) < 5.0


def test_a_wait_for_queues_wakes_when_work_is_due_there(store, sqlite_url, monkeypatch):
    def writes(other):
        other.submit([new(queue="other")])
        other.submit([new(group="g")])  # a group's head is due work too

    assert _wait_while(store, sqlite_url, monkeypatch, 30.0, writes, queues=["default"]) < 5.0


def test_wait_for_work_times_out_without_commits(store):
    t0 = time.monotonic()
    store.wait_for_work(0.05)
    assert time.monotonic() - t0 >= 0.05


def test_close_makes_store_unusable(sqlite_url):
    s = SQLiteStore(sqlite_url)
    s.close()
    with pytest.raises(StoreError):
        s.submit([new()])


def test_plain_fast_path_still_sees_grouped_work_from_another_process(store, sqlite_url):
    """While only plain work is queued, claims take a one-statement path; work
    with a group or a limit submitted elsewhere is still claimed, in order,
    within the path's short re-check interval, and never through it."""

    store.submit([new() for _ in range(2000)])
    (c,) = store.claim("w", ClaimRequest(["default"], 1))
    assert c.group is None and store._plain_until > time.monotonic()  # on the fast path
    other = open_store(sqlite_url)
    try:
        gid = other.submit([new(group="g", priority=5), new(group="g", priority=5)])[0].id
        claimed: list = []

        def got_group_task():
            claimed.extend(t for cl in store.claim("w", ClaimRequest(["default"], 1)) for t in cl.tasks)
            return [t for t in claimed if t.group == "g"]

        grouped = wait_for(got_group_task, timeout=5, message="the grouped task is claimed")
        assert [t.id for t in grouped] == [gid]  # its head only: the group rule held
        assert len(claimed) < 1990  # found long before the plain backlog ran out
    finally:
        other.close()


# ---- claims behind a full limit ------------------------------------------------------


def _limit_full(store: SQLiteStore, sqlite_url: str):
    """A limit of one place held by another process's claim; ``store`` has
    claimed once and found its work only behind that full limit."""
    from corral.core.model import LimitSpec

    store.set_limit(LimitSpec("api", concurrency=1))
    store.submit([new(limits=["api"]), new(limits=["api"])])
    other = SQLiteStore(sqlite_url)
    (held,) = other.claim("w1", ClaimRequest(["default"], 1))
    assert store.claim("w2", ClaimRequest(["default"], 1)) == []
    return other, held


def test_a_claim_behind_a_full_limit_looks_without_the_write_lock(store, sqlite_url):
    """With two processes on one file, a freed place woke both and the one
    that lost took the write lock for nothing, in the way of the other's
    claims and completions. A claim that found only limited work now looks
    read-only first, so it returns even while another process writes."""
    other, _ = _limit_full(store, sqlite_url)
    writer = raw(store)
    store.busy_timeout_ms = 200
    try:
        writer.execute("BEGIN IMMEDIATE")  # another process mid-write
        assert store.claim("w2", ClaimRequest(["default"], 1)) == []
        writer.execute("ROLLBACK")
    finally:
        writer.close()
        other.close()


def test_a_place_freed_after_a_read_only_look_is_claimed(store, sqlite_url):
    """The look finds nothing, the place frees before the worker waits: its
    wait ends at once (it counts commits since the look), and the claim
    takes the task."""
    other, held = _limit_full(store, sqlite_url)
    try:
        assert store.claim("w2", ClaimRequest(["default"], 1)) == []  # a read-only look
        t = held.tasks[0]
        other.complete([Outcome(t.id, held.token, t.version, State.SUCCESS)])
        t0 = time.monotonic()
        store.wait_for_work(30.0)
        assert time.monotonic() - t0 < 20.0, "the commit before the wait went unnoticed"
        (c,) = store.claim("w2", ClaimRequest(["default"], 1))
        assert tuple(c.tasks[0].limits) == ("api",) and c.tasks[0].id != t.id
    finally:
        other.close()


def test_a_claim_behind_a_full_limit_looks_again_only_when_something_changed(store, sqlite_url, monkeypatch):
    """Every commit of another process wakes an idle worker; behind a full
    limit most wake-ups change nothing it could take, and a look costs a
    read of every ready head. It looks again when a place frees, a task is
    added or the ready heads change (and at least every few hundredths of a
    second, which the test stretches)."""
    import corral.stores.sqlite as mod

    monkeypatch.setattr(mod, "GATED_LOOK_EVERY", 3600.0)
    other, held = _limit_full(store, sqlite_url)
    looks = []
    pick = store._pick
    monkeypatch.setattr(store, "_pick", lambda *a, **k: looks.append(k.get("dry")) or pick(*a, **k))
    try:
        assert store.claim("w2", ClaimRequest(["default"], 1)) == [] and looks == [True]
        other.heartbeat([held.token], 60)  # a commit that changes nothing claimable
        assert store.claim("w2", ClaimRequest(["default"], 1)) == [] and looks == [True]
        (plain,) = other.submit([new()])  # a task the limit does not hold back
        (c,) = store.claim("w2", ClaimRequest(["default"], 1))
        assert c.tasks[0].id == plain.id
    finally:
        other.close()


def test_a_claim_behind_a_full_limit_looks_again_when_a_place_changed_hands(store, sqlite_url, monkeypatch):
    """A place freed and taken again at once by the other worker of the
    limit leaves every count as it was; a worker that took that for
    "nothing changed" sat out the race for the places that followed (in one
    run a worker of another queue ran 45 tasks in a row under the shared
    limit while this one waited)."""
    import corral.stores.sqlite as mod

    monkeypatch.setattr(mod, "GATED_LOOK_EVERY", 3600.0)
    other, held = _limit_full(store, sqlite_url)
    other.submit([new(limits=["api"])])
    looks = []
    pick = store._pick
    monkeypatch.setattr(store, "_pick", lambda *a, **k: looks.append(k.get("dry")) or pick(*a, **k))
    try:
        assert store.claim("w2", ClaimRequest(["default"], 1)) == [] and looks == [True]
        t = held.tasks[0]
        (again,) = other.complete_and_claim(
            [Outcome(t.id, held.token, t.version, State.SUCCESS)], [("api",)], "w1", ClaimRequest(["default"])
        )[1]
        assert again.tasks[0].id != t.id  # the place went straight to the other worker's next task
        assert store.claim("w2", ClaimRequest(["default"], 1)) == [] and looks == [True, True]  # looked again
    finally:
        other.close()


def test_a_skipped_look_is_per_kind_of_claim(store, sqlite_url, monkeypatch):
    """A worker with slots per queue claims for one queue, then another: a
    look that found nothing for the first says nothing about the second."""
    import corral.stores.sqlite as mod
    from corral.core.model import LimitSpec

    monkeypatch.setattr(mod, "GATED_LOOK_EVERY", 3600.0)
    store.set_limit(LimitSpec("api", concurrency=1))
    store.submit([new(queue="a", limits=["api"]), new(queue="a", limits=["api"])])
    (plain,) = store.submit([new(queue="b")])
    other = SQLiteStore(sqlite_url)
    try:
        assert len(other.claim("w1", ClaimRequest(["a"], 1))) == 1  # the limit is full now
        assert store.claim("w2", ClaimRequest(["a"], 1)) == []
        assert store.claim("w2", ClaimRequest(["a"], 1)) == []  # a read-only look, remembered
        (c,) = store.claim("w2", ClaimRequest(["b"], 1))
        assert c.tasks[0].id == plain.id
    finally:
        other.close()


def _statements(con: sqlite3.Connection, act) -> list[str]:
    """The statements ``act()`` runs on ``con`` (a trigger's steps are traced
    as the statement that fired them again: counted once)."""
    seen: list[str] = []
    con.set_trace_callback(seen.append)
    try:
        act()
    finally:
        con.set_trace_callback(None)
    return [q for i, q in enumerate(seen) if not i or q != seen[i - 1]]


@pytest.mark.parametrize("spec", [{"concurrency": 1000}, {"concurrency": 1000, "rate": "1000/s"}])
def test_a_keyed_claim_makes_a_few_statements_whatever_the_number_of_keys(store, spec):
    """A claim read the places and the row of each key it met one at a time
    and wrote each unit (and each key's rate) in its own statement: 30 units
    of 30 keys cost it about 110. It reads the keys of the candidates it is
    about to consider in one go, and writes the units and charges at once."""
    from corral.core.gates import keyed_name
    from corral.core.model import LimitSpec

    store.set_limit(LimitSpec("acct", **spec))
    store.submit([new(limits=[keyed_name("acct", f"k{k}")]) for k in range(10)])
    held = store.claim("w0", ClaimRequest(["default"], 10))  # ten keys hold a place
    store.submit([new(limits=[keyed_name("acct", f"k{k}")]) for _ in range(2) for k in range(30)])
    got: list = []
    ran = _statements(store._con(), lambda: got.extend(store.claim("w1", ClaimRequest(["default"], 30))))
    assert len(got) == 30 and len({c.token for c in got + held}) == 40
    assert sorted(n for c in got for t in c.tasks for n in t.limits) == sorted(
        keyed_name("acct", f"k{k}") for k in range(30)
    )
    assert len(ran) < 15, "\n".join(q[:80] for q in ran)
    assert store.limit_usage()["acct"] == 40


def test_a_handover_finds_a_keys_first_waiter_whatever_the_json_of_its_limits(store):
    """A place passes to the ender's successor only when the first work
    waiting under the key is the ender's: the key is looked for in the
    limits' text first, as this store writes it and with non-ASCII
    characters escaped (as another writer may have)."""
    import json

    from corral.core.gates import keyed_name

    name = keyed_name("acct", "caf\u00e9")
    (theirs,) = store.submit([new(queue="other", limits=[name])])
    store.submit([new(limits=[name])])
    request = ClaimRequest(["default"], 1)
    with store._write() as con:
        assert not store._ours_first(con, [[name]], request)  # the other queue's waits first
        con.execute("UPDATE tasks SET limits = ? WHERE id = ?", (json.dumps([name]), theirs.id))
        assert "\\u00e9" in con.execute("SELECT limits FROM tasks WHERE id = ?", (theirs.id,)).fetchone()[0]
        assert not store._ours_first(con, [[name]], request)
        assert store._ours_first(con, [[keyed_name("acct", "other")]], request)  # no work waits under it


# ---- the queue bound ---------------------------------------------------------------


def _queued(store: SQLiteStore) -> tuple[int, int]:
    """The queue as a bounded submit counts it, and as active_counts does."""
    counts = store.active_counts()
    counted = sum(counts.get(s, 0) for s in ("WAITING", "PENDING", "RETRYING"))
    (bound_count,) = store._con().execute(Q["queued_count"]).fetchone()
    return bound_count, counted


def test_a_bounded_submit_counts_the_queue_from_its_indexes_alone(store):
    """Every other writer waits while a submit holds the write lock: a
    bounded one counts the queued tasks from the partial indexes alone (no
    table row read, no grouping by status, which took milliseconds at
    thousands queued), and counts every kind of queued task."""
    from corral.errors import QueueFull

    store.submit([new() for _ in range(300)])
    (up,) = store.submit([new()])
    store.submit([new(depends_on=(up.id,))])  # WAITING
    con = store._con()
    seen: list[str] = []
    con.set_trace_callback(seen.append)
    try:
        store.submit([new()], max_queued=303)
        with pytest.raises(QueueFull, match="303 queued"):
            store.submit([new()], max_queued=303)
    finally:
        con.set_trace_callback(None)
    counts = [q for q in seen if "count(" in q.lower()]
    assert counts and not [q for q in counts if "group by" in q.lower()], counts
    for q in set(counts):
        plan = [row[3] for row in con.execute("EXPLAIN QUERY PLAN " + q)]
        scans = [p for p in plan if p.startswith(("SCAN", "SEARCH")) and p != "SCAN CONSTANT ROW"]
        assert scans and all(
            p.endswith(("USING INDEX tasks_queued_run_at", "USING INDEX tasks_waiting")) for p in scans
        )
        assert not [p for p in plan if "TEMP B-TREE" in p], plan
    assert _queued(store) == (303, 303)


def test_the_bound_counts_what_active_counts_counts_through_every_change(store):
    rng = random.Random(11)
    running: list = []
    for _step in range(300):
        op = rng.random()
        if op < 0.25:
            store.submit([new(group=rng.choice([None, "a", "b"]), max_retries=1) for _ in range(rng.randint(1, 4))])
        elif op < 0.3:
            (up,) = store.submit([new()])
            store.submit([new(depends_on=(up.id,))])  # WAITING until its upstream ends
        elif op < 0.5:
            for c in store.claim("w", ClaimRequest(["default"], rng.randint(1, 3))):
                running.extend((c.token, t) for t in c.tasks)
        elif op < 0.75 and running:
            token, t = running.pop(rng.randrange(len(running)))
            rec = store.get(t.id)
            status = rng.choice([State.SUCCESS, State.FAILED, State.CANCELED, State.RETRYING, State.PENDING])
            store.complete([Outcome(t.id, token, rec.version, status, run_at=store.now())])
        elif op < 0.85:
            failed = store.list_tasks(TaskFilter(status=State.FAILED, limit=5))
            if failed:
                store.retry(rng.choice(failed).id)
        else:
            queued = store.list_tasks(TaskFilter(status=rng.choice([State.PENDING, State.WAITING]), limit=5))
            if queued:
                store.cancel(rng.choice(queued).id)
        bound_count, counted = _queued(store)
        assert bound_count == counted, _step

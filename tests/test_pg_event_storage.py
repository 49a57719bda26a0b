"""The event stream's storage on PostgreSQL (schema 49): trimming leaves no
dead row per event, even while another session holds a snapshot open (the
xmin horizon pinned), because it moves a floor and empties spent partitions
by TRUNCATE instead of deleting rows; a reader holding a spent partition
delays its emptying, never the trim or the writers; a store of schema 48
keeps its events through the migration."""

from __future__ import annotations

import threading

import psycopg
import pytest

from corral.core.claims import ClaimRequest
from corral.core.model import NewTask, Outcome
from corral.core.states import State
from corral.stores import open_store
from corral.stores.stream import iter_events
from helpers import wait_for

pytestmark = pytest.mark.postgres

#: ids a partition holds (migration_0049)
SPAN = 65536

_STORAGE = """
SELECT oid::regclass::text FROM pg_class WHERE oid = 'corral_events'::regclass AND relkind = 'r'
UNION ALL
SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = 'corral_events'::regclass
"""


def _conn(url: str):
    return psycopg.connect(url, autocommit=True)


def _dead_and_rows(url: str) -> tuple[int, int]:
    """Dead and live row versions in the events' storage (the table, or its
    partitions), counted page by page (pgstattuple)."""
    with _conn(url) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
        dead = live = 0
        for (rel,) in conn.execute(_STORAGE).fetchall():
            d, n = conn.execute("SELECT dead_tuple_count, tuple_count FROM pgstattuple(%s)", (rel,)).fetchone()
            dead, live = dead + d, live + n
        return dead, live


def _near_a_partition_end(url: str, left: int) -> None:
    """Let the next ids cross from one partition into the next after ``left`` ids."""
    with _conn(url) as conn:
        if conn.execute("SELECT to_regclass('corral_events_ids') IS NOT NULL").fetchone()[0]:
            conn.execute("SELECT setval('corral_events_ids', %s)", (SPAN - 1 - left,))


def _run_tasks(store, n: int) -> None:
    """Submit, claim and finish ``n`` tasks: three events each."""
    store.submit([NewTask(name="t", args="[]") for _ in range(n)])
    done = 0
    while done < n:
        claims = store.claim("w", ClaimRequest(("default",), n))
        outcomes = [Outcome(t.id, t.lease_token, t.version, State.SUCCESS) for c in claims for t in c.tasks]
        assert outcomes, "nothing left to claim"
        assert all(store.complete(outcomes))
        done += len(outcomes)


def _pin(url: str):
    """A session holding a REPEATABLE READ snapshot open (it read the tasks, not the events)."""
    pin = _conn(url)
    pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    pin.execute("SELECT count(*) FROM corral_tasks").fetchone()
    return pin


def test_trimming_under_a_pinned_horizon_leaves_no_dead_rows(pg_own_url):
    store = open_store(pg_own_url)
    pin = _pin(pg_own_url)
    try:
        _near_a_partition_end(pg_own_url, 30)
        _run_tasks(store, 40)  # 120 events, the last 90 in the next partition
        before = [e.id for e in iter_events(store, since=0)]
        assert len(before) == 120 and before == sorted(before)
        assert store.trim_events(keep=10, before=0.0) == 110
        assert [e.id for e in iter_events(store, since=0)] == before[-10:]
        assert [e.id for e in store.events(limit=1000)] == before[-10:][::-1]
        dead, rows = _dead_and_rows(pg_own_url)
        assert dead == 0
        assert rows == 90  # the partition of the first 30 events was emptied; 80 rows are hidden
        _run_tasks(store, 5)
        after = [e.id for e in iter_events(store, since=0)]
        assert after[:10] == before[-10:] and len(after) == 25 and after == sorted(after)
        assert store.trim_events(keep=0, before=0.0) == 25
        assert store.events() == [] and list(iter_events(store, since=0)) == []
        assert _dead_and_rows(pg_own_url) == (0, 0)  # every row trimmed: every partition emptied
    finally:
        pin.rollback()
        pin.close()
        store.close()


def test_a_reader_holding_a_spent_partition_delays_its_emptying_not_the_trim_or_the_writers(pg_own_url):
    store = open_store(pg_own_url)
    _near_a_partition_end(pg_own_url, 30)
    _run_tasks(store, 40)
    reader = _conn(pg_own_url)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM corral_events_read").fetchone()  # holds every partition (ACCESS SHARE)
    try:
        done = threading.Event()
        trimmed: list[int] = []
        worker = threading.Thread(target=lambda: (trimmed.append(store.trim_events(10, 0.0)), done.set()), daemon=True)
        worker.start()
        wait_for(done.is_set, timeout=20, message="the trim returned while a reader held the spent partition")
        assert trimmed == [110]
        assert len(store.events(limit=1000)) == 10  # trimmed as the rules say
        assert _dead_and_rows(pg_own_url) == (0, 120)  # not emptied yet: the reader holds it
        _run_tasks(store, 2)  # writers go on
    finally:
        reader.rollback()
        reader.close()
    try:
        assert store.trim_events(keep=16, before=0.0) == 0  # nothing more to trim; the spent partition goes
        assert _dead_and_rows(pg_own_url) == (0, 96)
        assert len(store.events(limit=1000)) == 16
    finally:
        store.close()


def test_writers_do_not_wait_for_a_spent_partition_being_emptied(pg_own_url):
    """Inserts lock only the partition their rows go to: one held for a
    TRUNCATE (ACCESS EXCLUSIVE, as corral_events_truncate takes it) stops
    no submit, claim or completion."""
    store = open_store(pg_own_url)
    _near_a_partition_end(pg_own_url, 30)
    _run_tasks(store, 40)
    store.trim_events(keep=10, before=0.0, limit=100)  # not emptied: the floor was still moving
    (spent,) = (r[0] for r in store._fetchall("events_spent"))
    holder = _conn(pg_own_url)
    holder.execute("BEGIN")
    holder.execute(f"LOCK TABLE {spent} IN ACCESS EXCLUSIVE MODE")
    try:
        done = threading.Event()
        runner = threading.Thread(target=lambda: (_run_tasks(store, 3), done.set()), daemon=True)
        runner.start()
        wait_for(done.is_set, timeout=20, message="tasks ran while a spent partition was locked")
    finally:
        holder.rollback()
        holder.close()
        store.close()


def test_a_schema_48_store_keeps_its_events_through_the_migration(pg_empty_url):
    from corral.stores.postgres import SCHEMA_VERSION
    from corral.stores.sql import load

    q = load("postgres")
    steps = sorted((int(k.rsplit("_", 1)[1]), k) for k in q if k.startswith("migration_"))
    with _conn(pg_empty_url) as conn:
        conn.execute(q["schema_version_table"])
        for version, key in steps:
            if version <= 48:
                conn.execute(q[key])
        conn.execute(q["set_schema_version"], {"v": 48})
        assert conn.execute("SELECT relkind FROM pg_class WHERE relname = 'corral_events'").fetchone()[0] == "r"
    store = open_store(pg_empty_url)  # a store in use before the migration
    try:
        _run_tasks(store, 3)
        store.add_event("level", "fleet", '{"to": "NORMAL"}')
        with _conn(pg_empty_url) as conn:  # an id taken and rolled back: the sequence is ahead of the rows
            conn.execute("BEGIN")
            conn.execute("INSERT INTO corral_events (at, kind, subject, data) VALUES (0, 'x', 'x', 'x')")
            conn.execute("ROLLBACK")
        old = [(e.id, e.kind, e.subject, e.data) for e in iter_events(store, since=0)]
        assert len(old) == 10
        store.migrate()
        with _conn(pg_empty_url) as conn:
            assert conn.execute(q["schema_version"]).fetchone()[0] == SCHEMA_VERSION
            assert conn.execute("SELECT relkind FROM pg_class WHERE relname = 'corral_events'").fetchone()[0] == "p"
        assert [(e.id, e.kind, e.subject, e.data) for e in iter_events(store, since=0)] == old
        _run_tasks(store, 1)
        new = [e.id for e in iter_events(store, since=old[-1][0])]
        assert len(new) == 3 and new[0] == old[-1][0] + 2  # after the rolled-back id
        assert store.trim_events(keep=4, before=0.0) == 9
        assert _dead_and_rows(pg_empty_url)[0] == 0
    finally:
        store.close()

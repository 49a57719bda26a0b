"""PostgreSQL-specific behaviour of PostgresStore: concurrency under real
row locks, LISTEN/NOTIFY wake-ups, reconnects and connection errors.

The cross-store semantics are checked by tests/conformance; these tests are
about what only a shared database server can get wrong.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from corral.core.claims import ClaimRequest
from corral.core.model import LimitSpec, NewTask, Outcome, TaskFilter
from corral.core.states import State
from corral.errors import StoreUnavailable
from corral.stores import open_store
from helpers import ARGS, run_concurrently, wait_for

pytestmark = pytest.mark.postgres


def task(name: str = "t", **kw) -> NewTask:
    return NewTask(name=name, args=ARGS, **kw)


@pytest.fixture
def pg(pg_url):
    s = open_store(pg_url)
    s.migrate()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def stores(pg_url, pg):
    """Three more instances on the same database (separate pools)."""
    others = [open_store(pg_url) for _ in range(3)]
    try:
        yield [pg, *others]
    finally:
        for s in others:
            s.close()


def test_claim_race_never_claims_twice_nor_more_than_max_units(pg, stores):
    ids = [r.id for r in pg.submit([task() for _ in range(1500)])]
    max_units = 9

    def claimer(i):
        store = stores[i % len(stores)]
        got = []
        while True:
            claims = store.claim(f"w{i}", ClaimRequest(["default"], max_units))
            assert len(claims) <= max_units
            if not claims:
                return got
            got += [t.id for c in claims for t in c.tasks]

    claimed = [tid for r in run_concurrently(12, claimer) for tid in r]
    dupes = [tid for tid, n in Counter(claimed).items() if n > 1]
    assert dupes == []
    assert sorted(claimed) == ids
    assert pg.counts() == {"RUNNING": len(ids)}


@pytest.mark.parametrize("chunk_size", [1, 3])
def test_groups_stay_exclusive_under_concurrent_claimers(pg, stores, chunk_size):
    n_groups, per_group = 25, 12
    tasks = [task(group=f"g{g}") for _ in range(per_group) for g in range(n_groups)]
    tasks += [task() for _ in range(100)]  # ungrouped work mixed in
    pg.submit(tasks)
    lock = threading.Lock()
    in_flight: set[str] = set()
    violations: list[str] = []
    order: dict[str, list[int]] = {}
    done = Counter()

    def worker(i):
        store = stores[i % len(stores)]
        idle = 0
        while idle < 3:
            claims = store.claim(f"w{i}", ClaimRequest(["default"], 4, chunk_size=chunk_size))
            if not claims:
                idle += 1
                store.wait_for_work(0.05)
                continue
            idle = 0
            with lock:
                for c in claims:
                    if c.group is None:
                        continue
                    if c.group in in_flight:
                        violations.append(c.group)
                    in_flight.add(c.group)
                    order.setdefault(c.group, []).extend(t.id for t in c.tasks)
            outcomes = []
            for c in claims:
                for n, t in enumerate(c.tasks):
                    started = {} if n == 0 else {"attempt": 1, "started_at": time.time()}
                    outcomes.append(Outcome(t.id, c.token, t.version, State.SUCCESS, **started))
            with lock:  # leave the group before its completion becomes visible
                for c in claims:
                    in_flight.discard(c.group)
            assert all(store.complete(outcomes))
            done[i] += len(outcomes)
        # the queue may look empty while other workers still hold chunks

    run_concurrently(8, worker)
    assert violations == []
    assert pg.counts() == {"SUCCESS": len(tasks)}
    for group, ids in order.items():
        assert ids == sorted(ids), f"{group} ran out of order"
        assert len(ids) == per_group


def test_no_group_ever_has_two_running_tasks_in_the_database(pg, stores):
    pg.submit([task(group=f"g{g % 10}") for g in range(300)])
    stop = threading.Event()
    worst: list[int] = []

    def watcher():
        import psycopg

        with psycopg.connect(pg.url, autocommit=True) as conn:
            while not stop.is_set():
                row = conn.execute(
                    "SELECT coalesce(max(n), 0) FROM (SELECT count(DISTINCT lease_token) AS n "
                    "FROM corral_tasks WHERE status = 'RUNNING' GROUP BY group_key) x"
                ).fetchone()
                worst.append(row[0])

    w = threading.Thread(target=watcher)
    w.start()
    try:

        def worker(i):
            store = stores[i % len(stores)]
            for _ in range(200):
                claims = store.claim(f"w{i}", ClaimRequest(["default"], 3))
                if not claims:
                    if store.counts().get("PENDING", 0) == 0:
                        return
                    continue
                store.complete([Outcome(t.id, c.token, t.version, State.SUCCESS) for c in claims for t in c.tasks])

        run_concurrently(8, worker)
    finally:
        stop.set()
        w.join(10)
    assert worst and max(worst) <= 1
    assert pg.counts() == {"SUCCESS": 300}


def test_named_limit_holds_across_store_instances(pg, pg_url, stores):
    """The cap is counted where it matters, in the database: each worker,
    while it holds what it claimed, counts the RUNNING rows under the limit.
    (A count the workers keep themselves could drop a claim before its row
    ends and so miss an overshoot.)"""
    import psycopg

    pg.set_limit(LimitSpec("api", concurrency=2))
    pg.submit([task(limits=("api",)) for _ in range(40)] + [task() for _ in range(40)])
    running_under_limit = "SELECT count(*) FROM corral_tasks WHERE status = 'RUNNING' AND 'api' = ANY(limits)"
    peaks: list[int] = []
    limited: list[int] = []

    def worker(i):
        store = stores[i % len(stores)]
        idle = 0
        with psycopg.connect(pg_url, autocommit=True) as db:
            while idle < 5:
                claims = store.claim(f"w{i}", ClaimRequest(["default"], 5))
                if not claims:
                    idle += 1
                    store.wait_for_work(0.05)
                    continue
                idle = 0
                mine = [t.id for c in claims for t in c.tasks if "api" in t.limits]
                if mine:
                    limited.extend(mine)
                    peaks.append(db.execute(running_under_limit).fetchone()[0])
                threading.Event().wait(0.002)  # the workload
                store.complete([Outcome(t.id, c.token, t.version, State.SUCCESS) for c in claims for t in c.tasks])

    run_concurrently(6, worker)
    assert len(limited) == 40  # every claim of a limited task looked, holding it
    assert 1 <= min(peaks) and max(peaks) <= 2, Counter(peaks)
    assert pg.counts() == {"SUCCESS": 80}
    assert pg.limit_usage() == {}  # a limit with no claim is absent


def test_wait_for_work_wakes_on_submit_from_another_instance(pg, pg_url):
    producer = open_store(pg_url)
    try:
        pg.claim("w", ClaimRequest(["default"], 1))
        pg.wait_for_work(5)  # first call: returns once LISTEN is in place
        timeout = 30.0
        woke: list[float] = []
        got: list[int] = []

        def consumer():
            start = time.monotonic()
            while time.monotonic() - start < timeout:
                claims = pg.claim("w", ClaimRequest(["default"], 1))
                if claims:
                    got.append(claims[0].tasks[0].id)
                    woke.append(time.monotonic() - start)
                    return
                pg.wait_for_work(timeout)

        t = threading.Thread(target=consumer)
        t.start()
        (tid,) = [r.id for r in producer.submit([task()])]
        t.join(timeout + 5)
        assert got == [tid]
        # a wake-up, not the polling fallback: far before the wait's timeout
        assert woke[0] < timeout / 3
    finally:
        producer.close()


def test_two_waiting_threads_of_one_process_both_wake(pg, pg_url):
    """One thread waits on the listening connection, the other for its word."""
    producer = open_store(pg_url)
    try:
        pg.wait_for_work(5)  # LISTEN in place
        timeout = 30.0
        barrier = threading.Barrier(3)
        woke: list[float] = []

        def waiter():
            pg.claim("w", ClaimRequest(["default"], 1))  # nothing yet; remembers what it has seen
            barrier.wait()
            start = time.monotonic()
            pg.wait_for_work(timeout)
            woke.append(time.monotonic() - start)

        threads = [threading.Thread(target=waiter) for _ in range(2)]
        for t in threads:
            t.start()
        barrier.wait()
        wait_for(lambda: pg._listen_lock.locked(), timeout=10, message="one thread listens")
        producer.submit([task()])
        for t in threads:
            t.join(timeout + 5)
        assert len(woke) == 2 and max(woke) < timeout / 3, woke
    finally:
        producer.close()


def test_claims_between_waits_run_on_the_listening_connection(pg):
    """The pool (two connections) is left to the completer and the heartbeat:
    a claim made after a wait that timed out does not ask it for a connection."""
    pg.wait_for_work(5)  # LISTEN in place
    pg.wait_for_work(0.05)  # nothing came
    before = pg._pool.get_stats().get("requests_num", 0)
    assert pg.claim("w", ClaimRequest(["default"], 1)) == []
    assert pg._pool.get_stats().get("requests_num", 0) == before


def test_a_notification_that_arrives_during_a_claim_wakes_the_next_wait(pg, pg_url):
    """Work submitted while the listening connection runs a claim is not lost."""
    producer = open_store(pg_url)
    try:
        pg.wait_for_work(5)  # LISTEN in place
        pg.wait_for_work(0.05)

        def claim_after_a_submit(conn):
            producer.submit([task()])  # its NOTIFY reaches this connection during the next statement
            conn.execute("SELECT 1")
            return []

        pg._run_listening(claim_after_a_submit)
        start = time.monotonic()
        pg.wait_for_work(30)
        assert time.monotonic() - start < 10
    finally:
        producer.close()


def test_wait_for_work_times_out_without_work(pg):
    pg.wait_for_work(5)  # start listening
    pg.claim("w", ClaimRequest(["default"], 1))
    start = time.monotonic()
    pg.wait_for_work(0.2)
    assert time.monotonic() - start >= 0.15


def test_unreachable_server_is_store_unavailable():
    with pytest.raises(StoreUnavailable) as info:
        open_store("postgresql://postgres@127.0.0.1:1/nothing")
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith("cannot connect to postgresql://postgres@127.0.0.1:1/nothing")


def test_password_is_not_shown_in_errors():
    with pytest.raises(StoreUnavailable) as info:
        open_store("postgresql://bob:s3cret@127.0.0.1:1/nothing")
    assert "s3cret" not in str(info.value)


def test_unparsable_url_is_store_unavailable():
    with pytest.raises(StoreUnavailable) as info:
        open_store("postgresql://127.0.0.1:notaport/db")
    assert "\n" not in str(info.value)


def test_concurrent_migrate_from_many_threads(pg_empty_url):
    def boot(i):
        s = open_store(pg_empty_url)
        try:
            s.migrate()
            s.migrate()  # idempotent
            return s.submit([task()])[0].id
        finally:
            s.close()

    ids = run_concurrently(6, boot)
    assert sorted(ids) == list(range(min(ids), min(ids) + 6))


def test_reconnects_after_connections_are_killed(pg, pg_admin_url):
    import psycopg

    pg.submit([task()])
    assert pg.counts() == {"PENDING": 1}
    dbname = pg.url.rsplit("/", 1)[1]
    with psycopg.connect(pg_admin_url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (dbname,),
        )
    # the pool's connections are dead now; the next calls must carry on
    claims = pg.claim("w", ClaimRequest(["default"], 5))
    assert len(claims) == 1
    assert pg.complete([Outcome(t.id, c.token, t.version, State.SUCCESS) for c in claims for t in c.tasks]) == [True]


def test_claim_takes_at_most_max_units_with_many_ready(pg):
    pg.submit([task(priority=p % 3) for p in range(500)])
    claims = pg.claim("w", ClaimRequest(["default"], 37))
    assert len(claims) == 37
    prios = [c.tasks[0].priority for c in claims]
    assert prios == sorted(prios, reverse=True)
    assert all(p == 2 for p in prios)


def test_active_counts_read_partial_indexes_only(pg):
    """Backpressure and drain ask for the unfinished states on every submit:
    the query must be answerable from the partial indexes alone."""
    pg.submit([task() for _ in range(3)] + [task(group="g") for _ in range(2)])
    pg.claim("w", ClaimRequest(["default"], 1))

    def plan(conn):
        with conn.transaction():
            conn.execute("SET LOCAL enable_seqscan = off")
            return "\n".join(r[0] for r in conn.execute("EXPLAIN " + pg._q["active_counts"]))

    text = pg._run(plan)
    assert "Seq Scan" not in text, text
    assert pg.active_counts() == {"PENDING": 4, "RUNNING": 1}


# ---- group heads kept in the rows ------------------------------------------------------


def test_a_group_fed_while_its_last_task_finishes_never_sticks(pg, stores):
    """Submit into a group at the moment its only task completes, from another
    store instance, in many groups at once: every new task must be claimable
    (each side refreshes the group's head after the other, never neither)."""
    groups = [f"race{i}" for i in range(40)]
    pg.submit([task(group=g) for g in groups])
    claims = pg.claim("w", ClaimRequest(["default"], len(groups)))
    assert len(claims) == len(groups)
    by_group = {c.group: c for c in claims}

    def side(i):
        g = groups[i // 2]
        if i % 2 == 0:
            c = by_group[g]
            t = c.tasks[0]
            assert stores[1].complete([Outcome(t.id, c.token, t.version, State.SUCCESS)]) == [True]
        else:
            stores[2].submit([task(group=g)])

    run_concurrently(2 * len(groups), side)
    again = pg.claim("w", ClaimRequest(["default"], 2 * len(groups)))
    assert sorted(c.group for c in again) == sorted(groups)


def test_a_claim_never_waits_for_a_group_lock_while_holding_its_tasks(pg, pg_url):
    """A head refresh locks a group's row and then its tasks; a claim holds
    the tasks when it marks the group's turn. Had the claim waited for the
    row, the two would deadlock (two workers each stalled a second until the
    server broke the cycle): the claim must finish while the row is held."""
    import psycopg

    pg.submit([task(group="g"), task(group="g")])
    holder = psycopg.connect(pg_url)
    try:
        holder.execute("SELECT 1 FROM corral_groups WHERE group_key = 'g' FOR UPDATE")
        got: list = []
        t = threading.Thread(target=lambda: got.append(pg.claim("w", ClaimRequest(["default"], 1))), daemon=True)
        t.start()
        t.join(10)
        assert got, "the claim waited for the group row a refresher holds"
        assert [c.group for c in got[0]] == ["g"]
    finally:
        holder.rollback()
        holder.close()
        t.join(10)


def test_claims_find_heads_among_many_groups_in_round_robin_order(pg):
    pg.submit([task(group=f"user{i}") for i in range(2000)] + [task(group="user0") for _ in range(3)])
    first = pg.claim("w", ClaimRequest(["default"], 2000))
    assert len(first) == 2000 and len({c.group for c in first}) == 2000
    c = next(c for c in first if c.group == "user0")
    t = c.tasks[0]
    assert pg.complete([Outcome(t.id, c.token, t.version, State.SUCCESS)]) == [True]
    nxt = pg.claim("w", ClaimRequest(["default"], 10))
    assert [x.group for x in nxt] == ["user0"]


def test_migrating_a_version_1_database_flags_its_group_heads(pg_empty_url):
    import psycopg

    from corral.stores.sql import load

    q = load("postgres")
    with psycopg.connect(pg_empty_url, autocommit=True) as conn:  # the schema as version 1 left it
        conn.execute(q["schema_version_table"])
        conn.execute(q["migration_0001"])
        conn.execute(q["set_schema_version"], {"v": 1})
        conn.execute(
            "INSERT INTO corral_groups (group_key) VALUES ('a'), ('b');"
            "INSERT INTO corral_tasks (name, args, status, group_key, created_at, run_at, finished_at) VALUES"
            " ('t', '{}', 'SUCCESS', 'a', 0, 0, 1), ('t', '{}', 'PENDING', 'a', 0, 0, NULL),"
            " ('t', '{}', 'PENDING', 'a', 0, 0, NULL), ('t', '{}', 'RUNNING', 'b', 0, 0, NULL),"
            " ('t', '{}', 'PENDING', 'b', 0, 0, NULL), ('t', '{}', 'PENDING', NULL, 0, 0, NULL)"
        )
    s = open_store(pg_empty_url)
    try:
        s.migrate()
        got = s.claim("w", ClaimRequest(["default"], 10))
        # a's first queued task, and the free one; b waits for its running task
        assert sorted(t.id for c in got for t in c.tasks) == [2, 6]
    finally:
        s.close()


@pytest.mark.parametrize("version", [4, 5, 6, 7])
def test_an_older_database_gains_both_flow_control_migrations(pg_empty_url, version):
    """A database at version 4 (before flow control) takes migrations 0005
    (rates, snoozes, breakers), 0006 (dead letters, fleet level, events),
    0007 (the retry path's index) and every later one (periodic schedules,
    batch settings, graph columns, ...) in order; a newer one the rest."""
    import psycopg

    from corral.core.breaker import BreakerConfig, BreakerState
    from corral.stores.base import FleetLevel
    from corral.stores.postgres import SCHEMA_VERSION
    from corral.stores.sql import load

    q = load("postgres")
    with psycopg.connect(pg_empty_url, autocommit=True) as conn:
        conn.execute(q["schema_version_table"])
        for n in range(1, version + 1):
            conn.execute(q[f"migration_000{n}"])
        conn.execute(q["set_schema_version"], {"v": version})
        conn.execute(
            "INSERT INTO corral_tasks (name, args, status, created_at, run_at) VALUES ('t', '{}', 'PENDING', 0, 0)"
        )
    s = open_store(pg_empty_url)
    try:
        s.migrate()
        with psycopg.connect(pg_empty_url, autocommit=True) as conn:
            assert conn.execute(q["schema_version"]).fetchone()[0] == SCHEMA_VERSION
            assert conn.execute("SELECT to_regclass('corral_batches') IS NOT NULL").fetchone()[0]
            ranked = "SELECT indexname, indexdef FROM pg_indexes WHERE indexname LIKE 'corral_tasks_ready_%%'"
            defs = dict(conn.execute(ranked).fetchall())
            for name in ("corral_tasks_ready_fresh", "corral_tasks_ready_heads", "corral_tasks_ready_retry"):
                assert "60" in defs[name] and "DESC" not in defs[name], defs[name]  # the ageing rank
            assert "corral_tasks_ready_free" not in defs  # one index per claim path, by exact status
            dashboard = "SELECT count(*) FROM pg_indexes WHERE indexname IN ("
            dashboard += "'corral_tasks_finished', 'corral_tasks_trace', 'corral_tasks_group_done',"
            dashboard += " 'corral_tasks_batch_status')"
            assert conn.execute(dashboard).fetchone()[0] == 4
            gone = "SELECT count(*) FROM pg_indexes WHERE indexname = 'corral_tasks_group_all'"
            assert conn.execute(gone).fetchone()[0] == 0  # every grouped task's index (versions 14-21)
            tables = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE tablename LIKE 'corral_%'")}
            assert {"corral_breakers", "corral_breaker_events", "corral_fleet", "corral_events"} <= tables
            assert {"corral_schedules", "corral_schedule_ticks"} <= tables
            assert conn.execute("SELECT count(*) FROM pg_indexes WHERE indexname = 'corral_tasks_dead'").fetchone()[0]
        (rec,) = s.list_tasks(TaskFilter())
        assert rec.snoozes == 0
        assert (rec.ref, rec.on_upstream_failure) == (None, "cancel")
        s.set_limit(LimitSpec("api", rate="1/m", burst=1))
        s.set_breaker("t", BreakerConfig())
        s.force_breaker("t", BreakerState.OPEN, "test")
        assert s.claim("w", ClaimRequest(["default"], 5)) == []  # the breaker holds the task
        s.force_breaker("t", BreakerState.CLOSED, "test")
        (c,) = s.claim("w", ClaimRequest(["default"], 5))
        t = c.tasks[0]
        assert s.complete([Outcome(t.id, t.lease_token, t.version, State.FAILED, error="boom")]) == [True]
        assert [d.id for d in s.dead_letters()] == [rec.id]
        assert s.set_fleet_level(FleetLevel(1, True, None, "test"), auto=False, event="{}")
        assert s.fleet_level().level == 1 and len(s.events("level")) == 1
    finally:
        s.close()


@pytest.mark.parametrize("share", [None, 0.25])
def test_a_claim_reads_its_own_path_on_a_table_with_no_statistics(pg_own_url, share):
    """A queue just filled has no planner statistics yet. A plain claim, with
    or without a retry share, must still read fresh work and retries from
    their own indexes: touching a few rows, not every queued one."""
    import json

    import psycopg

    s = open_store(pg_own_url)
    try:
        s.migrate()
        s.submit([task() for _ in range(3000)])
        params = dict(
            queues=["default"],
            all_names=True,
            names=[],
            chunk=1,
            lease=30.0,
            worker="w",
            only_retries=False,
            share=share,
            cap=None,
            most=2**31 - 1,
            solo=[],
            prefetch=False,
            n=8,
        )
        with psycopg.connect(pg_own_url) as conn:
            plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + s._q["claim_plain"], params).fetchone()[0]
            conn.rollback()
        removed = []

        def walk(node):
            removed.append(node.get("Rows Removed by Filter", 0))
            for child in node.get("Plans", ()):
                walk(child)

        walk((plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"])
        assert sum(removed) < 100, removed
    finally:
        s.close()


def test_a_retry_after_a_backoff_wakes_no_worker_but_one_due_now_does(pg_url):
    """Workers are woken when something became claimable. A retry due in a
    minute is not: a notification for it only has every worker claim nothing.
    Notifications arrive in commit order, so a marker sent after the write
    shows whether the write sent one."""
    import psycopg

    s = open_store(pg_url)
    try:
        s.migrate()
        s.submit([task(), task()])
        claims = s.claim("w", ClaimRequest(["default"], 2))
        later, now = [t for c in claims for t in c.tasks]
        tokens = {t.id: c.token for c in claims for t in c.tasks}
        with psycopg.connect(pg_url, autocommit=True) as listener:
            listener.execute("LISTEN corral_work")

            def first_after(outcome):
                s.complete([outcome])
                listener.execute("SELECT pg_notify('corral_work', 'marker')")
                return next(listener.notifies(timeout=10)).payload

            far = Outcome(later.id, tokens[later.id], later.version, State.RETRYING, run_at=time.time() + 60)
            assert first_after(far) == "marker"
            due = Outcome(now.id, tokens[now.id], now.version, State.RETRYING, run_at=time.time() - 1)
            assert first_after(due) == "default:g"
    finally:
        s.close()


def test_sessions_never_compile_statements_with_jit(pg):
    """A generic plan's cost estimate can pass the server's JIT thresholds
    (a table without statistics counts as hundreds of rows); compiling then
    took 0.7 s of a 2 ms claim probe, on every call."""
    with pg._pool.connection() as conn:
        assert conn.execute("SHOW jit").fetchone()[0] == "off"
        assert conn.execute("SHOW plan_cache_mode").fetchone()[0] == "force_generic_plan"


def test_the_task_table_is_vacuumed_after_a_small_share_of_changes(pg):
    """Each claim and completion leaves a dead row version that claims step
    over until a vacuum; PostgreSQL's default waits for a fifth of the table."""
    with pg._pool.connection() as conn:
        (options,) = conn.execute("SELECT reloptions FROM pg_class WHERE relname = 'corral_tasks'").fetchone()
    assert "autovacuum_vacuum_scale_factor=0.01" in options
    assert "autovacuum_analyze_scale_factor=0.02" in options


def test_a_store_warns_of_old_planner_statistics_on_status(pg_own_url, caplog):
    """Statistics an ANALYZE took on the status column before the column
    stopped taking them can make a claim read the whole table: opening the
    store says so, and says nothing once they are gone (or were never taken)."""
    import logging

    import psycopg

    caplog.set_level(logging.WARNING, logger="corral.store")
    pg = open_store(pg_own_url)  # a database of its own: no statistics an earlier test took
    try:
        pg.migrate()
        pg.submit([task() for _ in range(50)])
        pg.migrate()
        assert "planner statistics" not in caplog.text  # a new database has none
        with psycopg.connect(pg_own_url, autocommit=True) as conn:
            # as an older corral left it: statistics taken, then the column stopped
            conn.execute("ALTER TABLE corral_tasks ALTER COLUMN status SET STATISTICS 100")
            conn.execute("ANALYZE corral_tasks")
            conn.execute("ALTER TABLE corral_tasks ALTER COLUMN status SET STATISTICS 0")
        pg.migrate()
        assert "corral_tasks.status still has planner statistics" in caplog.text
        caplog.clear()
        with psycopg.connect(pg_own_url, autocommit=True) as conn:
            conn.execute(
                "DELETE FROM pg_statistic WHERE starelid = 'corral_tasks'::regclass AND staattnum = "
                "(SELECT attnum FROM pg_attribute WHERE attrelid = 'corral_tasks'::regclass AND attname = 'status')"
            )
        pg.migrate()
        assert "planner statistics" not in caplog.text
    finally:
        pg.close()


def test_a_claim_walks_the_claim_order_index_after_the_table_is_analyzed(pg_own_url):
    """Once ANALYZE has sized a full table (autovacuum does it in a busy
    run), the claim's generic plan must still walk fresh work in claim order
    and stop after the rows it takes, not read and sort every queued task on
    each claim (the claim of four took 9 ms before an ANALYZE and 45 ms
    after, with 20 000 queued)."""
    import psycopg

    from corral.stores.postgres import SESSION_OPTIONS, _claim_params

    s = open_store(pg_own_url)
    try:
        s.migrate()
        s.submit([task() for _ in range(3000)])
        s.submit([task(group=f"g{i % 30}") for i in range(300)])
        params = {**_claim_params("w", ClaimRequest(("default",))), "n": 4, "allowed": []}
        with psycopg.connect(pg_own_url, autocommit=True, options=SESSION_OPTIONS) as conn:
            conn.execute("ANALYZE corral_tasks")

            def fresh_rows_read() -> int:
                conn.execute("SELECT pg_stat_force_next_flush()")
                return conn.execute(
                    "SELECT idx_tup_read FROM pg_stat_user_indexes WHERE indexrelname = 'corral_tasks_ready_fresh'"
                ).fetchone()[0]

            before = fresh_rows_read()
            with conn.transaction(force_rollback=True):
                got = conn.execute(s._q["claim"], params, prepare=True).fetchall()
            assert len(got) == 4
            assert fresh_rows_read() - before < 100
    finally:
        s.close()


def _rows_made(plan) -> int:
    """Rows all the nodes of an EXPLAIN ANALYZE plan (JSON) made, over all their loops."""
    import json

    root = (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]
    total, todo = 0, [root]
    while todo:
        node = todo.pop()
        total += node.get("Actual Rows", 0) * node.get("Actual Loops", 1)
        todo += node.get("Plans", ())
    return total


@pytest.mark.parametrize("statement", ["claim", "claim_plain", "claim_simple"])
def test_a_claim_of_many_takes_rows_in_proportion_after_an_analyze_saw_no_rows(pg_own_url, statement):
    """An ANALYZE (autovacuum's) while a big submit is not yet committed finds
    pages but no live row in them: the planner then takes the tasks and the
    groups for one row each. A claim joined what it took to the tasks and to
    the groups, and those joins became nested loops reading one side again
    for every row of the other: a claim of 1 000 groups made over a hundred
    million rows (2 000: minutes). It must make rows in proportion to the
    tasks it takes, whatever the statistics."""
    import psycopg

    from corral.stores.postgres import SESSION_OPTIONS, _claim_params

    n = 1000
    s = open_store(pg_own_url)
    try:
        s.migrate()
        if statement == "claim":
            tasks = [task(group=f"user{i}") for i in range(n)] + [task(group="user0") for _ in range(3)]
        elif statement == "claim_simple":
            s.set_limit(LimitSpec("cap", concurrency=1_000_000, per_key=True))
            tasks = [task(limits=(f"cap\x1fk{i}",)) for i in range(n + 3)]
        else:
            tasks = [task() for _ in range(n + 3)]
        with psycopg.connect(pg_own_url) as submitter:
            s.submit_in(submitter, tasks)
            with psycopg.connect(pg_own_url, autocommit=True) as conn:
                conn.execute("ANALYZE")
                (seen,) = conn.execute("SELECT reltuples FROM pg_class WHERE relname = 'corral_tasks'").fetchone()
                assert seen <= 0  # pages, but no row in them
            submitter.commit()
        if statement == "claim_simple":
            n = 50  # a claim of keyed work takes a slot's worth (its look-ahead is bounded), not the queue
        params = {**_claim_params("w", ClaimRequest(("default",), n)), "n": n, "allowed": [], "look": 2 * n}
        guard = " -c statement_timeout=60s"  # (so a failure is a message, not the run's timeout)
        with psycopg.connect(pg_own_url, autocommit=True, options=SESSION_OPTIONS + guard) as conn:
            with conn.transaction(force_rollback=True):
                try:
                    (plan,) = conn.execute(
                        "EXPLAIN (ANALYZE, FORMAT JSON) " + s._q[statement], params, prepare=True
                    ).fetchone()
                except psycopg.errors.QueryCanceled:
                    pytest.fail(f"the {statement} of {n} did not end within a minute")
        assert _rows_made(plan) < 100 * n
    finally:
        s.close()


def test_task_events_are_stored_narrow_and_read_with_the_tasks_fields(pg, pg_url):
    """A claim's and a completion's events store the task's id and states,
    not a JSON text made inside the statement (which cost every claim and
    completion, and made each row several times wider): the JSON is made
    when the stream is read, from the task's row, and says the same."""
    import psycopg

    (rec,) = pg.submit([task("narrow", group="g", batch="b")])
    (claim,) = pg.claim("w", ClaimRequest(["default"], 1))
    (t,) = claim.tasks
    assert pg.complete([Outcome(t.id, claim.token, t.version, State.FAILED, error="boom")]) == [True]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        stored = conn.execute(
            "SELECT kind, data, task_id, status, prior FROM corral_events WHERE task_id = %s ORDER BY id", (rec.id,)
        ).fetchall()
    assert [(k, d, s, p) for k, d, _, s, p in stored] == [
        ("submitted", "", "PENDING", None),
        ("started", "", "RUNNING", "PENDING"),
        ("failed", "", "FAILED", "RUNNING"),
    ]
    import json

    read = [e for e in pg.events(limit=50) if e.subject == f"task:{rec.id}"]
    failed = json.loads(next(e.data for e in read if e.kind == "failed"))
    assert failed == {
        "id": rec.id,
        "name": "narrow",
        "queue": "default",
        "status": "FAILED",
        "from": "RUNNING",
        "attempt": failed["attempt"],
        "group": "g",
        "batch": "b",
        "trace_id": failed["trace_id"],
        "error": "boom",
    }


def test_a_bounded_submit_far_from_the_bound_does_not_wait_for_another_in_flight(pg):
    """Bounded submits used to go in single file through their commits (about
    100 a second): one still in flight far from the bound holds none up now."""
    from corral.errors import QueueFull

    pg.submit([task() for _ in range(3)])
    with pg._pool.connection() as conn, conn.transaction():
        pg._admit(conn, 5, 100)  # another submitter's 5, counted but not committed
        done = threading.Event()
        worker = threading.Thread(target=lambda: (pg.submit([task()], max_queued=100), done.set()), daemon=True)
        worker.start()
        assert done.wait(30), "a bounded submit waited for another one far from the bound"
        # the one in flight is counted although its rows are not visible yet: 3 + 1 + 5 + 2 > 10
        with pytest.raises(QueueFull, match="bound 10"):
            pg.submit([task(), task()], max_queued=10)
        assert pg.submit([task()], max_queued=10)  # 3 + 1 + 5 + 1 = 10 fits
    assert sum(pg.active_counts().values()) == 5  # the 5 were never inserted


def test_racing_single_bounded_submits_fill_the_bound_exactly(pg, stores):
    """Many submitters of one task each, from four store instances at once,
    against a bound: exactly the room is taken, never more, never less."""
    from corral.errors import QueueFull

    pg.submit([task() for _ in range(10)])
    bound = 40

    def one(i: int) -> int:
        store = stores[i % len(stores)]
        stored = 0
        for _ in range(12):
            try:
                store.submit([task()], max_queued=bound)
                stored += 1
            except QueueFull:
                pass
        return stored

    got = run_concurrently(8, one)
    assert sum(got) == bound - 10
    assert sum(pg.active_counts().values()) == bound


def test_a_prune_takes_at_most_its_batch_after_an_analyze_saw_no_rows(pg_own_url):
    """Retention deletes at most ``limit`` tasks a pass. As ``id IN (SELECT ...
    LIMIT n FOR UPDATE SKIP LOCKED)``, statistics that saw no row gave a plan
    running the subquery again for each row of the table, each time taking the
    next n: one pass deleted every old task."""
    import psycopg

    s = open_store(pg_own_url)
    try:
        s.migrate()
        with psycopg.connect(pg_own_url) as submitter:
            s.submit_in(submitter, [task() for _ in range(200)])
            submitter.execute("UPDATE corral_tasks SET status = 'SUCCESS', finished_at = 1000.0")
            with psycopg.connect(pg_own_url, autocommit=True) as conn:
                conn.execute("ANALYZE")
                (seen,) = conn.execute("SELECT reltuples FROM pg_class WHERE relname = 'corral_tasks'").fetchone()
                assert seen <= 0  # pages, but no row in them
            submitter.commit()
        before = {"SUCCESS": 2000.0, "CANCELED": 2000.0, "FAILED": 2000.0, "TIMEOUT": 2000.0}
        assert s.prune(before, 2) == 2
        assert s.counts().get(State.SUCCESS, 0) == 198
    finally:
        s.close()

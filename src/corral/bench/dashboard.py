"""``corral bench dashboard``: how fast the dashboard's pages render on a big store.

Seeds a fresh store with N finished tasks in a few bulk statements (spread
over the last day, in batches of 1 000 and 2 000 groups, 3 % dead letters,
every task with a trace id and one in ten with a key), plus some live work
(pending grouped tasks, named limits, a breaker), starts the dashboard, and
fetches each page ``repeat`` times over HTTP, reporting p50 and max per page.
The SQL here seeds a benchmark; the store's own SQL is in corral/stores/sql.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from corral.core.breaker import BreakerConfig
from corral.core.cron import Schedule
from corral.core.minutes import QUEUE_ROW, MinuteStat, minute_of
from corral.core.model import LimitSpec, NewTask, WorkerInfo
from corral.core.stats import percentile
from corral.engine.heartbeat import HEALTH_EVENT
from corral.stores import open_store
from corral.stores.base import Store

BATCH = 1000
GROUPS = 2000
DAY = 86_400.0
CHUNK = 100_000

SQLITE_SEED = """
WITH RECURSIVE c(i) AS (SELECT ?1 UNION ALL SELECT i + 1 FROM c WHERE i < ?2)
INSERT INTO tasks (name, args, status, queue, attempt, max_retries, group_key, batch, idem_key, trace_id,
                   created_at, run_at, started_at, finished_at, error, version)
SELECT 'sync_sku', '{"args":[' || i || '],"kwargs":{}}',
       CASE WHEN i % 100 < 2 THEN 'FAILED' WHEN i % 100 = 2 THEN 'TIMEOUT' ELSE 'SUCCESS' END,
       'default', 1, 0, 'merchant-' || (i % ?3), 'batch-' || (i / ?4),
       CASE WHEN i % 10 = 0 THEN 'key-' || i END, printf('%032x', i),
       ?5 + i * ?6, ?5 + i * ?6, ?5 + i * ?6 + 0.01, ?5 + i * ?6 + 0.05 + (i % 7) * 0.01,
       CASE WHEN i % 100 < 3 THEN 'partner answered 503' END, 2
FROM c
"""

PG_SEED = """
INSERT INTO corral_tasks (name, args, status, queue, attempt, max_retries, group_key, batch, idem_key, trace_id,
                          created_at, run_at, ready_at, started_at, finished_at, error, version)
SELECT 'sync_sku', '{"args":[' || i || '],"kwargs":{}}',
       CASE WHEN mod(i, 100) < 2 THEN 'FAILED' WHEN mod(i, 100) = 2 THEN 'TIMEOUT' ELSE 'SUCCESS' END,
       'default', 1, 0, 'merchant-' || mod(i, %(groups)s), 'batch-' || (i / %(batch)s),
       CASE WHEN mod(i, 10) = 0 THEN 'key-' || i END, lpad(to_hex(i), 32, '0'),
       %(t0)s + i * %(step)s, %(t0)s + i * %(step)s, %(t0)s + i * %(step)s, %(t0)s + i * %(step)s + 0.01,
       %(t0)s + i * %(step)s + 0.05 + mod(i, 7) * 0.01,
       CASE WHEN mod(i, 100) < 3 THEN 'partner answered 503' END, 2
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS i
"""


#: Queued tasks submitted in one call.
SUBMIT_CHUNK = 2000


def queued_tasks(n: int, now: float) -> list[NewTask]:
    """``n`` queued tasks of the kinds a waiting list shows: grouped lines, a
    queue of plain ones, tasks held by a limit, tasks due later."""
    out = []
    for i in range(n):
        kind = i % 10
        if kind < 3:  # a line of a group: all but its head wait behind it
            out.append(NewTask(name="notify", args='{"args":[],"kwargs":{}}', group=f"merchant-{i % 200}"))
        elif kind < 5:  # held by a named limit
            out.append(
                NewTask(name="call_partner", args='{"args":[],"kwargs":{}}', queue="partner", limits=("partner",))
            )
        elif kind == 5:  # due later
            out.append(NewTask(name="sync_sku", args='{"args":[],"kwargs":{}}', queue="bulk", run_at=now + 3600))
        else:
            out.append(NewTask(name="sync_sku", args='{"args":[],"kwargs":{}}', queue="bulk"))
    return out


def seed(url: str, n: int, queued: int = 10_000, progress: Callable[[int, int], None] | None = None) -> Store:
    """Open ``url`` (fresh), write ``n`` finished tasks and ``queued`` queued ones
    (see :func:`queued_tasks`), a limit and a breaker; returns the open store."""
    store = open_store(url)
    store.migrate()
    now = store.now()
    t0, step = now - DAY, DAY / max(1, n)
    done = 0
    while done < n:
        lo, hi = done, min(n, done + CHUNK) - 1
        if url.startswith("sqlite"):
            con = store._con()  # type: ignore[attr-defined]
            with con:
                con.execute(SQLITE_SEED, (lo, hi, GROUPS, BATCH, t0, step))
        else:
            import psycopg

            with psycopg.connect(url) as conn:
                conn.execute(PG_SEED, {"lo": lo, "hi": hi, "groups": GROUPS, "batch": BATCH, "t0": t0, "step": step})
        done = hi + 1
        if progress:
            progress(done, n)
    store.set_limit(LimitSpec("partner", concurrency=20, rate="100/s"))
    live = queued_tasks(queued, store.now())
    for i in range(0, len(live), SUBMIT_CHUNK):
        store.submit(live[i : i + SUBMIT_CHUNK])
    seed_around(store, n)
    if not url.startswith("sqlite"):  # what autovacuum does to a table this size soon after
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE corral_tasks")
    store.set_breaker("partner", BreakerConfig())
    return store


#: Worker processes, schedules and health events the seeded store has.
WORKERS = 20
SCHEDULES = 20
HEALTH_EVENTS = 500


def seed_around(store: Store, n: int) -> None:
    """What the other pages read: a day of per-minute figures (as the sweeper's
    leader records them), workers (a few of them dead), schedules with a tick
    each, and workers' health events."""
    now = store.now()
    end = minute_of(now)
    per_minute = max(1, n // 1440)
    rows = []
    for minute in range(end - 86_400, end, 60):
        for queue, name, share in (("default", QUEUE_ROW, 1.0), ("default", "sync_sku", 1.0), ("bulk", QUEUE_ROW, 0.0)):
            done = int(per_minute * share)
            rows.append(
                MinuteStat(
                    minute, queue, name, done, done * 3 // 100, 3000 if queue == "bulk" else 0, 0.08, 0.11, 0.01, 0.2
                )
            )
    store.save_minute_stats(rows, end - 86_400)
    for i in range(WORKERS):
        store.report_worker(
            WorkerInfo(
                f"vm-{i}:{1000 + i}:w",
                f"vm-{i}",
                1000 + i,
                ("default", "bulk"),
                8,
                i % 8,
                "bench",
                5.0 if i % 5 else 0.001,
            )  # every fifth one's row is soon old: a dead worker
        )
    schedules = [Schedule(f"report-{i}", "sync_sku", f"{i % 60} * * * *", queue="bulk") for i in range(SCHEDULES)]
    store.save_schedules(schedules)
    for sched in schedules:
        store.fire_tick(sched, minute_of(now))
    for i in range(HEALTH_EVENTS):
        store.add_event(HEALTH_EVENT, f"vm-{i % WORKERS}:{1000 + i % WORKERS}:w", '{"unregistered":{}}')


def pages(n: int, queued: int = 10_000) -> list[str]:
    """Every page, every filter of the Tasks page, its sorts and deep pages (by
    keyset), the why column of waiting tasks, and the charts."""
    mid = max(1, n // 2)
    deep = max(1, n // 50)  # near the end of a newest-first walk
    q_mid = n + max(1, queued // 2)  # among the queued tasks
    trace, key, batch = f"{mid:032x}", f"key-{(mid // 10) * 10}", f"batch-{mid // BATCH}"
    # the seed's dead letters are its i % 100 < 3 (ids i + 1); the page five sixths of the way
    # through them starts after the id of the one before (by keyset, as its next link goes)
    deep_dead = (3 * (n // 100) + min(3, n % 100)) * 5 // 6
    dead_after = (deep_dead // 3) * 100 + deep_dead % 3
    return [
        "/",
        "/queues",
        "/groups",
        "/groups?offset=150",
        "/limits",
        "/batches",
        f"/batches?after=batch-{mid // BATCH}",
        f"/batches/{batch}",
        "/tasks",
        f"/tasks?after={mid}",
        f"/tasks?after={deep}",
        "/tasks?sort=age",
        f"/tasks?sort=age&after={mid}",
        "/tasks?sort=status",
        f"/tasks?sort=status&after=PENDING%3A{q_mid}",
        f"/tasks?sort=status&after=SUCCESS%3A{mid}",
        f"/tasks?sort=status&after=FAILED%3A{mid}",
        "/tasks?status=FAILED",
        f"/tasks?status=FAILED&after={mid}",
        f"/tasks?status=TIMEOUT&after={deep}",
        "/tasks?status=PENDING",
        f"/tasks?status=PENDING&after={q_mid}",
        "/tasks?status=PENDING&queue=partner",
        "/tasks?status=PENDING&group=merchant-7",
        "/tasks?status=RUNNING",
        "/tasks?status=WAITING",
        "/tasks?name=sync_sku",
        f"/tasks?name=sync_sku&after={mid}",
        "/tasks?name=notify",
        "/tasks?name=sync_sku&status=FAILED",
        "/tasks?queue=default",
        "/tasks?queue=bulk",
        f"/tasks?queue=default&status=TIMEOUT&after={mid}",
        "/tasks?group=merchant-7",
        f"/tasks?group=merchant-7&after={mid}",
        "/tasks?group=merchant-7&status=FAILED",
        f"/tasks?batch={batch}",
        f"/tasks?batch={batch}&status=FAILED",
        f"/tasks?key={key}",
        f"/tasks?trace={trace}",
        "/tasks?worker=vm-1%3A1001%3Aw",
        "/tasks?older=1h",
        "/tasks?older=23h",
        "/tasks?newer=10m&status=SUCCESS",
        "/tasks?older=6h&newer=12h&name=sync_sku",
        "/tasks?older=6h&newer=12h&status=FAILED&sort=age",
        "/tasks?newer=1h&group=merchant-7",
        "/tasks/bulk?status=FAILED&action=retry",
        f"/tasks/bulk?batch={batch}&action=retry",
        "/tasks/bulk?queue=bulk&action=cancel",
        f"/tasks/{mid}",
        f"/tasks/{q_mid}",
        "/dead",
        f"/dead?after={dead_after}",
        f"/dead?batch={batch}&after={mid}",
        f"/dead?batch={batch}",
        f"/search?q={trace}&by=trace",
        f"/search?q={key}&by=key",
        f"/search?q={batch}&by=batch",
        "/search?q=merchant-7&by=group",
        f"/search?q={trace}",
        f"/search?q={mid}",
        "/workers",
        "/api/workers",
        "/schedules",
        "/events",
        "/events?kind=failed",
        "/events?kind=worker.health",
        f"/events?subject={q_mid}",
        "/over-time",
        "/over-time?window=day",
        "/over-time?window=day&queue=default&name=sync_sku",
        "/metrics",
        "/api/snapshot",
    ]


def fetch(url: str) -> int:
    """GET ``url`` and read it whole; its status (an error status too)."""
    try:
        with urllib.request.urlopen(url, timeout=60) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        exc.read()
        return int(exc.code)


def time_pages(base: str, paths: list[str], repeat: int) -> list[dict[str, Any]]:
    """Fetch each page ``repeat`` times (its first fetch not counted: it warms
    the page's templates and the store's caches for it): p50 and max."""
    out = []
    for path in paths:
        times = []
        status = fetch(base + path)
        for _ in range(repeat):
            t = time.perf_counter()
            status = fetch(base + path)
            times.append(time.perf_counter() - t)
        times.sort()
        out.append(
            {
                "page": path,
                "status": status,
                "p50_ms": round(1000 * (percentile(times, 0.5, presorted=True) or 0.0), 1),
                "max_ms": round(1000 * times[-1], 1),
            }
        )
    return out


def measure(store: Store, n: int, queued: int, repeat: int) -> dict[str, Any]:
    """Start the dashboard over a seeded ``store`` and time its pages."""
    from corral.edges.dashboard import serve_background

    t = time.perf_counter()
    dash = serve_background(store)
    try:
        fetch(dash.url + "/api/snapshot")  # waits for the sampler's first look (the last hour of finishes)
        started = time.perf_counter() - t
        results = time_pages(dash.url, pages(n, queued), repeat)
    finally:
        dash.stop()
    return {"start_s": round(started, 2), "pages": results}


def run(
    url: str, n: int, repeat: int, queued: int = 10_000, progress: Callable[[int, int], None] | None = None
) -> dict[str, Any]:
    t = time.perf_counter()
    store = seed(url, n, queued, progress)
    seeded = time.perf_counter() - t
    try:
        timed = measure(store, n, queued, repeat)
    finally:
        store.close()
    return {"tasks": n, "queued": queued, "repeat": repeat, "seed_s": round(seeded, 1), **timed}

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
import urllib.request
from collections.abc import Callable
from typing import Any

from corral.core.breaker import BreakerConfig
from corral.core.model import LimitSpec, NewTask
from corral.core.stats import percentile
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


def seed(url: str, n: int, progress: Callable[[int, int], None] | None = None) -> Store:
    """Open ``url`` (fresh), write ``n`` finished tasks and some live work; returns the open store."""
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
    if not url.startswith("sqlite"):
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE corral_tasks")
    # live work: grouped and plain pending tasks, limits and a breaker
    live = [NewTask(name="notify", args='{"args":[],"kwargs":{}}', group=f"merchant-{i % 200}") for i in range(2000)]
    live += [NewTask(name="sync_sku", args='{"args":[],"kwargs":{}}', queue="bulk") for _ in range(1000)]
    store.submit(live)
    store.set_limit(LimitSpec("partner", concurrency=20, rate="100/s"))
    store.set_breaker("partner", BreakerConfig())
    return store


def pages(n: int) -> list[str]:
    mid = max(1, n // 2)
    return [
        "/",
        "/queues",
        "/groups",
        "/limits",
        "/batches",
        f"/batches/batch-{mid // BATCH}",
        "/tasks",
        f"/tasks?after={mid}",
        "/tasks?status=FAILED",
        f"/tasks?status=FAILED&after={mid}",
        f"/tasks?sort=age&after={mid}",
        "/tasks?sort=status",
        f"/tasks?sort=status&after=SUCCESS%3A{mid}",
        "/tasks?older=1h",
        "/tasks?newer=10m&status=SUCCESS",
        "/tasks?older=6h&newer=12h&name=sync_sku",
        "/tasks?worker=vm-1%3A1%3Aw",
        "/tasks/bulk?status=FAILED&action=retry",
        f"/tasks/bulk?batch=batch-{mid // BATCH}&action=retry",
        f"/tasks/{mid}",
        "/dead",
        f"/search?q={mid:032x}&by=trace",
        f"/search?q=key-{(mid // 10) * 10}&by=key",
        f"/search?q=batch-{mid // BATCH}&by=batch",
        "/search?q=merchant-7&by=group",
        f"/search?q={mid:032x}",
        "/workers",
        "/schedules",
        "/events",
        "/events?kind=failed",
        "/metrics",
        "/api/snapshot",
    ]


def time_pages(base: str, paths: list[str], repeat: int) -> list[dict[str, Any]]:
    out = []
    for path in paths:
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            with urllib.request.urlopen(base + path, timeout=60) as resp:
                resp.read()
                status = resp.status
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


def run(url: str, n: int, repeat: int, progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    from corral.edges.dashboard import serve_background

    t = time.perf_counter()
    store = seed(url, n, progress)
    seeded = time.perf_counter() - t
    try:
        t = time.perf_counter()
        dash = serve_background(store)
        with urllib.request.urlopen(dash.url + "/api/snapshot", timeout=120) as resp:
            resp.read()  # waits for the sampler's first look (the last hour of finishes)
        started = time.perf_counter() - t
        try:
            results = time_pages(dash.url, pages(n), repeat)
        finally:
            dash.stop()
    finally:
        store.close()
    return {"tasks": n, "repeat": repeat, "seed_s": round(seeded, 1), "start_s": round(started, 2), "pages": results}

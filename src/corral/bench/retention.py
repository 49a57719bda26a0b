"""``corral bench retention``: the PostgreSQL tasks table over a long steady run
with retention on.

Tasks are submitted at a steady ``--rate`` and run by an in-process worker
(each does nothing) whose sweeper leads and applies
``App(retention={"SUCCESS": --keep, ...})`` every ``--sweep`` seconds. Every
``--sample`` seconds the run reads, for ``corral_tasks``, PostgreSQL's
``n_live_tup`` and ``n_dead_tup`` (pg_stat_user_tables), the table's size
on disk with its indexes, the rows per state and the vacuums so far.

With retention on, live rows settle near ``rate x (keep + sweep)`` (what
finished within the age, plus what waits for the next pass) and stay there;
dead tuples rise and fall with autovacuum instead of growing; and the table's
size stops growing once vacuum's freed space is reused. With ``--keep off``
the same run shows the rows growing without end. Dead tuples are reclaimed
by autovacuum only: on a server where it is off (the report says so) they
grow in either case.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

STATS = """
SELECT n_live_tup, n_dead_tup, pg_total_relation_size(relid), autovacuum_count + vacuum_count
FROM pg_stat_user_tables WHERE relname = 'corral_tasks'
"""


def run(
    url: str,
    *,
    rate: float,
    duration: float,
    keep: float | None,
    sweep: float,
    sample: float,
    workers: int,
    on_sample: Callable[[dict[str, Any]], None] = lambda row: None,
) -> dict[str, Any]:
    """One run on the (fresh) PostgreSQL store ``url``; returns the samples."""
    import psycopg

    import corral

    retention: Any = {"SUCCESS": keep, "CANCELED": keep, "FAILED": keep, "TIMEOUT": keep} if keep else False
    app = corral.App(url, retention=retention)

    @app.task(name="noop")
    def noop(i: int) -> None:
        return None

    stop = threading.Event()
    submitted = 0

    def submitter() -> None:
        nonlocal submitted
        tick = 0.1
        per_tick = rate * tick
        owed = 0.0
        next_at = time.monotonic()
        while not stop.is_set():
            owed += per_tick
            n = int(owed)
            owed -= n
            if n:
                noop.submit_many([(submitted + k,) for k in range(n)])
                submitted += n
            next_at += tick
            stop.wait(max(0.0, next_at - time.monotonic()))

    app.start(workers, sweep_interval=sweep)
    feeder = threading.Thread(target=submitter, name="bench-submitter", daemon=True)
    t0 = time.monotonic()
    feeder.start()
    samples: list[dict[str, Any]] = []
    with psycopg.connect(url, autocommit=True) as conn:
        (autovacuum,) = conn.execute("SHOW autovacuum").fetchone()  # type: ignore[misc]
        try:
            while True:
                elapsed = time.monotonic() - t0
                live, dead, size, vacuums = conn.execute(STATS).fetchone() or (0, 0, 0, 0)
                counts = app.counts()
                row = {
                    "t_s": round(elapsed, 1),
                    "submitted": submitted,
                    "rows": sum(counts.values()),
                    "success_rows": counts.get("SUCCESS", 0),
                    "queued_rows": sum(counts.get(s, 0) for s in ("PENDING", "RETRYING", "RUNNING", "WAITING")),
                    "n_live_tup": live,
                    "n_dead_tup": dead,
                    "table_mb": round(size / 2**20, 2),
                    "vacuums": vacuums,
                }
                samples.append(row)
                on_sample(row)
                if elapsed >= duration:
                    break
                time.sleep(min(sample, max(0.0, duration - elapsed)) or sample)
        finally:
            stop.set()
            feeder.join(5.0)
            app.close(timeout=30.0)
    return {
        "scenario": "retention",
        "rate": rate,
        "duration_s": duration,
        "keep_s": keep,
        "sweep_s": sweep,
        "workers": workers,
        "expected_rows": round(rate * (keep + sweep)) if keep else None,
        "autovacuum": autovacuum,
        "samples": samples,
    }


def render(report: dict[str, Any], echo: Callable[[str], None]) -> None:
    keep = report["keep_s"]
    echo(
        f"retention on PostgreSQL: {report['rate']:g} tasks/s for {report['duration_s']:g} s, "
        f"keep {'off' if not keep else f'{keep:g} s'}, sweep every {report['sweep_s']:g} s"
        + (f" (expected plateau about {report['expected_rows']:,} rows)" if report["expected_rows"] else "")
    )
    head = (
        f"{'t s':>7} {'submitted':>10} {'rows':>8} {'SUCCESS':>8} {'live_tup':>9} {'dead_tup':>9} {'MB':>7} {'vac':>4}"
    )
    echo(head)
    for r in report["samples"]:
        echo(
            f"{r['t_s']:>7.0f} {r['submitted']:>10,} {r['rows']:>8,} {r['success_rows']:>8,} "
            f"{r['n_live_tup']:>9,} {r['n_dead_tup']:>9,} {r['table_mb']:>7.2f} {r['vacuums']:>4}"
        )

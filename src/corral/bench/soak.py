"""``corral bench soak``: steady single submits on PostgreSQL, with a phase in
the middle where the xmin horizon is pinned.

On a fresh PostgreSQL store, ``--workers`` ``corral worker`` processes of an
app with retention on (``--keep``, and ``--events-keep`` for the event stream; their
sweeper applies it) run tasks that
only record when they started (as in ``bench latency``); other processes
submit single tasks at a steady ``--rate`` for ``--duration`` (the schedule
and the marks are ``bench latency``'s). For ``--pin-minutes`` in the middle of
the run a session sits idle in a transaction that holds a transaction id
(so PostgreSQL's xmin horizon stays where it was: no vacuum or index scan
may remove what changed since), and ``--readers`` sessions scan the tasks
table in REPEATABLE READ transactions.

Every ``--sample`` seconds (a minute) a row: the phase; tasks started against
offered (a backlog that grows); pickup p50/p95 of the tasks that started in
the window (start less the return of the submit call; filled in at the end,
from the submitters' notes); the tasks
table's and its indexes' size; ``n_dead_tup``; the event stream's dead and
live rows and its size (table and indexes); and the claim's cost: index
entries of the claim-order index (``corral_tasks_ready_fresh``) read per
index scan and per task started (``pg_stat_user_indexes``), and the time of a
claim-shaped read of that index (``EXPLAIN ANALYZE``: the first ready row in
claim order from the start of the index, which is what a claim that keeps no
mark reads). With ``pg_stat_statements`` loaded, the mean ms of the claim
statements in the window too.
"""

from __future__ import annotations

import math
import os
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from corral.app import App
from corral.bench import latency as lat
from corral.edges.fleet import WorkerFleet, lazy_app

APP_SPEC = "corral.bench.soak:app"
#: the age the workers' retention keeps finished tasks (seconds)
KEEP_ENV = "CORRAL_BENCH_SOAK_KEEP"
#: the events the leader keeps (unset: the worker's own, 100 000)
EVENTS_KEEP_ENV = "CORRAL_BENCH_SOAK_EVENTS_KEEP"

TABLE_STATS = """
SELECT n_dead_tup, pg_relation_size(relid), pg_indexes_size(relid),
       pg_relation_size('corral_tasks_ready_fresh'),
       (SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelname = 'corral_tasks_ready_fresh'),
       (SELECT idx_tup_read FROM pg_stat_user_indexes WHERE indexrelname = 'corral_tasks_ready_fresh'),
       (SELECT count(*) FROM corral_tasks WHERE status = 'PENDING')
FROM pg_stat_user_tables WHERE relname = 'corral_tasks'
"""
#: the event stream's storage: the table, or its partitions (schema 49)
EVENT_STATS = """
SELECT coalesce(sum(n_dead_tup), 0), coalesce(sum(n_live_tup), 0), coalesce(sum(pg_total_relation_size(relid)), 0)
FROM pg_stat_user_tables
WHERE relid = 'corral_events'::regclass
   OR relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'corral_events'::regclass)
"""
#: a claim's read of the claim-order index from its start (no FOR UPDATE: it locks nothing)
CLAIM_SHAPE = """
EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)
SELECT t.id FROM corral_tasks t
WHERE t.status = 'PENDING' AND t.group_key IS NULL AND t.limits = '{}'::text[]
  AND t.run_at <= extract(epoch FROM now())::float8
ORDER BY (t.run_at - t.priority * 60::float8), t.id
LIMIT 1
"""
STATEMENTS = """
SELECT coalesce(sum(calls), 0), coalesce(sum(total_exec_time), 0) FROM pg_stat_statements
WHERE query LIKE '%%UPDATE corral_tasks t%%SET status = ''RUNNING''%%'
"""


def build_app(store: str | None = None) -> App:
    """The soak's app: ``bench latency``'s task, retention from ``$CORRAL_BENCH_SOAK_KEEP``."""
    keep = float(os.environ.get(KEEP_ENV, "60"))
    if os.environ.get(EVENTS_KEEP_ENV):  # a short run reaches the stream's trimming sooner
        from corral.maintenance import level_keeper

        level_keeper.EVENTS_KEEP = int(os.environ[EVENTS_KEEP_ENV])
    app = App(store, retention={"SUCCESS": keep, "CANCELED": keep, "FAILED": keep, "TIMEOUT": keep})
    app.task(name=lat.TASK)(lat.mark)
    return app


__getattr__ = lazy_app(build_app)


class Pin:
    """The pinned horizon: one session idle in a transaction holding an xid,
    and ``readers`` sessions scanning the tasks table in REPEATABLE READ."""

    def __init__(self, url: str, readers: int, pause: float = 1.0) -> None:
        import psycopg

        self.stop = threading.Event()
        self.idle = psycopg.connect(url)
        self.idle.execute("SELECT txid_current()")  # an xid: the horizon stays here till rollback
        self.scans = 0
        self.threads = [
            threading.Thread(target=self._reader, args=(url, pause), name=f"soak-reader-{k}", daemon=True)
            for k in range(readers)
        ]
        for t in self.threads:
            t.start()

    def _reader(self, url: str, pause: float) -> None:
        import psycopg

        with psycopg.connect(url) as conn:
            while not self.stop.is_set():
                with conn.transaction():
                    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                    conn.execute("SELECT status, count(*) FROM corral_tasks GROUP BY status").fetchall()
                    self.scans += 1
                self.stop.wait(pause)

    def release(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30.0)
        self.idle.rollback()
        self.idle.close()


def _claim_shape_ms(conn) -> float:
    (plan,) = conn.execute(CLAIM_SHAPE).fetchone()
    return round(float(plan[0]["Execution Time"]), 3)


def _phase(elapsed: float, pin_from: float, pin_to: float) -> str:
    if elapsed <= pin_from:
        return "clean"
    if elapsed <= pin_to:
        return "pinned"
    return "after"


def run(
    url: str,
    *,
    rate: float,
    duration: float,
    pin: float,
    readers: int,
    keep: float,
    sample: float,
    workers: int,
    concurrency: int | None,
    submitters: int | None,
    events_keep: int | None = None,
    on_sample: Callable[[dict[str, Any]], None] = lambda row: None,
) -> dict[str, Any]:
    """One run on the fresh PostgreSQL store ``url``; returns the samples."""
    import psycopg

    pin_from = max(0.0, (duration - pin) / 2)
    pin_to = pin_from + pin
    procs = submitters or lat.submitters_for(rate)
    samples: list[dict[str, Any]] = []
    sub: lat.Submits | None = None
    with tempfile.TemporaryDirectory() as d:
        marks = os.path.join(d, "marks")
        open(marks, "wb").close()
        os.environ[KEEP_ENV] = repr(keep)
        app = build_app(url)
        conn = psycopg.connect(url, autocommit=True)
        try:
            env = {lat.MARKS_ENV: marks, KEEP_ENV: repr(keep)}
            if events_keep is not None:
                env[EVENTS_KEEP_ENV] = str(events_keep)
            with WorkerFleet(APP_SPEC, url, workers, concurrency, env) as fl:
                fl.wait_ready()
                for k in range(lat.PROBES):
                    app.submit(lat.TASK, args=(lat.PROBE_BASE + k,))
                if lat._wait_marks(marks, lat.PROBES, fl, 60.0) < lat.PROBES:
                    raise RuntimeError("the workers did not run the warm-up tasks within 60 s")
                (statements,) = conn.execute(
                    "SELECT count(*) FROM pg_extension WHERE extname = 'pg_stat_statements'"
                ).fetchone()  # type: ignore[misc]
                result: dict[str, Any] = {}

                def feed() -> None:
                    try:
                        result["sub"] = lat.submit_from(url, rate, duration, procs)
                    except Exception as exc:  # reported by the sampling loop
                        result["error"] = exc

                feeder = threading.Thread(target=feed, name="soak-submit", daemon=True)
                feeder.start()
                # the schedule starts START_LEAD_S after the submitters are ready: wait for its first marks
                while lat.count_marks(marks) <= lat.PROBES and feeder.is_alive():
                    fl.check()
                    time.sleep(0.05)
                start_wall, t0 = time.time(), time.monotonic()
                offset = lat.PROBES * lat.REC.size
                pinned: Pin | None = None
                last = conn.execute(TABLE_STATS).fetchone() or (0,) * 7
                last_calls = conn.execute(STATEMENTS).fetchone() if statements else None
                k = 0
                while True:
                    k += 1
                    target = t0 + k * sample
                    while time.monotonic() < target:
                        fl.check()
                        if "error" in result:
                            raise RuntimeError(f"the submitters failed: {result['error']}")
                        elapsed = time.monotonic() - t0
                        if pinned is None and pin > 0 and pin_from <= elapsed < pin_to:
                            pinned = Pin(url, readers)
                        elif pinned is not None and elapsed >= pin_to:
                            pinned.release()
                            pinned = None
                        time.sleep(min(0.2, max(0.0, target - time.monotonic())))
                    elapsed = time.monotonic() - t0
                    with open(marks, "rb") as f:
                        f.seek(offset)
                        data = f.read()
                    whole = len(data) // lat.REC.size * lat.REC.size
                    offset += whole
                    started = sum(
                        1 for j in range(0, whole, lat.REC.size) if lat.REC.unpack_from(data, j)[0] < lat.PROBE_BASE
                    )
                    stats = conn.execute(TABLE_STATS).fetchone() or (0,) * 7
                    dead, heap, indexes, fresh, scans, tup_read, pending = stats
                    ev_dead, ev_live, ev_size = conn.execute(EVENT_STATS).fetchone() or (0, 0, 0)
                    d_scans, d_read = (scans or 0) - (last[4] or 0), (tup_read or 0) - (last[5] or 0)
                    row: dict[str, Any] = {
                        "t_s": round(elapsed),
                        "phase": _phase(elapsed - sample / 2, pin_from, pin_to),
                        "offered_per_s": round(rate, 1),
                        "started_per_s": round(started / sample, 1),
                        "pending": pending,
                        "pickup_p50_ms": None,  # from the submitters' notes, at the end
                        "pickup_p95_ms": None,
                        "table_mb": round(heap / 2**20, 1),
                        "indexes_mb": round(indexes / 2**20, 1),
                        "ready_fresh_mb": round(fresh / 2**20, 2),
                        "n_dead_tup": dead,
                        "events_dead": int(ev_dead),
                        "events_live": int(ev_live),
                        "events_mb": round(int(ev_size) / 2**20, 1),
                        "index_reads_per_scan": round(d_read / d_scans, 1) if d_scans else None,
                        "index_reads_per_task": round(d_read / started, 1) if started else None,
                        "claim_shape_ms": _claim_shape_ms(conn),
                    }
                    if statements:
                        calls = conn.execute(STATEMENTS).fetchone()
                        n, ms_total = calls[0] - last_calls[0], calls[1] - last_calls[1]  # type: ignore[index]
                        row["claim_mean_ms"] = round(ms_total / n, 3) if n else None
                        last_calls = calls
                    last = stats
                    samples.append(row)
                    on_sample(row)
                    if elapsed >= duration - 1e-6 or not feeder.is_alive():
                        break
                feeder.join(lat.DRAIN_S + 60.0)
                if pinned is not None:
                    pinned.release()
                sub = result.get("sub")
                if sub is not None:
                    lat._wait_marks(marks, lat.PROBES + len(sub), fl, lat.DRAIN_S)
            starts, duplicates = lat.read_marks(marks)
        finally:
            conn.close()
            app.close()
    phases: dict[str, Any] = {}
    if sub is not None:
        # pickup per phase from the submitters' notes: start less the submit call's return
        split: dict[str, list[float]] = {"clean": [], "pinned": [], "after": []}
        for j in range(len(sub)):
            s = starts.get(sub.ids[j])
            split[_phase(sub.before[j] - start_wall, pin_from, pin_to)].append(
                math.inf if s is None else s - sub.after[j]
            )
        for name, values in split.items():
            values.sort()
            if values:
                phases[name] = {
                    "tasks": len(values),
                    "missing": sum(1 for v in values if math.isinf(v)),
                    "pickup_p50_ms": lat._pct_ms(values, 0.50),
                    "pickup_p95_ms": lat._pct_ms(values, 0.95),
                }
        for k, row in enumerate(samples):
            lo = start_wall + k * sample if k else -math.inf
            hi = start_wall + (k + 1) * sample
            values = sorted(
                math.inf if sub.ids[j] not in starts else starts[sub.ids[j]] - sub.after[j]
                for j in range(len(sub))
                if lo <= sub.before[j] < hi
            )
            if values:
                row["pickup_p50_ms"] = lat._pct_ms(values, 0.50)
                row["pickup_p95_ms"] = lat._pct_ms(values, 0.95)
    return {
        "scenario": "soak",
        "rate": rate,
        "duration_s": duration,
        "pin_s": pin,
        "pin_from_s": pin_from,
        "readers": readers,
        "keep_s": keep,
        "events_keep": events_keep,
        "workers": workers,
        "submitters": procs,
        "submitted": len(sub) if sub is not None else None,
        "duplicates": duplicates,
        "pg_stat_statements": bool(statements),
        "load_average": [round(v, 2) for v in os.getloadavg()],
        "phases": phases,
        "samples": samples,
    }


def sample_line(r: dict[str, Any]) -> str:
    def f(v: Any, fmt: str = ",.1f") -> str:
        return "—" if v is None else format(v, fmt)

    return (
        f"{r['t_s']:>6} {r['phase']:>6} {f(r['started_per_s'])!s:>8}/{r['offered_per_s']:<6g} {r['pending']:>7,}"
        f" {f(r['pickup_p50_ms'])!s:>8} {f(r['pickup_p95_ms'])!s:>8} {r['table_mb']:>7.1f} {r['indexes_mb']:>7.1f}"
        f" {r['n_dead_tup']:>9,} {r['events_dead']:>9,} {r['events_live']:>9,} {r['events_mb']:>6.1f}"
        f" {f(r['index_reads_per_scan'])!s:>9} {f(r['index_reads_per_task'])!s:>9}"
        f" {r['claim_shape_ms']:>8.2f}" + (f" {f(r.get('claim_mean_ms'), '.3f')!s:>8}" if "claim_mean_ms" in r else "")
    )


HEAD = (
    f"{'t s':>6} {'phase':>6} {'started/offered':>15} {'pending':>7} {'p50 ms':>8} {'p95 ms':>8} {'heap MB':>7}"
    f" {'idx MB':>7} {'dead_tup':>9} {'ev dead':>9} {'ev live':>9} {'ev MB':>6}"
    f" {'idx/scan':>9} {'idx/task':>9} {'shape ms':>8}"
)


def render(report: dict[str, Any], echo: Callable[[str], None]) -> None:
    echo(
        f"soak on PostgreSQL: {report['rate']:g} single submits/s ({report['submitters']} processes) for"
        f" {report['duration_s']:g} s into {report['workers']} x `corral worker`, retention {report['keep_s']:g} s"
        f" (events: the newest {report['events_keep'] or 100_000:,});"
        f" horizon pinned from {report['pin_from_s']:g} s for {report['pin_s']:g} s ({report['readers']} readers);"
        f" load average {report['load_average']}"
    )
    echo(HEAD + (f" {'claim ms':>8}" if report["pg_stat_statements"] else ""))
    for r in report["samples"]:
        echo(sample_line(r))
    for name, p in report["phases"].items():
        echo(
            f"{name}: {p['tasks']:,} tasks, pickup p50 {p['pickup_p50_ms']} ms, p95 {p['pickup_p95_ms']} ms,"
            f" {p['missing']} never started"
        )

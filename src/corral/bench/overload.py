"""``corral bench overload``: offered load above what the fleet can run.

Per store, on a fresh store, three phases:

1. **Capacity.** ``--workers`` ``corral worker corral.bench.overload:app``
   processes (the command's defaults) are started and warmed up;
   ``--capacity-tasks`` tasks of ``--task-ms`` (a sleep) are submitted in
   bulk, and the rate at which they start, from the 10th to the 90th
   percentile of their starts, is the fleet's capacity for that task shape.
2. **Overload.** A second fleet, started on the same store with the queue
   bound ``App(max_queued=)`` (``--max-queued``; default: ``--bound-seconds``
   of the capacity), so the degradation level has its backlog signal; then
   ``--factor`` times the capacity is offered for ``--seconds`` as single
   submits from submitting processes that run no worker (the submitters of
   ``corral bench latency``, open-loop). A submit the bound refuses
   (``QueueFull``) is counted, not retried.
3. **Drain.** After the offered load stops, the backlog is run to the end;
   its rate is set against the capacity.

Every task's first act is the mark of ``corral bench latency``; a sampler
reads the unfinished counts and the fleet's level once a second. Reported
per ``--window`` seconds: throughput (starts), submits, backlog, p50/p95
pickup (start - the submit call's return) of the tasks that started in it,
and the highest level; then the level's changes with their times and
reasons.

One child process per store (``python -m corral.bench.overload``) prints one
JSON object.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import threading
import time
from typing import Any

from corral.app import App
from corral.bench import common, latency
from corral.bench.common import emit_progress
from corral.core.levels import Level
from corral.core.stats import percentile
from corral.edges.fleet import WorkerFleet, lazy_app

APP_SPEC = "corral.bench.overload:app"
TASK = "overload.work"
TASK_MS_ENV = "CORRAL_BENCH_TASK_MS"
MAX_QUEUED_ENV = "CORRAL_BENCH_MAX_QUEUED"
CAPACITY_BASE = 1 << 41
#: the task's default length (``--task-ms``): long enough that 1.5x the
#: capacity of 2 x 10 slots (about 300 submits/s) can be offered as single
#: submits on a small machine; with 5 ms tasks it is thousands a second, more
#: durable commits than a 2-core host makes beside its workers
TASK_MS = 100.0
#: tasks run in bulk to measure the capacity (``--capacity-tasks``)
CAPACITY_TASKS = 4_000
#: seconds of the capacity the default queue bound holds (``--bound-seconds``)
BOUND_SECONDS = 30.0
#: the share of the capacity the targets ask of the overload and the drain
TARGET = 0.95


def work(i: int) -> None:
    """Mark the start, then the task's few ms of work (a sleep: a call out)."""
    latency.mark(i)
    ms = float(os.environ.get(TASK_MS_ENV, TASK_MS))
    if ms > 0:
        time.sleep(ms / 1000.0)


def build_app(store: str | None = None) -> App:
    """The benchmark's app on ``store``, bounded by ``$CORRAL_BENCH_MAX_QUEUED`` when set."""
    bound = int(os.environ.get(MAX_QUEUED_ENV) or 0)
    app = App(store, max_queued=bound or None)
    app.task(name=TASK)(work)
    return app


#: ``app`` is built on first access, so importing this module opens no store.
__getattr__ = lazy_app(build_app)


# ---- the sampler -------------------------------------------------------------------------------
class Sampler:
    """Once a second, in a thread with its own store: the unfinished counts and the fleet's level."""

    def __init__(self, url: str, every: float = 1.0):
        self.url, self.every = url, every
        self.samples: list[tuple[float, int, int, int, str]] = []  # (time, backlog, running, level, reason)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        app = App(self.url)
        try:
            while not self._stop.is_set():
                t = time.time()
                try:
                    counts = app.store.active_counts()
                    level = app.store.fleet_level()
                    backlog = sum(counts.get(s, 0) for s in ("PENDING", "RETRYING", "WAITING"))
                    self.samples.append((t, backlog, counts.get("RUNNING", 0), int(level.level), level.reason))
                except Exception:  # noqa: BLE001 - a missed sample, the next one will do
                    pass
                self._stop.wait(self.every)
        finally:
            app.close()

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


# ---- the figures -------------------------------------------------------------------------------
def capacity_of(starts: list[float]) -> float | None:
    """Starts a second from the 10th to the 90th percentile of ``starts``
    (sorted): the fleet at full speed, without its ramp and its tail."""
    n = len(starts)
    lo, hi = int(n * 0.1), int(n * 0.9)
    if hi - lo < 2 or starts[hi] <= starts[lo]:
        return None
    return (hi - lo) / (starts[hi] - starts[lo])


def windows(
    sub: latency.Submits,
    starts: dict[int, float],
    samples: list[tuple[float, int, int, int, str]],
    t0: float,
    end: float,
    width: float,
    capacity: float,
) -> list[dict[str, Any]]:
    """Per ``width`` seconds from ``t0`` to ``end``: throughput, submits,
    backlog at its end, pickup of the tasks started in it, highest level."""
    n = max(1, math.ceil((end - t0) / width - 1e-9))
    started: list[list[float]] = [[] for _ in range(n)]
    submitted = [0] * n
    for k in range(len(sub)):
        w = int((sub.before[k] - t0) // width)
        if 0 <= w < n:
            submitted[w] += 1
        s = starts.get(sub.ids[k])
        if s is not None:
            w = int((s - t0) // width)
            if 0 <= w < n:
                started[w].append(s - sub.after[k])
    out = []
    for w in range(n):
        a, b = t0 + w * width, min(end, t0 + (w + 1) * width)
        span = b - a
        inside = [s for s in samples if a <= s[0] < b]
        before = [s for s in samples if s[0] < b]
        pick = sorted(started[w])
        rate = len(pick) / span if span > 0 else 0.0
        out.append(
            {
                "from_s": round(w * width, 1),
                "seconds": round(span, 2),
                "throughput": round(rate, 1),
                "of_capacity": round(rate / capacity, 3) if capacity else None,
                "submits": round(submitted[w] / span, 1) if span > 0 else 0.0,
                "backlog": before[-1][1] if before else None,
                "pickup_p50_ms": common.ms(percentile(pick, 0.50, presorted=True)),
                "pickup_p95_ms": common.ms(percentile(pick, 0.95, presorted=True)),
                "level": Level(max(s[3] for s in inside)).name if inside else None,
            }
        )
    return out


def level_changes(samples: list[tuple[float, int, int, int, str]], t0: float) -> list[dict[str, Any]]:
    """Each change of the fleet's level the sampler saw, with its time (s from ``t0``), backlog and reason."""
    out: list[dict[str, Any]] = []
    last: int | None = None
    for t, backlog, _, level, reason in samples:
        if level != last:
            out.append({"at_s": round(t - t0, 1), "level": Level(level).name, "backlog": backlog, "reason": reason})
            last = level
    return out


# ---- one store ---------------------------------------------------------------------------------
def _wait(path: str, n: int, fleet: WorkerFleet, timeout: float, progress=None) -> int:
    end = time.monotonic() + timeout
    while True:
        have = latency.count_marks(path)
        if progress is not None:
            progress(have)
        if have >= n or time.monotonic() > end:
            return have
        fleet.check()
        time.sleep(0.05)


def _warm(app: App, fleet: WorkerFleet, marks: str, base: int) -> None:
    fleet.wait_ready()
    have = latency.count_marks(marks)
    for k in range(latency.PROBES):
        app.submit(TASK, args=(base + k,))
    if _wait(marks, have + latency.PROBES, fleet, 60.0) < have + latency.PROBES:
        raise RuntimeError("the workers did not run the warm-up tasks within 60 s")


def run(args) -> dict[str, Any]:
    os.environ[TASK_MS_ENV] = str(args.task_ms)
    os.environ.pop(MAX_QUEUED_ENV, None)
    say = emit_progress if args.progress else (lambda done, total: None)
    with common.temp_store_url(args.store, args.pg_url) as url, tempfile.TemporaryDirectory() as d:
        marks = os.path.join(d, "marks")
        open(marks, "wb").close()
        env = {latency.MARKS_ENV: marks, TASK_MS_ENV: str(args.task_ms)}
        app = build_app(url)
        try:
            # 1. capacity
            with WorkerFleet(APP_SPEC, url, args.workers, args.concurrency, env) as fleet:
                _warm(app, fleet, marks, latency.PROBE_BASE)
                base = latency.count_marks(marks)
                n = args.capacity_tasks
                for lo in range(0, n, 5000):
                    app.submit_many(TASK, [{"args": (CAPACITY_BASE + i,)} for i in range(lo, min(n, lo + 5000))])
                if _wait(marks, base + n, fleet, 600.0) < base + n:
                    raise RuntimeError("the capacity tasks did not all start within 600 s")
            starts, _ = latency.read_marks(marks)
            capacity = capacity_of(sorted(t for i, t in starts.items() if i >= CAPACITY_BASE))
            if not capacity:
                raise RuntimeError("too few capacity tasks to measure the fleet's rate")
            # 2. overload
            rate = capacity * args.factor
            bound = args.max_queued if args.max_queued is not None else int(capacity * args.bound_seconds)
            if bound:
                env[MAX_QUEUED_ENV] = os.environ[MAX_QUEUED_ENV] = str(bound)
            submitters = args.submitters or latency.submitters_for(rate)
            with Sampler(url) as sampler, WorkerFleet(APP_SPEC, url, args.workers, args.concurrency, env) as fleet:
                _warm(app, fleet, marks, latency.PROBE_BASE + latency.PROBES)
                before = latency.count_marks(marks)
                sub = latency.submit_from(
                    url,
                    rate,
                    args.seconds,
                    submitters,
                    (lambda i: say(i, int(rate * args.seconds))) if args.progress else None,
                    build=build_app,
                    task=TASK,
                )
                accepted = len(sub) - len(sub.refused)
                # 3. drain
                backlog_s = max(0.0, accepted / capacity - args.seconds)
                _wait(marks, before + accepted, fleet, 3 * backlog_s + 60.0)
                time.sleep(1.5)  # a last sample of the level and the backlog
            samples = sampler.samples
        finally:
            app.close()
        starts, duplicates = latency.read_marks(marks)
    t0 = min(sub.before) if len(sub) else time.time()
    stop = t0 + args.seconds
    ours = [starts[i] for i in sub.ids if i in starts]
    last = max(ours) if ours else stop
    after_stop = [t for t in ours if t >= stop]
    drain_s = last - stop
    drain_rate = len(after_stop) / drain_s if drain_s > 0 and len(after_stop) > 1 else None
    wins = windows(sub, starts, samples, t0, max(last, stop), args.window, capacity)
    full = [w for w in wins if w["from_s"] + w["seconds"] <= args.seconds + 1e-6 and w["seconds"] >= args.window]
    over = [w["of_capacity"] for w in full if w["of_capacity"] is not None]
    refused = set(sub.refused)
    missing = sum(1 for i in sub.ids if i not in refused and i not in starts)
    return {
        "scenario": "overload",
        "store": args.store,
        "workers": args.workers,
        "concurrency": args.concurrency,
        "task_ms": args.task_ms,
        "capacity": round(capacity, 1),
        "factor": args.factor,
        "offered": round(rate, 1),
        "submitters": submitters,
        "seconds": args.seconds,
        "window_s": args.window,
        "max_queued": bound or None,
        "submitted": len(sub),
        "submit_rate": round(len(sub) / sub.elapsed, 1) if sub.elapsed else None,
        "submit_call_p50_ms": common.ms(percentile(sorted(b - a for a, b in zip(sub.before, sub.after)), 0.5)),
        "refused": len(refused),
        "missing": missing,
        "duplicates": duplicates,
        "throughput_min_of_capacity": min(over) if over else None,
        "throughput_mean_of_capacity": round(sum(over) / len(over), 3) if over else None,
        "drain_tasks": len(after_stop),
        "drain_s": round(drain_s, 1),
        "drain_rate": round(drain_rate, 1) if drain_rate else None,
        "drain_of_capacity": round(drain_rate / capacity, 3) if drain_rate else None,
        "peak_backlog": max((s[1] for s in samples), default=None),
        "levels": level_changes(samples, t0),
        "windows": wins,
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m corral.bench.overload")
    p.add_argument("--store", default="sqlite", choices=["sqlite", "postgres"])
    p.add_argument("--pg-url", default=None)
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--factor", type=float, default=1.5)
    p.add_argument("--task-ms", type=float, default=TASK_MS)
    p.add_argument("--capacity-tasks", type=int, default=CAPACITY_TASKS)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=None)
    p.add_argument("--submitters", type=int, default=None)
    p.add_argument("--max-queued", type=int, default=None)
    p.add_argument("--bound-seconds", type=float, default=BOUND_SECONDS)
    p.add_argument("--window", type=float, default=10.0)
    p.add_argument("--progress", action="store_true")
    return p


def child_argv(**opts: Any) -> list[str]:
    return common.child_argv("corral.bench.overload", **opts)


def render(reports: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    def f(v: Any, digits: int = 1) -> str:
        return "—" if v is None else f"{v:,.{digits}f}" if isinstance(v, float) else f"{v:,}"

    console = Console(width=max(120, Console().width))
    for rep in reports:
        slots = f"{rep['concurrency']} slots" if rep["concurrency"] else "its defaults"
        bound = f"max_queued {rep['max_queued']:,}" if rep["max_queued"] else "no queue bound"
        t = Table(
            title=f"overload on {rep['store']}: {rep['workers']} x `corral worker` ({slots}), tasks of"
            f" {rep['task_ms']:g} ms; capacity {rep['capacity']:,.0f}/s, offered {rep['factor']:g}x ="
            f" {rep['offered']:,.0f}/s from {rep['submitters']} submitting processes for {rep['seconds']:g} s"
            f" ({bound})"
        )
        for col in ("from s", "tasks/s", "of capacity", "submits/s", "backlog", "pickup p50 ms", "pickup p95 ms"):
            t.add_column(col, justify="right")
        t.add_column("level")
        for w in rep["windows"]:
            t.add_row(
                f"{w['from_s']:g}",
                f(w["throughput"], 0),
                f(w["of_capacity"], 2),
                f(w["submits"], 0),
                f(w["backlog"]),
                f(w["pickup_p50_ms"]),
                f(w["pickup_p95_ms"]),
                w["level"] or "—",
            )
        console.print(t)
        ok = (rep["throughput_min_of_capacity"] or 0) >= TARGET and (rep["drain_of_capacity"] or 0) >= TARGET
        console.print(
            f"  under overload: throughput min {f(rep['throughput_min_of_capacity'], 2)}, mean"
            f" {f(rep['throughput_mean_of_capacity'], 2)} of capacity; submitted {rep['submitted']:,} at"
            f" {f(rep['submit_rate'], 0)}/s (a submit call p50 {f(rep['submit_call_p50_ms'], 2)} ms),"
            f" refused by the bound {rep['refused']:,}; peak backlog"
            f" {f(rep['peak_backlog'])}\n  drain: {rep['drain_tasks']:,} tasks in {rep['drain_s']:g} s ="
            f" {f(rep['drain_rate'], 0)}/s, {f(rep['drain_of_capacity'], 2)} of capacity; missing"
            f" {rep['missing']:,}, duplicates {rep['duplicates']:,};"
            f" targets (>= {TARGET:g}) {'met' if ok else 'NOT met'}"
        )
        for c in rep["levels"]:
            console.print(f"  level {c['level']} at {c['at_s']:g} s (backlog {c['backlog']:,}): {c['reason'] or '—'}")


def main(argv: list[str] | None = None) -> None:
    common.child_main(parser, run, argv)


if __name__ == "__main__":
    main()

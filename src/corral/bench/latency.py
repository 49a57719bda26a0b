"""``corral bench latency``: pickup at a steady rate of single submits.

For each rate of ``--rates``, on a fresh store, ``--workers`` ``corral
worker corral.bench.latency:app`` processes (the command's defaults) are
started and warmed up; then ``--submitters`` processes, which run no worker,
share a steady schedule of single submits (``app.submit``), task i due at
``t0 + i / rate`` and submitted by process ``i mod submitters``, for
``--seconds``. Each process submits one task at a time: one process reaches
only so many durable commits a second (on PostgreSQL about 130-300 on a
small machine), so by default there is one per :data:`RATE_PER_SUBMITTER`
submits a second of the rate. The schedule is open-loop: a submit never
waits for a task to run, and a submitter that falls behind submits at once
until it is back on time; the rate reached is reported as it was.

Every task's first act is to append ``(i, time.time())`` to a file of marks
(one ``os.write`` of 16 bytes, ``O_APPEND``, the file named by
``$CORRAL_BENCH_MARKS``); the submitter notes ``time.time()`` just before
and just after each submit call. Every process runs on this host, so the
clocks are one. Per task: **submit to start** (start - before the call),
and its two parts, the submit call (after - before) and **pickup** (start -
after the call returned: the commit seen, the worker woken, the claim, the
slot). Tasks submitted in the first ``--warmup`` seconds (2) are left out; a
task that never started counts as slower than every one that did.

One child process per store (``python -m corral.bench.latency``) prints one
JSON object; it starts the submitting processes of each rate.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import struct
import tempfile
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from typing import Any

from corral.app import App
from corral.bench import common
from corral.bench.common import emit_progress
from corral.core.stats import percentile
from corral.edges.fleet import WorkerFleet, lazy_app

APP_SPEC = "corral.bench.latency:app"
TASK = "latency.mark"
MARKS_ENV = "CORRAL_BENCH_MARKS"
#: one mark: the task's index and the wall-clock time its body started
REC = struct.Struct("<qd")
#: submits of the first seconds of each rate are not measured (``--warmup``)
WARMUP_S = 2.0
#: tasks run before the schedule starts, so every worker has claimed and run work
PROBES = 20
PROBE_BASE = 1 << 40
#: seconds the tasks submitted last may take to start before the run is cut
DRAIN_S = 30.0
PERCENTILES = (0.50, 0.95, 0.99)
#: submits a second one submitting process is given by default (``--submitters``)
RATE_PER_SUBMITTER = 150.0
#: how long the submitting processes have to start before the schedule does
START_LEAD_S = 0.5


def submitters_for(rate: float) -> int:
    """The default number of submitting processes at ``rate``: one per
    :data:`RATE_PER_SUBMITTER` a second (1 at 100/s, 2 at 300/s, 7 at 1 000/s)."""
    return max(1, math.ceil(rate / RATE_PER_SUBMITTER - 1e-9))


# ---- the task (in the worker processes) --------------------------------------------------------
_fd: int | None = None
_fd_lock = threading.Lock()


def mark(i: int) -> None:
    """Record that task ``i`` started now (its first act)."""
    t = time.time()
    global _fd
    fd = _fd
    if fd is None:
        with _fd_lock:
            if _fd is None:
                _fd = os.open(os.environ[MARKS_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            fd = _fd
    os.write(fd, REC.pack(i, t))


def build_app(store: str | None = None) -> App:
    """The benchmark's app on ``store`` (default: ``$CORRAL_STORE``)."""
    app = App(store)
    app.task(name=TASK)(mark)
    return app


#: ``app`` is built on first access, so importing this module opens no store.
__getattr__ = lazy_app(build_app)


# ---- the marks ---------------------------------------------------------------------------------
def count_marks(path: str) -> int:
    try:
        return os.stat(path).st_size // REC.size
    except FileNotFoundError:
        return 0


def read_marks(path: str) -> tuple[dict[int, float], int]:
    """Each task's first start, and how many tasks started more than once."""
    with open(path, "rb") as f:
        data = f.read()
    starts: dict[int, float] = {}
    duplicates = 0
    for k in range(len(data) // REC.size):
        i, t = REC.unpack_from(data, k * REC.size)
        if i in starts:
            duplicates += 1
            starts[i] = min(starts[i], t)
        else:
            starts[i] = t
    return starts, duplicates


# ---- the schedule ------------------------------------------------------------------------------
class Submits:
    """What the submitters noted, per submit: the task's index, how late the
    submit began against the schedule (s), and the wall-clock time just
    before and after the call; and the tasks the store refused (a queue
    bound, ``QueueFull``)."""

    def __init__(self) -> None:
        self.ids = array("q")
        self.late = array("d")
        self.before = array("d")
        self.after = array("d")
        self.refused = array("q")
        self.elapsed = 0.0

    def __len__(self) -> int:
        return len(self.before)

    @classmethod
    def merged(cls, parts: Sequence[Submits]) -> Submits:
        """The notes of several submitters in one, in the schedule's order;
        the elapsed time is the longest (they share one start)."""
        out = cls()
        rows = sorted((p.ids[k], p.late[k], p.before[k], p.after[k]) for p in parts for k in range(len(p)))
        for i, late, before, after in rows:
            out.ids.append(i)
            out.late.append(late)
            out.before.append(before)
            out.after.append(after)
        out.refused = array("q", sorted(i for p in parts for i in p.refused))
        out.elapsed = max((p.elapsed for p in parts), default=0.0)
        return out


def submit_steady(
    submit: Callable[[int], Any],
    rate: float,
    seconds: float,
    *,
    first: int = 0,
    step: int = 1,
    start: float | None = None,
    progress: Callable[[int], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    wall: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> Submits:
    """Call ``submit(i)`` for task i at ``start + i / rate`` until ``seconds``
    have passed, one call at a time; behind schedule, at once. One of
    ``step`` submitters sharing the schedule takes the tasks ``first``,
    ``first + step``, ... (``start``: the schedule's start on ``clock``,
    which they share; default now). A call that returns False was refused
    by the store: it is noted in ``refused``."""
    out = Submits()
    t0 = clock() if start is None else start
    end = t0 + seconds
    now = clock()
    if now < t0:
        sleep(t0 - now)
    next_report = t0
    i = first
    while True:
        due = t0 + i / rate
        if due >= end:
            break
        now = clock()
        if now >= end:
            break
        if due > now:
            sleep(due - now)
            now = clock()
        out.ids.append(i)
        out.late.append(max(0.0, now - due))
        out.before.append(wall())
        if submit(i) is False:
            out.refused.append(i)
        out.after.append(wall())
        i += step
        if progress is not None and now >= next_report:
            progress(len(out))
            next_report = now + 0.5
    out.elapsed = clock() - t0
    return out


def _pct_ms(sorted_values: Sequence[float], q: float) -> float | None:
    """A nearest-rank percentile in ms; None where it falls on a task that never started."""
    v = percentile(sorted_values, q, presorted=True)
    return None if v is None or math.isinf(v) else common.ms(v)


def figures(sub: Submits, starts: dict[int, float], rate: float, warmup: float = WARMUP_S) -> dict[str, Any]:
    """The report of one rate from the submitter's notes and the marks."""
    n = len(sub)
    first = min(sub.before) if n else 0.0
    measured = [k for k in range(n) if sub.before[k] - first >= warmup]
    total, call, pickup = [], [], []
    for k in measured:
        t = starts.get(sub.ids[k])
        if t is None:
            total.append(math.inf)
            pickup.append(math.inf)
        else:
            total.append(t - sub.before[k])
            pickup.append(t - sub.after[k])
        call.append(sub.after[k] - sub.before[k])
    total.sort()
    pickup.sort()
    call.sort()
    started = [starts[sub.ids[k]] for k in measured if sub.ids[k] in starts]
    late = sorted(sub.late[k] for k in measured)
    begun = [sub.before[k] for k in measured]
    window = (max(begun) - min(begun)) if len(measured) > 1 else 0.0
    out: dict[str, Any] = {
        "rate": rate,
        "submitted": n,
        "submit_rate": round(n / sub.elapsed, 1) if sub.elapsed else None,
        "measured": len(measured),
        "measured_submit_rate": round((len(measured) - 1) / window, 1) if window else None,
        "started": len(started),
        "missing": len(measured) - len(started),
        "start_rate": (
            round(len(started) / (max(started) - min(begun)), 1) if started and max(started) > min(begun) else None
        ),
    }
    for q in PERCENTILES:
        out[f"p{round(q * 100)}_ms"] = _pct_ms(total, q)
    out["max_ms"] = _pct_ms(total, 1.0)
    for q in PERCENTILES:
        out[f"pickup_p{round(q * 100)}_ms"] = _pct_ms(pickup, q)
    out["submit_call_p50_ms"] = _pct_ms(call, 0.50)
    out["submit_call_p99_ms"] = _pct_ms(call, 0.99)
    out["late_p99_ms"] = common.ms(percentile(late, 0.99, presorted=True))
    out["late_max_ms"] = common.ms(late[-1]) if late else None
    return out


# ---- one run -----------------------------------------------------------------------------------
def _wait_marks(path: str, n: int, fleet: WorkerFleet, timeout: float) -> int:
    end = time.monotonic() + timeout
    while True:
        have = count_marks(path)
        if have >= n or time.monotonic() > end:
            return have
        fleet.check()
        time.sleep(0.01)


def _submitter(
    url: str, rate: float, seconds: float, first: int, step: int, conn: Any, build: Callable[[str], App], task: str
) -> None:
    """One submitting process: its store open, it says so, takes the
    schedule's start (wall-clock time) and sends back its notes."""
    from corral import QueueFull

    app = build(url)

    def submit(i: int) -> bool:
        try:
            app.submit(task, args=(i,))
        except QueueFull:
            return False
        return True

    try:
        app.store.counts()  # connected before the schedule starts
        conn.send("ready")
        start_wall = conn.recv()
        start = time.perf_counter() + (start_wall - time.time())
        conn.send(submit_steady(submit, rate, seconds, first=first, step=step, start=start))
    finally:
        app.close()


def submit_from(
    url: str,
    rate: float,
    seconds: float,
    submitters: int,
    progress: Callable[[int], None] | None = None,
    *,
    build: Callable[[str], App] = build_app,
    task: str = TASK,
) -> Submits:
    """The schedule submitted by ``submitters`` processes sharing it, their
    notes merged. Each process submits ``task(i)`` on the app ``build(url)``
    (a module-level function: it is sent to the spawned process)."""
    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    try:
        for k in range(submitters):
            here, there = ctx.Pipe()
            proc = ctx.Process(
                target=_submitter, args=(url, rate, seconds, k, submitters, there, build, task), daemon=True
            )
            proc.start()
            there.close()
            pipes.append(here)
            procs.append(proc)
        for here in pipes:
            if not here.poll(60.0) or here.recv() != "ready":
                raise RuntimeError("a submitting process did not start within 60 s")
        start = time.time() + START_LEAD_S
        for here in pipes:
            here.send(start)
        parts: list[Submits] = []
        for here in pipes:
            while not here.poll(0.5):
                if progress is not None:
                    progress(int(max(0.0, min(seconds, time.time() - start)) * rate))
                if not all(p.is_alive() for p in procs) and not here.poll(0):
                    raise RuntimeError("a submitting process died")
            parts.append(here.recv())
        return Submits.merged(parts)
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()


def run_rate(args, rate: float, progress: Callable[[int], None] | None) -> dict[str, Any]:
    """One rate on a fresh store: workers up and warmed, the schedule, the marks."""
    submitters = args.submitters or submitters_for(rate)
    with common.temp_store_url(args.store, args.pg_url) as url, tempfile.TemporaryDirectory() as d:
        marks = os.path.join(d, "marks")
        open(marks, "wb").close()
        app = build_app(url)
        try:
            with WorkerFleet(APP_SPEC, url, args.workers, args.concurrency, {MARKS_ENV: marks}) as fleet:
                fleet.wait_ready()
                for k in range(PROBES):
                    app.submit(TASK, args=(PROBE_BASE + k,))
                if _wait_marks(marks, PROBES, fleet, 60.0) < PROBES:
                    raise RuntimeError("the workers did not run the warm-up tasks within 60 s")
                sub = submit_from(url, rate, args.seconds, submitters, progress)
                _wait_marks(marks, PROBES + len(sub), fleet, DRAIN_S)
            starts, duplicates = read_marks(marks)
        finally:
            app.close()
    out = figures(sub, starts, rate, args.warmup)
    out["submitters"] = submitters
    out["seconds"] = args.seconds
    out["duplicates"] = duplicates
    return out


def run(args) -> dict[str, Any]:
    rates = [float(r) for r in args.rates.split(",")]
    total = int(sum(r * args.seconds for r in rates))
    done = 0

    def progress(i: int) -> None:
        emit_progress(done + i, total)

    results = []
    for rate in rates:
        results.append(run_rate(args, rate, progress if args.progress else None))
        done += int(rate * args.seconds)
    return {
        "scenario": "latency",
        "store": args.store,
        "workers": args.workers,
        "concurrency": args.concurrency,
        "submitters": args.submitters,
        "seconds": args.seconds,
        "warmup_s": args.warmup,
        "results": results,
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m corral.bench.latency")
    p.add_argument("--store", default="sqlite", choices=["sqlite", "postgres"])
    p.add_argument("--pg-url", default=None)
    p.add_argument("--rates", default="100,300,1000")
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--warmup", type=float, default=WARMUP_S)
    p.add_argument("--concurrency", type=int, default=None)
    p.add_argument("--submitters", type=int, default=None)
    p.add_argument("--progress", action="store_true")
    return p


def child_argv(**opts: Any) -> list[str]:
    return common.child_argv("corral.bench.latency", **opts)


def render(reports: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    def f(v: Any, digits: int = 2) -> str:
        return "—" if v is None else f"{v:,.{digits}f}"

    first = reports[0]
    slots = f"{first['concurrency']} slots" if first["concurrency"] else "its defaults"
    t = Table(
        title=f"latency: single submits at a steady rate, {first['seconds']:g} s each (first {first['warmup_s']:g} s"
        f" not measured), {first['workers']} x `corral worker` ({slots})"
    )
    for col in (
        "store",
        "rate/s",
        "submitters",
        "reached/s",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "max ms",
        "pickup p95 ms",
        "submit p50 ms",
    ):
        t.add_column(col, justify="left" if col == "store" else "right")
    t.add_column("missing", justify="right")
    for rep in reports:
        for r in rep["results"]:
            t.add_row(
                rep["store"],
                f"{r['rate']:,.0f}",
                str(r["submitters"]),
                f(r["submit_rate"], 0),
                f(r["p50_ms"]),
                f(r["p95_ms"]),
                f(r["p99_ms"]),
                f(r["max_ms"]),
                f(r["pickup_p95_ms"]),
                f(r["submit_call_p50_ms"]),
                f"{r['missing']:,}",
            )
    Console(width=max(120, Console().width)).print(t)


def main(argv: list[str] | None = None) -> None:
    common.child_main(parser, run, argv)


if __name__ == "__main__":
    main()

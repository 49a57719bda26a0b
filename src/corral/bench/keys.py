"""``corral bench keys``: keyed limits held by a fleet, and what a key costs a claim.

**The run.** One keyed limit, ``app.limit("bench_keys", concurrency=C,
rate="R/s", per_key=True)``, and ``--keys`` keys with ``--tasks-per-key`` N
tasks each, queued in one submit, key after key in turn (task j of every key
before task j + 1 of any), into ``--workers`` ``corral worker
corral.bench.keys:app`` processes already up. Each task sleeps ``--duration``
d; its body appends ``(task, key, start, end)`` (``time.time()``, one
``os.write`` of 32 bytes, ``O_APPEND``) to a file named by
``$CORRAL_BENCH_KEYS_LOG``. The same tasks run again with no limit (the
fleet's own pace, side by side).

Checked exactly, per key, then the worst key:

- **in flight**: the most bodies of one key running at once (a body ending
  at t and one starting at t do not overlap): at most C;
- **starts in any sliding second**: the most store start times (the claim
  that charged the key's rate) in any half-open [t, t + 1 s): at most R.
  The bodies' own starts come a dispatch later and are shown beside, not held
  to the bound.

**What the keys allow.** Sort one key's starts s_0 <= s_1 <= ...: starts
i - R .. i are R + 1 starts, so s_i >= s_(i-R) + 1 s; with equal durations the
earliest to end of the C started before i is i - C, so s_i >= s_(i-C) + d.
Starting each task as early as both allow meets both with equality, so the
least time for a key's N tasks is that schedule's last start + d; for large N
about max(N / R, N * d / C) seconds. All keys run side by side: the run's
ideal is that of one key, and **throughput / allowed** = ideal / (last end -
first start).

**Claim cost** (``--claim-cost``): in this process, on a fresh store, 10 000
tasks each under its own key are claimed and left running (10 000 active
keys), then Q tasks are queued under those keys, and claims of the worker's
default batch (its default slots, 10) are timed: warm-up claims first, then
the median of ``--claims`` claims. The same with no limit (the same running
and queued tasks), and with a keyed rate beside the concurrency (a row per
key): the limits never bind (concurrency and rate far above what is held).
"""

from __future__ import annotations

import argparse
import math
import os
import struct
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from corral.app import App
from corral.bench import common
from corral.bench.common import emit_progress
from corral.core.stats import percentile
from corral.edges.fleet import WorkerFleet, lazy_app

APP_SPEC = "corral.bench.keys:app"
LIMIT = "bench_keys"
KEYED_TASK = "keys.keyed"
PLAIN_TASK = "keys.plain"
LOG_ENV = "CORRAL_BENCH_KEYS_LOG"
#: one record: the task's index, its key's index, the body's start and end (wall clock)
REC = struct.Struct("<qqdd")
#: the worker's default slots (``corral worker -c``): the claim cost's batch
DEFAULT_BATCH = 10
SUBMIT_BATCH = 5000

# ---- the task (in the worker processes) --------------------------------------------------------
_fd: int | None = None
_fd_lock = threading.Lock()


def _append(rec: bytes) -> None:
    global _fd
    fd = _fd
    if fd is None:
        with _fd_lock:
            if _fd is None:
                _fd = os.open(os.environ[LOG_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            fd = _fd
    os.write(fd, rec)


def work(i: int, key: int, seconds: float) -> None:
    """Sleep ``seconds``; record when the body ran."""
    t0 = time.time()
    if seconds > 0:
        time.sleep(seconds)
    _append(REC.pack(i, key, t0, time.time()))


def build_app(store: str | None = None) -> App:
    """The benchmark's app on ``store`` (default: ``$CORRAL_STORE``). The
    keyed limit is declared in the store by the benchmark before the workers
    start; the key is each submit's ``limit_key=``."""
    app = App(store)
    app.task(name=KEYED_TASK, limits=[LIMIT])(work)
    app.task(name=PLAIN_TASK)(work)
    return app


#: ``app`` is built on first access, so importing this module opens no store.
__getattr__ = lazy_app(build_app)


# ---- the checker (pure) --------------------------------------------------------------------------
def most_in_flight(intervals: Iterable[tuple[float, float]]) -> int:
    """The most of ``intervals`` ([start, end)) open at one instant."""
    events = []
    for s, e in intervals:
        events.append((s, 1))
        events.append((max(s, e), -1))
    events.sort()  # at one instant an end (-1) comes before a start (+1)
    most = now = 0
    for _, d in events:
        now += d
        most = max(most, now)
    return most


def most_in_window(starts: Iterable[float], window: float) -> int:
    """The most of ``starts`` in any half-open window [t, t + window)."""
    ts = sorted(starts)
    most = lo = 0
    for hi, t in enumerate(ts):
        while ts[lo] <= t - window:
            lo += 1
        most = max(most, hi - lo + 1)
    return most


@dataclass(frozen=True, slots=True)
class Run:
    """One task's run as recorded: its key, the body's start and end, and the
    store's start time (the claim that charged its key; None: not known)."""

    key: Any
    start: float
    end: float
    claimed: float | None = None


def key_figures(runs: Iterable[Run], window: float = 1.0) -> dict[str, Any]:
    """The worst key of a history: most in flight (bodies), most starts in
    any sliding ``window`` (store starts, and bodies' starts), with the key
    each was seen on."""
    by_key: dict[Any, list[Run]] = {}
    for r in runs:
        by_key.setdefault(r.key, []).append(r)
    worst = {"in_flight": (0, None), "starts": (0, None), "body_starts": (0, None)}
    for key, rs in by_key.items():
        for name, value in (
            ("in_flight", most_in_flight((r.start, r.end) for r in rs)),
            ("starts", most_in_window([r.claimed for r in rs if r.claimed is not None], window)),
            ("body_starts", most_in_window([r.start for r in rs], window)),
        ):
            if value > worst[name][0]:
                worst[name] = (value, key)
    return {
        "keys": len(by_key),
        "runs": sum(len(rs) for rs in by_key.values()),
        "max_in_flight": worst["in_flight"][0],
        "max_in_flight_key": worst["in_flight"][1],
        "max_starts_per_window": worst["starts"][0],
        "max_starts_key": worst["starts"][1],
        "max_body_starts_per_window": worst["body_starts"][0],
    }


def broken_bounds(fig: dict[str, Any], concurrency: int, rate: int) -> list[str]:
    """The bounds a history's figures (:func:`key_figures`) break, in words."""
    out = []
    if fig["max_in_flight"] > concurrency:
        out.append(f"key {fig['max_in_flight_key']!r} had {fig['max_in_flight']} in flight (bound {concurrency})")
    if rate > 0 and fig["max_starts_per_window"] > rate:
        out.append(
            f"key {fig['max_starts_key']!r} started {fig['max_starts_per_window']} in one sliding second (bound {rate})"
        )
    return out


def key_schedule(n: int, duration: float, concurrency: int, rate: int, window: float = 1.0) -> list[float]:
    """The earliest starts of one key's ``n`` tasks of ``duration`` under at
    most ``concurrency`` at once and ``rate`` starts in any ``window``:
    s_i = max(s_(i-rate) + window, s_(i-concurrency) + duration)."""
    s: list[float] = []
    for i in range(n):
        t = 0.0
        if i >= rate:
            t = max(t, s[i - rate] + window)
        if i >= concurrency:
            t = max(t, s[i - concurrency] + duration)
        s.append(t)
    return s


def ideal_seconds(n: int, duration: float, concurrency: int, rate: int, window: float = 1.0) -> float:
    """The least time one key's ``n`` tasks take under its bounds (see :func:`key_schedule`)."""
    if n < 1:
        return 0.0
    return key_schedule(n, duration, concurrency, rate, window)[-1] + duration


def tasks_for(seconds: float, duration: float, concurrency: int, rate: int) -> int:
    """Tasks per key that keep a key busy about ``seconds`` at its bound."""
    per_s = min(float(rate), concurrency / duration if duration > 0 else math.inf)
    return max(1, round(seconds * per_s))


# ---- the run ------------------------------------------------------------------------------------
def read_log(path: str) -> list[tuple[int, int, float, float]]:
    with open(path, "rb") as f:
        data = f.read()
    return [REC.unpack_from(data, k * REC.size) for k in range(len(data) // REC.size)]


def _count(path: str) -> int:
    try:
        return os.stat(path).st_size // REC.size
    except FileNotFoundError:
        return 0


def _wait(path: str, n: int, fleet: WorkerFleet, timeout: float, progress: bool, base: int, total: int) -> None:
    end = time.monotonic() + timeout
    while True:
        have = _count(path)
        if progress:
            emit_progress(base + have, total)
        if have >= n:
            return
        fleet.check()
        if time.monotonic() > end:
            raise RuntimeError(f"timed out after {timeout:g}s: {have}/{n} tasks ran")
        time.sleep(0.1)


def fleet_run(args, keyed: bool, base: int, total: int) -> dict[str, Any]:
    """One run on a fresh store: the fleet up, every task queued in one
    submit, until each has run; the figures from the log and the store."""
    from corral.core.gates import split_key
    from corral.core.model import TaskFilter

    n, keys = args.tasks_per_key, args.keys
    task = KEYED_TASK if keyed else PLAIN_TASK
    with common.temp_store_url(args.store, args.pg_url) as url, tempfile.TemporaryDirectory() as d:
        log = os.path.join(d, "runs")
        open(log, "wb").close()
        app = build_app(url)
        try:
            rate = f"{args.rate}/s" if args.rate > 0 else None  # 0: none (--w1)
            app.limit(LIMIT, concurrency=args.concurrency, rate=rate, per_key=True)
            with WorkerFleet(APP_SPEC, url, args.workers, args.slots, {LOG_ENV: log}) as fleet:
                fleet.wait_ready()
                calls = []
                for j in range(n):
                    for k in range(keys):
                        call: dict[str, Any] = {"args": (j * keys + k, k, args.duration)}
                        if keyed:
                            call["limit_key"] = f"k{k}"
                        calls.append(call)
                t_submit = time.time()
                handles = app.submit_many(task, calls)  # one write: every key's work visible at once
                index = {h.id: i for i, h in enumerate(handles)}
                submit_s = time.time() - t_submit
                del calls, handles
                _wait(log, n * keys, fleet, args.timeout, args.progress, base, total)
            rows = read_log(log)
            claimed: dict[int, tuple[Any, float | None]] = {}
            if keyed:
                after = None
                while True:
                    page = app.store.list_tasks(TaskFilter(name=task, limit=10_000, newest_first=False, after_id=after))
                    if not page:
                        break
                    for rec in page:
                        key = next((split_key(x)[1] for x in rec.limits if split_key(x)[1] is not None), None)
                        claimed[index[rec.id]] = (key, rec.started_at)
                    after = page[-1].id
        finally:
            app.close()
    first: dict[int, tuple[int, float, float]] = {}
    duplicates = 0
    for i, k, s, e in rows:
        if i in first:
            duplicates += 1
        else:
            first[i] = (k, s, e)
    starts = [s for _, s, _ in first.values()]
    ends = [e for _, _, e in first.values()]
    wall = max(ends) - min(starts) if first else 0.0
    out: dict[str, Any] = {
        "keyed": keyed,
        "tasks": n * keys,
        "ran": len(first),
        "duplicates": duplicates,
        "submit_s": round(submit_s, 3),
        "wall_s": round(wall, 3),
        "tasks_per_s": round(len(first) / wall, 1) if wall > 0 else None,
    }
    if keyed:
        runs = [
            Run(claimed.get(i, (f"k{k}", None))[0], s, e, claimed.get(i, (None, None))[1])
            for i, (k, s, e) in first.items()
        ]
        out.update(key_figures(runs))
        # the store's starts on the bodies' clock: how long a claim waited for its slot
        lags = sorted(r.start - r.claimed for r in runs if r.claimed is not None)
        out["claim_to_body_p50_ms"] = common.ms(percentile(lags, 0.5, presorted=True))
        out["claim_to_body_p99_ms"] = common.ms(percentile(lags, 0.99, presorted=True))
        per_key_wall: dict[Any, list[float]] = {}
        for r in runs:
            w = per_key_wall.setdefault(r.key, [math.inf, -math.inf])
            w[0], w[1] = min(w[0], r.start), max(w[1], r.end)
        spans = sorted(b - a for a, b in per_key_wall.values())
        out["key_span_p50_s"] = round(percentile(spans, 0.5, presorted=True) or 0.0, 3)
        out["key_span_max_s"] = round(spans[-1], 3) if spans else None
    return out


def run_fleet(args) -> dict[str, Any]:
    # rate 0: no rate (--w1), so the ideal is the concurrency's alone
    ideal = ideal_seconds(args.tasks_per_key, args.duration, args.concurrency, args.rate or args.tasks_per_key + 1)
    total = args.tasks_per_key * args.keys * (1 if args.no_plain else 2)
    keyed = fleet_run(args, True, 0, total)
    plain = None if args.no_plain else fleet_run(args, False, args.tasks_per_key * args.keys, total)
    ratio = round(ideal / keyed["wall_s"], 4) if keyed["wall_s"] else None
    broken = broken_bounds(keyed, args.concurrency, args.rate)
    if keyed["ran"] < keyed["tasks"]:
        broken.append(f"{keyed['tasks'] - keyed['ran']} tasks never ran")
    return {
        "scenario": "keys",
        "store": args.store,
        "workers": args.workers,
        "slots": args.slots,
        "keys": args.keys,
        "tasks_per_key": args.tasks_per_key,
        "duration_s": args.duration,
        "concurrency": args.concurrency,
        "rate": args.rate,
        "ideal_s": round(ideal, 3),
        "allowed_tasks_per_s": round(args.keys * args.tasks_per_key / ideal, 1) if ideal else None,
        "keyed": keyed,
        "plain": plain,
        "throughput_ratio": ratio,
        "keyed_vs_plain": round(plain["wall_s"] / keyed["wall_s"], 4) if plain and keyed["wall_s"] else None,
        "broken": broken,
    }


# ---- the claim cost -------------------------------------------------------------------------------
#: no limit; one plain limit that never binds (for scale); a keyed limit, then with a rate too
CLAIM_VARIANTS = ("none", "limit", "keyed", "keyed_rate")
PLAIN_LIMIT = "bench_plain"


def claim_request(batch: int, names: Iterable[str]):
    """The request a worker with ``batch`` free slots makes, by its defaults."""
    from corral.core import validation
    from corral.core.claims import ClaimRequest

    share = validation.retry_share(validation.DEFAULT_RETRY_SHARE)
    return ClaimRequest(
        ("default",),
        batch,
        names=frozenset(names),
        chunk_size=1,
        retry_share=share,
        retry_cap=None if share is None else validation.held_retry_cap(batch, share, 0),
    )


def claim_variant(args, variant: str, progress) -> dict[str, Any]:
    """Claims of ``args.batch`` timed with ``args.active`` tasks held running
    (each under its own key, or under none) and ``args.queued`` queued."""
    from corral.core.claims import ClaimRequest

    keyed = variant.startswith("keyed")
    task = KEYED_TASK if keyed else PLAIN_TASK
    with common.temp_store_url(args.store, args.pg_url) as url:
        app = build_app(url)
        try:
            big = 1 << 30
            if variant == "limit":
                task = "keys.limited"
                app.task(name=task, limits=[PLAIN_LIMIT])(work)
                app.limit(PLAIN_LIMIT, concurrency=big)
            if keyed:
                rate = "1000000/s" if variant == "keyed_rate" else None
                app.limit(LIMIT, concurrency=big, rate=rate, per_key=True)

            def submit(lo: int, hi: int) -> None:
                for a in range(lo, hi, SUBMIT_BATCH):
                    calls = []
                    for i in range(a, min(hi, a + SUBMIT_BATCH)):
                        call: dict[str, Any] = {"args": (i, i % args.active, 0.0)}
                        if keyed:
                            call["limit_key"] = f"k{i % args.active}"
                        calls.append(call)
                    app.submit_many(task, calls)

            submit(0, args.active)
            held = 0
            while held < args.active:  # every key active: a task of its own running
                got = app.store.claim("holder", ClaimRequest(("default",), min(1000, args.active - held)))
                if not got:
                    raise RuntimeError(f"{variant}: only {held} of {args.active} tasks could be held")
                held += sum(len(c.tasks) for c in got)
            submit(args.active, args.active + args.queued)
            request = claim_request(args.batch, (task,))
            times: list[float] = []
            taken = 0
            for k in range(args.warmup + args.claims):
                t0 = time.perf_counter_ns()
                got = app.store.claim("w", request)
                dt = (time.perf_counter_ns() - t0) / 1e6
                if k >= args.warmup:
                    times.append(dt)
                    taken += sum(len(c.tasks) for c in got)
                progress()
        finally:
            app.close()
    times.sort()
    return {
        "variant": variant,
        "active_keys": args.active if keyed else 0,
        "held": held,
        "claims": len(times),
        "tasks_per_claim": round(taken / len(times), 2) if times else None,
        "p50_ms": round(percentile(times, 0.5, presorted=True) or 0.0, 3),
        "p90_ms": round(percentile(times, 0.9, presorted=True) or 0.0, 3),
        "mean_ms": round(sum(times) / len(times), 3) if times else None,
    }


def run_claims(args) -> dict[str, Any]:
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    total = len(variants) * (args.warmup + args.claims)
    done = [0]

    def progress() -> None:
        done[0] += 1
        if args.progress and done[0] % 10 == 0:
            emit_progress(done[0], total)

    out = [claim_variant(args, v, progress) for v in variants]
    base = next((r for r in out if r["variant"] == "none"), None)
    for r in out:
        r["ratio"] = round(r["p50_ms"] / base["p50_ms"], 3) if base and base["p50_ms"] else None
    return {
        "scenario": "keys-claim-cost",
        "store": args.store,
        "active": args.active,
        "queued": args.queued,
        "batch": args.batch,
        "warmup": args.warmup,
        "results": out,
    }


def run(args) -> dict[str, Any]:
    return run_claims(args) if args.claim_cost else run_fleet(args)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m corral.bench.keys")
    p.add_argument("--store", default="sqlite", choices=["memory", "sqlite", "postgres"])
    p.add_argument("--pg-url", default=None)
    p.add_argument("--claim-cost", action="store_true")
    p.add_argument("--keys", type=int, default=1000)
    p.add_argument("--tasks-per-key", type=int, default=10)
    p.add_argument("--duration", type=float, default=0.25)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--rate", type=int, default=5)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--slots", type=int, default=None)
    p.add_argument("--no-plain", action="store_true")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--active", type=int, default=10_000)
    p.add_argument("--queued", type=int, default=5_000)
    p.add_argument("--batch", type=int, default=DEFAULT_BATCH)
    p.add_argument("--claims", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--variants", default=",".join(CLAIM_VARIANTS))
    p.add_argument("--progress", action="store_true")
    return p


def child_argv(**opts: Any) -> list[str]:
    return common.child_argv("corral.bench.keys", **opts)


def main(argv: list[str] | None = None) -> None:
    common.child_main(parser, run, argv)


# ---- the tables ------------------------------------------------------------------------------------
def _f(v: Any, digits: int = 3) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def render(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(120, Console().width))
    if report["scenario"] == "keys-claim-cost":
        t = Table(
            title=f"claim cost on {report['store']}: {report['active']:,} tasks running, {report['queued']:,} queued,"
            f" claims of {report['batch']} (median after {report['warmup']} warm-up claims)"
        )
        for c in ("limit", "active keys", "claims", "tasks/claim", "p50 ms", "p90 ms", "mean ms", "p50 / none"):
            t.add_column(c, justify="left" if c == "limit" else "right")
        names = {
            "none": "none",
            "limit": "one plain limit",
            "keyed": "keyed, concurrency",
            "keyed_rate": "keyed, concurrency + rate",
        }
        for r in report["results"]:
            t.add_row(
                names.get(r["variant"], r["variant"]),
                _f(r["active_keys"]),
                _f(r["claims"]),
                _f(r["tasks_per_claim"], 1),
                _f(r["p50_ms"]),
                _f(r["p90_ms"]),
                _f(r["mean_ms"]),
                _f(r["ratio"]),
            )
        console.print(t)
        return
    k, p = report["keyed"], report["plain"]
    t = Table(
        title=f"keys on {report['store']}: {report['keys']:,} keys x {report['tasks_per_key']} tasks of"
        f" {report['duration_s']:g} s, each key {report['concurrency']} at once and {report['rate']}/s;"
        f" {report['workers']} workers x {report['slots']} slots"
    )
    for c in ("run", "tasks", "wall s", "tasks/s", "most in flight", "most starts in 1 s", "(bodies)", "dup"):
        t.add_column(c, justify="left" if c == "run" else "right")
    t.add_row(
        "keyed",
        _f(k["ran"]),
        _f(k["wall_s"]),
        _f(k["tasks_per_s"], 0),
        _f(k["max_in_flight"]),
        _f(k["max_starts_per_window"]),
        _f(k["max_body_starts_per_window"]),
        _f(k["duplicates"]),
    )
    if p:
        t.add_row(
            "no limit", _f(p["ran"]), _f(p["wall_s"]), _f(p["tasks_per_s"], 0), "—", "—", "—", _f(p["duplicates"])
        )
    console.print(t)
    if report["ideal_s"] > 0:
        console.print(
            f"ideal (the keys' own bounds) {report['ideal_s']:.3f} s = {_f(report['allowed_tasks_per_s'], 0)} tasks/s;"
            f" throughput / allowed [bold]{_f(report['throughput_ratio'])}[/] (target >= 0.9)"
            + (f"; no limit / keyed wall {_f(report['keyed_vs_plain'])}" if p else "")
        )
    elif p:  # no-op tasks under a limit that never binds (--w1): the keys allow anything
        console.print(f"keyed / no limit throughput [bold]{_f(report['keyed_vs_plain'])}[/] (target >= 0.8)")
    console.print(
        f"per key: span p50 {_f(k['key_span_p50_s'])} s, max {_f(k['key_span_max_s'])} s;"
        f" claim to body p50 {_f(k['claim_to_body_p50_ms'], 1)} ms, p99 {_f(k['claim_to_body_p99_ms'], 1)} ms"
    )
    if report["broken"]:
        for b in report["broken"]:
            console.print(f"[red]bound broken:[/] {b}")
    else:
        console.print("[green]no key broke its bounds[/]")


if __name__ == "__main__":
    main()

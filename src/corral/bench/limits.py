"""``corral bench limits``: flow control against a partner API, as a user runs it.

The partner (:class:`corral.edges.partner.PartnerServer`: at most ``cap``
calls in any sliding second, ~``latency`` a call, 429 + Retry-After over the
cap, 503 in an outage) runs in this process; the tasks run in ``--workers``
``corral worker corral.bench.limits_app:app`` processes against a fresh
store. What is reported comes from the partner's own call log and the
store's own records, never from the workers' word. Three scenarios:

- ``rate``: N SKU syncs under the limit ``corral plan`` advises
  (``planning.limit_advice``), and, for comparison, under the limit a user
  might write by hand (``concurrency`` from QPS x latency x 0.7, ``rate`` =
  the cap, default burst);
- ``breaker``: the partner fails every call with 503 for ``--outage``
  seconds from the first call, then recovers; the same workload without and
  with a breaker on the limit;
- ``retry``: fresh tasks arriving at a steady pace while failing tasks
  retry (arriving alongside them, and, apart, all queued at the start),
  against the same arrivals alone; the fresh tasks' wait (submit to start,
  from the store's records);
- ``adaptive``: ``rate="auto"`` (``max_rate`` twice the partner's cap,
  so the limit starts at a twentieth of it, 10/s against a cap of 100) with
  work always waiting; the cap halves after ``--adaptive-phases``' first
  part: how soon the limit finds the cap, how many calls are throttled
  (each a ``Retry``, no attempt burned), and the same after the halving;
- ``sustain``: plentiful short calls (``--sustain-latency-ms``) under
  ``rate="N/s"`` with the default burst, for each N of ``--rates``: the
  busiest sliding second (from the store's start times and from the
  partner's log) and the rate held, as a share of N.

Each scenario is one child process (``python -m corral.bench.limits
--scenario S``) printing one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from corral.bench import common
from corral.bench.common import emit_progress
from corral.core.model import BreakerEvent
from corral.core.planning import concurrency_limit, limit_advice
from corral.core.rates import parse_rate
from corral.core.states import FINAL
from corral.core.stats import percentile
from corral.edges.fleet import WorkerFleet
from corral.edges.partner import Call, max_in_window

SCENARIOS = ("rate", "breaker", "retry", "sustain", "adaptive")
APP_SPEC = "corral.bench.limits_app:app"
SUBMIT_BATCH = 1000
#: the breaker of the breaker scenario (``app.breaker("partner_api", ...)``)
BREAKER = {"failure_ratio": 0.5, "min_calls": 10, "window": "10s", "cooldown": "5s", "probes": 3}


# ---- targets ------------------------------------------------------------------------------
def target(name: str, value: Any, goal: str, met: bool | None) -> dict[str, Any]:
    """One line of a scenario's verdict (``met`` None: could not be measured)."""
    return {"name": name, "value": value, "target": goal, "met": met}


# ---- the rate scenario's figures --------------------------------------------------------------
def window_rates(times: Sequence[float]) -> list[int]:
    """Accepted calls in each whole second after the first one, up to the
    last full second: ``[t0 + k, t0 + k + 1)`` for k = 1 .. floor(span) - 1,
    where t0 is the first call. The first second holds the initial burst and
    the last one is cut short, so neither says what rate is held."""
    if not times:
        return []
    ts = sorted(times)
    t0 = ts[0]
    full = math.floor(ts[-1] - t0)
    counts = [0] * max(0, full - 1)
    for t in ts:
        k = math.floor(t - t0)
        if 1 <= k < full:
            counts[k - 1] += 1
    return counts


def rate_figures(log: Sequence[Call], *, cap: int, rate: float, burst: int) -> dict[str, Any]:
    """What the partner saw of one run under a rate limit."""
    ok = sorted(c.at for c in log if c.status == 200)
    over = sum(1 for c in log if c.status == 429)
    per_window = window_rates(ok)
    span = ok[-1] - ok[0] if ok else 0.0
    # the burst's tokens are spent at once; every later call waits for a token
    expected = max(0, len(ok) - burst) / rate
    by_worker: dict[str, int] = {}
    for c in log:
        if c.status == 200:
            by_worker[c.worker] = by_worker.get(c.worker, 0) + 1
    t0 = ok[0] if ok else 0.0
    return {
        "calls": len(log),
        "ok": len(ok),
        "over_cap": over,
        "busiest_second": max_in_window([t - t0 for t in ok], 1.0),
        "windows": len(per_window),
        "min_rate": min(per_window) if per_window else None,
        "median_rate": percentile(per_window, 0.5) if per_window else None,
        "wall_s": round(span, 3),
        "expected_s": round(expected, 3),
        "wall_ratio": round(span / expected, 4) if expected > 0 else None,
        "calls_by_worker": sorted(by_worker.values(), reverse=True),
        "per_second": per_window,
    }


def rate_targets(fig: dict[str, Any], *, cap: int, rate: float, workers: int) -> list[dict[str, Any]]:
    min_rate = fig["min_rate"]
    ratio = fig["wall_ratio"]
    shares = fig["calls_by_worker"]
    return [
        target("requests over the cap", fig["over_cap"], "0", fig["over_cap"] == 0),
        target("busiest sliding second", fig["busiest_second"], f"<= {cap}", fig["busiest_second"] <= cap),
        target(
            "slowest whole second",
            min_rate,
            f">= {0.95 * rate:g}/s (95 % of {rate:g}/s)",
            None if min_rate is None else min_rate >= 0.95 * rate,
        ),
        target(
            "wall / (N - burst) / rate",
            ratio,
            "within 5 %",
            None if ratio is None else abs(ratio - 1.0) <= 0.05,
        ),
        target(
            "worker processes that made calls",
            len(shares),
            f"{workers} (one limit across all of them)",
            len(shares) == workers,
        ),
    ]


# ---- the breaker scenario's figures -----------------------------------------------------------
def open_spans(events: Sequence[BreakerEvent], end: float) -> list[tuple[float, float]]:
    """The times a breaker was OPEN: from each change to OPEN to the next
    change away from it (or ``end``)."""
    spans = []
    opened: float | None = None
    for e in sorted(events, key=lambda e: e.at):
        if e.after == "OPEN" and opened is None:
            opened = e.at
        elif e.after != "OPEN" and opened is not None:
            spans.append((opened, e.at))
            opened = None
    if opened is not None:
        spans.append((opened, end))
    return spans


def cooldown_at(events: Sequence[BreakerEvent], when: float, base: float, cap: float = 600.0) -> float | None:
    """The cooldown in force at ``when``: the base one after the breaker
    opened on its counts, doubled by each failed probe since (up to ``cap``);
    None when the breaker was not open or half-open then."""
    cooldown: float | None = None
    for e in sorted(events, key=lambda e: e.at):
        if e.at > when:
            break
        if e.after == "OPEN":
            cooldown = min(cap, cooldown * 2) if (e.before == "HALF_OPEN" and cooldown) else base
        elif e.after == "CLOSED":
            cooldown = None
    return cooldown


def breaker_figures(
    log: Sequence[Call], outage: tuple[float, float] | None, events: Sequence[BreakerEvent], cooldown: float
) -> dict[str, Any]:
    """What the partner and the breaker's log show of one outage run."""
    if outage is None:
        return {"calls": len(log), "outage_calls": None}
    start, end = outage
    during = sum(1 for c in log if start <= c.at < end)
    first_ok = next((c.at for c in log if c.status == 200 and c.at >= end), None)
    last = max((c.at for c in log), default=end)
    spans = open_spans(events, last)
    # a call whose attempt the store handed out inside an OPEN span (by its
    # own claim time, on the clock of the breaker's changes) is an attempt
    # burned on a downstream known to be down
    burned = [
        (round(c.claimed - a, 4), round(c.at - a, 4), c.status, c.worker)
        for c in log
        if c.claimed is not None
        for a, b in spans
        if a < c.claimed < b
    ]
    return {
        "calls": len(log),
        "outage_s": round(end - start, 3),
        "outage_calls": during,
        "opened": sum(1 for e in events if e.after == "OPEN"),
        "open_s": round(sum(b - a for a, b in spans), 3),
        "claimed_while_open": len(burned),
        # (claim, call) in seconds after the breaker opened, answer, process: the first ten
        "claimed_while_open_calls": burned[:10],
        "recovery_to_first_ok_s": None if first_ok is None else round(first_ok - end, 3),
        "cooldown_at_recovery_s": cooldown_at(events, end, cooldown),
        "changes": [
            {"at": round(e.at - start, 3), "before": e.before, "after": e.after, "reason": e.reason}
            for e in sorted(events, key=lambda e: e.at)
        ],
    }


def breaker_targets(without: dict[str, Any], with_: dict[str, Any]) -> list[dict[str, Any]]:
    a, b = without.get("outage_calls"), with_.get("outage_calls")
    fewer = None if not a or b is None else round(1.0 - b / a, 4)
    delay, cool = with_.get("recovery_to_first_ok_s"), with_.get("cooldown_at_recovery_s")
    return [
        target("fewer outage calls with the breaker", fewer, ">= 90 %", None if fewer is None else fewer >= 0.9),
        target(
            "attempts claimed while OPEN",
            with_.get("claimed_while_open"),
            "0",
            with_.get("claimed_while_open") == 0,
        ),
        target(
            "recovery to first success (s)",
            delay,
            f"<= the cooldown in force ({cool:g} s)" if cool else "<= the cooldown in force",
            None if delay is None or cool is None else delay <= cool,
        ),
    ]


# ---- the retry-path scenario's figures --------------------------------------------------------
def wait_figures(waits: Sequence[float]) -> dict[str, Any]:
    return {
        "tasks": len(waits),
        "p50_wait_ms": common.ms(percentile(waits, 0.5)),
        "p99_wait_ms": common.ms(percentile(waits, 0.99)),
        "max_wait_ms": common.ms(max(waits)) if waits else None,
    }


def retry_targets(alone: dict[str, Any], beside: dict[str, Any]) -> list[dict[str, Any]]:
    a, b = alone.get("p99_wait_ms"), beside.get("p99_wait_ms")
    ratio = round(b / a, 3) if a and b is not None else None
    return [target("fresh p99 wait, with / without retries", ratio, "<= 2x", None if ratio is None else ratio <= 2.0)]


# ---- running: the fleet --------------------------------------------------------------------
def _fleet(url: str, partner_url: str | None, n: int, concurrency: int) -> WorkerFleet:
    """``n`` ``corral worker`` processes on ``url``, started as a user would."""
    env = {"CORRAL_BENCH_PARTNER_URL": partner_url} if partner_url else {}
    return WorkerFleet(APP_SPEC, url, n, concurrency, env)


def _wait_final(app, n: int, fleet: WorkerFleet, timeout: float, progress: bool) -> None:
    end = time.monotonic() + timeout
    while True:
        counts = app.counts()
        done = sum(v for k, v in counts.items() if k in {s.value for s in FINAL})
        if progress:
            emit_progress(done, n)
        if done >= n:
            return
        fleet.check()
        if time.monotonic() > end:
            raise RuntimeError(f"timed out after {timeout:g}s: {done}/{n} tasks final ({counts})")
        time.sleep(0.25)


def _submit(app, name: str, n: int, prefix: str = "sku") -> None:
    for start in range(0, n, SUBMIT_BATCH):
        app.submit_many(name, [{"args": (f"{prefix}-{i}",)} for i in range(start, min(n, start + SUBMIT_BATCH))])


@dataclass
class PartnerRun:
    log: list[Call]
    outage: tuple[float, float] | None
    events: list[BreakerEvent]
    counts: dict[str, int]
    elapsed_s: float
    #: the breaker's configured cooldown (s), as the store keeps it
    cooldown: float
    #: claim to written outcome of each finished task (s): how long it held its place under the limit
    held: list[float]
    #: the store's start time of each finished task
    starts: list[float]


def partner_run(
    args,
    *,
    task: str,
    n: int,
    limit: dict[str, Any],
    breaker: dict[str, Any] | None = None,
    outage: float = 0.0,
    cap: int | None = None,
    latency_ms: float | None = None,
) -> PartnerRun:
    """One run: a fresh store with ``limit`` (and ``breaker``) declared, the
    partner and the worker processes up, then ``n`` tasks submitted; until
    every task is final."""
    from corral.bench.limits_app import LIMIT, build_app
    from corral.core.model import TaskFilter
    from corral.core.states import State
    from corral.edges.partner import PartnerServer

    with common.temp_store_url(args.store, args.pg_url) as url:
        app = build_app(url)
        try:
            app.limit(LIMIT, **limit)
            if breaker is not None:
                app.breaker(LIMIT, **breaker)
            cap = args.cap if cap is None else cap
            latency = (args.latency_ms if latency_ms is None else latency_ms) / 1000.0
            with PartnerServer(cap=cap, latency=latency) as partner:
                if outage:
                    partner.state.arm_outage(outage)
                with _fleet(url, partner.url, args.workers, args.concurrency) as fleet:
                    # every process is up before the work arrives, so none starts late
                    fleet.wait_ready()
                    t0 = time.monotonic()
                    _submit(app, task, n)
                    _wait_final(app, n, fleet, args.timeout, args.progress)
                elapsed = time.monotonic() - t0
                log = partner.state.calls_log()
                window = partner.state.outage_window
            events, cooldown = [], 0.0
            if breaker is not None:
                events = app.store.breaker_events(LIMIT, limit=10_000)
                cooldown = app.store.breakers()[LIMIT][0].cooldown
            done = app.store.list_tasks(TaskFilter(name=task, status=State.SUCCESS, limit=n + 1))
            held = [r.finished_at - r.started_at for r in done if r.finished_at and r.started_at]
            starts = sorted(r.started_at for r in done if r.started_at)
            return PartnerRun(log, window, events, app.counts(), round(elapsed, 3), cooldown, held, starts)
        finally:
            app.store.close()


def scenario_rate(args) -> dict[str, Any]:
    latency = args.latency_ms / 1000.0
    advice = limit_advice(args.cap, latency)
    runs = []
    variants = [
        (
            "advised",
            args.tasks,
            {"concurrency": advice.concurrency, "rate": f"{advice.rate_per_s}/s"},
            float(advice.rate_per_s),
            # default burst: the sliding window's pacing bucket is spent at once
            int(parse_rate(f"{advice.rate_per_s}/s").bucket_size),
        )
    ]
    if args.hand_tasks:
        conc = concurrency_limit(args.cap, latency).limit
        # default burst: the sliding window's pacing bucket is spent at once
        first = int(parse_rate(f"{args.cap}/s").bucket_size)
        variants.append(("by hand", args.hand_tasks, {"concurrency": conc, "rate": f"{args.cap}/s"}, args.cap, first))
    for label, n, limit, rate, burst in variants:
        run = partner_run(args, task="limits.sync_sku", n=n, limit=limit)
        fig = rate_figures(run.log, cap=args.cap, rate=rate, burst=burst)
        runs.append(
            {
                "variant": label,
                "tasks": n,
                "limit": limit,
                "elapsed_s": run.elapsed_s,
                "succeeded": run.counts.get("SUCCESS", 0),
                # a limit of `concurrency` places held this long each runs at most concurrency / held a second
                "held_p50_ms": common.ms(percentile(run.held, 0.5)),
                "held_p90_ms": common.ms(percentile(run.held, 0.9)),
                **fig,
                "targets": rate_targets(fig, cap=args.cap, rate=rate, workers=args.workers),
            }
        )
    return {"scenario": "rate", "cap": args.cap, "latency_ms": args.latency_ms, "runs": runs}


def scenario_breaker(args) -> dict[str, Any]:
    advice = limit_advice(args.cap, args.latency_ms / 1000.0)
    limit = {"concurrency": advice.concurrency, "rate": f"{advice.rate_per_s}/s"}
    out: dict[str, Any] = {}
    for label, breaker in (("without", None), ("with", BREAKER)):
        run = partner_run(
            args, task="limits.sync_sku_outage", n=args.breaker_tasks, limit=limit, breaker=breaker, outage=args.outage
        )
        fig = breaker_figures(run.log, run.outage, run.events, run.cooldown)
        out[label] = {"elapsed_s": run.elapsed_s, "succeeded": run.counts.get("SUCCESS", 0), **fig}
    return {
        "scenario": "breaker",
        "tasks": args.breaker_tasks,
        "outage_s": args.outage,
        "limit": limit,
        "breaker": BREAKER,
        "without": out["without"],
        "with": out["with"],
        "targets": breaker_targets(out["without"], out["with"]),
    }


def retry_run(args, failing: int, arrival: str = "start") -> dict[str, Any]:
    """Fresh tasks arriving at ``--fresh-rate`` a second beside ``failing``
    failing tasks, queued at the start (``arrival="start"``) or arriving
    alongside the fresh ones, spread over the same seconds (``"alongside"``);
    the fresh tasks' waits from the store.

    Each stream comes as one submit every 50 ms; alongside, the failing
    tasks' submit comes half a step after the fresh one. Submitted in the
    same instant, the fresh tasks' claims waited for the second submit's
    write (SQLite has one writer): a delay of the benchmark's own making,
    which the same tasks arriving a moment apart do not have."""
    from corral.bench.limits_app import build_app
    from corral.core.model import TaskFilter

    n = args.retry_tasks
    with common.temp_store_url(args.store, args.pg_url) as url:
        app = build_app(url)
        try:
            with _fleet(url, None, args.workers, args.concurrency) as fleet:
                fleet.wait_ready()
                t0 = time.monotonic()
                if failing and arrival == "start":
                    _submit(app, "limits.flaky", failing, prefix="f")
                step, per = 0.05, max(1, round(args.fresh_rate * 0.05))
                sent = flaky_sent = 0
                while sent < n:
                    k = min(per, n - sent)
                    app.submit_many("limits.fresh", [{"args": (sent + j,)} for j in range(k)])
                    sent += k
                    if failing and arrival == "alongside":
                        # half a step later: the two streams take turns
                        pause = t0 + step * (sent // per - 0.5) - time.monotonic()
                        if pause > 0:
                            time.sleep(pause)
                        due = failing if sent >= n else failing * sent // n
                        if due > flaky_sent:
                            app.submit_many("limits.flaky", [{"args": (f"f-{i}",)} for i in range(flaky_sent, due)])
                            flaky_sent = due
                    pause = t0 + step * (sent // per) - time.monotonic()
                    if pause > 0:
                        time.sleep(pause)
                _wait_final(app, n + failing, fleet, args.timeout, args.progress)
                elapsed = time.monotonic() - t0
            fresh = app.store.list_tasks(TaskFilter(name="limits.fresh", limit=n + 1))
            waits = [r.started_at - r.created_at for r in fresh if r.started_at is not None]
            retried = app.store.list_tasks(TaskFilter(name="limits.flaky", limit=failing + 1)) if failing else []
            attempts = sum(r.attempt for r in retried)
        finally:
            app.store.close()
    return {
        "failing": failing,
        "arrival": arrival,
        "failing_attempts": attempts,
        "elapsed_s": round(elapsed, 3),
        **wait_figures(waits),
    }


def scenario_retry(args) -> dict[str, Any]:
    alone = retry_run(args, 0)
    alongside = retry_run(args, args.retry_tasks, "alongside")
    at_start = retry_run(args, args.retry_tasks, "start")
    return {
        "scenario": "retry",
        "fresh": args.retry_tasks,
        "fresh_rate": args.fresh_rate,
        "alone": alone,
        "beside_retries": alongside,
        "queued_first": at_start,
        "targets": retry_targets(alone, alongside),
        "queued_first_ratio": retry_targets(alone, at_start)[0]["value"],
    }


# ---- the sustain scenario ----------------------------------------------------------------------
def sustain_figures(log: Sequence[Call], starts: Sequence[float], rate: int) -> dict[str, Any]:
    """What one run under ``rate="N/s"`` (default burst) showed: the partner's
    view (:func:`rate_figures`; the first tokens are the window's pacing
    bucket, spent at once), the busiest sliding second of the store's own
    start times, and the rate held (``sustained``: the time the starts after
    the first tokens take at N a second, over the time they took)."""
    first = int(parse_rate(f"{rate}/s").bucket_size)
    fig = rate_figures(log, cap=rate, rate=float(rate), burst=first)
    ratio = fig["wall_ratio"]
    return {
        **fig,
        "busiest_second_store": max_in_window(sorted(starts), 1.0),
        "sustained": round(1.0 / ratio, 4) if ratio else None,
    }


def sustain_targets(fig: dict[str, Any], rate: int) -> list[dict[str, Any]]:
    """The promise is on starts; the partner's busiest second (also shown)
    adds each call's own delay from its start, which no limit controls."""
    held = fig["sustained"]
    return [
        target(
            "busiest sliding second (store's starts)",
            fig["busiest_second_store"],
            f"<= {rate}",
            fig["busiest_second_store"] <= rate,
        ),
        target("rate held", held, ">= 0.95 of the rate", None if held is None else held >= 0.95),
    ]


def scenario_sustain(args) -> dict[str, Any]:
    runs = []
    for rate in [int(r) for r in str(args.rates).split(",") if r.strip()]:
        n = rate * (args.sustain_seconds + 1)  # the first second's N, then N a second
        limit = {"rate": f"{rate}/s"}
        # the partner refuses nothing: the figures say what the limit let through
        run = partner_run(
            args, task="limits.sync_sku", n=n, limit=limit, cap=max(10 * rate, 1000), latency_ms=args.sustain_latency_ms
        )
        fig = sustain_figures(run.log, run.starts, rate)
        runs.append(
            {
                "rate": rate,
                "tasks": n,
                "limit": limit,
                "elapsed_s": run.elapsed_s,
                "succeeded": run.counts.get("SUCCESS", 0),
                **fig,
                "targets": sustain_targets(fig, rate),
            }
        )
    return {"scenario": "sustain", "latency_ms": args.sustain_latency_ms, "runs": runs}


# ---- the adaptive scenario ---------------------------------------------------------------------
def per_second(times: Sequence[float], t0: float, seconds: int) -> list[int]:
    """How many of ``times`` fall in each whole second ``[t0 + k, t0 + k + 1)``, k < ``seconds``."""
    out = [0] * max(0, seconds)
    for t in times:
        k = math.floor(t - t0)
        if 0 <= k < seconds:
            out[k] += 1
    return out


#: the adaptive scenario compares throughputs from this second on (the slow start is over)
SETTLED = 15


def adaptive_figures(log: Sequence[Call], t0: float, first: int, second: int, cap: int) -> dict[str, Any]:
    """What the partner saw: successes and 429s per second from the submit
    (``t0``, wall clock), the cap ``cap`` for ``first`` seconds, then half."""
    total = first + second
    ok = per_second([c.at for c in log if c.status == 200], t0, total)
    over = per_second([c.at for c in log if c.status == 429], t0, total)

    def share(a: int, b: int) -> float | None:
        calls = sum(ok[a:b]) + sum(over[a:b])
        return round(100.0 * sum(over[a:b]) / calls, 2) if calls else None

    def mean(a: int, b: int) -> float | None:
        return round(sum(ok[a:b]) / (b - a), 1) if b > a else None

    reach = next((k + 5 for k in range(0, first - 4) if sum(ok[k : k + 5]) >= 5 * 0.9 * cap), None)
    best = max((sum(ok[k : k + 5]) / 5 for k in range(0, first - 4)), default=None)
    half = cap / 2
    reach_half = next((k + 5 - first for k in range(first, total - 4) if sum(ok[k : k + 5]) >= 5 * 0.85 * half), None)
    return {
        "seconds_to_90pct": reach,
        "best_5s_before_halving": best,
        "throughput_15s_on": mean(SETTLED, first),
        "throttled_pct_first": share(0, first),
        "throughput_after_reach": None if reach is None else mean(reach, first),
        "throttled_pct_after_halving_10s_on": share(first + 10, total),
        "throughput_after_halving_20s_on": mean(first + 20, total),
        "seconds_to_85pct_after_halving": reach_half,
        "ok_per_second": ok,
        "throttled_per_second": over,
    }


def adaptive_targets(fig: dict[str, Any], cap: int, burned: int) -> list[dict[str, Any]]:
    reach, first, after = fig["seconds_to_90pct"], fig["throttled_pct_first"], fig["throttled_pct_after_halving_10s_on"]
    tput, reach_half = fig["throughput_after_halving_20s_on"], fig["seconds_to_85pct_after_halving"]
    return [
        target(f"seconds to 90 % of {cap}/s (5 s average)", reach, "<= 30", reach is not None and reach <= 30),
        target("calls throttled before the halving (%)", first, "< 2", None if first is None else first < 2.0),
        target("attempts burned", burned, "0", burned == 0),
        target("calls throttled 10 s after the halving on (%)", after, "< 2", None if after is None else after < 2.0),
        target(
            f"seconds to 85 % of {cap / 2:g}/s after the halving",
            reach_half,
            "<= 20",
            None if reach_half is None else reach_half <= 20,
        ),
        target(
            "throughput 20 s after the halving on (/s)",
            tput,
            f">= {0.85 * cap / 2:g}",
            None if tput is None else tput >= 0.85 * cap / 2,
        ),
    ]


def _leader(fleet: WorkerFleet) -> int | None:
    """The worker (index) whose sweeper took the lead last, from the workers'
    logs (``sweeper HOST:PID:ID took the lead``): the one that runs the
    adaptive controller."""
    pids = {p.pid: k for k, p in enumerate(fleet.procs) if k not in fleet.killed}
    for k in pids.values():
        said = re.findall(r"sweeper \S+?:(\d+):\w+ (took|lost) the lead", fleet.log_text(k))
        if said and said[-1][1] == "took" and pids.get(int(said[-1][0])) == k:
            return k  # its last word on the lead: it holds it
    return None


def handover(effective: list[tuple[float, float]], events: list[tuple[float, float]], killed_at: float) -> dict:
    """The effective rate across a change of leader: the rate the old leader
    left (its last decision before ``killed_at``), the seconds without a
    decision, and the furthest the rate strayed from it from the kill to the
    new leader's first decision, that one included (``effective``: (seconds,
    rate/s) sampled; ``events``: (seconds, rate/s) of each decision, which is
    written only when the rate changes; seconds from the submit)."""
    before = [r for t, r in events if t < killed_at]
    after = [(t, r) for t, r in events if t >= killed_at]
    if not before or not after:
        return {"killed_at_s": round(killed_at, 2), "rate_left": before[-1] if before else None, "decided_again": None}
    left = before[-1]
    until, first = after[0]
    seen = [r for t, r in effective if killed_at <= t <= until] + [first]
    worst = max(seen, key=lambda r: abs(r - left))
    return {
        "killed_at_s": round(killed_at, 2),
        "rate_left": left,
        "seconds_without_a_decision": round(until - max(t for t, _ in events if t < killed_at), 2),
        "first_decision_after_kill_s": round(until - killed_at, 2),
        "new_leaders_first_rate": first,
        "furthest_rate": worst,
        "furthest_pct": round(100.0 * (worst - left) / left, 1),
    }


def adaptive_run(args, limit: dict[str, Any], first: int, second: int, kill_at: float | None = None) -> dict[str, Any]:
    """One run of the adaptive scenario's load under ``limit``: work always
    waiting, the partner's cap for ``first`` seconds, then half of it for
    ``second`` (none: 0). The partner's log, the effective rate each second.
    With ``kill_at``, the worker that leads is SIGKILLed that many seconds in."""
    from corral.bench.limits_app import LIMIT, build_app
    from corral.core.model import TaskFilter
    from corral.edges.partner import PartnerServer

    cap = args.cap
    task = "limits.sync_sku_adaptive"
    n = int(1.5 * (cap * first + cap / 2 * second))
    with common.temp_store_url(args.store, args.pg_url) as url:
        app = build_app(url)
        try:
            app.limit(LIMIT, **limit)
            with PartnerServer(cap=cap, latency=args.adaptive_latency_ms / 1000.0) as partner:
                with _fleet(url, partner.url, args.workers, args.concurrency) as fleet:
                    fleet.wait_ready()
                    _submit(app, task, n)
                    t0, m0 = time.time(), time.monotonic()
                    effective: list[str | None] = []
                    sampled: list[tuple[float, float | None]] = []  # (seconds in, rate/s), ten a second
                    killed_at: float | None = None
                    halved = False
                    while time.monotonic() - m0 < first + second:
                        k = len(effective)
                        rate = app.store.limits()[LIMIT].rate
                        sampled.append((time.monotonic() - m0, _per_s(rate)))
                        if time.monotonic() - m0 >= k:
                            effective.append(rate)
                        if kill_at is not None and killed_at is None and time.monotonic() - m0 >= kill_at:
                            lead = _leader(fleet)
                            if lead is not None:
                                fleet.kill(lead)
                                killed_at = time.time() - t0
                        if not halved and time.monotonic() - m0 >= first:
                            with partner.state.lock:
                                partner.state.cap = cap // 2
                            halved = True
                        fleet.check()
                        if args.progress:
                            emit_progress(min(k, first + second), first + second)
                        time.sleep(0.05)
                log = partner.state.calls_log()
            done = app.store.list_tasks(TaskFilter(name=task, limit=n + 1))
            # a throttle is a Retry: the attempt goes back; any attempt past the first is one burned
            burned = sum(max(0, r.attempt - 1) for r in done) + sum(1 for r in done if r.status.value == "FAILED")
            events = app.store.events("limit_adapted", limit=10_000)
        finally:
            app.store.close()
    decisions = []
    for e in reversed(events):  # oldest first: when, the new rate, its rule, what the fleet reported
        d = json.loads(e.data)
        i = d["inputs"]
        decisions.append(
            [
                round(e.at - t0, 2),
                d["rate"],
                d["rate_rule"],
                i["calls"],
                i["successes"],
                i["throttles"],
                i["held_by_rate"],
            ]
        )
    return {
        "log": log,
        "t0": t0,
        "effective": effective,
        "burned": burned,
        "events": len(events),
        "decisions": decisions,
        "handover": None
        if kill_at is None
        else (
            {"killed_at_s": None, "why": "no leader found in the workers' logs"}
            if killed_at is None
            else handover(
                [(t, r) for t, r in sampled if r is not None],
                [(d[0], float(d[1])) for d in decisions],
                killed_at,
            )
        ),
    }


def _per_s(rate: str | None) -> float | None:
    return None if rate is None else parse_rate(rate).per_second


def scenario_adaptive(args) -> dict[str, Any]:
    first, second = (int(x) for x in str(args.adaptive_phases).split(","))
    cap = args.cap
    limit = {"rate": "auto", "max_rate": f"{2 * cap}/s"}
    kill_at = first / 2 if getattr(args, "kill_leader", False) else None
    run = adaptive_run(args, limit, first, second, kill_at=kill_at)
    fig = adaptive_figures(run["log"], run["t0"], first, second, cap)
    out = {
        "scenario": "adaptive",
        "cap": cap,
        "latency_ms": args.adaptive_latency_ms,
        "phases": [first, second],
        "limit": limit,
        "effective_per_second": run["effective"],
        "attempts_burned": run["burned"],
        "events": run["events"],
        "decisions": run["decisions"],
        **fig,
        "targets": adaptive_targets(fig, cap, run["burned"]),
    }
    if kill_at is not None:
        h = out["handover"] = run["handover"]
        pct = h.get("furthest_pct")
        met = None if pct is None else abs(pct) <= 10
        out["targets"].append(target("effective rate across the change of leader (%)", pct, "within +/-10", met))
    if args.adaptive_compare:
        # the best fixed limit in hindsight for the first part: the cap itself
        fixed = adaptive_run(args, {"rate": f"{cap}/s"}, first, 0)
        ok = per_second([c.at for c in fixed["log"] if c.status == 200], fixed["t0"], first)
        over = sum(1 for c in fixed["log"] if c.status == 429)
        fixed_tput = round(sum(ok[SETTLED:first]) / max(1, first - SETTLED), 1)
        share = None
        if fig["throughput_15s_on"] is not None and fixed_tput:
            share = round(fig["throughput_15s_on"] / fixed_tput, 3)
        out["fixed"] = {"limit": f"{cap}/s", "ok_per_second": ok, "throttled": over, "throughput": fixed_tput}
        out["targets"].append(
            target(
                f"throughput / fixed {cap}/s's, same seconds", share, ">= 0.9", None if share is None else share >= 0.9
            )
        )
    return out


def run(args) -> dict[str, Any]:
    scenarios = {
        "rate": scenario_rate,
        "breaker": scenario_breaker,
        "retry": scenario_retry,
        "sustain": scenario_sustain,
        "adaptive": scenario_adaptive,
    }
    body = scenarios[args.scenario](args)
    return {"store": args.store, "workers": args.workers, "concurrency": args.concurrency, **body}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m corral.bench.limits", description=__doc__.splitlines()[0])
    p.add_argument("--scenario", choices=SCENARIOS, required=True)
    p.add_argument("--store", default="sqlite", choices=["sqlite", "postgres"])
    p.add_argument("--pg-url", default=None)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=20)
    p.add_argument("--tasks", type=int, default=3000)
    p.add_argument("--hand-tasks", type=int, default=1000)
    p.add_argument("--breaker-tasks", type=int, default=600)
    p.add_argument("--outage", type=float, default=20.0)
    p.add_argument("--retry-tasks", type=int, default=1000)
    p.add_argument("--fresh-rate", type=float, default=200.0)
    p.add_argument("--cap", type=int, default=100)
    p.add_argument("--latency-ms", type=float, default=200.0)
    p.add_argument("--rates", default="20,60,200")
    p.add_argument("--sustain-seconds", type=int, default=10)
    p.add_argument("--sustain-latency-ms", type=float, default=20.0)
    p.add_argument("--adaptive-phases", default="40,30")
    p.add_argument("--adaptive-latency-ms", type=float, default=50.0)
    p.add_argument("--adaptive-compare", action="store_true")
    p.add_argument("--kill-leader", action="store_true")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--progress", action="store_true")
    return p


def child_argv(scenario: str, **opts: Any) -> list[str]:
    return common.child_argv("corral.bench.limits", "--scenario", scenario, **opts)


def main(argv: list[str] | None = None) -> None:
    common.child_main(parser, run, argv)


if __name__ == "__main__":
    main()


# ---- the tables ---------------------------------------------------------------------------
def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:,.3f}".rstrip("0").rstrip(".") if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, list):
        return " + ".join(_fmt(x) for x in v)
    return str(v)


def _limit_text(limit: dict[str, Any]) -> str:
    burst = limit.get("burst")
    return f"{limit['concurrency']} at once, {limit['rate']}, burst {burst if burst is not None else 'default'}"


def verdicts(report: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every target of a ``bench limits`` report, with the run it belongs to."""
    out = []
    for r in report["results"]:
        if r["scenario"] == "rate":
            out += [(f"rate: {run['variant']}", t) for run in r["runs"] for t in run["targets"]]
        elif r["scenario"] == "sustain":
            out += [(f"sustain: {run['rate']}/s", t) for run in r["runs"] for t in run["targets"]]
        else:
            out += [(r["scenario"], t) for t in r["targets"]]
    return out


def render(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(120, Console().width))
    head = f"{report['store']}, {report['workers']} worker processes x {report['concurrency']} slots"
    for r in report["results"]:
        if r["scenario"] == "rate":
            t = Table(
                title=f"rate: partner capped at {r['cap']} calls in any sliding second, "
                f"{r['latency_ms']:g} ms a call ({head})"
            )
            cols: tuple[str, ...] = (
                "limit",
                "tasks",
                "429s",
                "busiest 1 s",
                "min / median per s",
                "wall s",
                "(N-burst)/rate s",
                "ratio",
                "calls per worker",
            )
            t.add_column("variant")
            for c in cols:
                t.add_column(c, justify="right")
            for run in r["runs"]:
                t.add_row(
                    run["variant"],
                    _limit_text(run["limit"]),
                    _fmt(run["ok"]),
                    _fmt(run["over_cap"]),
                    _fmt(run["busiest_second"]),
                    f"{_fmt(run['min_rate'])} / {_fmt(run['median_rate'])}",
                    _fmt(run["wall_s"]),
                    _fmt(run["expected_s"]),
                    _fmt(run["wall_ratio"]),
                    _fmt(run["calls_by_worker"]),
                )
        elif r["scenario"] == "sustain":
            t = Table(title=f'sustain: plentiful {r["latency_ms"]:g} ms calls under rate="N/s", default burst ({head})')
            cols = (
                "tasks",
                "busiest 1 s (store)",
                "busiest 1 s (partner)",
                "min / median per s",
                "wall s",
                "(N-burst)/rate s",
                "rate held",
                "calls per worker",
            )
            t.add_column("rate")
            for c in cols:
                t.add_column(c, justify="right")
            for run in r["runs"]:
                t.add_row(
                    f"{run['rate']}/s",
                    _fmt(run["ok"]),
                    _fmt(run["busiest_second_store"]),
                    _fmt(run["busiest_second"]),
                    f"{_fmt(run['min_rate'])} / {_fmt(run['median_rate'])}",
                    _fmt(run["wall_s"]),
                    _fmt(run["expected_s"]),
                    _fmt(run["sustained"]),
                    _fmt(run["calls_by_worker"]),
                )
        elif r["scenario"] == "adaptive":
            first, second = r["phases"]
            t = Table(
                title=f'adaptive: rate="auto" (max {r["limit"]["max_rate"]}), partner capped '
                f"at {r['cap']}/s for {first} s then {r['cap'] // 2}/s for {second} s, {r['latency_ms']:g} ms a call "
                f"({head})"
            )
            for c in ("second", "effective rate", "successes", "429s"):
                t.add_column(c, justify="right")
            eff = r["effective_per_second"]
            for k, (ok, over) in enumerate(zip(r["ok_per_second"], r["throttled_per_second"], strict=True)):
                if k % 5 == 0 or k == first:
                    t.add_row(str(k), _fmt(eff[k] if k < len(eff) else None), _fmt(ok), _fmt(over))
        elif r["scenario"] == "breaker":
            t = Table(
                title=f"breaker: {r['tasks']} SKU syncs, the partner down {r['outage_s']:g} s "
                f"from its first call ({head})"
            )
            cols = (
                "outage calls",
                "opened",
                "open s",
                "claimed while open",
                "recovery to 1st ok s",
                "cooldown then s",
                "elapsed s",
            )
            t.add_column("run")
            for c in cols:
                t.add_column(c, justify="right")
            for label in ("without", "with"):
                b = r[label]
                t.add_row(
                    f"{label} breaker",
                    _fmt(b.get("outage_calls")),
                    _fmt(b.get("opened")) if label == "with" else "—",
                    _fmt(b.get("open_s")) if label == "with" else "—",
                    _fmt(b.get("claimed_while_open")) if label == "with" else "—",
                    _fmt(b.get("recovery_to_first_ok_s")),
                    _fmt(b.get("cooldown_at_recovery_s")),
                    _fmt(b.get("elapsed_s")),
                )
        else:
            t = Table(title=f"retry path: {r['fresh']} fresh tasks at {r['fresh_rate']:g}/s ({head})")
            for c in ("run", "failing tasks", "fresh p50 wait ms", "fresh p99 wait ms", "max ms", "elapsed s"):
                t.add_column(c, justify="left" if c == "run" else "right")
            rows = (
                ("fresh alone", "alone"),
                ("failing ones arriving alongside", "beside_retries"),
                ("failing ones queued first", "queued_first"),
            )
            for label, key in rows:
                if key not in r:
                    continue
                x = r[key]
                t.add_row(
                    label,
                    _fmt(x["failing"]),
                    _fmt(x["p50_wait_ms"]),
                    _fmt(x["p99_wait_ms"]),
                    _fmt(x["max_wait_ms"]),
                    _fmt(x["elapsed_s"]),
                )
        console.print(t)
    v = Table(title="targets")
    for c in ("scenario", "measure", "value", "target", ""):
        v.add_column(c, justify="right" if c == "value" else "left")
    for where, tg in verdicts(report):
        met = tg["met"]
        mark = "[green]met[/]" if met else ("[red]not met[/]" if met is False else "[yellow]not measured[/]")
        v.add_row(where, tg["name"], _fmt(tg["value"]), tg["target"], mark)
    console.print(v)

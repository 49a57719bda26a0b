"""``corral demo``'s main scenario: the SKU sync incident, end to end.

3 000 SKUs of 20 merchants are synced from a partner API capped at 100 QPS
(:class:`corral.edges.partner.PartnerServer`, on loopback) that answers a
share of its calls with 503 or 429 anyway. Each SKU is three tasks
(:mod:`corral.edges.demo_app`): its detail, then its images (``depends_on``
the detail), then a notification to its merchant (``depends_on`` the images;
one group per merchant, so each merchant hears about its SKUs in order while
merchants run in parallel).

corral is configured with what the planner advises for the partner
(``planning.limit_advice``: a rate with a safety margin, a burst, a
concurrency) and a breaker on that limit; by default the work runs in two
``corral worker`` processes that share the limit through the store, as a
deployment would. What the report says comes from the partner's own counts
(calls per sliding second, 429s for its cap, notifications in arrival order)
and the store's own records, never from the workers' word.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.core.model import TaskFilter, loads
from corral.core.planning import LimitAdvice, format_duration, limit_advice
from corral.core.states import FINAL, State
from corral.edges import demo_app
from corral.edges.fleet import WorkerFleet
from corral.edges.partner import PartnerServer
from corral.testing.history import History

APP_SPEC = "corral.edges.demo_app:app"
PHASES = ("detail", "images", "notify")
#: SKUs submitted per store write (each write: their details, images and notifications)
SUBMIT_CHUNK = 250
#: the breaker on the partner's limit: an outage holds the work instead of burning its retries
BREAKER: dict[str, Any] = {"failure_ratio": 0.5, "min_calls": 20, "window": "30s", "cooldown": "5s", "probes": 3}
#: merchant notifications in flight at once, over all merchants (the push gateway's limit)
PUSH_CONCURRENCY = 10


# ---- pure: the checks of the report ----------------------------------------------------------
def order_problems(received: Mapping[str, Sequence[int]], expected: Mapping[str, Sequence[int]]) -> dict[str, str]:
    """Per merchant, what is wrong with the notifications it received (none: in order, each once).

    ``expected``: the numbers of the merchant's notifications that the store
    says were delivered, ascending; ``received``: what the merchant got, in
    arrival order. Merchants with nothing wrong are left out."""
    problems: dict[str, str] = {}
    for merchant in sorted(set(received) | set(expected)):
        got = list(received.get(merchant, ()))
        want = sorted(expected.get(merchant, ()))
        if got == want:
            continue
        if len(set(got)) < len(got):
            problems[merchant] = "a notification arrived twice"
        elif sorted(got) != want:
            missing = sorted(set(want) - set(got))
            extra = sorted(set(got) - set(want))
            problems[merchant] = f"missing {missing[:5]} extra {extra[:5]}"
        else:
            k = next(i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b)
            problems[merchant] = f"out of order: #{got[k]} arrived where #{want[k]} should have"
    return problems


def rate_per_s(samples: Sequence[tuple[float, int]], window: float = 5.0) -> float:
    """Events per second over the last ``window`` seconds of ``(time, running total)`` samples."""
    if len(samples) < 2:
        return 0.0
    t1, n1 = samples[-1]
    t0, n0 = next(((t, n) for t, n in samples if t >= t1 - window), samples[0])
    return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0


# ---- the report -------------------------------------------------------------------------------
@dataclass
class Phase:
    counts: dict[str, int]
    avg: float | None
    p99: float | None
    dead: int
    first_dead_error: str | None = None


@dataclass
class MainDemoReport:
    """What ``corral demo`` measured; every figure from the partner or the store."""

    run: str
    store_url: str
    skus: int
    merchants: int
    processes: int
    slots: int
    advice: LimitAdvice
    cap: int
    finished: bool
    elapsed: float
    tasks: int
    synced: int
    phases: dict[str, Phase]
    retries: int
    dead_letters: int
    partner_calls: int
    busiest_second: int
    over_cap_429: int
    flaky: dict[int, int]
    peak_in_flight: int
    notified: int
    order_problems: dict[str, str]
    history_violations: int
    breaker: str
    breaker_opened: int
    level: str
    dashboard_url: str | None = None

    @property
    def ordering_verified(self) -> bool:
        return self.finished and not self.order_problems and self.history_violations == 0

    @property
    def rate_held(self) -> bool:
        return self.over_cap_429 == 0 and self.busiest_second <= self.cap


# ---- worker processes -----------------------------------------------------------------------
@contextmanager
def _env(values: Mapping[str, str]) -> Iterator[None]:
    """Set environment variables for in-process workers, and put them back."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def _dashboard(store: Any, con: Any) -> Iterator[Any]:
    """The web dashboard on loopback while the demo runs, when this install has it."""
    try:
        from corral.edges.dashboard import serve_background  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        yield None
        return
    try:
        server = serve_background(store, host="127.0.0.1", port=0, read_only=False)
    except Exception as exc:  # noqa: BLE001 - the demo runs without it
        con.print(f"  dashboard: could not start ({exc})", markup=False)
        yield None
        return
    try:
        yield server
    finally:
        server.stop()


# ---- the run -----------------------------------------------------------------------------------
def submit_all(app: Any, run: str, skus: Sequence[str], merchants: int) -> int:
    """Queue every SKU's detail, images and notification; returns the tasks queued.

    A chunk of SKUs at a time, so work starts while the rest is queued; within
    a merchant, notification numbers (and ids) follow the SKU order."""
    detail, images, notify = (app.registry[n] for n in (demo_app.DETAIL, demo_app.IMAGES, demo_app.NOTIFY))
    seq: dict[str, int] = {}
    n = 0
    for start in range(0, len(skus), SUBMIT_CHUNK):
        part = list(enumerate(skus[start : start + SUBMIT_CHUNK], start))
        owner = [f"merchant-{1001 + i % merchants}" for i, _ in part]
        d = detail.submit_many(
            [{"args": (sku, m), "key": f"{run}:{sku}:detail"} for (_, sku), m in zip(part, owner, strict=True)],
            batch=f"{run}-detail",
        )
        im = images.submit_many(
            [
                {"args": (sku, m), "key": f"{run}:{sku}:images", "depends_on": [h]}
                for (_, sku), m, h in zip(part, owner, d, strict=True)
            ],
            batch=f"{run}-images",
        )
        calls = []
        for (_, sku), m, h in zip(part, owner, im, strict=True):
            seq[m] = seq.get(m, 0) + 1
            calls.append({"args": (m, seq[m], sku), "group": m, "key": f"{run}:{sku}:notify", "depends_on": [h]})
        notify.submit_many(calls, batch=f"{run}-notify")
        n += 3 * len(part)
    return n


def run_main_demo(
    store_url: str,
    *,
    skus: int = 3000,
    merchants: int = 20,
    processes: int = 2,
    slots: int = 32,
    latency: float = 0.2,
    qps: float = 100.0,
    flaky: float = 0.05,
    seed: int | None = None,
    hold: float = 0.0,
    timeout: float = 900.0,
    console: Any = None,
    hint_store: str | None = None,
) -> MainDemoReport:
    """Run the scenario against ``store_url`` with a live view, print the report, return it."""
    import random

    from rich.console import Console
    from rich.markup import escape

    con = console or Console(highlight=False)
    rng = random.Random(seed)
    merchants = max(1, min(merchants, skus))
    cap = int(qps)
    advice = limit_advice(qps, latency, 0.7)
    run = time.strftime("sku-sync-%Y%m%d-%H%M%S") + f"-{rng.randrange(16**4):04x}"
    sku_ids = [f"SKU-{i:05d}" for i in range(1, skus + 1)]
    bad = frozenset({sku_ids[min(len(sku_ids) - 1, 41)]})
    workdir = Path(tempfile.mkdtemp(prefix="corral-demo-"))
    history_path = workdir / "notify-runs.jsonl"

    app = demo_app.build_app(store_url)
    try:
        app.limit(demo_app.PARTNER_LIMIT, concurrency=advice.concurrency, rate=f"{advice.rate_per_s}/s")
        app.breaker(demo_app.PARTNER_LIMIT, **BREAKER)
        app.limit(demo_app.PUSH_LIMIT, concurrency=PUSH_CONCURRENCY)
        where = (
            f"{processes} `corral worker {APP_SPEC}` processes x {slots} slots, as a deployment runs them: "
            "the limit, the breaker and the groups hold across processes because the store keeps them"
            if processes
            else f"in this process, {slots} slots"
        )
        con.print(
            f"[bold]corral demo[/]: sync {skus} SKUs for {merchants} merchants from a partner API capped at "
            f"{cap} QPS (~{latency * 1000:.0f} ms a call, {flaky:.0%} of answers 503/429)\n"
            f"  each SKU: detail -> images (depends_on) -> a notification to its merchant "
            f"(one ordered lane per merchant)\n"
            f"  planner: [bold]{escape(advice.line(demo_app.PARTNER_LIMIT))}[/], breaker on it; "
            f"{demo_app.PUSH_LIMIT}: concurrency={PUSH_CONCURRENCY}\n"
            f"  workers: {where}\n"
            f"  store: {escape(store_url)}   run: [bold]{run}[/]",
            markup=True,
        )
        with (
            PartnerServer(cap=cap, latency=latency, flaky=flaky, bad_skus=bad, notify_latency=0.01, seed=seed) as p,
            _dashboard(app.store, con) as dash,
        ):
            env = {demo_app.PARTNER_ENV: p.url, demo_app.HISTORY_ENV: str(history_path)}
            if dash is not None:
                con.print(f"  dashboard: [bold]{dash.url}[/] (up while the demo runs)")
            dash_url: str | None = dash.url if dash is not None else None
            meta: dict[str, Any] = {
                "store_url": store_url,
                "skus": skus,
                "merchants": merchants,
                "processes": processes,
                "slots": slots,
                "dashboard_url": dash_url,
            }
            with _env(env):
                if processes:
                    with WorkerFleet(APP_SPEC, store_url, processes, slots, env) as fleet:
                        fleet.wait_ready()
                        finished, elapsed, total = _drive(
                            app, run, sku_ids, merchants, p, advice, con, timeout, fleet, dash_url
                        )
                        report = _report(app, run, p, advice, history_path, finished, elapsed, total, meta)
                else:
                    app.start(workers=slots, poll_interval=0.05)
                    finished, elapsed, total = _drive(
                        app, run, sku_ids, merchants, p, advice, con, timeout, None, dash_url
                    )
                    report = _report(app, run, p, advice, history_path, finished, elapsed, total, meta)
            render_report(report, con, hint_store)
            if dash is not None and hold > 0:
                con.print(f"dashboard kept up for {hold:g}s more: {dash.url}  (Ctrl-C ends it)")
                with suppress(KeyboardInterrupt):
                    time.sleep(hold)
            elif hold > 0:
                con.print("--hold: this install has no web dashboard to keep up")
        return report
    finally:
        app.close(timeout=10)
        with suppress(OSError):
            history_path.unlink(missing_ok=True)
            workdir.rmdir()


def _snapshot(app: Any, run: str) -> dict[str, Any]:
    return {ph: app.batch_status(f"{run}-{ph}") for ph in PHASES}


def _drive(
    app: Any,
    run: str,
    sku_ids: Sequence[str],
    merchants: int,
    partner: PartnerServer,
    advice: LimitAdvice,
    con: Any,
    timeout: float,
    fleet: WorkerFleet | None,
    dashboard_url: str | None = None,
) -> tuple[bool, float, int]:
    """Submit everything and show the run live until every task is final (or ``timeout``)."""
    from rich.console import Group
    from rich.live import Live
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bars = Progress(
        TextColumn("[bold]{task.description:<8}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
        console=con,
    )
    jobs = {ph: bars.add_task(ph, total=len(sku_ids), detail="") for ph in PHASES}
    final = {s.value for s in FINAL}
    samples: deque[tuple[float, int]] = deque(maxlen=200)
    started = time.monotonic()
    total = 0
    with Live(Group(bars, ""), console=con, refresh_per_second=4, transient=False) as live:
        total = submit_all(app, run, sku_ids, merchants)
        while True:
            if fleet is not None:
                fleet.check()
            snap = _snapshot(app, run)
            done = 0
            for ph, summary in snap.items():
                n = sum(v for k, v in summary.counts.items() if k in final)
                done += n
                bad = sum(summary.counts.get(s, 0) for s in ("FAILED", "TIMEOUT", "CANCELED"))
                bars.update(
                    jobs[ph],
                    completed=n,
                    detail=(
                        f"running {summary.counts.get('RUNNING', 0):>2}  "
                        f"retrying {summary.counts.get('RETRYING', 0):>2}  failed {bad}"
                    ),
                )
            now = time.monotonic()
            samples.append((now, done))
            live.update(Group(bars, _live_lines(app, partner, advice, rate_per_s(samples), dashboard_url)))
            if done >= total:
                return True, now - started, total
            if now - started > timeout:
                return False, now - started, total
            time.sleep(0.25)


def _breaker_and_level(app: Any) -> tuple[str, str]:
    found = app.store.breakers().get(demo_app.PARTNER_LIMIT)
    if found is None:
        return "CLOSED", app.level().name
    _, breaker = found
    return breaker.state.value, app.level().name


def _live_lines(app: Any, partner: PartnerServer, advice: LimitAdvice, per_s: float, dashboard_url: str | None) -> Any:
    from rich.table import Table

    st = partner.state
    breaker, level = _breaker_and_level(app)
    in_use = app.store.limit_usage().get(demo_app.PARTNER_LIMIT, 0)
    flaky = st.flaky_answers
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("throughput", f"{per_s:.0f} tasks/s (last 5 s)")
    grid.add_row(
        "partner",
        f"{st.last_second()} calls in the last second, busiest {st.busiest_second()} "
        f"(limit {advice.rate_per_s}/s, cap {st.cap}); {st.over_cap} refused for the cap",
    )
    grid.add_row("in flight", f"{in_use} of {advice.concurrency} partner calls (the limit's concurrency)")
    grid.add_row("retries", f"flaky answers 503 x{flaky.get(503, 0)}, 429 x{flaky.get(429, 0)}: each retried")
    grid.add_row("flow", f"breaker {demo_app.PARTNER_LIMIT} {breaker}, level {level}")
    if dashboard_url:
        grid.add_row("dashboard", dashboard_url)
    return grid


def _report(
    app: Any,
    run: str,
    partner: PartnerServer,
    advice: LimitAdvice,
    history_path: Path,
    finished: bool,
    elapsed: float,
    total: int,
    meta: dict[str, Any],
) -> MainDemoReport:
    """Read the store and the partner once the work is done (``meta``: how it ran)."""
    phases: dict[str, Phase] = {}
    rows_of: dict[str, list[Any]] = {}
    retries = 0
    dead_total = 0
    for ph in PHASES:
        batch = f"{run}-{ph}"
        summary = app.batch_status(batch)
        rows = app.store.list_tasks(TaskFilter(batch=batch, limit=summary.total + 10, newest_first=False))
        rows_of[ph] = rows
        retries += sum(max(0, r.attempt - 1) for r in rows)
        dead = app.dead(batch=batch, limit=summary.total + 10)
        dead_total += len(dead)
        phases[ph] = Phase(
            dict(summary.counts), summary.avg_duration, summary.p99_duration, len(dead), dead[0].error if dead else None
        )
    ok = State.SUCCESS
    synced = sum(
        1 for d, i in zip(rows_of["detail"], rows_of["images"], strict=False) if d.status is ok and i.status is ok
    )
    expected: dict[str, list[int]] = {}
    for r in rows_of["notify"]:
        if r.status is ok:
            merchant, seq = loads(r.args)["args"][:2]
            expected.setdefault(merchant, []).append(seq)
    history = History.load(history_path)
    breaker, level = _breaker_and_level(app)
    opened = sum(1 for e in app.store.breaker_events(demo_app.PARTNER_LIMIT, limit=10_000) if e.after == "OPEN")
    st = partner.state
    stats = st.stats()
    notified = st.notifications()
    return MainDemoReport(
        run=run,
        advice=advice,
        cap=st.cap,
        finished=finished,
        elapsed=elapsed,
        tasks=total,
        synced=synced,
        phases=phases,
        retries=retries,
        dead_letters=dead_total,
        partner_calls=stats["calls"],
        busiest_second=stats["max_in_any_second"],
        over_cap_429=stats["over_cap"],
        flaky=dict(st.flaky_answers),
        peak_in_flight=st.peak_in_flight,
        notified=sum(len(v) for v in notified.values()),
        order_problems=order_problems(notified, expected),
        history_violations=len(history.check()),
        breaker=breaker,
        breaker_opened=opened,
        level=level,
        **meta,
    )


def render_report(rep: MainDemoReport, con: Any, hint_store: str | None) -> None:
    """Print the report: one table, then where to look further."""
    from rich.markup import escape
    from rich.table import Table

    def verdict(good: bool) -> str:
        return "[green]yes[/]" if good else "[red]NO[/]"

    t = Table(title=f"run {rep.run}", title_justify="left", show_header=False)
    t.add_column(style="bold")
    t.add_column()
    status = "all tasks final" if rep.finished else "[red]stopped at the time limit: not every task is final[/]"
    t.add_row("work", f"{rep.synced} of {rep.skus} SKUs synced; {rep.tasks} tasks; {status}")
    if rep.elapsed > 0:
        t.add_row(
            "throughput",
            f"{rep.tasks / rep.elapsed:.0f} tasks/s, {rep.synced / rep.elapsed:.1f} SKUs/s "
            f"(wall time {rep.elapsed:.1f}s)",
        )
    for ph, f in rep.phases.items():
        failed = sum(f.counts.get(s, 0) for s in ("FAILED", "TIMEOUT"))
        canceled = f.counts.get("CANCELED", 0)
        t.add_row(
            f"  {ph}",
            f"{f.counts.get('SUCCESS', 0)} ok, {failed} failed"
            + (f", {canceled} canceled after an upstream failure" if canceled else "")
            + f"; duration avg {format_duration(f.avg or 0)}, p99 {format_duration(f.p99 or 0)}",
        )
    flaky = ", ".join(f"{code} x{n}" for code, n in sorted(rep.flaky.items())) or "none"
    t.add_row("retries", f"{rep.retries} (the partner's flaky answers: {flaky}; backoff with jitter)")
    t.add_row("dead letters", f"{rep.dead_letters} (final failures, kept for `corral dead` and `corral retry --dead`)")
    for ph, f in rep.phases.items():
        if f.dead:
            t.add_row(f"  {ph}", f"{f.dead}: {escape((f.first_dead_error or '')[:140])}")
    order = (
        f"{verdict(rep.ordering_verified)}: {rep.merchants - len(rep.order_problems)} of {rep.merchants} merchants "
        f"got their {rep.notified} notifications in order, each once; "
        f"{rep.history_violations} overlaps or overtakes in the recorded runs"
    )
    t.add_row("ordering", order)
    t.add_row(
        "rate held",
        f"{verdict(rep.rate_held)}: busiest sliding second {rep.busiest_second} calls at the partner "
        f"(cap {rep.cap}; limit {rep.advice.rate_per_s}/s); "
        f"{rep.over_cap_429} 429s for the cap of {rep.partner_calls} calls",
    )
    t.add_row("in flight", f"peak {rep.peak_in_flight} calls at the partner (limit {rep.advice.concurrency})")
    t.add_row(
        "breaker / level",
        f"{demo_app.PARTNER_LIMIT} {rep.breaker} (opened {rep.breaker_opened} times) / fleet level {rep.level}",
    )
    where = (
        f"{rep.processes} worker processes x {rep.slots} slots"
        if rep.processes
        else f"one in-process worker, {rep.slots} slots"
    )
    t.add_row("workers", where)
    if rep.dashboard_url:
        t.add_row("dashboard", rep.dashboard_url)
    con.print()
    con.print(t)
    for merchant, problem in sorted(rep.order_problems.items())[:5]:
        con.print(f"  [red]{escape(merchant)}[/]: {escape(problem)}")
    flag = f" --store {hint_store}" if hint_store else ""
    con.print(
        f"inspect with:\n  corral status{flag}\n  corral tasks{flag} --batch {rep.run}-detail\n  corral dead{flag}",
        markup=False,
    )

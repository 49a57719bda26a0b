"""``corral demo``: a SKU sync, end to end, on the embedded store.

Sync N SKUs from a partner API whose QPS is capped. The planner turns the
partner's cap (100 QPS at ~200 ms a call) into the limit ``partner_api``
that every worker of the store shares: a rate of 70 a second (the cap x the
0.7 safety factor) with a burst of 15, and at most 40 calls at once; a
breaker on it holds the work through an outage. The limit, not the pool
size, protects the partner.
SKUs are synced in order per merchant (one lane per merchant, merchants in
parallel, round robin), under one batch id with an aggregate status. Some
calls fail with 429/503 and retry with backoff; one SKU carries a bad price
and fails for good (a validation error is never retried). Each task reports
progress.

The database is left in place, so ``corral status`` and ``corral tasks`` can
look at the run afterwards.
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import corral
from corral.core.model import TaskFilter
from corral.core.planning import LimitAdvice, concurrency_limit, format_duration, limit_advice
from corral.core.retries import Backoff
from corral.core.states import FINAL, State
from corral.edges.partner import max_in_window

CHANNELS = ("tmall", "jd", "pdd")
#: Roughly one call in this many is refused once with a 503 or 429 (then retried).
TRANSIENT_EVERY = 16


class PartnerError(Exception):
    """An HTTP error from the partner; ``status_code`` tells corral whether to retry."""

    def __init__(self, status_code: int, text: str):
        super().__init__(f"partner API {status_code}: {text}")
        self.status_code = status_code


class PartnerAPI:
    """A simulated partner product API: ~``latency`` per call, at most ``qps``
    calls in any one second (over that: 429), and it counts how many calls it
    has in flight, so the demo can show the limit held."""

    def __init__(self, qps: float, latency: float, rng: random.Random):
        self.qps = qps
        self.latency = latency
        self.rng = rng
        self._lock = threading.Lock()
        self._recent: deque[float] = deque()
        self.in_flight = 0
        self.peak_in_flight = 0
        self.calls = 0
        self.refused: dict[int, int] = {}
        #: when each call the partner accepted arrived (monotonic), for the busiest second
        self.accepted_at: list[float] = []

    def fetch(self, sku: str, channel: str, fail_with: int | None = None) -> dict:
        now = time.monotonic()
        with self._lock:
            while self._recent and self._recent[0] <= now - 1.0:
                self._recent.popleft()
            self.calls += 1
            if len(self._recent) >= self.qps:
                self.refused[429] = self.refused.get(429, 0) + 1
                raise PartnerError(429, "too many requests")
            self._recent.append(now)
            self.accepted_at.append(now)
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            jitter = self.rng.uniform(0.6, 1.4)
        try:
            time.sleep(self.latency * jitter)
            if fail_with is not None:
                with self._lock:
                    self.refused[fail_with] = self.refused.get(fail_with, 0) + 1
                raise PartnerError(fail_with, "service busy" if fail_with == 503 else "rate limited upstream")
            price = round(5 + (sum(map(ord, sku)) % 400) / 4, 2)
            return {"sku": sku, "channel": channel, "price": price, "stock": sum(map(ord, sku + channel)) % 97}
        finally:
            with self._lock:
                self.in_flight -= 1


@dataclass
class DemoResult:
    batch: str
    store_url: str
    status: str
    counts: dict[str, int]
    elapsed: float
    retries: int
    limit: int
    peak_in_flight: int
    #: the most calls the partner accepted in any sliding second, and its cap
    busiest_second: int = 0
    rate: str = ""
    breaker: str = ""
    level: str = ""
    task_ids: list[int] = field(default_factory=list)


def build_app(
    store_url: str, partner: PartnerAPI, advice: LimitAdvice, bad_sku: str, flaky: dict[str, int]
) -> corral.App:
    app = corral.App(store_url)
    # what `corral plan --qps 100 --latency-ms 200` advises: the rate keeps the safety margin
    app.limit("partner_api", concurrency=advice.concurrency, rate=f"{advice.rate_per_s}/s")
    # an outage of the partner opens it: its tasks wait (no attempt burned) instead of failing
    app.breaker("partner_api", failure_ratio=0.5, min_calls=20, window="30s", cooldown="5s", probes=3)

    @app.task(
        name="sync_sku",
        retries=3,
        timeout=30,
        limits=["partner_api"],
        backoff=Backoff(base=0.25, factor=2.0, cap=2.0, jitter=0.5),
    )
    def sync_sku(ctx: corral.Context, sku: str, channel: str, merchant: str) -> dict:
        ctx.progress(0.1, "fetching detail")
        fail_with = flaky.get(sku) if ctx.attempt == 1 else None
        detail = partner.fetch(sku, channel, fail_with)
        ctx.progress(0.7, "fetched detail")
        if sku == bad_sku:
            # A validation error: retrying cannot help, so corral fails it at once.
            raise ValueError(f"partner sent a negative price for {sku} on {channel}")
        ctx.check_canceled()
        ctx.progress(1.0, "saved")
        return {"merchant": merchant, **detail}

    return app


def run_demo(
    store_url: str,
    *,
    skus: int = 300,
    merchants: int = 20,
    workers: int = 16,
    latency: float = 0.2,
    qps: float = 100.0,
    seed: int | None = None,
    console=None,
    hint_store: str | None = None,
    timeout: float = 120.0,
) -> DemoResult:
    """Run the demo against ``store_url`` and print a summary; return the numbers."""
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    con = console or Console(highlight=False)
    rng = random.Random(seed)
    merchants = max(1, min(merchants, skus))
    plan = concurrency_limit(qps, latency, 0.7)
    advice = limit_advice(qps, latency, 0.7)
    partner = PartnerAPI(qps, latency, rng)
    batch = time.strftime("sku-sync-%Y%m%d-%H%M%S") + f"-{rng.randrange(16**4):04x}"
    sku_ids = [f"SKU-{i:05d}" for i in range(1, skus + 1)]
    bad_sku = sku_ids[min(len(sku_ids) - 1, 41)]
    flaky = {s: (503 if i % 2 else 429) for i, s in enumerate(sku_ids[7::TRANSIENT_EVERY]) if s != bad_sku}

    app = build_app(store_url, partner, advice, bad_sku, flaky)
    con.print(
        f"[bold]corral demo[/]: sync {skus} SKUs for {merchants} merchants from a partner API capped at "
        f"{qps:g} QPS (~{latency * 1000:.0f} ms a call)\n"
        f"  planner: [bold]{escape(advice.line('partner_api'))}[/] (worker slots: {workers})\n"
        f"  store: {store_url}   batch: [bold]{batch}[/]"
    )
    calls = []
    for i, sku in enumerate(sku_ids):
        merchant = f"merchant-{1001 + i % merchants}"
        channel = CHANNELS[i % len(CHANNELS)]
        calls.append({"args": (sku, channel, merchant), "group": merchant, "key": f"{sku}:{channel}:{batch}"})
    sync_sku = app.registry["sync_sku"]
    handles = sync_sku.submit_many(calls, batch=batch)

    started = time.monotonic()
    app.start(workers=workers, poll_interval=0.05)
    try:
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            console=con,
            transient=False,
        ) as bar:
            job = bar.add_task("syncing", total=skus, detail="")
            while True:
                summary = app.batch_status(batch)
                done = sum(summary.counts.get(s.value, 0) for s in FINAL)
                detail = (
                    f"running {summary.counts.get('RUNNING', 0):>2}  "
                    f"retrying {summary.counts.get('RETRYING', 0):>2}  "
                    f"failed {summary.counts.get('FAILED', 0)}"
                )
                bar.update(job, completed=done, detail=detail)
                if summary.status != "RUNNING" or time.monotonic() - started > timeout:
                    break
                time.sleep(0.1)
        app.drain(timeout=10)
        elapsed = time.monotonic() - started
        summary = app.batch_status(batch)
        rows = app.store.list_tasks(TaskFilter(batch=batch, limit=skus + 10, newest_first=False))
        _, partner_breaker = app.store.breakers().get("partner_api", (None, None))
        breaker = partner_breaker.state.value if partner_breaker is not None else "CLOSED"
        level = app.level().name
    finally:
        app.close(timeout=10)  # closes the store too: read everything first
    retries = sum(max(0, r.attempt - 1) for r in rows)
    failed = [r for r in rows if r.status in (State.FAILED, State.TIMEOUT, State.CANCELED)]

    t = Table(title=f"batch {batch}", title_justify="left")
    t.add_column("", style="bold")
    t.add_column("", justify="right")
    for s in (State.SUCCESS, State.FAILED, State.TIMEOUT, State.CANCELED, State.RUNNING, State.RETRYING, State.PENDING):
        n = summary.counts.get(s.value, 0)
        if n or s in (State.SUCCESS, State.FAILED):
            t.add_row(s.value, str(n))
    t.add_section()
    style = {"ALL_SUCCESS": "green", "PARTIAL_SUCCESS": "yellow"}.get(summary.status, "red")
    t.add_row("batch status", f"[{style}]{summary.status}[/]")
    t.add_row("tasks", str(summary.total))
    t.add_row("retries", f"{retries} (transient 429/503, backoff with jitter)")
    t.add_row("wall time", f"{elapsed:.1f}s ({summary.total / elapsed:.0f} tasks/s)" if elapsed > 0 else "-")
    t.add_row(
        "task duration avg / p99",
        f"{format_duration(summary.avg_duration or 0)} / {format_duration(summary.p99_duration or 0)}",
    )
    busiest = max_in_window(partner.accepted_at, 1.0)
    refused_429 = partner.refused.get(429, 0) - sum(1 for c in flaky.values() if c == 429)
    t.add_row(
        "rate held",
        f"busiest second {busiest} calls (limit {advice.rate_per_s}/s, partner cap {qps:g}); "
        f"{max(0, refused_429)} refused for the cap",
    )
    t.add_row(
        "partner calls in flight, peak",
        f"{partner.peak_in_flight} (limit {advice.concurrency}, at the cap {plan.theoretical:g})",
    )
    t.add_row("breaker partner_api / fleet level", f"{breaker} / {level}")
    t.add_row("ordered lanes", f"{merchants} merchants, one SKU in flight each")
    con.print(t)
    for r in failed[:3]:
        con.print(f"  [red]{r.status.value}[/] task {r.id}: {escape(r.error or '')}")
    store_flag = f" --store {hint_store}" if hint_store else ""
    show_id = failed[0].id if failed else (rows[0].id if rows else 1)
    con.print(
        f"inspect with: corral status{store_flag} / corral tasks{store_flag} --batch {batch} / "
        f"corral show{store_flag} {show_id}",
        markup=False,
    )
    return DemoResult(
        batch=batch,
        store_url=store_url,
        status=summary.status,
        counts=dict(summary.counts),
        elapsed=elapsed,
        retries=retries,
        limit=advice.concurrency,
        peak_in_flight=partner.peak_in_flight,
        task_ids=[h.id for h in handles],
        busiest_second=busiest,
        rate=f"{advice.rate_per_s}/s",
        breaker=breaker,
        level=level,
    )

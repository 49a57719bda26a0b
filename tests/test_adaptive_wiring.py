"""Adaptive limits wired: the workers' reports (never a write per task) and
the sweeper leader's controller writing the effective limit, fenced by its
leadership, continued by a new leader from the limit's row."""

from __future__ import annotations

import json
from dataclasses import dataclass

import corral
from corral.core.adaptive import LimitReport, bucket_of
from corral.core.clock import FakeClock
from corral.core.events import LIMIT_ADAPTED
from corral.core.model import NewTask
from corral.maintenance.adaptive_keeper import AdaptiveKeeper
from corral.stores import open_store
from helpers import ARGS, wait_for


@dataclass
class Leading:
    """A sweeper as the keeper reads it: its holder id and whether it leads."""

    holder: str
    is_leader: bool = True


def report(calls: int, *, throttles: int = 0, latency_ms: float = 20.0, peak: int = 2) -> str:
    ok = calls - throttles
    rep = LimitReport(1.0, calls, ok, throttles, 0, peak, latency={bucket_of(latency_ms): ok} if ok else {})
    return json.dumps({"api": rep.to_dict()})


def test_leader_moves_the_effective_limit_from_reports_and_a_new_leader_continues(fake_clock_url):
    clock = FakeClock()
    store = open_store(fake_clock_url, clock=clock)
    store.migrate()
    app = corral.App(store)
    app.limit("api", rate="auto", max_rate="200/s", concurrency=50)
    store.submit([NewTask("t", ARGS, limits=("api",)) for _ in range(5)])  # work waits under the limit
    assert store.try_lead("sweeper", "one", 10.0)
    first = AdaptiveKeeper(store, Leading("one"), aligned=False)
    assert first.tick() == []  # a new leader's first second only takes the reports

    def second(keeper: AdaptiveKeeper, text: str) -> str:
        store.report_limits("w1", text)
        clock.advance(1.0)
        keeper.tick()
        return store.limits()["api"].rate

    rates = [store.limits()["api"].rate]
    for _ in range(4):  # the limit is the bottleneck: slow start, 1.5x a second
        rates.append(second(first, report(int(rates[-1].split("/")[0]))))
    assert rates == ["10/s", "15/s", "22/s", "34/s", "51/s"]
    assert store.limits()["api"].concurrency == 50  # the fixed knob is left alone
    cut = second(first, report(51, throttles=10))
    assert cut == "37/s"  # 0.9 x the 41/s that succeeded
    (last, *_) = store.events(LIMIT_ADAPTED)
    assert last.subject == "limit:api"
    assert json.loads(last.data)["rate_rule"] == "throttled: cut"
    row = store.adaptive_limits()["api"]
    assert row.state is not None and row.state.w_max == 41.0

    # the leadership passes: the old leader is fenced out, the new one goes on from the row
    clock.advance(11.0)
    assert store.try_lead("sweeper", "two", 10.0)
    assert second(first, report(37)) == "37/s"
    assert first.fenced == 1
    after = AdaptiveKeeper(store, Leading("two"), aligned=False)
    assert after.tick() == []
    store.report_limits("w1", report(37))
    clock.advance(1.0)
    (decision,) = after.tick()
    assert decision.inputs["rate_before"] == 36.9  # the unrounded rate of the cut, from the row
    assert decision.rate_rule == "bottleneck: cubic recovery"  # the cut's memory came with the row
    assert decision.state.w_max == 41.0
    store.close()


def test_workers_report_what_ran_without_a_write_per_task(fake_clock_url):
    app = corral.App(fake_clock_url)
    app.limit("api", concurrency="auto", max_concurrency=100, rate="auto", max_rate="20000/s")
    tries: dict[int, int] = {}

    @app.task(limits=["api"], retries=0)
    def call(i: int) -> None:
        tries[i] = tries.get(i, 0) + 1
        if i % 10 == 1 and tries[i] == 1:
            raise corral.Retry(after=0.01)  # throttled: runs again, burns no attempt
        if i % 10 == 2:
            raise ConnectionError("partner unreachable")  # an error load can cause

    n = 300
    for i in range(n):
        call.submit(i)
    worker = app.worker(concurrency=8, sweep_interval=None, poll_interval=0.02).start()
    try:
        wait_for(lambda: sum(app.counts().get(s, 0) for s in ("SUCCESS", "FAILED")) == n, timeout=30)
    finally:
        worker.stop()
    reports = app.store.take_limit_reports()
    merged = LimitReport.merged((LimitReport.from_dict(json.loads(text)["api"]) for _, text in reports), seconds=1.0)
    assert (merged.calls, merged.successes, merged.throttles, merged.errors) == (n + 30, n - 30, 30, 30)
    assert sum(merged.latency.values()) == n - 30
    assert 1 <= merged.peak_in_flight <= 8
    # one write a second at most (and one at the stop), never one per task
    assert len(reports) == worker.limit_reports.writes
    assert len(reports) < 15


class HTTPError(Exception):
    def __init__(self, status_code: int):
        super().__init__(f"answered {status_code}")
        self.status_code = status_code


def test_what_an_end_says_about_the_partners_load():
    from corral.core.model import Outcome
    from corral.core.states import State
    from corral.engine.limit_reporter import ERROR, SUCCESS, THROTTLE, signal

    def ended(status: State, exc: BaseException | None = None, **kw) -> str | None:
        return signal(Outcome(1, "tok", 1, status, **kw), exc)

    assert ended(State.SUCCESS) == SUCCESS
    assert ended(State.RETRYING, corral.Retry(after=1.0), snooze=True) == THROTTLE
    assert ended(State.RETRYING, HTTPError(429)) == THROTTLE
    assert ended(State.FAILED, HTTPError(503)) == THROTTLE
    assert ended(State.RETRYING, HTTPError(500)) == ERROR
    assert ended(State.RETRYING, TimeoutError()) == ERROR
    assert ended(State.TIMEOUT) == ERROR
    assert ended(State.FAILED, ValueError("bad input")) is None  # a bug says nothing of the load
    assert ended(State.FAILED, HTTPError(404)) is None
    assert ended(State.CANCELED) is None

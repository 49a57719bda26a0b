"""Per-key adaptive limits wired end to end on the fake clock: a worker's
reporter counts each key (its busiest only), the sweeper leader's keeper
decides each key and writes its values to the key's row, and the claims
gate each key by what it learned."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

import corral
from corral.core.adaptive import MAX_KEY_EVENTS, MAX_KEY_STATES, LimitReport, bucket_of, key_state_of
from corral.core.claims import ClaimRequest
from corral.core.clock import FakeClock
from corral.core.events import LIMIT_ADAPTED, LIMIT_KEY_ADAPTED, limit_key_subject
from corral.core.gates import keyed_name
from corral.core.model import NewTask, Outcome
from corral.core.states import State
from corral.edges.limit_view import limits_report
from corral.engine.limit_reporter import LimitReporter
from corral.maintenance.adaptive_keeper import AdaptiveKeeper
from corral.stores import open_store
from corral.stores.base import Store
from helpers import ARGS

HOT, COLD = keyed_name("merchant", "hot"), keyed_name("merchant", "cold")


@dataclass
class Leading:
    """A sweeper as the keeper reads it: its holder id and whether it leads."""

    holder: str
    is_leader: bool = True


def ended(status: State) -> Outcome:
    return Outcome(task_id=1, token="lease", version=1, status=status)


def test_a_throttled_hot_key_is_cut_while_a_cold_key_keeps_its_rate(fake_clock_url):
    clock = FakeClock()
    store = open_store(fake_clock_url, clock=clock)
    store.migrate()
    app = corral.App(store)
    app.limit("merchant", rate="auto", max_rate="200/s", per_key=True)  # each key starts at the limit's 10/s
    store.submit([NewTask("t", ARGS, limits=(gate,)) for gate in (HOT, COLD) for _ in range(30)])
    assert store.try_lead("sweeper", "one", 60.0)
    keeper = AdaptiveKeeper(store, Leading("one"), aligned=False)
    reporter = LimitReporter(store, "w1", now=clock.monotonic)
    reporter.refresh()
    keeper.tick()  # a new leader's first second only takes the reports
    for _ in range(3):
        # the hot key's partner refuses 4 of its 10 calls a second for load; the cold key's 2 calls pass
        for gate, calls, throttled in ((HOT, 10, 4), (COLD, 2, 0)):
            for i in range(calls):
                counted = reporter.started((gate,))
                assert counted == (gate,)
                if i < throttled:
                    reporter.ended(counted, ended(State.RETRYING), corral.Retry(after=1), 0.02)
                else:
                    reporter.ended(counted, ended(State.SUCCESS), None, 0.02)
        assert reporter.flush()
        clock.advance(1.0)
        keeper.tick()
    keys = {key: key_state_of(text) for key, text in store.adaptive_keys("merchant").items()}
    hot, cold = keys["hot"], keys["cold"]
    assert hot is not None and cold is not None
    assert hot.state.w_max is not None and hot.state.rate < 6.0  # cut below what succeeded (6 of 10 a second)
    assert cold.state.w_max is None and cold.state.rate == 10.0  # not throttled, not the bottleneck: held
    assert store.limits()["merchant"].rate == "10/s"  # the limit's own values: where new keys start
    # the claims: the hot key under its own cut rate, the cold one under the limit's 10/s
    started: Counter[str] = Counter()
    for _ in range(40):  # two seconds of claims, paced by the rates
        got = store.claim("w1", ClaimRequest(("default",), 100))
        started.update(n for c in got for t in c.tasks for n in t.limits)
        clock.advance(0.05)
    assert 18 <= started[COLD] <= 21  # about 10/s
    assert 1 <= started[HOT] <= 11  # about 5/s
    # corral limit show: the busiest keys (by places held) with what they learned
    (row,) = limits_report(store)
    assert row["learning_keys"] == 2
    learned = {k["key"]: k["learned"] for k in row["busiest_keys"]}
    assert learned == {"cold": {"concurrency": None, "rate": "10/s"}, "hot": {"concurrency": None, "rate": "5/s"}}
    store.close()


def test_a_worker_reports_each_key_but_only_its_busiest(fake_clock_url):
    clock = FakeClock()
    store = open_store(fake_clock_url, clock=clock)
    store.migrate()
    corral.App(store).limit("merchant", concurrency="auto", max_concurrency=10, per_key=True)
    reporter = LimitReporter(store, "w1", now=clock.monotonic)
    reporter.refresh()
    many = MAX_KEY_STATES + 20
    for k in range(many):
        gate = keyed_name("merchant", f"k{k:04d}")
        for _ in range(1 + (k >= 20)):  # the first 20 keys have one call, the others two
            reporter.ended(reporter.started((gate,)), ended(State.SUCCESS), None, 0.01)
    assert reporter.started(("other",)) == ()  # a limit that is not adaptive is not counted
    assert reporter.flush()
    ((_, text),) = store.take_limit_reports()
    sent = json.loads(text)
    assert len(sent) == MAX_KEY_STATES
    assert all(report["calls"] == 2 for report in sent.values())
    assert not reporter.flush()  # nothing counted since, nothing written; the keys' counts are let go
    store.close()


def test_the_keepers_bench_runs_small():
    from corral.bench.adaptive_keys import run

    out = run("memory://", keys=4, queued=40, ticks=2)
    assert out["keys_decided"] == 8 and out["keyed_tick_ms_median"] >= 0


def _keys_report(reports: dict[str, tuple[int, int]]) -> str:
    """A worker's report of keys of ``merchant``: key to (calls, throttled), 20 ms each success."""
    out = {}
    for key, (calls, throttles) in reports.items():
        ok = calls - throttles
        report = LimitReport(1.0, calls, ok, throttles, 0, 1, latency={bucket_of(20.0): ok} if ok else {})
        out[keyed_name("merchant", key)] = report.to_dict()
    return json.dumps(out)


def _keyed_leader(url: str) -> tuple[FakeClock, Store, AdaptiveKeeper]:
    """A keyed adaptive limit (each key starts at the limit's 10/s) and its leader's keeper, past its first tick."""
    clock = FakeClock()
    store = open_store(url, clock=clock)
    store.migrate()
    corral.App(store).limit("merchant", rate="auto", max_rate="200/s", per_key=True)
    assert store.try_lead("sweeper", "one", 60.0)
    keeper = AdaptiveKeeper(store, Leading("one"), aligned=False)
    keeper.tick()  # a new leader's first second only takes the reports
    return clock, store, keeper


def test_a_throttled_keys_cut_is_one_event_naming_the_key_with_its_inputs(fake_clock_url):
    clock, store, keeper = _keyed_leader(fake_clock_url)
    store.submit([NewTask("t", ARGS, limits=(gate,)) for gate in (HOT, COLD) for _ in range(30)])
    # the hot key's partner refuses 4 of its 10 calls; the cold key's 2 calls pass (not its bottleneck: held)
    store.report_limits("w1", _keys_report({"hot": (10, 4), "cold": (2, 0)}))
    clock.advance(1.0)
    keeper.tick()
    (event,) = store.events(LIMIT_KEY_ADAPTED)
    assert event.subject == limit_key_subject("merchant", "hot") == "limit:merchant:key:hot"
    d = event.details
    assert d["limit"] == "merchant" and d["key"] == "hot"
    assert d["rate_rule"].startswith("throttled") and d["rate"] < 10.0
    assert d["inputs"]["calls"] == 10 and d["inputs"]["throttles"] == 4 and d["inputs"]["rate_before"] == 10.0
    assert store.events(LIMIT_ADAPTED) == []  # the limit's own values did not move
    # the key remembers when it changed; the cold key never did
    keys = {key: key_state_of(text) for key, text in store.adaptive_keys("merchant").items()}
    assert keys["hot"] is not None and keys["hot"].changed == event.at
    assert keys["cold"] is not None and keys["cold"].changed is None
    # a second the hot key is not the bottleneck (one call): its rate holds, no event
    store.report_limits("w1", _keys_report({"hot": (1, 0), "cold": (2, 0)}))
    clock.advance(1.0)
    keeper.tick()
    assert [e.subject for e in store.events(LIMIT_KEY_ADAPTED)] == [event.subject]
    store.close()


def test_a_thousand_keys_changing_in_one_second_write_only_the_busiest_keys_events(fake_clock_url):
    clock, store, keeper = _keyed_leader(fake_clock_url)
    # every key throttled, 5 of its calls passing (so cut below its 10/s): k0999 the busiest
    many = {f"k{k:04d}": (10 + k, 5 + k) for k in range(1000)}
    store.submit([NewTask("t", ARGS, limits=(keyed_name("merchant", key),)) for key in many])  # work waits
    store.report_limits("w1", _keys_report(many))
    clock.advance(1.0)
    keeper.tick()
    events = store.events(LIMIT_KEY_ADAPTED, limit=10_000)
    assert len(events) == MAX_KEY_EVENTS == 20
    assert sorted(e.details["key"] for e in events) == [f"k{k:04d}" for k in range(980, 1000)]
    assert keeper.key_decisions == MAX_KEY_STATES and keeper.key_events_left == MAX_KEY_STATES - 20
    store.close()

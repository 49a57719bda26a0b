"""Workers follow the fleet's degradation level; dead letters from the app and
the command line."""

from __future__ import annotations

import json
import logging

import pytest
from click.testing import CliRunner

import corral
from corral.cli import cli
from corral.core.claims import ClaimRequest
from corral.core.clock import FakeClock
from corral.core.levels import Level
from corral.core.model import NewTask, Outcome
from corral.core.states import State
from corral.engine.hooks import UNLIMITED, DispatchPolicy, HookChain, Hooks, Lane
from corral.engine.level_follower import LevelHooks
from corral.errors import ConfigError, StoreError
from corral.maintenance.level_keeper import LevelKeeper
from corral.maintenance.sweeper import Sweeper
from corral.stores.base import FleetLevel
from corral.stores.memory import MemoryStore
from helpers import ARGS, wait_for


class _Ticker:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _set(store, level: Level, manual: bool = True) -> None:
    store.set_fleet_level(FleetLevel(int(level), manual, None, "test"), auto=False)


# ---- the hook ------------------------------------------------------------------------------
def test_level_hooks_turn_each_level_into_a_dispatch_policy():
    store = MemoryStore()
    hooks = LevelHooks(store, 10, critical_names=["crit"], critical_queues=["vip"], refresh=0)
    assert hooks.dispatch() == DispatchPolicy(10)
    _set(store, Level.WARNING)
    assert hooks.dispatch() == DispatchPolicy(5)
    _set(store, Level.DEGRADED)
    lanes = (Lane(queues=frozenset({"vip"})), Lane(names=frozenset({"crit"})))
    assert hooks.dispatch() == DispatchPolicy(5, slots=5, lanes=lanes)
    _set(store, Level.CIRCUIT_OPEN)
    assert hooks.dispatch() == DispatchPolicy(5, only_retries=True)
    _set(store, Level.EMERGENCY)
    assert hooks.dispatch() == DispatchPolicy(None)
    assert hooks.dispatch_budget() is None


def test_degraded_with_nothing_marked_critical_only_halves_the_slots():
    store = MemoryStore()
    _set(store, Level.DEGRADED)
    assert LevelHooks(store, 8, refresh=0).dispatch() == DispatchPolicy(4, slots=4)


def test_the_level_is_read_at_most_once_per_refresh():
    store = MemoryStore()
    tick = _Ticker()
    hooks = LevelHooks(store, 4, refresh=1.0, monotonic=tick)
    assert hooks.level() is Level.NORMAL
    _set(store, Level.EMERGENCY)
    tick.t = 0.9
    assert hooks.level() is Level.NORMAL  # cached
    tick.t = 1.0
    assert hooks.level() is Level.EMERGENCY


def test_a_store_outage_keeps_the_last_level_seen(caplog):
    store = MemoryStore()
    _set(store, Level.CIRCUIT_OPEN)
    hooks = LevelHooks(store, 4, refresh=0)
    assert hooks.level() is Level.CIRCUIT_OPEN

    def down():
        raise StoreError("database unreachable")

    store.fleet_level = down  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="corral.levels"):
        assert hooks.level() is Level.CIRCUIT_OPEN
    assert "keeping CIRCUIT_OPEN" in caplog.text


def test_hook_chains_combine_policies():
    class Fixed(Hooks):
        def __init__(self, p: DispatchPolicy):
            self.p = p

        def dispatch(self) -> DispatchPolicy:
            return self.p

    class Budget(Hooks):
        def dispatch_budget(self) -> int | None:
            return 3

    a = Fixed(DispatchPolicy(8, slots=6, lanes=(Lane(queues=frozenset({"q", "r"})),)))
    b = Fixed(DispatchPolicy(5, slots=4, only_retries=True, lanes=(Lane(names=frozenset({"n"})),)))
    got = HookChain(a, b, Budget()).dispatch()
    assert got == DispatchPolicy(3, 4, True, (Lane(frozenset({"q", "r"}), frozenset({"n"})),))
    assert HookChain(a, Fixed(DispatchPolicy(None))).dispatch().max_units is None
    assert HookChain().dispatch() == DispatchPolicy(UNLIMITED)


# ---- workers follow the level -----------------------------------------------------------------
def _app(store, **kw) -> tuple[corral.App, list[str]]:
    app = corral.App(store, **kw)
    ran: list[str] = []

    @app.task(name="plain", queue="default")
    def plain(tag):
        ran.append(tag)

    @app.task(name="crit", critical=True)
    def crit(tag):
        ran.append(tag)

    return app, ran


def test_circuit_open_runs_only_retries_and_burns_no_attempt_of_fresh_work():
    store = MemoryStore()
    app, ran = _app(store)
    # a task in RETRYING, due now
    retry_id = app.registry["plain"].submit("retry", retries=2).id
    (c,) = store.claim("w", ClaimRequest(["default"], 1))
    rec = c.tasks[0]
    store.complete([Outcome(rec.id, rec.lease_token, rec.version, State.RETRYING, error="x", run_at=0.0)])
    # fresh work, ahead of the retry by priority: claimed first unless held
    fresh = app.registry["plain"].submit("fresh", priority=5)
    app.set_level("CIRCUIT_OPEN", reason="partner outage")
    app.start(workers=1)
    try:
        wait_for(lambda: store.get(retry_id).status is State.SUCCESS)
        assert ran == ["retry"]
        got = fresh.get()
        assert (got.status, got.attempt) == (State.PENDING, 0)
        app.set_level("auto")
        app.set_level("NORMAL", reason="recovered")
        wait_for(lambda: fresh.status() is State.SUCCESS)
        assert fresh.get().attempt == 1
    finally:
        app.close(timeout=10)


def test_degraded_runs_only_critical_kinds_and_queues():
    store = MemoryStore()
    app, ran = _app(store, critical_queues=["vip"])
    plain = app.registry["plain"].submit("plain", priority=9)
    crit = app.registry["crit"].submit("crit")
    vip = app.registry["plain"].submit("vip", queue="vip")
    app.set_level("DEGRADED", reason="test")
    app.start(workers=2, queues=("default", "vip"))
    try:
        wait_for(lambda: crit.status() is State.SUCCESS and vip.status() is State.SUCCESS)
        assert sorted(ran) == ["crit", "vip"]
        assert plain.get().status is State.PENDING
        app.set_level("NORMAL", reason="recovered")
        wait_for(lambda: plain.status() is State.SUCCESS)
    finally:
        app.close(timeout=10)


def test_emergency_dispatches_nothing_until_an_operator_resumes():
    calls = []

    class Count(Hooks):
        def dispatch_budget(self) -> int | None:
            calls.append(1)
            return UNLIMITED

    store = MemoryStore()
    app, ran = _app(store, hooks=[Count()])
    app.set_level("L4", reason="stop everything")
    h = app.registry["crit"].submit("x")
    app.start(workers=2)
    try:
        wait_for(lambda: len(calls) >= 3)  # the dispatcher asked again and again
        assert ran == [] and h.status() is State.PENDING
        assert app.level() is Level.EMERGENCY
        app.set_level("NORMAL", reason="resumed")
        wait_for(lambda: h.status() is State.SUCCESS)
    finally:
        app.close(timeout=10)


def test_set_level_refuses_unknown_levels_and_records_events():
    app = corral.App("memory://")
    with pytest.raises(ConfigError, match="unknown level 'SOMETIMES'"):
        app.set_level("SOMETIMES")
    assert app.store.events() == []
    assert app.set_level("degraded", reason="db slow") is Level.DEGRADED
    st = app.level_state()
    assert (st.level, st.manual, st.reason) == (2, True, "db slow")
    assert app.set_level("auto") is Level.DEGRADED
    assert app.level_state().manual is False
    events = [json.loads(e.data) for e in app.store.events(kind="level")]
    assert [(e["to"], e["manual"]) for e in events] == [("DEGRADED", False), ("DEGRADED", True)]
    assert events[1]["reason"] == "db slow"
    app.close()


# ---- the sweeper leader steps the level ----------------------------------------------------------
def test_the_sweeper_leader_steps_the_level_after_its_sweep(caplog):
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    for name in ("a", "b", "c"):
        for _ in range(3):
            store.submit([NewTask(name=name, args=ARGS)])
            (c,) = store.claim("w", ClaimRequest(["default"], 1))
            rec = c.tasks[0]
            store.complete([Outcome(rec.id, rec.lease_token, rec.version, State.FAILED, error="boom")])
    sweeper = Sweeper(store, interval=1, levels=LevelKeeper(store))
    with caplog.at_level(logging.WARNING, logger="corral.levels"):
        sweeper.tick()
    assert Level(store.fleet_level().level) is Level.DEGRADED
    assert "fleet level NORMAL -> DEGRADED" in caplog.text
    # another process does not lead: it does not step
    other = Sweeper(store, interval=1, levels=LevelKeeper(store))
    assert other.tick() is None


@pytest.mark.parametrize("held", [Level.EMERGENCY, Level.CIRCUIT_OPEN])
def test_level_auto_hands_a_healthy_idle_fleet_back_to_work_in_one_evaluation(url, held):
    app, ran = _app(url)
    handles = [app.registry["plain"].submit(f"t{i}") for i in range(5)]
    app.set_level(held, reason="ops")
    leader = Sweeper(app.store, interval=30, levels=LevelKeeper(app.store), chores_every=0)  # evaluates every tick
    app.start(workers=2, sweep_interval=None)  # this test's sweeper is the leader
    try:
        leader.tick()
        assert app.level() is held  # held by hand: the rules leave it alone
        assert app.set_level("auto") is held  # until the next evaluation
        leader.tick()  # one evaluation
        assert app.level() is Level.NORMAL
        wait_for(lambda: all(h.status() is State.SUCCESS for h in handles), timeout=60)
        assert sorted(ran) == [f"t{i}" for i in range(5)]
        last = json.loads(app.store.events(kind="level")[0].data)
        assert (last["from"], last["to"], last["manual"]) == (held.name, "NORMAL", False)
        assert "handed back" in last["reason"]
    finally:
        app.close(timeout=10)


def test_the_step_down_pace_is_an_app_setting():
    app = corral.App("memory://", level_calm_period=90)
    assert app.level_calm_period == 90.0
    with pytest.raises(ConfigError, match="level_calm_period must be"):
        corral.App("memory://", level_calm_period=0)
    assert LevelKeeper(app.store, calm_period=90).thresholds.calm_period == 90.0
    app.close()


# ---- dead letters --------------------------------------------------------------------------------
def test_a_task_whose_arguments_cannot_be_decoded_is_a_dead_letter():
    store = MemoryStore()
    app, _ = _app(store)
    (bad,) = store.submit([NewTask(name="plain", args="{not json", trace_id="tr-1", batch="b")])
    good = app.registry["plain"].submit("ok", batch="b")
    app.start(workers=1)
    try:
        wait_for(lambda: good.status() is State.SUCCESS and store.get(bad.id).status is State.FAILED)
        (dead,) = app.dead()
        assert dead.id == bad.id and dead.trace_id == "tr-1" and dead.attempt == 1
        assert "cannot decode" in (dead.error or "")
        assert [t.id for t in app.dead(batch="b")] == [bad.id]
        assert app.dead(batch="other") == []
    finally:
        app.close(timeout=10)


def test_cli_level_dead_and_retry_dead(tmp_path):
    url = f"sqlite:///{tmp_path}/cli.db"
    corral.App(url).close()  # the store exists: commands that only read never create one
    run = CliRunner().invoke

    def ok(*args: str) -> str:
        res = run(cli, ["--store", url, *args], catch_exceptions=False)
        assert res.exit_code == 0, res.output
        return res.output

    assert ok("level").startswith("L0 NORMAL (automatic)")
    assert "L3 CIRCUIT_OPEN by hand: partner outage" in ok("level", "set", "CIRCUIT_OPEN", "--reason", "partner outage")
    shown = json.loads(ok("level", "show", "--json"))
    assert (shown["level"], shown["manual"], shown["reason"]) == ("CIRCUIT_OPEN", True, "partner outage")
    bad = run(cli, ["--store", url, "level", "set", "L9", "--reason", "x"])
    assert bad.exit_code != 0 and "unknown level 'L9'" in bad.output
    assert "handed back" in ok("level", "auto")
    assert "(automatic)" in ok("level")
    assert "L3 CIRCUIT_OPEN (automatic)" in ok("level")  # until the sweeper leader's next evaluation

    app = corral.App(url)
    ids = [r.id for r in app.store.submit([NewTask(name="t", args="{}", batch=f"b{i % 2}") for i in range(3)])]
    for _ in ids:
        (c,) = app.store.claim("w", ClaimRequest(["default"], 1))
        rec = c.tasks[0]
        app.store.complete([Outcome(rec.id, rec.lease_token, rec.version, State.FAILED, error="boom")])
    out = ok("dead")
    assert [int(line.split()[0]) for line in out.splitlines()] == ids
    assert "attempts 1" in out and "boom" in out
    assert [d["id"] for d in json.loads(ok("dead", "--batch", "b1", "--json"))] == [ids[1]]
    assert "1 dead letter(s) queued again from batch b1" in ok("retry", "--dead", "--batch", "b1")
    assert "2 dead letter(s) queued again" in ok("retry", "--dead")
    assert ok("dead").strip() == "no dead letters"
    assert app.store.get(ids[0]).status is State.PENDING
    app.close()

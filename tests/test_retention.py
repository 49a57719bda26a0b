"""Retention: ``App(retention=)`` applied by the sweeper's leader, ``app.prune``
and ``corral prune``, on every store; the policy's rules in plain functions.
(Which tasks a store keeps whatever their age: tests/conformance/test_store_retention.py.)"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import corral
from corral.cli import cli
from corral.core.clock import FakeClock
from corral.core.retention import DEFAULT_RETENTION, cutoffs, policy
from corral.core.states import State
from corral.errors import ConfigError
from corral.maintenance.retention import Retention
from corral.maintenance.sweeper import Sweeper

DAY = 86400.0


# ---- the policy (pure) ---------------------------------------------------------------
def test_default_retention_keeps_failures_longer_than_successes():
    assert policy(True) == DEFAULT_RETENTION
    assert DEFAULT_RETENTION[State.SUCCESS] == DEFAULT_RETENTION[State.CANCELED] == 7 * DAY
    assert DEFAULT_RETENTION[State.FAILED] == DEFAULT_RETENTION[State.TIMEOUT] == 30 * DAY
    assert policy(False) == {} and policy(None) == {}


def test_a_mapping_changes_the_default_state_by_state():
    got = policy({"success": "1d", "FAILED": None, State.TIMEOUT: 3600})
    assert got == {State.SUCCESS: DAY, State.CANCELED: 7 * DAY, State.TIMEOUT: 3600.0}
    assert cutoffs(got, 1000.0 * DAY)["SUCCESS"] == 999.0 * DAY


@pytest.mark.parametrize(
    "bad, needle",
    [
        ({"RUNNING": "1d"}, "only finished tasks"),
        ({"DONE": "1d"}, "unknown state"),
        ({"SUCCESS": "0"}, "more than 0"),
        ({"SUCCESS": "soon"}, "an age like"),
        ({"SUCCESS": -5}, "an age like"),
        ("7d", "mapping of state"),
    ],
)
def test_a_bad_retention_is_refused_in_one_line(bad, needle):
    with pytest.raises(ConfigError, match=needle) as err:
        policy(bad)
    assert "\n" not in str(err.value)


# ---- on every store ------------------------------------------------------------------
def _app(url: str, **kw) -> corral.App:
    app = corral.App(url, clock=FakeClock(), **kw)

    @app.task
    def ok(x: int) -> int:
        return x

    @app.task(retries=0)
    def bad(x: int) -> int:
        raise RuntimeError("boom")

    return app


def _age(app: corral.App, seconds: float) -> None:
    """Make every finished task ``seconds`` older (the database's clock cannot be moved)."""
    if app.store.url.startswith("postgres"):
        import psycopg

        with psycopg.connect(app.store.url, autocommit=True) as conn:
            conn.execute("UPDATE corral_tasks SET finished_at = finished_at - %s", (seconds,))
    else:
        app.clock.advance(seconds)  # type: ignore[attr-defined]


def _finished(app: corral.App, ok: int = 3, bad: int = 2) -> None:
    from corral.testing import run_until_idle

    for i in range(ok):
        app.registry["ok"].submit(i)
    for i in range(bad):
        app.registry["bad"].submit(i)
    run_until_idle(app)
    assert app.counts().get("SUCCESS") == ok and app.counts().get("FAILED") == bad


def test_app_prune_removes_old_successes_and_keeps_dead_letters_unless_named(url):
    with _app(url) as app:
        _finished(app)
        assert app.prune(older_than="7d") == 0  # nothing is old yet
        _age(app, 8 * DAY)
        assert app.prune(older_than="7d") == 3
        assert app.counts().get("SUCCESS", 0) == 0
        assert len(app.dead()) == 2  # dead letters go only when asked by name
        assert app.prune(older_than="7d", states=["FAILED"]) == 2
        assert app.counts().get("FAILED", 0) == 0


def test_app_prune_refuses_bad_input(url):
    with _app(url) as app:
        with pytest.raises(ConfigError, match="only finished tasks"):
            app.prune(older_than="7d", states=["PENDING"])
        with pytest.raises(ConfigError, match="more than 0"):
            app.prune(older_than=0)


def test_the_sweepers_leader_applies_retention_and_a_follower_does_not(url):
    with _app(url, retention={"SUCCESS": "1d", "FAILED": "2d"}) as app:
        _finished(app)
        _age(app, 1.5 * DAY)
        retention = Retention(app.store, app.retention, batch=2)
        leader = Sweeper(app.store, holder="leader", retention=retention, chores_every=0)  # chores every tick
        follower = Sweeper(app.store, holder="follower", retention=Retention(app.store, app.retention))
        assert leader.tick() is not None
        assert follower.tick() is None  # not the leader: it neither sweeps nor prunes
        assert retention.pruned == 3  # in batches of 2: two statements in one tick
        assert app.counts().get("SUCCESS", 0) == 0 and app.counts().get("FAILED") == 2
        _age(app, 1 * DAY)
        leader.tick()
        assert app.counts().get("FAILED", 0) == 0


def test_every_way_of_running_a_worker_gets_the_apps_retention(url):
    with _app(url, retention={"SUCCESS": "1d"}) as app:
        worker = app.worker(2, sweep_interval=30.0)
        assert worker.retention == {**DEFAULT_RETENTION, State.SUCCESS: DAY}
    with _app(url, retention=False) as app:
        assert app.worker(2, sweep_interval=30.0).retention is None


# ---- corral prune --------------------------------------------------------------------
def _cli(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_corral_prune_removes_old_finished_tasks(durable_url):
    with _app(durable_url) as app:
        _finished(app)
        _age(app, 8 * DAY)
        fresh = app.registry["ok"].submit(99).id
        got = _cli("prune", "--store", durable_url, "--older-than", "7d")
        assert got.exit_code == 0, got.output
        assert got.stdout.startswith("removed 3 finished task(s)")
        got = _cli("prune", "--store", durable_url, "--older-than", "7d", "--state", "failed", "--json")
        assert json.loads(got.stdout)["removed"] == 2
        assert [t.id for t in app.tasks()] == [fresh]


@pytest.mark.parametrize(
    "args, needle",
    [
        ((), "--older-than"),
        (("--older-than", "soon"), "an age like"),
        (("--older-than", "0"), "more than 0"),
        (("--older-than", "7d", "--state", "RUNNING"), "only finished tasks"),
        (("--older-than", "7d", "--state", "DONE"), "unknown state"),
    ],
)
def test_corral_prune_refuses_bad_input_in_one_line(sqlite_url, args, needle):
    corral.App(sqlite_url).close()
    got = _cli("prune", "--store", sqlite_url, *args)
    assert got.exit_code != 0
    lines = got.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], got.stderr

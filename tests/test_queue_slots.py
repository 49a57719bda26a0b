"""Per-queue slots inside one worker (``-q default:8,bulk:2``), and the retry
path's share counted in slots held: the rules alone, then a real worker."""

from __future__ import annotations

import json
import threading

import pytest
from click.testing import CliRunner

import corral
from corral.core.claims import ClaimRequest
from corral.core.clock import poll_until
from corral.core.model import TaskFilter
from corral.core.slots import RecentPeak, parse_queues, queue_budgets, retry_room, rotate
from corral.core.states import State
from corral.core.validation import held_retry_cap
from corral.errors import ConfigError

WAIT = 30.0


# ---- the rules -----------------------------------------------------------------------------
def test_parse_queues():
    assert parse_queues("default") == (("default",), None)
    assert parse_queues("a, b") == (("a", "b"), None)
    assert parse_queues("default:8,bulk:2") == (("default", "bulk"), {"default": 8, "bulk": 2})


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "no queue"),
        ("a:8,b", "every queue"),
        ("a:x", "whole number"),
        ("a:0", "from 1"),
        ("a:2,a:3", "twice"),
        (":3", "no name"),
    ],
)
def test_parse_queues_refuses(text, says):
    with pytest.raises(ConfigError, match=says):
        parse_queues(text)


def test_queue_budgets_give_each_queue_its_free_slots_within_the_claim():
    slots = {"default": 8, "bulk": 2}
    assert queue_budgets(["default", "bulk"], slots, {"bulk": 2}, 10) == [("default", 8)]
    assert queue_budgets(["default", "bulk"], slots, {"default": 7}, 10) == [("default", 1), ("bulk", 2)]
    assert queue_budgets(["bulk", "default"], slots, {}, 3) == [("bulk", 2), ("default", 1)]
    assert queue_budgets(["default"], slots, {"default": 8}, 5) == []
    assert rotate(["a", "b", "c"], 4) == ("b", "c", "a")


def test_retries_hold_their_share_of_the_slots_not_of_each_claim():
    assert held_retry_cap(4, 0.25, 0) == 1
    assert held_retry_cap(4, 0.25, 1) == 0  # a claim of one freed slot does not go to a second retry
    assert held_retry_cap(40, 0.25, 3) == 7
    assert held_retry_cap(1, 0.25, 0) == 1  # at least one: retries always move
    assert held_retry_cap(4, None, 9) is None


def test_retry_room_keeps_room_for_recent_fresh_work_and_never_less_than_the_share():
    assert retry_room(20, 0.25, 0) == 20  # no fresh work lately: every slot
    assert retry_room(20, 0.25, 3) == 14  # room for twice the recent fresh peak
    assert retry_room(20, 0.25, 10) == 5  # never below the share
    assert retry_room(1, 0.25, 5) == 1


def test_recent_peak_forgets_after_a_window_or_two():
    p = RecentPeak(1.0)
    assert p.peak(0.0) == 0
    p.note(3, 0.0)
    p.note(1, 0.5)
    assert p.peak(0.9) == 3
    assert p.peak(1.5) == 3  # the previous window still counts
    p.note(2, 1.6)
    assert p.peak(2.7) == 2
    assert p.peak(5.0) == 0


# ---- a worker ------------------------------------------------------------------------------
class Gates:
    """One event per task argument: a test lets each task end when it wants."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[str, threading.Event] = {}

    def __call__(self, key: str) -> threading.Event:
        with self._lock:
            return self._events.setdefault(key, threading.Event())

    def open_all(self) -> None:
        with self._lock:
            for e in self._events.values():
                e.set()


def _running(app: corral.App, **kw) -> list:
    return app.store.list_tasks(TaskFilter(status=State.RUNNING, **kw))


def _keys(records) -> set[str]:
    return {json.loads(r.args)["args"][0] for r in records}


@pytest.fixture
def gated_app():
    app = corral.App("memory://")
    gates = Gates()

    @app.task(name="job", queue="default")
    def job(key: str) -> str:
        assert gates(key).wait(WAIT)
        return key

    @app.task(name="bulk_job", queue="bulk")
    def bulk_job(key: str) -> str:
        assert gates(key).wait(WAIT)
        return key

    try:
        yield app, gates, job
    finally:
        gates.open_all()
        app.close()


def test_a_flooded_bulk_queue_keeps_to_its_slots_and_default_work_still_starts(gated_app):
    app, gates, job = gated_app
    app.submit_many("bulk_job", [{"args": (f"b{i}",)} for i in range(30)])
    worker = app.worker(queues={"default": 3, "bulk": 2}, poll_interval=0.05).start()
    try:
        assert worker.concurrency == 5
        assert poll_until(lambda: len(_running(app)) == 2, WAIT)
        # bulk holds its 2 slots and no more, though 28 more bulk tasks wait
        handles = [job.submit(f"d{i}") for i in range(3)]
        assert poll_until(lambda: len(_running(app)) == 5, WAIT)
        running = _running(app)
        assert sorted(r.queue for r in running) == ["bulk", "bulk", "default", "default", "default"]
        # default work ends and is replaced by default work only
        gates("d0").set()
        assert handles[0].result(timeout=WAIT) == "d0"
        more = job.submit("d3")
        assert poll_until(lambda: more.status() is State.RUNNING, WAIT)
        assert sum(r.queue == "bulk" for r in _running(app)) == 2
        # a bulk slot freed goes to bulk again
        gates("b0").set()
        assert poll_until(lambda: _keys(_running(app, queue="bulk")) == {"b1", "b2"}, WAIT)
    finally:
        gates.open_all()
        worker.stop(grace=5.0)


def test_the_cli_takes_per_queue_slots_and_refuses_a_bad_spec():
    from corral.cli import cli

    got = CliRunner().invoke(cli, ["worker", "tests.apps.runtime_app:app", "--store", "memory://", "-q", "a:2,b"])
    assert got.exit_code != 0
    assert "--queues" in got.output and "every queue" in got.output
    assert len(got.output.strip().splitlines()) == 1


def test_retries_hold_at_most_their_share_of_slots_while_fresh_work_waits_and_all_when_none_does(gated_app):
    """4 slots, share 0.25: one retry in flight while fresh work waits, even
    when slots free one at a time (each claim then asks for one unit) and the
    retries come first in claim order; never none (fresh work does not
    starve them); every slot once fresh work is gone."""
    app, gates, job = gated_app
    from corral.core.model import Outcome

    retries = [job.submit(f"r{i}").id for i in range(6)]
    got = app.store.claim("setup", ClaimRequest(["default"], 6))
    assert sorted(t.id for c in got for t in c.tasks) == sorted(retries)
    app.store.complete(
        [
            Outcome(t.id, t.lease_token, t.version, State.RETRYING, error="x", run_at=t.started_at)
            for c in got
            for t in c.tasks
        ]
    )
    fresh = [job.submit(f"f{i}") for i in range(10)]

    def held() -> tuple[int, int]:
        running = _running(app)
        n_retry = sum(r.attempt > 1 for r in running)
        return n_retry, len(running) - n_retry

    # prefetch=0: this counts slots by RUNNING rows, and a task holds its
    # slot from its start (a prefetched one reads RESERVED until its start shows)
    worker = app.worker(4, retry_share=0.25, poll_interval=0.05, prefetch=0).start()
    try:
        assert poll_until(lambda: held() == (1, 3), WAIT), held()
        for _ in range(3):  # slots free one at a time: fresh, then the retry
            (key,) = sorted(k for k in _keys(_running(app)) if k.startswith("f"))[:1]
            gates(key).set()
            assert poll_until(lambda k=key: k not in _keys(_running(app)) and held() == (1, 3), WAIT), held()
        (rkey,) = [k for k in _keys(_running(app)) if k.startswith("r")]
        gates(rkey).set()
        assert poll_until(lambda: rkey not in _keys(_running(app)) and held() == (1, 3), WAIT), held()
        for i in range(10):
            gates(f"f{i}").set()
        assert all(h.result(timeout=WAIT) == f"f{i}" for i, h in enumerate(fresh))
        assert poll_until(lambda: held() == (4, 0), WAIT), held()  # no fresh work: every slot
    finally:
        gates.open_all()
        worker.stop(grace=5.0)


def test_degraded_runs_the_critical_queue_within_its_own_slots():
    """DEGRADED claims only from queues marked critical, each still within its
    own slots (and the worker within half its slots); back to NORMAL, every
    queue fills its own."""
    app = corral.App("memory://", critical_queues=["vip"])
    gates = Gates()

    @app.task(name="job")
    def job(key: str) -> str:
        assert gates(key).wait(WAIT)
        return key

    vip = [job.submit(f"v{i}", queue="vip") for i in range(5)]
    [job.submit(f"b{i}", queue="bulk") for i in range(8)]
    app.set_level("DEGRADED", reason="test")
    worker = app.worker(queues={"vip": 2, "bulk": 4}, poll_interval=0.05).start()
    try:
        assert poll_until(lambda: len(_running(app)) == 2, WAIT)
        assert {r.queue for r in _running(app)} == {"vip"}  # its 2 slots, though DEGRADED leaves 3
        gates("v0").set()
        assert vip[0].result(timeout=WAIT) == "v0"
        assert poll_until(lambda: len(_running(app, queue="vip")) == 2, WAIT)
        assert _running(app, queue="bulk") == []
        app.set_level("NORMAL", reason="recovered")
        assert poll_until(lambda: len(_running(app, queue="bulk")) == 4, WAIT)
        assert len(_running(app, queue="vip")) == 2
    finally:
        gates.open_all()
        worker.stop(grace=5.0)
        app.close(timeout=10)

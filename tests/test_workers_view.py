"""Worker processes as an operator sees them (``corral workers``, the
dashboard's Workers page): a worker killed with kill -9 shows as dead, with
the tasks it held, until the sweeper has taken them back and forgets it; a
worker that stops cleanly leaves no row behind."""

from __future__ import annotations

import json

from click.testing import CliRunner

import corral
from corral.cli import cli
from corral.core.model import TaskRecord, WorkerInfo
from corral.core.states import State
from corral.core.workers import views
from corral.edges.workers import read_workers
from corral.maintenance.sweeper import Sweeper
from corral.stores import open_store
from faults import AppWorker
from helpers import wait_for


def _workers_json(url: str) -> list[dict]:
    got = CliRunner().invoke(cli, ["workers", "--json", "--store", url], catch_exceptions=False)
    assert got.exit_code == 0, got.output
    return json.loads(got.stdout)["workers"]


def test_a_worker_killed_with_kill_9_shows_dead_with_what_it_held(durable_url, tmp_path):
    submitter = corral.App(durable_url)

    @submitter.task(name="slow", retries=3)
    def slow(first_run: float) -> int:  # body runs in the worker process
        raise AssertionError

    ids = {slow.submit(120).id for _ in range(2)}
    # a short lease: the worker reports every second, silent for 3 it is dead
    worker = AppWorker(durable_url, tmp_path / "runs.jsonl", tmp_path / "w.log", concurrency=2, lease_seconds=3)
    store = open_store(durable_url)
    try:
        worker.wait_ready()

        def running_here() -> list[dict]:
            rows = [w for w in _workers_json(durable_url) if w["pid"] == int(worker.pid)]
            return rows if rows and {h["id"] for h in rows[0]["held"]} == ids else []

        (alive,) = wait_for(running_here, timeout=30, interval=0.1, message="the worker holds both tasks")
        assert alive["alive"] and alive["slots"] == 2 and alive["queues"] == ["default"]
        assert alive["version"] and alive["host"]

        worker.kill()

        def dead_here() -> dict | None:
            rows = [w for w in _workers_json(durable_url) if w["pid"] == int(worker.pid)]
            return rows[0] if rows and not rows[0]["alive"] else None

        dead = wait_for(dead_here, timeout=30, interval=0.1, message="the killed worker shows dead")
        assert {h["id"] for h in dead["held"]} == ids  # with what it held
        assert {h["name"] for h in dead["held"]} == {"slow"}
        table = CliRunner().invoke(cli, ["workers", "--store", durable_url], env={"COLUMNS": "250"}).stdout
        assert "DEAD" in table and "1 dead" in table

        # the sweeper takes its leases back, then forgets it
        sweeper = Sweeper(store, interval=0.2, outage_grace=0, forget_workers_after=1, stale_pending_age=None)

        def swept() -> bool:
            sweeper.tick()
            return not [w for w in _workers_json(durable_url) if w["pid"] == int(worker.pid)]

        wait_for(swept, timeout=30, interval=0.2, message="the sweeper clears the dead worker")
        assert {store.get(i).status for i in ids} <= {State.PENDING, State.RETRYING}
    finally:
        worker.close()
        store.close()
        submitter.close()


def test_a_worker_that_stops_cleanly_removes_its_row(sqlite_url):
    app = corral.App(sqlite_url)

    @app.task
    def noop() -> None:
        return None

    app.start(workers=1)
    try:
        wait_for(lambda: read_workers(app.store)[1], timeout=10, message="the worker reports")
        (v,) = read_workers(app.store)[1]
        assert v.alive and v.slots == 1 and v.held == []
    finally:
        app.close()
    assert read_workers(open_store(sqlite_url))[1] == []


def _task(tid: int, worker: str, lease: float) -> TaskRecord:
    rec = TaskRecord(id=tid, name="t", args="{}", status=State.RUNNING)
    rec.worker_id, rec.lease_expires_at, rec.started_at = worker, lease, 1.0
    return rec


def test_dead_is_a_silence_of_three_beats_or_a_lost_lease():
    row = WorkerInfo("a:1:x", "a", 1, ("default",), 4, 1, "1", 5.0, started_at=0.0, heartbeat_at=100.0)
    (v,) = views([row], [_task(7, "a:1:x", 200.0)], now=114.0)
    assert v.alive and [h.id for h in v.held] == [7]
    (v,) = views([row], [], now=116.0)
    assert v.dead == "silent for 16s"
    (v,) = views([row], [_task(7, "a:1:x", 110.0)], now=112.0)
    assert v.dead == "lease lost 2s ago"
    # a holder with no row (a worker of a corral that kept none) is shown from its tasks
    (v,) = views([], [_task(8, "b:42:y", 110.0)], now=112.0)
    assert (v.host, v.pid, v.dead) == ("b", 42, "lease lost 2s ago")


def test_slots_in_use_are_the_held_tasks_that_run_not_the_last_report():
    row = WorkerInfo("a:1:x", "a", 1, ("default",), 4, 0, "1", 5.0, started_at=0.0, heartbeat_at=100.0)
    reserved = _task(9, "a:1:x", 200.0)
    reserved.started_at = None
    reserved.status = State.RESERVED
    (v,) = views([row], [_task(7, "a:1:x", 200.0), reserved], now=101.0)
    assert v.in_use == 1 and [(h.id, h.status) for h in v.held] == [(7, "RUNNING"), (9, "RESERVED")]

"""`RUNNING` means started: a task a worker holds but has not started
(prefetched ahead of a free slot, a chunk member waiting its turn) reads
RESERVED in every view (the task, the counts, the CLI, the metrics), and a
held task whose body runs shows RUNNING with its start and attempt within
about a second, while it still runs. At most one task of a group is RUNNING."""

from __future__ import annotations

import json
import threading

from click.testing import CliRunner
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import corral
from corral import State
from corral.cli import cli
from corral.core.model import TaskFilter
from corral.edges import metrics
from helpers import wait_for

#: how long a held task's start may take to show (it shows within about a second)
SHOWN_WITHIN = 10.0


def _hanging(app, hang: dict[int, threading.Event]):
    """A task whose run with argument ``i`` waits on ``hang[i]`` if given; ``ran`` lists the runs."""
    ran: list[int] = []

    @app.task(retries=0)
    def job(i):
        ran.append(i)
        if i in hang:
            hang[i].wait(30)

    return job, ran


def _cli_json(*args: str):
    result = CliRunner().invoke(cli, [*args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _gauges(store) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(metrics.StoreCollector(store))
    out = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            if s.name == "corral_tasks":
                out[s.labels["state"]] = s.value
    return out


def test_prefetched_tasks_read_reserved_everywhere_until_they_start(url):
    app = corral.App(url)
    release = {0: threading.Event(), 1: threading.Event()}
    job, ran = _hanging(app, release)
    first = job.submit(0)
    held = [job.submit(i) for i in (1, 2)]
    worker = app.worker(1, prefetch=2, chunk_size=1).start()
    try:
        wait_for(lambda: ran == [0])
        wait_for(lambda: all(h.status() is State.RESERVED for h in held), message="two units prefetched")
        assert first.status() is State.RUNNING
        for h in held:
            rec = app.get(h.id)
            assert rec.attempt == 0 and rec.started_at is None
        assert app.counts() == {"RUNNING": 1, "RESERVED": 2}
        assert [r.id for r in app.store.list_tasks(TaskFilter(status=State.RUNNING))] == [first.id]
        gauges = _gauges(app.store)
        assert (gauges["RUNNING"], gauges["RESERVED"]) == (1, 2)
        if not url.startswith("memory"):  # the CLI reads the same store from outside
            status = _cli_json("status", "--store", url)
            assert (status["counts"]["RUNNING"], status["counts"]["RESERVED"]) == (1, 2), status
            listed = _cli_json("tasks", "--store", url, "--status", "RESERVED")
            assert sorted(t["id"] for t in listed) == [h.id for h in held]
            assert [t["id"] for t in _cli_json("tasks", "--store", url, "--status", "RUNNING")] == [first.id]
            shown = _cli_json("show", str(held[0].id), "--store", url)
            assert shown["status"] == "RESERVED"

        # the first ends: the next prefetched task starts in its slot and, while
        # it runs, shows RUNNING with its start and attempt
        release[0].set()
        wait_for(lambda: ran == [0, 1])
        wait_for(lambda: held[0].status() is State.RUNNING, timeout=SHOWN_WITHIN, message="its start shows")
        rec = app.get(held[0].id)
        assert rec.started_at is not None and rec.attempt == 1
        assert held[1].status() is State.RESERVED
        assert ran == [0, 1]  # still running
        release[1].set()
        assert worker.drain(30)
        for h in (first, *held):
            rec = app.get(h.id)
            assert rec.status is State.SUCCESS and rec.attempt == 1 and rec.started_at is not None
    finally:
        for ev in release.values():
            ev.set()
        worker.stop(10)
        app.close(10)


def test_one_task_of_a_group_is_running_and_a_long_member_shows_its_start(url):
    app = corral.App(url)
    release = {0: threading.Event(), 1: threading.Event()}
    job, ran = _hanging(app, release)
    hs = [job.submit(i, group="g") for i in range(4)]
    worker = app.worker(1, chunk_size=4, prefetch=0).start()

    def in_group(status: State) -> list[int]:
        return [r.id for r in app.store.list_tasks(TaskFilter(group="g", status=status, newest_first=False))]

    try:
        wait_for(lambda: ran == [0])
        wait_for(lambda: in_group(State.RESERVED) == [h.id for h in hs[1:]], message="the chunk's members held")
        assert in_group(State.RUNNING) == [hs[0].id]
        (line,) = app.store.group_lines()
        assert line.head_status == "RUNNING"
        release[0].set()
        wait_for(lambda: ran == [0, 1])
        # the member runs: its start shows while it runs, and it alone is RUNNING
        wait_for(lambda: in_group(State.RUNNING) == [hs[1].id], timeout=SHOWN_WITHIN, message="the member's start")
        rec = app.get(hs[1].id)
        assert rec.started_at is not None and rec.attempt == 1
        assert in_group(State.RESERVED) == [h.id for h in hs[2:]]
        assert ran == [0, 1]
        release[1].set()
        assert worker.drain(30)
        assert [app.get(h.id).attempt for h in hs] == [1, 1, 1, 1]
        assert all(app.get(h.id).status is State.SUCCESS for h in hs)
    finally:
        for ev in release.values():
            ev.set()
        worker.stop(10)
        app.close(10)

"""The engine over a durable store, as several processes see it: each App
below opens its own store connection, as another process would."""

from __future__ import annotations

import os
import threading

import corral
from corral import State
from helpers import wait_for


def test_cancel_from_another_process_reaches_a_running_task(durable_url):
    worker_app = corral.App(durable_url)
    started = threading.Event()

    @worker_app.task
    def coop(ctx):
        started.set()
        while True:  # the workload: a loop with cancel points
            ctx.check_cancelled()
            threading.Event().wait(0.01)

    operator = corral.App(durable_url)  # e.g. `corral cancel ID` in another process
    h = worker_app.submit("coop")
    worker_app.start(workers=1)
    try:
        wait_for(started.is_set)
        rec = operator.cancel(h.id)
        assert rec.status is State.RUNNING and rec.cancel_requested
        wait_for(
            lambda: operator.get(h.id).status is State.CANCELED,
            timeout=10,
            message="the worker should see the cancel within a poll interval",
        )
    finally:
        worker_app.close(10)


def test_process_task_killed_by_a_cancel_from_another_process(durable_url, tmp_path):
    worker_app = corral.App(durable_url)
    pidfile = tmp_path / "pid"

    @worker_app.task(isolation="process")
    def stuck(path):
        with open(path, "w") as f:
            f.write(str(os.getpid()))
        threading.Event().wait()  # the workload never ends by itself

    operator = corral.App(durable_url)
    h = stuck.submit(str(pidfile))
    worker_app.start(workers=1)
    try:
        pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text()))
        operator.cancel(h.id)
        wait_for(lambda: operator.get(h.id).status is State.CANCELED, timeout=10)
        wait_for(
            lambda: (
                not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split(")")[-1].split()[0] == "Z"
            )
        )
    finally:
        worker_app.close(10)


def test_chunks_on_a_durable_store_record_attempts_without_a_write_per_task(durable_url):
    """Chunk members record their start with their outcome: attempts are right."""
    app = corral.App(durable_url)
    seen = []

    @app.task(retries=2, backoff=corral.Backoff(base=0.001, cap=0.01))
    def step(ctx, i):
        seen.append((i, ctx.attempt))
        if i == 3 and ctx.attempt == 1:
            raise ConnectionError("hiccup")

    hs = step.submit_many([{"args": (i,), "group": "g"} for i in range(6)])
    app.start(workers=2, chunk_size=6)
    try:
        assert app.drain(20)
        assert [app.get(h.id).attempt for h in hs] == [1, 1, 1, 2, 1, 1]
        assert [i for i, _ in seen] == [0, 1, 2, 3, 3, 4, 5]  # order held across the retry
    finally:
        app.close(10)


def test_an_idle_worker_stops_without_waiting_out_its_poll_interval(durable_url):
    """A long poll interval (a listening PostgreSQL worker needs few polls)
    must not hold up a stop: the dispatcher's wait for work ends at once."""
    app = corral.App(durable_url)
    app.task(lambda: None, name="step")
    worker = app.worker(2, poll_interval=60)
    waits = {"in": 0, "out": 0}
    depth = threading.local()

    def counted(inner):
        # the dispatcher waits in wait_offering (which may wait in wait_for_work)
        def wait(timeout, *args, **kwargs):
            outer = not getattr(depth, "n", 0)
            depth.n = getattr(depth, "n", 0) + 1
            waits["in"] += outer and timeout >= 60
            try:
                return inner(timeout, *args, **kwargs)
            finally:
                depth.n -= 1
                waits["out"] += outer and timeout >= 60

        return wait

    worker.store.wait_for_work = counted(worker.store.wait_for_work)
    worker.store.wait_offering = counted(worker.store.wait_offering)
    worker.start()
    try:
        # the dispatcher found nothing and waits (a first wait on PostgreSQL
        # only starts listening)
        done = 1 if durable_url.startswith("postgresql") else 0
        wait_for(lambda: waits["in"] - waits["out"] == 1 and waits["out"] >= done, timeout=30)
        stopped = threading.Event()
        threading.Thread(target=lambda: worker.stop(5) and stopped.set(), daemon=True).start()
        assert stopped.wait(20), "stop waited for the poll interval"
    finally:
        app.close(10)


def test_stop_hands_back_a_chunk_mid_run_with_attempts_intact(durable_url):

    app = corral.App(durable_url)
    gate = threading.Event()
    ran = []

    @app.task
    def step(i):
        ran.append(i)
        if i == 1 and not gate.is_set():
            gate.wait(30)  # outlives the grace period

    hs = step.submit_many([{"args": (i,), "group": "g"} for i in range(5)])
    first = app.worker(1, chunk_size=5).start()
    wait_for(lambda: ran == [0, 1])
    assert first.stop(grace=0.2) is False  # something had to be handed back
    recs = [app.get(h.id) for h in hs]
    assert recs[0].status is State.SUCCESS
    assert [r.status for r in recs[1:]] == [State.PENDING] * 4
    assert [r.attempt for r in recs[1:]] == [0, 0, 0, 0]  # no attempt burned
    gate.set()  # the abandoned run returns now; its result must not count
    second = app.worker(1, chunk_size=5).start()
    try:
        wait_for(lambda: all(app.get(h.id).status is State.SUCCESS for h in hs))
        assert ran == [0, 1, 1, 2, 3, 4]  # only the run under way at the stop ran twice
        assert [app.get(h.id).attempt for h in hs] == [1, 1, 1, 1, 1]
    finally:
        second.stop(grace=5)


def test_a_worker_behind_a_rate_starts_the_next_task_when_the_rate_allows_not_at_its_poll(durable_url):
    """With a minute between polls, every task under ``rate="4/s"`` still
    runs within seconds: a worker whose only ready work waits for the rate
    looks again when the rate allows a start. No second holds more than 4."""
    from corral.edges.partner import max_in_window

    app = corral.App(durable_url)
    app.limit("paced", rate="4/s")
    step = app.task(lambda i: i, name="step", limits=["paced"])
    hs = step.submit_many([{"args": (i,)} for i in range(10)])
    worker = app.worker(2, poll_interval=60).start()
    try:
        wait_for(lambda: all(app.get(h.id).status is State.SUCCESS for h in hs), timeout=30)
        assert max_in_window(sorted(app.get(h.id).started_at for h in hs), 1.0) <= 4
    finally:
        worker.stop(5)
        app.close(5)

"""The CPU profile of `corral bench throughput --profile`: each thread's CPU
counted in its part of the worker, and a store call's CPU apart from the rest
of the thread that made it."""

import threading
import time

import pytest

from corral.bench.profile import WorkerProfile, by_part, part_of, summarize

pytestmark = pytest.mark.skipif(not __import__("os").path.isdir("/proc/self/task"), reason="reads /proc (Linux)")


def burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


@pytest.mark.parametrize(
    "name, part",
    [
        ("corral-dispatcher", "dispatcher"),
        ("corral-completer", "completer"),
        ("corral-slot-12", "slots"),
        ("corral-sweeper", "maintenance"),
        ("corral-heartbeat", "keep-alive"),
        ("MainThread", "main"),
        ("Thread-3", "other"),
    ],
)
def test_a_thread_is_counted_in_the_part_its_name_says(name, part):
    assert part_of(name) == part


def test_a_thread_born_after_the_first_reading_counts_whole_and_the_rest_by_difference():
    names = {1: "corral-dispatcher", 2: "corral-completer", 3: "corral-slot-1"}
    spent = by_part({1: 1.0, 2: 5.0}, {1: 1.5, 2: 5.0, 3: 0.25}, names)
    assert spent == {"dispatcher": 0.5, "slots": 0.25}


class Store:
    def claim(self, worker_id, request):
        burn(0.05)
        return []

    def complete(self, outcomes):
        return None


def test_a_store_calls_cpu_is_counted_apart_from_the_thread_that_made_it():
    store = Store()
    prof = WorkerProfile(store, calls=("claim", "complete"))
    prof.begin()

    def dispatcher():
        store.claim("w", None)
        burn(0.05)  # the dispatcher's own work beside its claim

    t = threading.Thread(target=dispatcher, name="corral-dispatcher")
    t.start()
    t.join()
    reading = prof.end()
    # the thread has ended, so /proc no longer lists it: read what the wrapper saw
    assert reading["calls"] == {"claim@dispatcher": 1}
    assert reading["inside"]["claim@dispatcher"] == pytest.approx(0.05, abs=0.02)
    report = summarize([{**reading, "threads": {"dispatcher": 0.1}}], tasks=1000, server=0.2)
    us = report["us_per_task"]
    assert us["store.claim"] == pytest.approx(50, abs=20)  # 0.05 s over 1 000 tasks
    assert us["dispatcher"] == pytest.approx(50, abs=20)  # its 0.1 s less the claim's
    assert us["database server"] == 200
    assert report["tasks_per_claim"] == 1000


def test_a_live_thread_s_cpu_is_read_from_proc_between_begin_and_end():
    prof = WorkerProfile(Store(), calls=())
    stop = threading.Event()
    started = threading.Event()

    def slot():
        started.set()
        burn(0.15)
        stop.wait()

    burn(0.05)  # before the begin: not counted
    prof.begin()
    t = threading.Thread(target=slot, name="corral-slot-1")
    t.start()
    started.wait(5)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # until the slot's burn has shown in /proc
        if _slot_cpu(t) >= 0.15:
            break
        time.sleep(0.01)
    reading = prof.end()
    stop.set()
    t.join()
    assert reading["threads"]["slots"] == pytest.approx(0.15, abs=0.03)
    assert reading["threads"].get("main", 0.0) < 0.03  # the main thread's burn came before the begin


def _slot_cpu(t: threading.Thread) -> float:
    from corral.bench.profile import proc_cpu

    return proc_cpu(f"/proc/self/task/{t.native_id}") or 0.0

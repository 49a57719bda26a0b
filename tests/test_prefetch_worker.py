"""Bounded prefetch in the worker, on every store: units held beyond the
free slots are handed back at stop with their attempts intact, never name a
limit, keep group order and exclusivity, and leave a small group's work
moving beside a big one."""

from __future__ import annotations

import threading
import time

import corral
from corral import State
from corral.core.pacing import (
    AUTO_PREFETCH_MAX,
    RELAY_LEAD_DEFAULT,
    RELAY_LEAD_MAX,
    AutoChunk,
    auto_prefetch,
    chunk_reach,
    default_prefetch,
    relay_due,
    relay_lead,
    tail_bound,
    tail_split,
)
from helpers import wait_for


class _ClaimLog:
    """Wraps a store's claim to record what each claim asked and got."""

    def __init__(self, store):
        self.calls: list[tuple[bool, list]] = []
        self._claim = store.claim
        store.claim = self

    def __call__(self, worker_id, request):
        got = self._claim(worker_id, request)
        self.calls.append((request.prefetch, got))
        return got

    def prefetch_calls(self) -> int:
        return sum(1 for ahead, _ in self.calls if ahead)


def _first_one_hangs(app):
    """A task whose run with argument 0 waits for ``release``; ``ran`` lists the runs."""
    release = threading.Event()
    ran: list[int] = []

    @app.task(retries=0)
    def job(i):
        ran.append(i)
        if i == 0:
            release.wait(30)

    return job, release, ran


def test_stop_hands_back_prefetched_units_with_attempts_intact(url):
    app = corral.App(url)
    job, release, ran = _first_one_hangs(app)

    first = job.submit(0)
    rest = [job.submit(i) for i in (1, 2, 3)]
    worker = app.worker(1, prefetch=3, chunk_size=1).start()
    try:
        wait_for(lambda: ran == [0])
        wait_for(
            lambda: all(app.get(h.id).status is State.RESERVED for h in rest),
            message="one unit running and three prefetched",
        )
        assert worker.busy == 4
        stopper = threading.Thread(target=worker.stop, kwargs={"grace": 30})
        stopper.start()
        # handed back before the grace period ends, not started
        wait_for(lambda: all(app.get(h.id).status is State.PENDING for h in rest), timeout=20)
        release.set()
        stopper.join(30)
        assert not stopper.is_alive()
    finally:
        release.set()
    assert ran == [0]
    assert app.get(first.id).status is State.SUCCESS
    assert worker.handed_back == 3
    for h in rest:
        rec = app.get(h.id)
        assert rec.attempt == 0 and rec.started_at is None
    app.close(10)


def test_prefetch_never_holds_a_unit_under_a_limit(url):
    app = corral.App(url)
    app.limit("downstream", concurrency=5)
    release = threading.Event()

    @app.task
    def blocker():
        release.wait(30)

    @app.task(limits=["downstream"])
    def limited(i):
        return i

    @app.task
    def plain(i):
        return i

    b = blocker.submit()
    worker = app.worker(1, prefetch=4, chunk_size=1)
    log = _ClaimLog(worker.store)
    worker.start()
    try:
        wait_for(lambda: app.get(b.id).status is State.RUNNING)
        lim = [limited.submit(i) for i in range(3)]
        # in one write: a worker running limited tasks takes one prefetch
        # between two claims into a free slot, and it must see both
        pl = plain.submit_many([(0,), (1,)])
        wait_for(lambda: all(app.get(h.id).status is State.RESERVED for h in pl), message="plain work prefetched")
        wait_for(lambda: log.prefetch_calls() >= 1)
        # the only slot is busy: limited work stays queued, holding no place of its limit
        assert all(app.get(h.id).status is State.PENDING for h in lim)
        assert app.store.limit_usage().get("downstream", 0) == 0
        release.set()
        assert worker.drain(30)
        assert all(app.get(h.id).status is State.SUCCESS for h in lim + pl)
    finally:
        release.set()
        worker.stop(10)
        app.close(10)
    for ahead, got in log.calls:
        if ahead:
            assert all(not t.limits for c in got for t in c.tasks)


def test_group_order_and_exclusivity_hold_under_prefetch(url):
    app = corral.App(url)
    lock = threading.Lock()
    running: dict[str, int] = {}
    seen: dict[str, list[int]] = {}
    overlaps = []

    @app.task
    def step(group, i):
        with lock:
            running[group] = running.get(group, 0) + 1
            if running[group] > 1:
                overlaps.append((group, i))
            seen.setdefault(group, []).append(i)
        threading.Event().wait(0.001)  # the workload
        with lock:
            running[group] -= 1

    for i in range(25):
        for g in ("a", "b", "c"):
            step.submit(g, i, group=g)
    for i in range(20):
        step.submit(f"solo-{i}", i)  # ungrouped work beside the groups
    app.start(workers=4, prefetch=8)
    try:
        assert app.drain(60)
    finally:
        app.close(10)
    assert overlaps == []
    for g in ("a", "b", "c"):
        assert seen[g] == list(range(25))


def test_a_small_group_is_not_held_behind_a_big_one_by_prefetch(url):
    app = corral.App(url)
    done: list[str] = []

    @app.task
    def step(group, i):
        threading.Event().wait(0.002)  # the workload
        done.append(group)

    for i in range(300):
        step.submit("big", i, group="big")
    for i in range(3):
        step.submit("small", i, group="small")
    app.start(workers=2, prefetch=4)
    try:
        assert app.drain(120)
    finally:
        app.close(10)
    last_small = max(i for i, g in enumerate(done) if g == "small")
    # round robin between groups: the small group ends long before the big one
    assert last_small < len(done) // 2


def test_prefetch_zero_claims_only_into_free_slots(url):
    app = corral.App(url)
    release = threading.Event()

    @app.task
    def job(i):
        if i == 0:
            release.wait(30)

    handles = [job.submit(i) for i in range(4)]
    worker = app.worker(1, prefetch=0, chunk_size=1)
    log = _ClaimLog(worker.store)
    worker.start()
    try:
        wait_for(lambda: app.get(handles[0].id).status is State.RUNNING)
        assert worker.busy == 1
        assert all(app.get(h.id).status is State.PENDING for h in handles[1:])
        release.set()
        assert worker.drain(30)
    finally:
        release.set()
        worker.stop(10)
        app.close(10)
    assert log.prefetch_calls() == 0


def test_at_warning_the_slots_stay_full_while_a_claim_waits(url):
    """WARNING makes each claim smaller (half the slots), not the slots
    fewer: units are still held ahead, each claim ahead as small, so a slot
    that frees starts its next unit while no claim can get through."""
    app = corral.App(url)
    app.set_level("WARNING", reason="test")
    gates: dict[int, threading.Event] = {i: threading.Event() for i in range(12)}
    ran: list[int] = []

    @app.task(retries=0)
    def job(i):
        ran.append(i)
        gates[i].wait(30)

    handles = [job.submit(i) for i in range(12)]
    worker = app.worker(4, prefetch=4, chunk_size=1)
    log = _ClaimLog(worker.store)
    claims_open = threading.Event()
    claims_open.set()
    inner = worker.store.claim

    def slow_claim(worker_id, request):
        claims_open.wait(30)
        return inner(worker_id, request)

    worker.store.claim = slow_claim
    worker.start()
    try:
        wait_for(lambda: len(ran) == 4, message="the four slots run")
        wait_for(
            lambda: sum(app.get(h.id).status is State.RESERVED for h in handles) == 4,
            message="four units held ahead at WARNING",
        )
        claims_open.clear()  # no claim gets through from now on
        first = list(ran)
        for i in first[:2]:
            gates[i].set()
        wait_for(lambda: len(ran) == 6, message="the freed slots started units held ahead, with no claim")
        assert worker.busy >= 4
        claims_open.set()
        for g in gates.values():
            g.set()
        assert worker.drain(30)
    finally:
        claims_open.set()
        for g in gates.values():
            g.set()
        worker.stop(10)
        app.close(10)
    assert sorted(ran) == list(range(12))
    assert log.prefetch_calls() > 0
    # every claim, ahead or into free slots, took at most half the slots
    assert all(len(got) <= 2 for _, got in log.calls)


def test_a_chunk_reaches_a_quarter_further_and_small_chunks_not_at_all():
    assert [chunk_reach(n) for n in (1, 3, 4, 8, 100, 200)] == [1, 3, 5, 10, 125, 250]


def test_chunks_shorten_near_the_end_of_the_queued_work():
    # far from the end (a chunk is at most a quarter of each slot's share): as usual
    assert tail_split(100, 8000, 20) is None
    assert tail_split(100, tail_bound(100, 20), 20) is None
    # nearer: chunks of a quarter of each slot's share; lines of a whole share keep the chunk
    assert tail_split(100, 4000, 20) == (50, 200)
    assert tail_split(100, 300, 20) == (4, 15)
    assert tail_split(100, 1, 20) == (1, 1)
    assert tail_split(100, 0, 20) == (1, 0)
    # chunks of one task, or nothing known: nothing to shorten
    assert tail_split(1, 10, 20) is None
    assert tail_split(100, 10, 0) is None


def test_a_worker_shortens_its_chunks_near_the_end_of_grouped_work(monkeypatch):
    app = corral.App("memory://")

    @app.task
    def step(i):
        return i

    seen: list[tuple[int, tuple[int, int] | None]] = []
    inner = app.store.claim

    def claim(worker_id, request):
        seen.append((request.chunk_size, request.tail))
        return inner(worker_id, request)

    monkeypatch.setattr(app.store, "claim", claim)
    # quick tasks: chunks of 200 once measured, usual while 4 000 are queued (4 slots)
    handles = step.submit_many([{"args": (i,), "group": f"g{i % 10}"} for i in range(4000)])
    worker = app.worker(4, poll_interval=0.01)
    worker.start()
    try:
        wait_for(lambda: all(app.get(h.id).status is State.SUCCESS for h in handles), timeout=60)
    finally:
        worker.stop(10)
        app.close(10)
    assert any(chunk > 1 and tail is None for chunk, tail in seen)  # chunks as usual at first
    near_end = [(chunk, tail) for chunk, tail in seen if tail is not None]
    assert near_end and all(tail[0] < chunk for chunk, tail in near_end)


def test_the_backlog_is_read_less_often_far_from_the_end(monkeypatch):
    import corral.engine.claimer as claimer_module

    app = corral.App("memory://")
    worker = app.worker(4)
    for _ in range(10):
        worker.pace.tasks.observe(0.010)  # chunks of 100: about a second of work each
    queued = [10**6]
    reads: list[float] = []
    clock = [1000.0]

    def backlog(at_most):
        reads.append(clock[0])
        return min(at_most, queued[0])

    monkeypatch.setattr(app.store, "backlog", backlog)
    monkeypatch.setattr(claimer_module.time, "monotonic", lambda: clock[0])
    for _ in range(20):  # one second of claims, 50 ms apart, grouped work coming
        worker.claimer.grouped_at = clock[0]
        assert worker.claimer.tail(100) is None
        clock[0] += 0.05
    assert len(reads) == 4  # far from the end: every 250 ms
    queued[0] = 100
    reads.clear()
    clock[0] += 0.3
    for _ in range(20):
        worker.claimer.grouped_at = clock[0]
        assert worker.claimer.tail(100) is not None
        clock[0] += 0.051
    assert len(reads) == 20  # near it: at every claim 50 ms apart
    app.close()


def test_a_handover_uses_the_last_count_and_never_waits_for_one(monkeypatch):
    import corral.engine.claimer as claimer_module

    app = corral.App("memory://")
    worker = app.worker(4)
    for _ in range(10):
        worker.pace.tasks.observe(0.010)
    reads: list[float] = []
    clock = [1000.0]

    def backlog(at_most):
        reads.append(clock[0])
        return 100  # near the end: short chunks

    monkeypatch.setattr(app.store, "backlog", backlog)
    monkeypatch.setattr(claimer_module.time, "monotonic", lambda: clock[0])
    worker.claimer.grouped_at = clock[0]
    assert worker.claimer.tail(100, read=False) is None  # nothing counted yet: chunks as usual
    assert reads == []
    assert worker.claimer.tail(100) is not None  # the completer's read, after a handover
    clock[0] += 10.0  # long past due
    worker.claimer.grouped_at = clock[0]
    assert worker.claimer.tail(100, read=False) == claimer_module.tail_split(100, 100, 4)
    assert len(reads) == 1  # the handover read nothing
    app.close()


def test_default_prefetch_is_small_and_bounded():
    assert default_prefetch(1) == 2
    assert default_prefetch(10) == 20
    assert default_prefetch(500) == 64


def test_auto_prefetch_holds_more_of_quick_units_only():
    assert auto_prefetch(8, None) == default_prefetch(8) == 16  # nothing measured yet
    assert auto_prefetch(8, 2.0) == 16  # long units: never fewer than the default
    assert auto_prefetch(8, 0.010) == 16  # 20 ms of each slot's work
    assert auto_prefetch(8, 0.001) == 160
    assert auto_prefetch(8, 1e-5) == auto_prefetch(8, 0.0) == AUTO_PREFETCH_MAX
    assert auto_prefetch(500, 1e-5) == AUTO_PREFETCH_MAX
    assert auto_prefetch(500, 1.0) == default_prefetch(500) == 64


def test_a_relay_is_asked_as_long_before_the_end_as_a_handover_takes():
    assert relay_lead(None) == RELAY_LEAD_DEFAULT  # nothing measured yet
    assert abs(relay_lead(0.020) - 0.060) < 1e-9  # with a margin for the completer's queue
    assert relay_lead(10.0) == RELAY_LEAD_MAX  # a successor never waits long in its place
    assert relay_lead(0.0) > 0
    assert relay_due(3, 0.010, 0.030) and not relay_due(4, 0.010, 0.030)
    assert relay_due(1, 0.010, 0.030)  # the last task: ask at its start
    assert not relay_due(1, 0.5, 0.030)  # a long last task asks for none: its end hands the place over
    assert not relay_due(2, None, 1.0)  # durations unknown: no relay yet
    assert not relay_due(0, 0.001, 1.0)


def test_a_worker_holds_more_ahead_once_its_units_prove_quick(url):
    app = corral.App(url)

    @app.task
    def noop(i):
        return i

    handles = [noop.submit(i) for i in range(40)]
    auto = app.worker(2)
    fixed = app.worker(2, prefetch=3)
    assert auto.prefetch == default_prefetch(2) and fixed.prefetch == 3
    auto.start()
    try:
        wait_for(lambda: all(app.get(h.id).status is State.SUCCESS for h in handles))
        measured = auto.pace.units.known()
        assert measured is not None  # the worker timed its units
        # the prefetch follows what it measured (how much that is depends on the machine's pace)
        assert auto.prefetch == auto_prefetch(2, measured)
    finally:
        auto.stop(10)
        app.close(10)
    for _ in range(200):
        fixed.pace.units.observe(0.0005)
        auto.pace.units.observe(0.0005)
    assert auto.prefetch > 4 * default_prefetch(2)  # units of half a millisecond: far more held ahead
    assert fixed.prefetch == 3  # a prefetch given is kept


def test_auto_chunk_follows_task_durations():
    chunk = AutoChunk(target=0.25, maximum=200, warmup=5)
    assert chunk.size() == 1  # nothing measured yet
    for _ in range(10):
        chunk.observe(0.010)
    assert chunk.size() == 25
    for _ in range(400):
        chunk.observe(2.0)
    assert chunk.size() == 1  # long tasks: one at a time
    quick = AutoChunk(target=0.25, maximum=200, warmup=1)
    quick.observe(0.0)
    assert quick.size() == 200


def test_prefetch_goes_on_after_prefetched_units_ran(url):
    """A prefetched unit must leave the fresh-work count it entered when it
    ends: counted as a retry (its attempt is raised when it starts), it once
    drove the retry count below zero, and a worker with retries held never
    prefetches again."""
    app = corral.App(url)
    gate = threading.Event()
    release = threading.Event()
    started = []

    @app.task(retries=0)
    def job(i):
        started.append(i)
        (gate if i < 2 else release).wait(30)

    def prefetched() -> int:
        return sum(1 for ahead, got in log.calls if ahead and got)

    for i in range(2):
        job.submit(i)
    worker = app.worker(1, prefetch=1, chunk_size=1)
    log = _ClaimLog(app.store)
    worker.start()
    try:
        # task 0 runs, task 1 is held ahead; both end
        wait_for(lambda: prefetched() >= 1, message="task 1 held ahead")
        gate.set()
        wait_for(lambda: worker.busy == 0 and len(started) == 2)
        # the next round: the slot busy again, and again a unit held ahead
        before = prefetched()
        hs = [job.submit(i) for i in (2, 3, 4)]
        wait_for(lambda: prefetched() > before, message="a prefetch claim after the first prefetched units ended")
        release.set()
        for h in hs:
            assert h.result(timeout=30) is None
    finally:
        gate.set()
        release.set()
        worker.stop(grace=10)
    app.close(10)


def test_a_unit_given_back_before_it_started_is_in_flight_until_the_hand_back_is_written(sqlite_url):
    """What a halt does (its prefetched units go back at once): a slot that
    then picks such a unit leaves its accounting to the hand-back, so "nothing
    in flight" means the task is back in the queue, not still RESERVED."""
    app = corral.App(sqlite_url)
    job, release, ran = _first_one_hangs(app)

    job.submit(0)
    second = job.submit(1)
    worker = app.worker(1, prefetch=1, chunk_size=1).start()
    writes = threading.Event()
    try:
        wait_for(lambda: ran == [0])
        wait_for(lambda: app.get(second.id).status is State.RESERVED, message="the second unit is prefetched")
        real_complete = worker.store.complete

        def held_complete(outcomes):
            writes.wait(30)  # the completer's writes wait until the end of the check
            return real_complete(outcomes)

        worker.store.complete = held_complete
        worker._stop_claiming.set()  # as a halt does, then its prefetched units go back
        assert worker.completer.hand_back_prefetched() == 1
        release.set()  # the slot ends task 0, then picks the unit given back
        wait_for(lambda: worker.ledger.inbox.empty(), message="the slot took the unit given back")
        end = time.monotonic() + 0.5
        while time.monotonic() < end:  # the hand-back is not written yet: still in flight
            assert worker.busy >= 1
        writes.set()
        wait_for(lambda: worker.busy == 0)
        assert app.get(second.id).status is State.PENDING
        assert ran == [0]
    finally:
        release.set()
        writes.set()
        worker.stop(10)
        app.close(10)

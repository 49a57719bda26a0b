"""A waiting worker's offer on PostgreSQL: a submit of one plain task due
now hands it to an idle worker in the submit's own commit (RUNNING under the
worker's lease, no start recorded, as a prefetch), and nothing else is ever
handed over: not grouped, limited, delayed or batched work, not a task the
worker cannot run, not past the slots offered, not after the wait ended. The
offer stays open through its hand-overs until its slots are all taken. A
task handed to a worker that died comes back with its attempts intact."""

from __future__ import annotations

import json
import threading

import psycopg

import corral
from corral import State
from corral.maintenance.recovery import sweep_once
from corral.stores.base import Offer
from helpers import wait_for


def _offers(url: str) -> list[tuple]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute("SELECT worker_id, free, given FROM corral_open_offers ORDER BY worker_id").fetchall()


def _app_with_job(url: str):
    app = corral.App(url)

    @app.task()
    def job(i):
        return i

    return app, job


class _Waiter:
    """A thread in ``store.wait_offering``; ``got`` holds the claims handed
    to it so far, ``ended`` is set when the wait returned."""

    def __init__(self, app: corral.App, url: str, offer: Offer, timeout: float = 60):
        self.got: list = []
        self.ended = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(app.store, offer, timeout), daemon=True)
        # the first wait on a store only starts listening: wait until the offer is open
        app.store.wait_for_work(0.01)
        self._thread.start()
        # open for this wait: a spent offer stays in the table, with no slot
        # free, until the next one
        wait_for(
            lambda: any(row[0] == offer.worker_id and row[1] > 0 for row in _offers(url)), message="the offer is open"
        )

    def _run(self, store, offer, timeout):
        store.wait_offering(timeout, offer.queues, offer, self.got.extend)
        self.ended.set()

    def ids(self) -> list[int]:
        return [t.id for c in self.got for t in c.tasks]

    def result(self, store) -> list:
        store.wake_waiters()
        self._thread.join(10)
        assert not self._thread.is_alive()
        return self.got


def test_a_plain_task_is_handed_to_the_waiting_worker_in_its_submit(pg_url):
    app, job = _app_with_job(pg_url)

    waiter = _Waiter(app, pg_url, Offer("w-1", ("default",), frozenset({job.name}), 2, 30.0))
    h = job.submit(7)
    # handed over by the submit's own commit: no claim came between
    rec = app.get(h.id)
    assert rec.status is State.RESERVED and rec.worker_id == "w-1"  # held, not started
    assert rec.attempt == 0 and rec.started_at is None
    wait_for(lambda: waiter.ids() == [h.id], message="the task is passed on as it comes")
    assert waiter.got[0].token == rec.lease_token
    kinds = [(json.loads(e.data)["status"], e.kind) for e in app.store.events(limit=50) if e.subject == f"task:{h.id}"]
    assert sorted(kinds) == sorted([("PENDING", "submitted"), ("RUNNING", "started")])
    app.close(5)


def test_an_offer_stays_open_for_every_slot_it_offered(pg_url):
    """A steady stream of single submits: the offer is not spent by one
    task, the wait goes on and the next submit is handed over too, until
    every slot offered is taken; then the wait ends by itself."""
    app, job = _app_with_job(pg_url)

    waiter = _Waiter(app, pg_url, Offer("w-1", ("default",), frozenset({job.name}), 3, 30.0))
    handed = []
    for i in range(3):
        h = job.submit(i)
        handed.append(h.id)
        assert app.get(h.id).worker_id == "w-1", f"submit {i} was not handed over"
        wait_for(lambda: waiter.ids() == handed, message=f"task {i} is passed on as it comes")
        if i < 2:
            assert not waiter.ended.is_set(), "the wait ended with slots still offered"
            assert [free for _, free, _ in _offers(pg_url)] == [2 - i]
    assert waiter.ended.wait(10), "a spent offer ends the wait"
    assert [free for _, free, _ in _offers(pg_url)] == [0]  # spent: nothing more is handed over
    assert app.get(job.submit(9).id).status is State.PENDING
    assert waiter.result(app.store) and waiter.ids() == handed  # nothing read back twice
    app.close(5)


def test_a_handed_task_rides_in_its_notification_and_a_big_one_is_read_back(pg_url, monkeypatch):
    """The worker starts a handed-over task from its notification, with no
    round trip to read it back; a row too big for a notification is read
    back, by the withdraw that ends the wait. A new offer after either does
    not hand the same task again."""
    app, job = _app_with_job(pg_url)
    store = app.store
    reads = []
    real = store._withdraw

    def withdraw(conn, opened):
        seen = len(opened.received)
        real(conn, opened)
        reads.append(len(opened.received) - seen)

    monkeypatch.setattr(store, "_withdraw", withdraw)
    offer = Offer("w-1", ("default",), frozenset({job.name}), 4, 30.0)
    waiter = _Waiter(app, pg_url, offer)
    small = job.submit(1)
    wait_for(lambda: waiter.ids() == [small.id], message="the small task comes in its notification")
    assert reads == [] and not waiter.ended.is_set()
    big = job.submit("x" * 9000)
    # its notification only names the worker: the wait ends, and the withdraw reads it back
    assert waiter.ended.wait(20), "a task too big for its notification ends the wait"
    assert waiter.ids() == [small.id, big.id] and reads == [1]
    for h, args in ((small, (1,)), (big, ("x" * 9000,))):
        rec = next(t for c in waiter.got for t in c.tasks if t.id == h.id)
        stored = app.get(h.id)
        assert (rec.status, stored.status) == (State.RUNNING, State.RESERVED)  # held, not started yet
        assert (rec.name, rec.args, rec.worker_id, rec.version, rec.lease_token) == (
            stored.name,
            stored.args,
            stored.worker_id,
            stored.version,
            stored.lease_token,
        )
        assert rec.arguments == stored.arguments and rec.arguments[0] == list(args)
    # a new offer starts clean: every slot free, nothing given yet
    waiter = _Waiter(app, pg_url, offer)
    assert _offers(pg_url) == [("w-1", 4, [])]
    assert waiter.result(store) == []
    app.close(5)


def test_only_plain_work_due_now_and_within_the_offer_is_handed_over(pg_url):
    app = corral.App(pg_url)
    app.limit("api", concurrency=5)

    @app.task()
    def job(i):
        return i

    @app.task(limits=["api"])
    def limited(i):
        return i

    @app.task()
    def other(i):
        return i

    offer = Offer("w-1", ("default",), frozenset({job.name, limited.name}), 1, 30.0)
    for submit in (
        lambda: [job.submit(1, group="g")],
        lambda: [limited.submit(2)],
        lambda: [job.submit(3, delay=60)],
        lambda: [job.submit(4, queue="elsewhere")],
        lambda: [other.submit(5)],  # a task the worker cannot run
        lambda: job.submit_many([(6,), (7,)]),  # more than one task in a submit
    ):
        waiter = _Waiter(app, pg_url, offer)
        kept = submit()
        assert waiter.result(app.store) == []
        for h in kept:
            rec = app.get(h.id)
            assert rec.status not in (State.RUNNING, State.RESERVED) and rec.worker_id is None, rec
    waiter = _Waiter(app, pg_url, offer)
    handed = job.submit(8)
    past = job.submit(9)  # the offer had one slot
    assert waiter.ended.wait(10), "a spent offer ends the wait"
    assert waiter.ids() == [handed.id]
    assert app.get(handed.id).status is State.RESERVED
    assert app.get(past.id).status is State.PENDING and app.get(past.id).worker_id is None
    after = job.submit(10)  # the wait ended: nothing is handed over
    assert app.get(after.id).status is State.PENDING
    app.close(5)


def test_a_task_handed_to_a_worker_that_died_comes_back_with_its_attempts(pg_url):
    app, job = _app_with_job(pg_url)

    # a worker that offered and died before withdrawing (its lease is short)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            app.store._q["offer"],
            {
                "worker": "gone",
                "n": 1,
                "old": None,
                "channel": "corral_offer_nobody",
                "queues": "{default}",
                "all_names": True,
                "names": "{}",
                "free": 1,
                "lease": 0.2,
                "ttl": 60.0,
            },
        )
    h = job.submit(1)
    assert app.get(h.id).worker_id == "gone"
    wait_for(lambda: h.id in sweep_once(app.store).lost_leases_retried, timeout=20)
    rec = app.get(h.id)
    assert rec.status is State.PENDING and rec.attempt == 0
    worker = app.worker(1).start()
    wait_for(lambda: app.get(h.id).status is State.SUCCESS)
    assert app.get(h.id).attempt == 1
    worker.stop(10)
    app.close(5)


def test_an_idle_worker_runs_a_task_handed_over_in_its_submit(pg_url):
    app = corral.App(pg_url)

    @app.task()
    def job(i):
        return i * 2

    worker = app.worker(2, poll_interval=60).start()
    try:
        wait_for(lambda: [r[0] for r in _offers(pg_url)] == [worker.id], message="the idle worker offers its slots")
        h = job.submit(21)
        rec = app.get(h.id)
        assert rec.status in (State.RESERVED, State.RUNNING, State.SUCCESS) and rec.worker_id == worker.id
        wait_for(lambda: app.get(h.id).status is State.SUCCESS, timeout=20)
        done = app.get(h.id)
        assert done.attempt == 1 and done.started_at is not None and h.result(timeout=5) == 42
    finally:
        worker.stop(10)
    assert _offers(pg_url) == []
    app.close(5)


def test_an_idle_worker_takes_a_stream_of_submits_without_claiming_between(pg_url):
    """One task after another into an idle worker: each is handed over in
    its submit and the offer stays open, so the worker makes no claim (and
    opens no new offer) between them; with the offer closing after each
    task, a claim came between every two and the next submit could find no
    offer open and wait for a claim's commit too."""
    app = corral.App(pg_url)

    @app.task()
    def job(i):
        return i

    worker = app.worker(4, poll_interval=60)
    claims = []
    inner = worker.store.claim
    worker.store.claim = lambda *args, **kwargs: claims.append(1) or inner(*args, **kwargs)
    worker.start()
    try:
        wait_for(lambda: [r[0] for r in _offers(pg_url)] == [worker.id], message="the idle worker offers its slots")
        before = len(claims)
        for i in range(3):
            h = job.submit(i)
            assert app.get(h.id).worker_id == worker.id, f"submit {i} was not handed over"
            wait_for(lambda h=h: app.get(h.id).status is State.SUCCESS, timeout=20)
        assert len(claims) == before, "the worker claimed between hand-overs"
        assert [free for _, free, _ in _offers(pg_url)] == [1]  # one slot of the four still offered
    finally:
        worker.stop(10)
    assert _offers(pg_url) == []
    app.close(5)


def test_a_stopping_worker_gives_back_what_was_handed_to_it(pg_url):
    app, job = _app_with_job(pg_url)

    worker = app.worker(2, poll_interval=60)
    inner = worker.store.wait_offering

    def wait_offering(timeout, queues, offer, take):
        def stop_and_take(claims):
            worker._stop_claiming.set()  # the stop comes as the hand-over arrives
            take(claims)

        inner(timeout, queues, offer, stop_and_take)

    worker.store.wait_offering = wait_offering
    worker.start()
    try:
        wait_for(lambda: len(_offers(pg_url)) == 1, message="the idle worker offers its slots")
        h = job.submit(1)
        wait_for(lambda: worker.handed_back == 1, timeout=20)
        # the hand-back is written by the completer, a moment later
        wait_for(lambda: app.get(h.id).status is State.PENDING, timeout=20)
        rec = app.get(h.id)
        assert rec.attempt == 0 and rec.started_at is None
    finally:
        worker.stop(10)
    app.close(5)


def test_stores_without_offers_just_wait(fake_clock_url):
    app = corral.App(fake_clock_url)
    got = []
    app.store.wait_offering(0.01, ("default",), Offer("w", ("default",), None, 4), got.extend)
    assert got == []
    app.close(1)


def test_racing_submits_and_waits_lose_nothing_and_run_nothing_twice(pg_url):
    """Single submits from several threads while three idle workers offer,
    take and withdraw: every task runs once, none waits for a poll or for its
    lease to end (a task handed over as an offer was withdrawn must still be
    picked up)."""
    apps = [corral.App(pg_url) for _ in range(3)]
    runs: dict[int, int] = {}
    lock = threading.Lock()
    for app in apps:

        @app.task(name="count")
        def count(i):
            with lock:
                runs[i] = runs.get(i, 0) + 1

    # no poll and no lease end within the test: only a hand-over or a wake-up starts a task
    workers = [app.worker(2, poll_interval=60, lease_seconds=120).start() for app in apps]
    try:
        wait_for(lambda: len(_offers(pg_url)) == 3, message="three idle workers offer")

        def submit(base: int) -> None:
            for i in range(base, base + 100):
                apps[0].submit("count", args=(i,))

        threads = [threading.Thread(target=submit, args=(k * 100,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        wait_for(lambda: len(runs) == 400, timeout=30, message="every task ran")
        assert set(runs.values()) == {1}
    finally:
        for w in workers:
            w.stop(10)
        for app in apps:
            app.close(10)


def test_a_task_of_a_paused_queue_is_never_handed_over(pg_url):
    app, job = _app_with_job(pg_url)
    app.pause(queue="default")
    waiter = _Waiter(app, pg_url, Offer("w-1", ("default",), frozenset({job.name}), 2, 30.0))
    h = job.submit(7)
    assert app.get(h.id).status is State.PENDING  # it waits for the resume, not in the worker
    assert waiter.result(app.store) == []
    app.close(5)


def _offer_index_reads(conn, sql: str, params: dict) -> int:
    """Index entries of the offers' table a statement reads, in a transaction
    of ``conn`` rolled back after."""
    try:
        # the plan the store's lookups have on a table of any size: by an index
        # (a table this small may be read whole once analyzed, reading no index)
        conn.execute("SET LOCAL enable_seqscan = off")
        conn.execute("SET LOCAL enable_bitmapscan = off")
        conn.execute(sql, params)
        return conn.execute(
            "SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(indexrelid)), 0) FROM pg_index"
            " WHERE indrelid = 'corral_open_offers'::regclass"
        ).fetchone()[0]
    finally:
        conn.rollback()


def test_each_wait_offers_under_a_key_of_its_own_so_a_pinned_horizon_leaves_its_lookups_short(pg_url):
    """Each wait's offer is a row of its own (the worker and the wait's
    number), and the next offer deletes the last one's: with a transaction
    left open (xmin horizon pinned: no row version or index entry can be
    removed), a lookup of the offer open now reads its own index entry only,
    not one per earlier wait of the worker, as a lookup by the worker did."""
    app, job = _app_with_job(pg_url)
    offer = Offer("w-1", ("default",), frozenset({job.name}), 1, 30.0)
    app.store.wait_for_work(0.01)  # the first wait only starts listening
    with psycopg.connect(pg_url) as pin, psycopg.connect(pg_url) as me:
        pin.execute("SELECT txid_current()")  # holds a transaction id, left open
        waits = 30
        for _ in range(waits):  # each opens an offer and withdraws it
            app.store.wait_offering(0.001, offer.queues, offer, lambda claims: None)
        waiter = _Waiter(app, pg_url, offer)
        assert [r[0] for r in _offers(pg_url)] == ["w-1"]  # the earlier offers' rows are gone
        n = app.store._offer_rows["w-1"]
        own = _offer_index_reads(me, app.store._q["offer_withdraw"], {"worker": "w-1", "n": n, "taken": []})
        params = app.store._offer_params(offer, 30.0, n + 1, n)
        next_offer = _offer_index_reads(me, app.store._q["offer"], params)
        by_worker = _offer_index_reads(me, "DELETE FROM corral_open_offers WHERE worker_id = 'w-1'", {})
        pin.rollback()
        assert own <= 1  # its own entry (none if the waiter has just offered again under a new number)
        assert next_offer <= 2  # the last offer's row, deleted by its key
        assert by_worker > waits  # what a lookup by the worker alone steps over
        h = job.submit(1)  # the offer still open takes it
        wait_for(lambda: waiter.ids() == [h.id], message="the task is handed over")
        waiter.result(app.store)
    app.close(5)

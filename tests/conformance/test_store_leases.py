"""Leases and cancel: heartbeat extends, reports lost leases and cancel flags."""

from __future__ import annotations

import threading
import time

from corral.core.claims import ClaimRequest
from corral.core.states import State
from corral.maintenance.recovery import sweep_once
from helpers import wait_for

from .conftest import (
    claim,
    claim_one,
    expire_lease,
    finish,
    new,
    status_of,
    submit,
    submit_one,
)


def test_heartbeat_extends_the_lease(store):
    tid = submit_one(store)
    (c,) = claim(store, 1, lease_seconds=5)
    before = store.get(tid).lease_expires_at
    reply = store.heartbeat([c.token], 120)
    assert reply.lost_tokens == set()
    assert reply.cancel_requested == set()
    after = store.get(tid)
    assert after.lease_expires_at >= before + 100
    assert after.status == State.RUNNING
    assert after.lease_token == c.token


def test_heartbeat_keeps_a_lease_alive_past_its_first_expiry(store, advance):
    tid = submit_one(store, max_retries=3)
    (c,) = claim(store, 1, lease_seconds=10)
    store.heartbeat([c.token], 60)
    advance(30)
    report = sweep_once(store)
    assert tid not in report.lost_leases_retried + report.lost_leases_failed
    assert status_of(store, tid) is State.RUNNING
    assert store.heartbeat([c.token], 60).lost_tokens == set()


def test_heartbeat_extends_every_task_of_a_chunk(store):
    ids = submit(store, *[new(group="g") for _ in range(3)])
    (c,) = claim(store, 1, chunk_size=3, lease_seconds=5)
    store.heartbeat([c.token], 120)
    now = store.now()
    for tid in ids:
        assert store.get(tid).lease_expires_at >= now + 100


def test_heartbeat_reports_unknown_tokens_as_lost(store):
    submit_one(store)
    (c,) = claim(store, 1)
    reply = store.heartbeat([c.token, "never-issued"], 30)
    assert reply.lost_tokens == {"never-issued"}


def test_heartbeat_reports_lost_token_after_sweep(store, advance):
    tid = submit_one(store, max_retries=3)
    (c,) = claim(store, 1, lease_seconds=30)
    expire_lease(store, c.tasks[0], advance)
    report = sweep_once(store)
    assert tid in report.lost_leases_retried
    reply = store.heartbeat([c.token], 30)
    assert c.token in reply.lost_tokens
    # the heartbeat did not revive it
    rec = store.get(tid)
    assert rec.status == State.RETRYING
    assert rec.lease_token != c.token


def test_heartbeat_reports_lost_token_after_completion(store):
    submit_one(store)
    (c,) = claim(store, 1)
    assert finish(store, c.tasks[0])
    assert c.token in store.heartbeat([c.token], 30).lost_tokens


def test_cancel_running_sets_flag_and_heartbeat_reports_it(store):
    tid = submit_one(store)
    other = submit_one(store)
    got = claim(store, 2)
    tokens = [c.token for c in got]
    rec = store.cancel(tid)
    assert rec.status == State.RUNNING
    assert rec.cancel_requested is True
    assert store.get(tid).cancel_requested is True
    assert store.get(other).cancel_requested is False
    reply = store.heartbeat(tokens, 30)
    assert reply.cancel_requested == {tid}
    assert reply.lost_tokens == set()
    # the worker then ends it CANCELED
    (mine,) = [t for c in got for t in c.tasks if t.id == tid]
    assert finish(store, mine, State.CANCELED)
    assert status_of(store, tid) is State.CANCELED


def test_cancel_requested_reads_the_flags_of_many_tasks_at_once(store):
    a, b, c = submit_one(store), submit_one(store), submit_one(store)
    got = claim(store, 3)
    assert store.cancel_requested([a, b, c]) == set()
    store.cancel(a)
    store.cancel(c)
    before = {t: store.get(t).lease_expires_at for t in (a, b, c)}
    assert store.cancel_requested([a, b, c, 99_999]) == {a, c}
    assert store.cancel_requested([b]) == set()
    assert store.cancel_requested([]) == set()
    assert {t: store.get(t).lease_expires_at for t in (a, b, c)} == before  # a read: leases untouched
    assert len(got) == 3


def test_cancel_pending_is_immediate(store):
    tid = submit_one(store)
    rec = store.cancel(tid)
    assert rec.status == State.CANCELED
    assert store.get(tid).status == State.CANCELED
    assert store.get(tid).finished_at is not None
    assert claim(store, 5) == []


def test_cancel_retrying_is_immediate(store):
    tid = submit_one(store, max_retries=3)
    assert finish(store, claim_one(store), State.RETRYING, run_at=store.now())
    assert store.cancel(tid).status == State.CANCELED
    assert status_of(store, tid) is State.CANCELED
    assert claim(store, 5) == []


def test_cancel_waiting_is_immediate(store):
    up = submit_one(store, "up")
    tid = submit_one(store, "down", depends_on=(up,))
    assert store.cancel(tid).status == State.CANCELED
    assert status_of(store, tid) is State.CANCELED


def test_cancel_final_changes_nothing(store):
    tid = submit_one(store)
    assert finish(store, claim_one(store), State.FAILED, error="x")
    version = store.get(tid).version
    rec = store.cancel(tid)
    assert rec.status == State.FAILED
    assert store.get(tid).version == version


def test_cancel_unknown_is_none(store):
    assert store.cancel(123456) is None


def _waiting(store, store_kind: str, monkeypatch) -> threading.Event:
    """An event set once a wait_for_work call has taken its snapshot of the
    store, so a submit after it must wake that call (and not be missed)."""
    waiting = threading.Event()
    if store_kind == "postgres":
        store.wait_for_work(5)  # first call: returns once LISTEN is in place
        store.claim("w", ClaimRequest(["default"], 1))  # nothing; the claim remembers what it has seen
        threading.Thread(
            target=lambda: wait_for(store._listen_lock.locked, timeout=30) and waiting.set(), daemon=True
        ).start()
    elif store_kind == "memory":
        real = store._gate_timeout  # called with the lock held, after the snapshot

        def gate(timeout):
            waiting.set()
            return real(timeout)

        monkeypatch.setattr(store, "_gate_timeout", gate)
    else:
        real_con = store._con

        class Watch:  # the waiter's connection, telling when it read data_version
            def __init__(self, con):
                self.con = con

            def execute(self, sql, *a):
                cur = self.con.execute(sql, *a)
                if sql == "PRAGMA data_version":
                    waiting.set()
                return cur

        waiter = threading.current_thread

        def con():
            c = real_con()
            return Watch(c) if waiter().name == "waiter" else c

        monkeypatch.setattr(store, "_con", con)
    return waiting


def test_wait_for_work_wakes_on_one_submit(store, store_kind, monkeypatch):
    """One submit wakes a long wait far before its timeout: a wait that only
    polled would sleep through it."""
    timeout = 30.0
    waiting = _waiting(store, store_kind, monkeypatch)
    woke: list[float] = []

    def waiter():
        t0 = time.monotonic()
        store.wait_for_work(timeout)
        woke.append(time.monotonic() - t0)

    th = threading.Thread(target=waiter, name="waiter", daemon=True)
    th.start()
    assert waiting.wait(10), "the waiter never started waiting"
    submit_one(store, "wake")
    th.join(timeout + 5)
    assert woke and woke[0] < 5.0, f"woke after {woke}s of a {timeout:g}s wait"


def test_a_lease_that_ran_out_unswept_is_still_its_workers(store, advance):
    """A worker cut off from the store past its lease (an outage, a pause)
    renews it and writes its outcome as long as no sweep took the task."""
    tid = submit_one(store, max_retries=3)
    (c,) = claim(store, 1, lease_seconds=5)
    expire_lease(store, c.tasks[0], advance)
    assert store.heartbeat([c.token], 5).lost_tokens == set()
    assert store.get(tid).lease_expires_at > store.now()
    assert finish(store, c.tasks[0])
    assert status_of(store, tid) is State.SUCCESS


def test_a_renewal_after_the_sweep_read_the_lease_wins(store, advance):
    """The sweep reads, the worker renews, the sweep writes: the write must not
    apply, or the worker would start the next task of a chunk it no longer holds."""
    from corral.maintenance.recovery import decide

    ids = submit(store, *[new(group="g", max_retries=3) for _ in range(2)])
    (c,) = claim(store, 1, chunk_size=2, lease_seconds=5)
    expire_lease(store, c.tasks[0], advance)
    now = store.now()
    stuck = store.find_stuck(now, 10)
    assert [r.id for r in stuck] == ids
    assert store.heartbeat([c.token], 5).lost_tokens == set()
    assert store.rescue([r for _, r in decide(stuck, [], now)]) == [False, False]
    # still held: the head started, the member not yet
    assert [status_of(store, i) for i in ids] == [State.RUNNING, State.RESERVED]
    assert store.heartbeat([c.token], 5).lost_tokens == set()

"""The event stream: every task state change, progress and breaker change is
an event, read by cursor in commit order, followed as it grows, trimmed by
age and count, and never skipped however many writers there are."""

from __future__ import annotations

import threading

from corral.core.breaker import BreakerConfig, BreakerState
from corral.core.states import State
from corral.stores.stream import iter_events

from .conftest import claim_one, finish, new, submit, submit_one


def read_all(store, since=0):
    return list(iter_events(store, since=since))


def task_kinds(events, task_id):
    return [e.kind for e in events if e.subject == f"task:{task_id}"]


def test_a_task_life_is_told_in_order(store):
    ok, bad, later = submit(store, new("ok"), new("bad", max_retries=1), new("later"))
    rec = claim_one(store)
    assert store.set_progress(rec.id, rec.lease_token, 0.5, "half")
    assert finish(store, rec)
    rec = claim_one(store)
    assert finish(store, rec, State.RETRYING, error="boom\nsecond line")
    store.cancel(later)
    events = read_all(store)
    assert task_kinds(events, ok) == ["submitted", "started", "progress", "succeeded"]
    assert task_kinds(events, bad) == ["submitted", "started", "retrying"]
    assert task_kinds(events, later) == ["submitted", "canceled"]
    ids = [e.id for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    retry = next(e for e in events if e.kind == "retrying")
    d = retry.details
    assert (d["id"], d["name"], d["status"], d["from"], d["attempt"]) == (bad, "bad", "RETRYING", "RUNNING", 1)
    assert d["error"].startswith("boom")
    progress = next(e for e in events if e.kind == "progress")
    assert progress.details["fraction"] == 0.5 and progress.details["message"] == "half"
    submitted = next(e for e in events if e.subject == f"task:{ok}")
    assert submitted.details["trace_id"] == store.get(ok).trace_id


def test_reading_resumes_after_a_given_event(store):
    first = submit_one(store, "a")
    events = read_all(store)
    assert [e.subject for e in events] == [f"task:{first}"]
    second = submit_one(store, "b")
    later = read_all(store, since=events[-1].id)
    assert [(e.kind, e.subject) for e in later] == [("submitted", f"task:{second}")]
    assert read_all(store, since=later[-1].id) == []


def test_a_follower_starts_now_and_is_woken_by_new_events(store, wait_for):
    submit_one(store, "before")
    got = []
    stop = threading.Event()
    started = threading.Event()

    def follow():
        events = iter_events(store, follow=True, stop=stop, kinds=("submitted", "started"))
        started.set()  # its starting point is taken: what comes next is new
        for ev in events:
            got.append(ev)

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    assert started.wait(5)
    try:
        tid = submit_one(store, "after")
        assert wait_for(lambda: any(e.subject == f"task:{tid}" for e in got), timeout=10)
        rec = claim_one(store)
        assert wait_for(lambda: any(e.kind == "started" and e.subject == f"task:{rec.id}" for e in got), timeout=10)
        assert finish(store, rec)  # succeeded: not a kind this follower asked for
    finally:
        stop.set()
        t.join(5)
    assert all(e.kind in ("submitted", "started") for e in got)
    assert not any(e.kind == "submitted" and e.details["name"] == "before" for e in got)


def test_breaker_and_level_changes_are_events(store):
    store.set_breaker("partner", BreakerConfig(failure_ratio=0.5, min_calls=4, window=60.0, cooldown=30.0, probes=1))
    store.force_breaker("partner", BreakerState.OPEN, "by hand")
    store.add_event("level", "fleet", '{"from": "NORMAL", "to": "DEGRADED"}')
    events = read_all(store)
    breaker = [e for e in events if e.kind == "breaker"]
    assert [(e.subject, e.details["to"], e.details["reason"]) for e in breaker] == [
        ("breaker:partner", "OPEN", "by hand")
    ]
    assert events[-1].kind == "level" and events[-1].details["to"] == "DEGRADED"


def test_retention_trims_by_count_and_by_age(store, advance):
    submit(store, *(new(f"t{i}") for i in range(5)))
    assert len(read_all(store)) == 5
    store.trim_events(keep=2, before=0.0)
    left = read_all(store)
    assert [e.details["name"] for e in left] == ["t3", "t4"]
    advance(3600)
    submit_one(store, "fresh")
    store.trim_events(keep=100, before=store.now() - 60)
    assert [e.details["name"] for e in read_all(store)] == ["fresh"]


def test_no_event_is_missed_under_concurrent_writers(store, wait_for):
    """Writers in several threads (several connections on PostgreSQL, whose
    ids can commit out of order) while a follower reads: it sees every
    event exactly once."""
    writers, per_writer = 4, 25
    seen: list = []
    stop = threading.Event()
    ready = threading.Event()

    def follow():
        it = iter_events(store, follow=True, stop=stop, kinds="submitted")
        ready.set()
        for ev in it:
            seen.append(ev)

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    assert ready.wait(5)
    ids: list[int] = []
    lock = threading.Lock()

    def write(w: int) -> None:
        for i in range(per_writer):
            got = submit(store, new(f"w{w}-{i}"))
            with lock:
                ids.extend(got)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        want = {f"task:{i}" for i in ids}
        assert wait_for(lambda: want <= {e.subject for e in seen}, timeout=20)
    finally:
        stop.set()
        follower.join(5)
    subjects = [e.subject for e in seen if e.subject in want]
    assert len(subjects) == len(set(subjects)) == writers * per_writer


def test_trimming_goes_a_batch_at_a_time_oldest_first(store):
    submit(store, *(new(f"t{i}") for i in range(7)))
    assert store.trim_events(keep=2, before=0.0, limit=3) == 3
    assert [e.details["name"] for e in read_all(store)] == ["t3", "t4", "t5", "t6"]
    assert store.trim_events(keep=2, before=0.0, limit=3) == 2
    assert store.trim_events(keep=2, before=0.0, limit=3) == 0
    assert [e.details["name"] for e in read_all(store)] == ["t5", "t6"]

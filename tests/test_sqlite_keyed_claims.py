"""SQLite's fast claim of ungrouped work under concurrency limits (claim_keyed):
used while no group's head is queued, never past a key's cap across
processes, never for work a rate, a pause or a breaker decides, and ended
at once by grouped work submitted here."""

from __future__ import annotations

import multiprocessing
import time
from collections import defaultdict

import pytest

from corral.core.claims import ClaimRequest
from corral.core.gates import keyed_name, split_key
from corral.core.model import LimitSpec, NewTask, Outcome
from corral.core.states import State
from corral.stores.sqlite import SQLiteStore
from helpers import ARGS

#: the start of claim_keyed's read, and of the full claim's first read
FAST = "WITH\nw AS MATERIALIZED"
FULL = "SELECT name, config, state FROM breakers"


def new(name: str = "t", **kw) -> NewTask:
    return NewTask(name=name, args=ARGS, **kw)


def keyed(key: str, limit: str = "api") -> NewTask:
    return new(limits=(keyed_name(limit, key),))


@pytest.fixture
def store(sqlite_url):
    s = SQLiteStore(sqlite_url)
    try:
        yield s
    finally:
        s.close()


def _statements(store: SQLiteStore, act) -> list[str]:
    seen: list[str] = []
    con = store._con()
    con.set_trace_callback(seen.append)
    try:
        act()
    finally:
        con.set_trace_callback(None)
    return seen


def _claim(store: SQLiteStore, n: int, **kw) -> list:
    return store.claim("w", ClaimRequest(("default",), n, **kw))


def _keys(claims) -> list[str]:
    return [split_key(t.limits[0])[1] for c in claims for t in c.tasks if t.limits]


def _armed(store: SQLiteStore) -> None:
    """As after a full claim that found only ungrouped work queued."""
    store._keyed_until = time.monotonic() + 60
    store._keyed_missed_until = 0.0


def test_a_claim_of_keyed_work_is_one_read_and_one_write_once_a_full_claim_found_no_group(store):
    store.set_limit(LimitSpec("api", concurrency=2, per_key=True))
    store.submit([keyed(f"k{k}") for _ in range(3) for k in range(10)])
    assert len(_claim(store, 3)) == 3  # a full claim: no group's head is queued
    got: list = []
    ran = _statements(store, lambda: got.extend(_claim(store, 10)))
    assert any(q.startswith(FAST) for q in ran) and not any(q.startswith(FULL) for q in ran)
    # keys in turn: every key's first task before any key's second, each key within its cap
    assert _keys(got) == [f"k{k}" for k in range(3, 10)] + ["k0", "k1", "k2"]
    got = _claim(store, 20)
    held = defaultdict(int)
    for key in _keys(got):
        held[key] += 1
    assert held == {f"k{k}": 1 for k in range(3, 10)}  # the keys with a place left, one each
    assert _claim(store, 20) == []  # every key full
    assert store.limit_usage()["api"] == 20


def test_grouped_work_submitted_here_ends_the_fast_path_at_once(store):
    store.set_limit(LimitSpec("api", concurrency=5, per_key=True))
    store.submit([keyed("a") for _ in range(3)])
    _claim(store, 1)
    assert store._keyed_until > time.monotonic()
    (head,) = store.submit([new(group="g", priority=5)])
    assert store._keyed_until == 0.0
    got = _claim(store, 1)
    assert got[0].tasks[0].id == head.id  # the group's head first, by its priority


@pytest.mark.parametrize("how", ["pause", "paused_until", "rate", "breaker"])
def test_work_a_pause_a_rate_or_a_breaker_decides_is_never_taken_by_it(store, how):
    store.set_limit(LimitSpec("api", concurrency=10, per_key=True))
    store.set_limit(LimitSpec("other", concurrency=10, rate="1/h" if how == "rate" else None, per_key=True))
    held_back = [r.id for r in store.submit([keyed("x", "other") for _ in range(3)])]
    free = [r.id for r in store.submit([keyed(f"k{k}") for k in range(3)])]
    if how == "pause":
        store.pause("limit", "other")
    elif how == "paused_until":
        with store._write() as con:
            con.execute(
                "INSERT INTO named_limits (name, paused_until) VALUES (?, ?)",
                (keyed_name("other", "x"), time.time() + 3600),
            )
    elif how == "breaker":
        from corral.core.breaker import BreakerConfig, BreakerState

        store.set_breaker(keyed_name("other", "x"), BreakerConfig())
        store.force_breaker(keyed_name("other", "x"), BreakerState.OPEN, "test")
    _armed(store)
    got = [t.id for c in _claim(store, 10) for t in c.tasks]
    if how == "rate":
        # the rate's one start an hour: the first of them, charged by the full claim
        assert sorted(got) == sorted([held_back[0], *free])
        assert _claim(store, 10) == []
    else:
        assert sorted(got) == sorted(free)


def _claim_and_hold(url: str, barrier, out, hold: float) -> None:
    """Claim keyed work until none is left, holding each task ``hold`` s;
    put (runs, claims the fast path made)."""
    import corral.stores.sqlite as mod

    store = SQLiteStore(url)
    made = [0]
    plain = mod.SQLiteStore._claim_keyed

    def counted(self, *a, **kw):
        got = plain(self, *a, **kw)
        made[0] += got is not None
        return got

    mod.SQLiteStore._claim_keyed = counted
    runs = []
    barrier.wait()
    idle_since = None
    try:
        while True:
            got = store.claim("w", ClaimRequest(("default",), 3))
            if not got:
                counts = store.counts()
                if not counts.get("PENDING") and not counts.get("RUNNING"):
                    break
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since > 60:
                    raise RuntimeError("no progress")
                store.wait_for_work(0.01)
                continue
            idle_since = None
            began = time.monotonic()
            time.sleep(hold)
            ended = time.monotonic()
            for c in got:
                for t in c.tasks:
                    runs.append((split_key(t.limits[0])[1], began, ended))
            store.complete([Outcome(t.id, t.lease_token, t.version, State.SUCCESS) for c in got for t in c.tasks])
    finally:
        store.close()
    out.put((runs, made[0]))


def test_three_processes_never_run_more_of_a_key_than_its_cap(store):
    # the places are counted in the write transaction that takes them: the
    # fast path holds the caps fleet-wide as the full claim does
    store.set_limit(LimitSpec("api", concurrency=2, per_key=True))
    store.submit([keyed(f"k{k}") for _ in range(12) for k in range(4)])
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_claim_and_hold, args=(store.url, barrier, out, 0.01)) for _ in range(3)]
    for p in procs:
        p.start()
    results = [out.get(timeout=180) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    runs = [r for got, _ in results for r in got]
    assert len(runs) == 48
    assert sum(made for _, made in results) > 0, "the fast path was never taken"
    by_key = defaultdict(list)
    for key, began, ended in runs:
        by_key[key].append((began, ended))
    for key, spans in by_key.items():
        # at each start, the runs of that key under way (each run within its claim and completion)
        most = max(sum(1 for b, e in spans if b <= at < e) for at, _ in spans)
        assert most <= 2, f"key {key} ran {most} at once"


def test_a_hot_keys_backlog_in_front_reads_further_then_leaves_it_to_the_full_claim(store):
    # the first candidates are all one key's: the read holds too few keys'
    # first turns, reads further each time, then stops trying for a while;
    # whichever decides, every key has its turn before the hot key a second
    store.set_limit(LimitSpec("api", concurrency=1000, per_key=True))
    store.submit([keyed("hot") for _ in range(400)] + [keyed(f"k{k}") for k in range(20)])
    claims = [_keys(_claim(store, 10))]
    while store._keyed_until > time.monotonic() and len(claims) < 12:
        claims.append(_keys(_claim(store, 10)))
    assert store._keyed_missed_until > time.monotonic(), "never left to the full claim"
    assert claims[:3] == [
        ["hot"] + [f"k{k}" for k in range(9)],
        ["hot"] + [f"k{k}" for k in range(9, 18)],
        ["hot", "k18", "k19"] + ["hot"] * 7,
    ]

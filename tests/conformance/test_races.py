"""Races on every store: concurrent claimers and writers on the same rows."""

from __future__ import annotations

from corral.core.claims import ClaimRequest
from corral.core.model import Outcome
from corral.core.states import State
from corral.maintenance.recovery import sweep_once
from corral.stores.base import Rescue
from helpers import run_concurrently

from .conftest import new, submit


def test_concurrent_claimers_never_share_a_task_nor_exceed_max_units(store, second_store):
    ids = submit(store, *[new() for _ in range(400)])
    stores = [store, second_store]

    def claimer(i):
        got = []
        while True:
            claims = stores[i % 2].claim(f"w{i}", ClaimRequest(["default"], 7))
            assert len(claims) <= 7
            if not claims:
                return got
            got += [t.id for c in claims for t in c.tasks]

    results = run_concurrently(8, claimer)
    claimed = [tid for r in results for tid in r]
    assert sorted(claimed) == sorted(ids)  # all claimed, none twice


def test_two_writers_racing_one_version_exactly_one_wins(store):
    for _ in range(10):
        tid = submit(store, new())[0]
        version = store.get(tid).version
        rescue = Rescue(tid, version, State.CANCELED, "stale")
        wins = run_concurrently(6, lambda i, rescue=rescue: store.rescue([rescue])[0])
        assert wins.count(True) == 1
        assert store.get(tid).status is State.CANCELED


def test_racing_outcomes_on_one_claim_exactly_one_applies_and_success_stays(store):
    submit(store, *[new() for _ in range(20)])
    claims = store.claim("w", ClaimRequest(["default"], 20))
    for c in claims:
        t = c.tasks[0]
        outcomes = [State.SUCCESS, State.FAILED, State.RETRYING, State.PENDING]
        applied = run_concurrently(
            4,
            lambda i, t=t, c=c, outcomes=outcomes: store.complete(
                [Outcome(t.id, c.token, t.version, outcomes[i], run_at=0.0)]
            )[0],
        )
        assert applied.count(True) == 1
        winner = outcomes[applied.index(True)]
        assert store.get(t.id).status is winner


def test_success_never_becomes_anything_else(store):
    tid = submit(store, new())[0]
    (c,) = store.claim("w", ClaimRequest(["default"], 1))
    t = c.tasks[0]
    assert store.complete([Outcome(tid, c.token, t.version, State.SUCCESS, result="1")]) == [True]
    rec = store.get(tid)

    def attack(i):
        return [
            store.complete([Outcome(tid, c.token, t.version, State.FAILED)])[0],
            store.retry(tid),
            store.cancel(tid).status,
            sweep_once(store, stale_pending_age=0).total,
        ]

    for complete_ok, retried, status, _ in run_concurrently(6, attack):
        assert not complete_ok and not retried and status is State.SUCCESS
    after = store.get(tid)
    assert after.status is State.SUCCESS and after.version == rec.version and after.result == "1"

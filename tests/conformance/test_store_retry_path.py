"""The retry path apart from fresh work: ``ClaimRequest(retry_share=...)``.

A claim takes candidates in claim order, but while fresh (PENDING) work is
claimable at most ``ceil(max_units * share)`` units (at least one) are
retries; the retries past that wait for a later claim, and take every unit
fresh work leaves. Group order still wins."""

from __future__ import annotations

from corral.core.model import LimitSpec, Outcome
from corral.core.states import State

from .conftest import claim, claimed_ids, submit_one


def _retrying(store, n: int, name: str = "again", groups: list[str] | None = None, **kw) -> list[int]:
    """``n`` tasks (heads of ``groups`` if given) that failed once and now wait
    in RETRYING, due at once: due long before any fresh task, so claim order
    alone would take them first."""
    ids = [submit_one(store, name, groups[i] if groups else None, max_retries=3, **kw) for i in range(n)]
    got = claim(store, n, names=[name])
    assert sorted(claimed_ids(got)) == sorted(ids)
    outs = [
        # due at the store's now (the claim's start): waiting since long ago would
        # age it past higher priorities
        Outcome(t.id, t.lease_token, t.version, State.RETRYING, error="x", run_at=c.tasks[0].started_at)
        for c in got
        for t in c.tasks
    ]
    assert all(store.complete(outs))
    return ids


def _lanes(store, claims) -> tuple[int, int]:
    """(retry units, fresh units) of ``claims``, by the state each head was claimed from."""
    retries = sum(1 for c in claims if c.tasks[0].attempt > 1)
    return retries, len(claims) - retries


def test_retries_take_at_most_their_share_while_fresh_work_waits(store):
    retries = _retrying(store, 10)
    fresh = [submit_one(store, "fresh") for _ in range(10)]
    first = claim(store, 4, retry_share=0.25)
    assert _lanes(store, first) == (1, 3)
    # again (a store may answer the second claim from its fast path for plain work)
    second = claim(store, 4, retry_share=0.25)
    assert _lanes(store, second) == (1, 3)
    got = claimed_ids(first + second)
    assert len(set(got) & set(retries)) == 2 and len(set(got) & set(fresh)) == 6
    # within each path, claim order: the oldest fresh tasks first
    assert sorted(set(got) & set(fresh)) == fresh[:6]
    for tid in set(retries) - set(got):  # the retries left wait: no attempt burned
        rec = store.get(tid)
        assert (rec.status, rec.attempt) == (State.RETRYING, 1)


def test_without_fresh_work_retries_take_every_unit(store):
    _retrying(store, 10)
    assert _lanes(store, claim(store, 4, retry_share=0.25)) == (4, 0)
    assert _lanes(store, claim(store, 4, retry_share=0.25)) == (4, 0)


def test_retries_take_the_units_fresh_work_leaves(store):
    _retrying(store, 10)
    fresh = [submit_one(store, "fresh") for _ in range(2)]
    got = claim(store, 4, retry_share=0.25)
    assert _lanes(store, got) == (2, 2)
    assert set(fresh) <= set(claimed_ids(got))


def test_retries_do_not_jump_ahead_of_fresh_work_earlier_in_claim_order(store):
    fresh = [submit_one(store, "fresh", priority=10) for _ in range(8)]
    _retrying(store, 3)
    got = claim(store, 4, retry_share=0.25)
    assert _lanes(store, got) == (0, 4)
    assert sorted(claimed_ids(got)) == fresh[:4]


def test_every_claim_of_one_unit_still_reaches_a_due_retry(store):
    retries = _retrying(store, 2)
    fresh = [submit_one(store, "fresh") for _ in range(3)]
    # one unit a claim: the retry due first is taken, its share is then spent
    order = [claimed_ids(claim(store, 1, retry_share=0.25)) for _ in range(5)]
    assert sorted(sum(order, [])) == sorted(retries + fresh)


def test_a_larger_share_gives_retries_more_units(store):
    _retrying(store, 10)
    for _ in range(10):
        submit_one(store, "fresh")
    assert _lanes(store, claim(store, 8, retry_share=0.5)) == (4, 4)


def test_no_share_keeps_claim_order(store):
    retries = _retrying(store, 10)
    for _ in range(10):
        submit_one(store, "fresh")
    got = claim(store, 4, retry_share=None)
    assert sorted(claimed_ids(got)) == retries[:4]  # due long ago: first by claim order


def test_group_order_holds_and_a_retrying_head_counts_toward_the_share(store):
    heads = _retrying(store, 3, "g", groups=["A", "B", "C"])
    behind = [submit_one(store, "g", group=g) for g in ("A", "B", "C")]
    fresh = [submit_one(store, "fresh") for _ in range(10)]
    got = claim(store, 4, retry_share=0.25)
    ids = claimed_ids(got)
    assert _lanes(store, got) == (1, 3)
    assert len(set(ids) & set(heads)) == 1
    assert not set(ids) & set(behind)  # a task behind a retrying head waits for it
    assert set(ids) - set(heads) <= set(fresh)
    # with the fresh work gone, the other heads come, and still nothing behind them
    claim(store, 10, retry_share=0.25)
    assert {t for t in heads if store.get(t).status == State.RUNNING} == set(heads)
    assert all(store.get(t).status == State.PENDING for t in behind)


def test_chunks_of_a_retrying_head_count_as_one_retry_unit(store):
    (head,) = _retrying(store, 1, "g", groups=["A"])
    submit_one(store, "g", group="A")
    fresh = [submit_one(store, "fresh") for _ in range(5)]
    got = claim(store, 4, retry_share=0.25, chunk_size=2)
    assert [c.tasks[0].id for c in got if c.group == "A"] == [head]
    assert [len(c.tasks) for c in got if c.group == "A"] == [2]
    assert len(set(claimed_ids(got)) & set(fresh)) == 3


def test_the_share_still_respects_a_limit(store):
    store.set_limit(LimitSpec("api", concurrency=3))
    _retrying(store, 3, "capped", limits=("api",))
    store.set_limit(LimitSpec("api", concurrency=1))
    got = claim(store, 4, retry_share=0.25)
    assert _lanes(store, got) == (1, 0)  # the path takes every unit, the limit still allows one


def test_only_retries_ignores_the_share(store):
    _retrying(store, 5)
    fresh = [submit_one(store, "fresh") for _ in range(5)]
    got = claim(store, 4, only_retries=True, retry_share=0.25)
    assert _lanes(store, got) == (4, 0)
    assert all(store.get(t).status == State.PENDING for t in fresh)


def test_a_worker_may_give_the_retry_bound_outright_even_zero(store):
    """``retry_cap``: a worker already holding its share of retries passes 0,
    and fresh work takes the claim; retries still take what fresh work leaves."""
    _retrying(store, 6)
    fresh = [submit_one(store, "fresh") for _ in range(5)]
    got = claim(store, 4, retry_share=0.25, retry_cap=0)
    assert _lanes(store, got) == (0, 4)
    assert sorted(claimed_ids(got)) == fresh[:4]
    got = claim(store, 4, retry_share=0.25, retry_cap=0)  # one fresh task left: retries take the rest
    assert _lanes(store, got) == (3, 1)
    got = claim(store, 4, retry_share=0.25, retry_cap=2)  # no fresh work: every unit
    assert _lanes(store, got) == (3, 0)


def test_a_given_retry_bound_above_the_claim_share(store):
    _retrying(store, 6)
    [submit_one(store, "fresh") for _ in range(6)]
    assert _lanes(store, claim(store, 4, retry_share=0.25, retry_cap=3)) == (3, 1)


def test_retry_max_bounds_retries_even_when_fresh_work_runs_short(store):
    """``retry_max``: a worker keeping room for fresh arrivals; the retries
    past it wait, whatever fresh work there is."""
    retries = _retrying(store, 6)
    fresh = submit_one(store, "fresh")
    got = claim(store, 4, retry_share=0.25, retry_cap=1, retry_max=2)
    assert _lanes(store, got) == (2, 1) and fresh in claimed_ids(got)
    got = claim(store, 4, retry_share=0.25, retry_max=3)  # no fresh work left
    assert _lanes(store, got) == (3, 0)
    got = claim(store, 4, retry_share=0.25, retry_max=0)
    assert got == []
    assert len([t for t in retries if store.get(t).status is State.RETRYING]) == 1


def test_a_fresh_group_chunked_in_the_claim_leaves_the_retry_bound_as_given(store):
    """A chunk taken in the same claim (its reach is a count of its own) does
    not change how many retries the claim may take."""
    _retrying(store, 6)
    group = [submit_one(store, "g", group="G") for _ in range(3)]
    got = claim(store, 6, retry_share=0.25, retry_cap=1, retry_max=2, chunk_size=4)
    assert [[t.id for t in c.tasks] for c in got if c.group == "G"] == [group]
    assert _lanes(store, got) == (2, 1)

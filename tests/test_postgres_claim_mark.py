"""The plain claim's low-water mark on PostgreSQL (stores/postgres.py,
MARK_SLACK): a claim walks the claim-order index from the first row its last
claim took, not from the index's start (where, under a transaction left open,
every task claimed since lies dead). Work that comes to be queued below the
mark must still be claimed at once: a task of a higher priority submitted
after the mark, a delayed one of a higher priority coming due, a failed one
retried by hand, a dependent released by its upstream's end (its run_at older
than the mark)."""

from __future__ import annotations

import math
import time

import pytest

from corral.core.claims import ClaimRequest
from corral.core.model import NewTask, Outcome
from corral.core.states import State
from corral.stores import open_store
from helpers import ARGS, wait_for

pytestmark = pytest.mark.postgres


def task(name: str = "t", **kw) -> NewTask:
    return NewTask(name=name, args=ARGS, **kw)


@pytest.fixture
def pg(pg_url):
    s = open_store(pg_url)
    s.migrate()
    # every claim from the mark (no walk from the start comes due in the
    # test), on the plain fast path (only plain work is queued)
    s._mark_rescan = math.inf
    s._plain_until = math.inf
    try:
        yield s
    finally:
        s.close()


def claim_one(store) -> list[int]:
    store._plain_until = math.inf
    return [t.id for c in store.claim("w", ClaimRequest(["default"], 1)) for t in c.tasks]


def marked(store, ids: list[int]) -> None:
    """Claim the first two of ``ids``: the first walks from the start and sets
    the mark, the second walks from it."""
    assert claim_one(store) == ids[:1]
    assert store._marks, "a claim from the start sets the mark"
    assert claim_one(store) == ids[1:2]
    (mark,) = store._marks.values()
    assert mark.id == ids[1]


def test_a_higher_priority_task_submitted_below_the_mark_is_claimed_next(pg):
    ids = [r.id for r in pg.submit([task() for _ in range(4)])]
    marked(pg, ids)
    (urgent,) = [r.id for r in pg.submit([task(priority=5)])]
    assert claim_one(pg) == [urgent]
    assert claim_one(pg) == ids[2:3]


def test_a_delayed_higher_priority_task_is_claimed_when_it_comes_due(pg):
    ids = [r.id for r in pg.submit([task() for _ in range(2)])]
    marked(pg, ids)
    (later,) = [r.id for r in pg.submit([task(priority=1, run_at=time.time() + 0.3)])]
    (other,) = [r.id for r in pg.submit([task()])]
    # not due yet: the plain task after the mark comes first, and it moves the mark past the delayed one
    assert claim_one(pg) == [other]
    assert wait_for(lambda: claim_one(pg), timeout=10.0, message="the delayed task once due") == [later]


def test_a_failed_task_retried_by_hand_below_the_mark_is_claimed_next(pg):
    (failing,) = [r.id for r in pg.submit([task(priority=2)])]
    got = pg.claim("w", ClaimRequest(["default"], 1))
    (t,) = got[0].tasks
    assert t.id == failing
    assert pg.complete([Outcome(t.id, got[0].token, t.version, State.FAILED, error="boom")]) == [True]
    ids = [r.id for r in pg.submit([task() for _ in range(3)])]
    marked(pg, ids)
    assert pg.retry(failing)
    assert claim_one(pg) == [failing]
    assert claim_one(pg) == ids[2:3]


def test_a_dependent_released_below_the_mark_is_claimed_next(pg):
    (upstream,) = [r.id for r in pg.submit([task(priority=3)])]
    got = pg.claim("w", ClaimRequest(["default"], 1))
    (up,) = got[0].tasks
    assert up.id == upstream
    # queued long ago (its run_at well before the mark's claim), waiting for the upstream
    (dependent,) = [r.id for r in pg.submit([task(run_at=time.time() - 60, depends_on=(upstream,))])]
    ids = [r.id for r in pg.submit([task() for _ in range(3)])]
    marked(pg, ids)
    assert pg.complete([Outcome(up.id, got[0].token, up.version, State.SUCCESS)]) == [True]
    assert claim_one(pg) == [dependent]

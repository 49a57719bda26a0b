"""What the capacity planner reads from every store: the newest finished
tasks of a name or a batch, bounded."""

from __future__ import annotations

from corral.core.states import State

from .conftest import claim_one, finish, new, submit


def test_finished_history_of_a_name_or_a_batch_newest_first(store, advance):
    ids = submit(store, new("a", batch="x"), new("a"), new("b", batch="x"), new("a", batch="x"), new("a"))
    results = {ids[0]: State.SUCCESS, ids[1]: State.FAILED, ids[2]: State.SUCCESS, ids[3]: State.TIMEOUT}
    for _ in range(4):
        rec = claim_one(store)
        advance(2.0)
        finish(store, rec, results[rec.id])
    store.cancel(ids[4])  # canceled: not a measurement
    rows = store.finished_history(name="a")
    assert [r.status for r in rows] == ["TIMEOUT", "FAILED", "SUCCESS"]
    assert all(r.finished_at - r.started_at >= 2.0 and r.attempt == 1 for r in rows)
    assert [r.status for r in store.finished_history(batch="x")] == ["TIMEOUT", "SUCCESS", "SUCCESS"]
    assert [r.status for r in store.finished_history(name="a", batch="x")] == ["TIMEOUT", "SUCCESS"]
    assert [r.status for r in store.finished_history(name="a", limit=1)] == ["TIMEOUT"]
    assert store.finished_history(name="nope") == []

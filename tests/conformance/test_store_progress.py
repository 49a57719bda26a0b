"""Progress and checkpoints: persisted, guarded by the lease, kept across retries."""

from __future__ import annotations

import json

from corral.core.states import State

from .conftest import claim, claim_one, finish, new, submit, submit_one


def test_set_progress_is_visible(store):
    tid = submit_one(store)
    rec = claim_one(store)
    assert store.set_progress(tid, rec.lease_token, 0.25, "a quarter") is True
    got = store.get(tid)
    assert got.progress == 0.25
    assert got.progress_message == "a quarter"
    assert store.set_progress(tid, rec.lease_token, 0.75, None) is True
    got = store.get(tid)
    assert got.progress == 0.75
    assert got.progress_message in (None, "a quarter")


def test_set_progress_guarded_by_token(store):
    tid = submit_one(store)
    rec = claim_one(store)
    assert store.set_progress(tid, rec.lease_token, 0.5, "half")
    assert store.set_progress(tid, "wrong", 0.9, "nope") is False
    got = store.get(tid)
    assert (got.progress, got.progress_message) == (0.5, "half")
    assert finish(store, rec)
    assert store.set_progress(tid, rec.lease_token, 1.0, "late") is False
    assert store.get(tid).progress == 0.5


def test_set_progress_on_pending_task_is_refused(store):
    tid = submit_one(store)
    assert store.set_progress(tid, "any", 0.5, None) is False
    assert store.get(tid).progress is None


def test_checkpoint_merges_stages_in_order(store):
    tid = submit_one(store)
    rec = claim_one(store)
    assert store.save_checkpoint(tid, rec.lease_token, "download", '{"bytes":100}') is True
    assert json.loads(store.get(tid).checkpoint) == {"download": {"bytes": 100}}
    assert store.save_checkpoint(tid, rec.lease_token, "parse", '{"rows":[1,2]}') is True
    cp = json.loads(store.get(tid).checkpoint)
    assert cp == {"download": {"bytes": 100}, "parse": {"rows": [1, 2]}}
    assert list(cp) == ["download", "parse"]
    assert store.save_checkpoint(tid, rec.lease_token, "download", '{"bytes":200}') is True
    cp = json.loads(store.get(tid).checkpoint)
    assert cp["download"] == {"bytes": 200} and cp["parse"] == {"rows": [1, 2]}


def test_checkpoint_guarded_by_token(store):
    tid = submit_one(store)
    rec = claim_one(store)
    assert store.save_checkpoint(tid, rec.lease_token, "a", "1")
    assert store.save_checkpoint(tid, "wrong", "b", "2") is False
    assert json.loads(store.get(tid).checkpoint) == {"a": 1}


def test_checkpoint_survives_a_retry(store):
    tid = submit_one(store, max_retries=2)
    rec = claim_one(store)
    assert store.save_checkpoint(tid, rec.lease_token, "s1", '{"done":3}')
    assert finish(store, rec, State.RETRYING, run_at=store.now(), error="flaky")
    again = claim_one(store)
    assert again.id == tid and again.attempt == 2
    assert json.loads(again.checkpoint) == {"s1": {"done": 3}}
    assert store.save_checkpoint(tid, again.lease_token, "s2", "true")
    assert json.loads(store.get(tid).checkpoint) == {"s1": {"done": 3}, "s2": True}
    # the old attempt's token no longer writes
    assert store.save_checkpoint(tid, rec.lease_token, "s3", "0") is False


def test_checkpoint_of_chunk_member(store):
    a, b = submit(store, new(group="g"), new(group="g"))
    (c,) = claim(store, 1, chunk_size=2)
    assert store.save_checkpoint(b, c.token, "x", "[1]")
    assert json.loads(store.get(b).checkpoint) == {"x": [1]}
    assert store.get(a).checkpoint in (None, "{}")

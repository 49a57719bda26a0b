"""Free text a task produces (errors, tracebacks, progress messages) is made
safe by every store, and one row a database refuses never sinks its batch."""

from __future__ import annotations

from corral.core import texts
from corral.core.model import Outcome
from corral.core.states import State

from .conftest import claim, finish, new, submit

BAD = "before\x00after\udcff"
BIG = 20 * 1024 * 1024  # what a task once stored in each of these


def _claimed(store, n: int = 1):
    submit(store, *[new(max_retries=3) for _ in range(n)])
    recs = [t for c in claim(store, n) for t in c.tasks]
    assert len(recs) == n
    return recs


def test_nul_and_lone_surrogates_in_error_traceback_and_progress_are_replaced(store):
    failed, retried = _claimed(store, 2)
    assert store.set_progress(failed.id, failed.lease_token, 0.5, BAD) is True
    assert store.get(failed.id).progress_message == "before\ufffdafter\ufffd"
    assert store.complete(
        [
            Outcome(failed.id, failed.lease_token, failed.version, State.FAILED, error=BAD, traceback=BAD),
            Outcome(
                retried.id, retried.lease_token, retried.version, State.RETRYING, error=BAD, run_at=store.now() + 60
            ),
        ]
    ) == [True, True]
    got = store.get(failed.id)
    assert got.status is State.FAILED
    assert got.error == got.traceback == "before\ufffdafter\ufffd"
    assert store.get(retried.id).error == "before\ufffdafter\ufffd"


def test_20_mb_of_error_traceback_and_progress_message_are_cut_with_their_length(store):
    (rec,) = _claimed(store)
    assert store.set_progress(rec.id, rec.lease_token, 0.1, "p" * BIG)
    message = store.get(rec.id).progress_message
    assert len(message) <= texts.MAX_PROGRESS_MESSAGE_CHARS and message.startswith("ppp")
    assert message.endswith(f"cut: {BIG} characters in all]")
    trace = "Traceback (most recent call last):\n" + "x" * BIG + "\nValueError: the end"
    assert finish(store, rec, State.FAILED, error="e" * BIG, traceback=trace)
    got = store.get(rec.id)
    assert len(got.error) <= texts.MAX_ERROR_CHARS and got.error.endswith(f"cut: {BIG} characters in all]")
    assert len(got.traceback) <= texts.MAX_TRACEBACK_CHARS
    assert got.traceback.startswith("Traceback") and got.traceback.endswith("ValueError: the end")
    assert f"cut: {len(trace)} characters in all]" in got.traceback


def test_a_batch_with_a_row_the_store_refuses_writes_the_others(store, store_kind):
    a, b, c = _claimed(store, 3)
    outcomes = [
        Outcome(a.id, a.lease_token, a.version, State.SUCCESS, result="1"),
        # a time no database holds: NaN
        Outcome(b.id, b.lease_token, b.version, State.RETRYING, error="flaky", run_at=float("nan")),
        Outcome(c.id, c.lease_token, c.version, State.FAILED, error="boom\x00", traceback="tb"),
    ]
    applied = store.complete(outcomes)
    assert applied[0] and applied[2]
    assert store.get(a.id).status is State.SUCCESS and store.get(a.id).result == "1"
    assert store.get(c.id).status is State.FAILED and store.get(c.id).error == "boom\ufffd"
    if store_kind != "memory":  # memory keeps any float; the databases refuse NaN here
        got = store.get(b.id)
        assert applied[1] and got.status is State.FAILED
        assert got.error.startswith("the store refused this attempt's outcome (RETRYING)")
        assert outcomes[1].status is State.FAILED  # the outcome says what was written


def test_a_batch_with_a_row_no_store_can_match_writes_the_others(store):
    a, b, c = _claimed(store, 3)
    applied = store.complete(
        [
            Outcome(a.id, a.lease_token, a.version, State.SUCCESS, result="1"),
            # a version past what the stores count to: no row can match it
            Outcome(b.id, b.lease_token, 2**40, State.SUCCESS, result="2"),
            Outcome(c.id, c.lease_token, c.version, State.SUCCESS, result="3"),
        ]
    )
    assert applied == [True, False, True]
    assert [store.get(t.id).status for t in (a, b, c)] == [State.SUCCESS, State.RUNNING, State.SUCCESS]


def test_the_traceback_goes_with_the_error(store):
    (rec,) = _claimed(store)
    assert finish(store, rec, State.RETRYING, error="ValueError: x", traceback="Traceback ...", run_at=store.now())
    got = store.get(rec.id)
    assert (got.error, got.traceback) == ("ValueError: x", "Traceback ...")
    (again,) = [t for c_ in claim(store, 1) for t in c_.tasks]
    assert finish(store, again, State.SUCCESS, result="null")
    got = store.get(rec.id)
    assert got.error is None and got.traceback is None  # a success clears both

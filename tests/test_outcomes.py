"""How an attempt's end is classified (engine/outcomes.py): pure functions of
the task, what it raised and the store's time, with no worker around them."""

from __future__ import annotations

from dataclasses import dataclass, field

from corral.core.model import TaskRecord
from corral.core.retries import MAX_SNOOZES, Backoff
from corral.core.states import State
from corral.engine import outcomes
from corral.errors import ChildFailed, PermanentError, Retry

NOW = 1000.0


def _now() -> float:
    return NOW


@dataclass(frozen=True)
class _Spec:
    name: str = "t"
    fn: object = None
    isolation: str = "thread"
    takes_ctx: bool = False
    retry_on: tuple[type[BaseException], ...] | None = None
    permanent_on: tuple[type[BaseException], ...] = ()
    backoff: Backoff = field(default_factory=lambda: Backoff(base=2.0, factor=1.0, jitter=0.0))
    overlap_on_timeout: bool = False


def _rec(**kw) -> TaskRecord:
    base = {"id": 7, "name": "t", "args": "{}", "status": State.RUNNING, "attempt": 1, "max_retries": 2, "version": 3}
    return TaskRecord(**(base | kw))


class _TooMany(Exception):
    status_code = 429

    def __init__(self, after: str):
        super().__init__("too many requests")
        self.headers = {"Retry-After": after}


def test_an_error_with_retries_left_runs_again_after_its_backoff():
    out = outcomes.failure(_rec(), "tok", ValueError("boom"), _Spec(), 5.0, _now)
    assert (out.task_id, out.token, out.version, out.status) == (7, "tok", 3, State.RETRYING)
    assert out.run_at == NOW + 2.0 and out.started_at == 5.0
    assert out.error == "ValueError: boom" and "boom" in (out.traceback or "")
    assert out.breaker_failure is True and not out.snooze


def test_an_error_with_no_retries_left_fails_and_says_it_gave_up():
    out = outcomes.failure(_rec(attempt=3), "tok", ValueError("boom"), _Spec(), 5.0, _now)
    assert out.status is State.FAILED
    assert out.error == "ValueError: boom (gave up after 3 attempts)"


def test_a_permanent_error_fails_at_once_and_an_unknown_task_cannot_retry():
    out = outcomes.failure(_rec(), "tok", PermanentError("bad input"), _Spec(), 5.0, _now)
    assert out.status is State.FAILED and "bad input" in (out.error or "")
    assert outcomes.failure(_rec(), "tok", ValueError("x"), None, 5.0, _now).status is State.FAILED


def test_a_child_process_failure_keeps_its_own_verdict_and_text():
    exc = ChildFailed("KeyError", "Traceback ...\nKeyError: 'k'", retryable=False, error="KeyError: 'k'")
    out = outcomes.failure(_rec(), "tok", exc, _Spec(), 5.0, _now)
    assert (out.status, out.error) == (State.FAILED, "KeyError: 'k'")


def test_a_retry_asked_for_is_a_snooze_until_the_most_a_task_may():
    out = outcomes.failure(_rec(), "tok", Retry(after=30.0, reason="later"), _Spec(), 5.0, _now)
    assert (out.status, out.snooze, out.run_at, out.error) == (State.RETRYING, True, NOW + 30.0, "later")
    capped = outcomes.failure(_rec(snoozes=MAX_SNOOZES), "tok", Retry(after=30.0), _Spec(), 5.0, _now)
    assert capped.status is State.FAILED and "asked to run later" in (capped.error or "")


def test_a_429_with_retry_after_under_a_limit_snoozes_and_pauses_the_limits():
    out = outcomes.failure(_rec(limits=("api",)), "tok", _TooMany("12"), _Spec(), 5.0, _now)
    assert (out.status, out.snooze, out.run_at, out.pause_limits) == (State.RETRYING, True, NOW + 12.0, 12.0)
    # with no limit named, a 429 is an ordinary failure
    plain = outcomes.failure(_rec(), "tok", _TooMany("12"), _Spec(), 5.0, _now)
    assert not plain.snooze and plain.pause_limits is None


def test_a_timeout_retries_while_it_may_then_is_final():
    out = outcomes.timed_out(_rec(timeout=1.5), "tok", _Spec(), 5.0, _now)
    assert (out.status, out.run_at, out.breaker_failure) == (State.RETRYING, NOW + 2.0, True)
    assert out.error == "timed out after 1.5s (attempt 1)"
    last = outcomes.timed_out(_rec(timeout=1.5, attempt=3), "tok", _Spec(), 5.0, _now)
    assert last.status is State.TIMEOUT


def test_the_error_line_is_the_last_line_of_the_text():
    assert outcomes.error_line("Traceback\n  ...\nValueError: boom\n") == "ValueError: boom"
    assert outcomes.error_line(None) == "-"

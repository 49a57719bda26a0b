"""Pure logic: state machine, backoff, retry classification, sub-groups. No threads."""

from __future__ import annotations

import itertools
import random

import pytest

from corral.core.groups import subgroup
from corral.core.retries import Backoff, is_retryable, retry_delay
from corral.core.states import (
    FINAL,
    QUEUED,
    STORED,
    TRANSITIONS,
    State,
    can_transition,
    check_transition,
)
from corral.errors import IllegalTransition, PermanentError, Retry

ALL_PAIRS = list(itertools.product(State, State))


@pytest.mark.parametrize("src,dst", [p for p in ALL_PAIRS if p in TRANSITIONS])
def test_legal_transitions_pass(src, dst):
    assert can_transition(src, dst)
    check_transition(src, dst)  # does not raise


@pytest.mark.parametrize("src,dst", [p for p in ALL_PAIRS if p not in TRANSITIONS])
def test_illegal_transitions_raise(src, dst):
    assert not can_transition(src, dst)
    with pytest.raises(IllegalTransition):
        check_transition(src, dst)


def test_success_is_final_and_nothing_returns_to_running_from_a_final_state():
    assert not [dst for (src, dst) in TRANSITIONS if src is State.SUCCESS]
    for final in FINAL:
        assert not can_transition(final, State.RUNNING)
    assert {src for (src, dst) in TRANSITIONS if dst is State.RUNNING} == QUEUED


def test_every_state_has_a_way_out_or_is_final():
    for s in STORED:
        outs = [d for (src, d) in TRANSITIONS if src is s]
        assert outs or s is State.SUCCESS, s


def test_backoff_grows_exponentially_and_is_capped():
    b = Backoff(base=1.0, factor=2.0, cap=10.0, jitter=0.0)
    assert [b.delay(n) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]


def test_backoff_is_jittered_within_bounds():
    b = Backoff(base=1.0, factor=2.0, cap=100.0, jitter=0.5)
    rng = random.Random(7)
    delays = [b.delay(3, rng) for _ in range(200)]
    assert all(4.0 <= d <= 6.0 for d in delays)
    assert len({round(d, 6) for d in delays}) > 150  # not all the same: spread out


def test_retry_after_overrides_backoff():
    assert retry_delay(Retry(after=2.5), 4, Backoff()) == 2.5
    assert retry_delay(ConnectionError(), 1, Backoff(base=0.5, jitter=0.0)) == 0.5


class HTTPError(Exception):
    def __init__(self, status_code):
        super().__init__(status_code)
        self.status_code = status_code


@pytest.mark.parametrize(
    "exc,expected",
    [
        (TimeoutError(), True),
        (ConnectionError(), True),
        (HTTPError(429), True),
        (HTTPError(503), True),
        (HTTPError(400), False),
        (HTTPError(401), False),
        (ValueError("bad sku"), False),
        (TypeError(), False),
        (PermanentError("no"), False),
        (Retry(), True),
        (RuntimeError("flaky"), True),
    ],
)
def test_retryable_vs_permanent(exc, expected):
    assert is_retryable(exc) is expected


def test_retry_on_narrows_what_retries():
    assert is_retryable(ConnectionError(), retry_on=(ConnectionError,))
    assert not is_retryable(RuntimeError(), retry_on=(ConnectionError,))
    assert is_retryable(Retry(), retry_on=(ConnectionError,))
    assert not is_retryable(PermanentError(), retry_on=(PermanentError,))


def test_subgroup_is_stable_and_spreads():
    assert subgroup("m1", "order-7", 8) == subgroup("m1", "order-7", 8)
    assert subgroup("m1", "x", 1) == "m1"
    spread = {subgroup("m1", f"order-{i}", 8) for i in range(200)}
    assert len(spread) == 8 and all(s.startswith("m1#") for s in spread)


def test_percentile_is_nearest_rank_and_an_observed_value():
    from corral.core.stats import percentile

    values = [float(v) for v in range(100, 0, -1)]  # 100 .. 1, unsorted
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 0.50) == 50.0
    assert percentile(values, 1.0) == 100.0
    assert percentile([3.0], 0.99) == 3.0
    assert percentile([], 0.5) is None
    assert percentile(sorted(values), 0.99, presorted=True) == 99.0

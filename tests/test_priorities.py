"""The ageing rule alone (core/priorities.py), and that the SQL agrees with it."""

from __future__ import annotations

import re

from corral.core.priorities import AGE_STEP, claim_rank, effective_priority, overtake_window
from corral.stores.sql import load


def test_rank_orders_like_effective_priority_at_any_moment():
    tasks = [(0, 100.0), (3, 250.0), (1, 130.0), (3, 100.0), (-2, 0.0), (5, 400.0)]
    by_rank = sorted(tasks, key=lambda t: claim_rank(*t))
    for now in (400.0, 1_000.0, 100_000.0):
        by_effective = sorted(tasks, key=lambda t: -effective_priority(t[0], t[1], now))
        assert by_effective == by_rank


def test_one_level_is_worth_age_step_seconds():
    assert effective_priority(2, 0.0, AGE_STEP) == 3
    assert effective_priority(2, 10.0, 5.0) == 2  # not yet eligible: no credit
    assert claim_rank(1, AGE_STEP) == claim_rank(0, 0.0)  # a level up, a step later: a tie


def test_overtake_window():
    assert overtake_window(0, 3) == 3 * AGE_STEP
    assert overtake_window(3, 3) == 0
    assert overtake_window(5, 1) == 0
    # a higher task arriving just inside the window ranks first, just outside it does not
    w = overtake_window(0, 2)
    assert claim_rank(2, w - 1) < claim_rank(0, 0.0) < claim_rank(2, w + 1)


def test_the_sql_stores_use_the_same_age_step():
    """The index expressions carry AGE_STEP as a literal: one number in three places."""
    for dialect in ("sqlite", "postgres"):
        text = "\n".join(load(dialect).values())
        steps = {float(m) for m in re.findall(r"priority \* (\d+(?:\.\d+)?)", text)}
        assert steps == {AGE_STEP}, (dialect, steps)

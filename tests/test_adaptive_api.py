"""Declaring an adaptive limit: app.limit(..., "auto", bounds), one-line errors on bad input, nothing stored."""

from __future__ import annotations

import pytest

import corral
from corral.core.adaptive import AdaptiveSpec, Bounds


def test_auto_knobs_store_their_bounds_and_start_low():
    app = corral.App("memory://")
    app.limit(
        "partner_api",
        concurrency="auto",
        rate="auto",
        max_concurrency=40,
        max_rate="200/s",
        min_concurrency=1,
        min_rate="1/s",
    )
    row = app.store.adaptive_limits()["partner_api"]
    assert row.spec == AdaptiveSpec(True, True, Bounds(1, 40, 1.0, 200.0))
    assert (row.concurrency, row.rate) == (2, "10/s")


def test_one_knob_auto_the_other_fixed():
    app = corral.App("memory://")
    app.limit("api", concurrency=8, rate="auto", max_rate="6000/m", min_rate="60/m")
    row = app.store.adaptive_limits()["api"]
    assert row.spec == AdaptiveSpec(False, True, Bounds(1, 1, 1.0, 100.0))
    assert (row.concurrency, row.rate) == (8, "5/s")
    app.limit("api", concurrency=8)  # declared fixed again: no controller sets it any more
    assert app.store.adaptive_limits() == {}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"concurrency": "auto"}, "concurrency='auto' needs max_concurrency"),
        ({"rate": "auto"}, "rate='auto' needs max_rate"),
        ({"rate": "auto", "max_rate": "fast"}, "max_rate: cannot parse rate 'fast'"),
        ({"rate": "auto", "max_rate": "10/s", "min_rate": "20/s"}, "min_rate '20/s' is above max_rate '10/s'"),
        ({"concurrency": "auto", "max_concurrency": 4, "min_concurrency": 5}, "min_concurrency must be an integer"),
        ({"concurrency": "auto", "max_concurrency": 0}, "max_concurrency must be an integer"),
        ({"max_concurrency": 10}, "max_concurrency bounds an adaptive limit; it needs concurrency='auto'"),
        ({"concurrency": 3, "rate": "auto", "max_rate": "9/s", "max_concurrency": 9}, "need concurrency='auto'"),
        ({"rate": "auto", "max_rate": "9/s", "burst": 5}, "an adaptive rate takes no burst"),
        ({"rate": "auto", "max_rate": "9/s", "per_key": "yes"}, "per_key must be True or False"),
        ({"concurrency": "many"}, "an integer from 1 to 2147483647 or 'auto'"),
    ],
)
def test_bad_declarations_are_one_line_errors_and_store_nothing(kwargs, message):
    app = corral.App("memory://")
    with pytest.raises(corral.ConfigError, match=message.replace("(", r"\(")) as err:
        app.limit("api", **kwargs)
    assert "\n" not in str(err.value)
    assert app.store.limits() == {} and app.store.adaptive_limits() == {}


def test_an_adaptive_limit_shown_effective_beside_bounds():
    from corral.cli.render import adaptive_line
    from corral.core.adaptive import ControllerState
    from corral.edges.limit_view import adaptive_dict

    app = corral.App("memory://")
    app.limit("partner_api", concurrency="auto", rate="auto", max_concurrency=40, max_rate="200/s")
    row = app.store.adaptive_limits()["partner_api"]
    assert adaptive_line(row) == (
        "partner_api  concurrency 2 (auto 1..40)  rate 10/s (auto 1/s..200/s)  not adapted yet"
    )
    app.limit("api", concurrency=4, rate="auto", max_rate="60/s")
    assert app.store.try_lead("sweeper", "me", 10.0)
    learned = '{"rate": 41.2, "concurrency": 4, "w_max": 45.25, "baseline_ms": 40.5}'
    assert app.store.save_adaptive("api", "me", "sweeper", learned, None, "41/s", None)
    row = app.store.adaptive_limits()["api"]
    assert row.state == ControllerState(41.2, 4, w_max=45.25, baseline_ms=40.5)
    assert adaptive_line(row) == (
        "api  concurrency 4 (fixed)  rate 41/s (auto 1/s..60/s)  baseline 40.5 ms  last cut at 45.25/s"
    )
    assert adaptive_dict(row) == {
        "name": "api",
        "concurrency": 4,
        "rate": "41/s",
        "rate_bounds": ["1/s", "60/s"],
        "baseline_ms": 40.5,
        "last_cut_rate": 45.25,
    }

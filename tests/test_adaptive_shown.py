"""An adaptive limit shown: ``corral limit show`` (text and ``--json``) prints
the effective values beside the bounds, the baseline and the last cut; the
dashboard's Limits page draws the effective rate against the calls that
succeeded, with the throttled seconds marked, from the ``limit_adapted`` events."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

import corral
from corral.cli import cli
from corral.core.adaptive import LimitReport, bucket_of
from corral.core.clock import FakeClock
from corral.core.model import NewTask
from corral.edges.limit_view import adaptive_history
from corral.maintenance.adaptive_keeper import AdaptiveKeeper
from corral.stores import open_store
from helpers import ARGS


class Leading:
    holder = "one"
    is_leader = True


def _report(calls: int, throttles: int = 0) -> str:
    ok = calls - throttles
    rep = LimitReport(1.0, calls, ok, throttles, 0, 2, latency={bucket_of(20.0): ok} if ok else {})
    return json.dumps({"api": rep.to_dict()})


@pytest.fixture
def adapted(sqlite_url):
    """An adaptive limit the leader's controller moved: four seconds of slow
    start, then a second with throttles (a cut)."""
    clock = FakeClock()
    store = open_store(sqlite_url, clock=clock)
    store.migrate()
    app = corral.App(store)
    app.limit("api", rate="auto", max_rate="200/s", concurrency=50)
    app.limit("plain", concurrency=3)
    store.submit([NewTask("t", ARGS, limits=("api",)) for _ in range(5)])  # work waits under the limit
    assert store.try_lead("sweeper", "one", 60.0)
    keeper = AdaptiveKeeper(store, Leading(), aligned=False)
    keeper.tick()
    for calls, throttles in [(10, 0), (15, 0), (22, 0), (34, 0), (51, 10)]:
        store.report_limits("w1", _report(calls, throttles))
        clock.advance(1.0)
        keeper.tick()
    assert store.limits()["api"].rate == "37/s"
    yield store, sqlite_url
    store.close()


def _run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_limit_show_prints_the_effective_values_beside_the_bounds(adapted):
    store, url = adapted
    text = _run("limit", "show", "--store", url).stdout
    line = "    adaptive: api  concurrency 50 (fixed)  rate 37/s (auto 1/s..200/s)  baseline 20.75 ms  last cut at 41/s"
    assert line in text
    assert "plain  0 of 3 held" in text and text.count("adaptive:") == 1
    shown = {r["name"]: r for r in json.loads(_run("limit", "show", "--json", "--store", url).stdout)["limits"]}
    assert shown["api"]["adaptive"] == {
        "name": "api",
        "concurrency": 50,
        "rate": "37/s",
        "rate_bounds": ["1/s", "200/s"],
        "baseline_ms": 20.75,
        "last_cut_rate": 41.0,
    }
    assert shown["plain"]["adaptive"] is None


def test_the_history_is_each_change_oldest_first_with_what_happened(adapted):
    store, _ = adapted
    (points,) = adaptive_history(store, ["api"]).values()
    assert [p["rate"] for p in points] == [15.0, 22.5, 33.75, 50.625, 36.9]
    assert [p["throttles"] for p in points] == [0, 0, 0, 0, 10]
    assert points[-1]["successes"] == 41 and points[-1]["rate_rule"] == "throttled: cut"
    assert adaptive_history(store, ["api"], seconds=2.5)["api"] == points[-3:]  # 3, 4 and 5 s in


def test_the_limits_page_draws_the_effective_rate_against_what_succeeded(adapted):
    pytest.importorskip("starlette", reason="the dashboard extra is not installed")
    from corral.edges.dashboard import serve_background
    from test_dashboard import Client

    store, _ = adapted
    dash = serve_background(store)
    try:
        status, body = Client(dash.url).request("/limits")
    finally:
        dash.stop()
    assert status == 200
    (section,) = re.findall(r'<section class="adaptive" data-adaptive="api">.*?</section>', body, re.S)
    assert "rate 37/s (auto 1/s..200/s)" in section and "last cut at 41/s" in section
    assert "5 changes, 10 throttled calls" in section
    (effective,) = re.findall(r'class="line effective" d="([^"]+)"', section)
    assert effective.count("M") == 1 and effective.count("L") >= 9  # a step line through the 5 changes
    (happened,) = re.findall(r'class="line second happened" d="([^"]+)"', section)
    assert happened.count("L") == 4
    assert len(re.findall(r'<line class="throttle"', section)) == 1
    assert "10 throttled at" in section
    assert 'data-adaptive="plain"' not in body

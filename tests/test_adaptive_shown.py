"""An adaptive limit shown: ``corral limit show`` (text and ``--json``) prints
the effective values beside the bounds, the baseline and the last cut; the
dashboard's Limits page draws the effective rate against the calls that
succeeded, with the throttled seconds marked, from the ``limit_adapted`` events;
for a keyed adaptive limit, both list the busiest keys' learned values."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

import corral
from corral.cli import cli
from corral.core.adaptive import LimitReport, bucket_of
from corral.core.clock import FakeClock
from corral.core.events import LIMIT_KEY_ADAPTED
from corral.core.gates import keyed_name
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


def _keys_report(keys: dict[str, tuple[int, int]]) -> str:
    out = {}
    for key, (calls, throttles) in keys.items():
        ok = calls - throttles
        rep = LimitReport(1.0, calls, ok, throttles, 0, 1, latency={bucket_of(20.0): ok} if ok else {})
        out[keyed_name("merchant", key)] = rep.to_dict()
    return json.dumps(out)


#: a keyed adaptive limit's keys' calls in their last second (and throttles): "hot" the busiest, cut
KEYS = {"hot": (10, 4), "k1": (7, 0), "k2": (6, 0), "k3": (5, 0), "k4": (4, 0), "k5": (3, 0), "k6": (2, 0)}


@pytest.fixture
def keyed(sqlite_url):
    """A keyed adaptive limit whose seven keys learned values of their own; the hot one was cut."""
    clock = FakeClock()
    store = open_store(sqlite_url, clock=clock)
    store.migrate()
    app = corral.App(store)
    app.limit("merchant", rate="auto", max_rate="200/s", per_key=True)  # each key starts at 10/s
    store.submit([NewTask("t", ARGS, limits=(keyed_name("merchant", k),)) for k in KEYS for _ in range(3)])
    assert store.try_lead("sweeper", "one", 60.0)
    keeper = AdaptiveKeeper(store, Leading(), aligned=False)
    keeper.tick()
    store.report_limits("w1", _keys_report(KEYS))
    clock.advance(1.0)
    keeper.tick()
    (cut,) = store.events(LIMIT_KEY_ADAPTED)
    yield store, sqlite_url, cut.at
    store.close()


def test_limit_show_json_has_the_busiest_keys_learned_values(keyed):
    store, url, cut_at = keyed
    out = json.loads(_run("limit", "show", "merchant", "--json", "--store", url).stdout)
    (row,) = out["limits"]
    assert row["learning_keys"] == 7
    learned = row["learned_keys"]
    assert [k["key"] for k in learned] == ["hot", "k1", "k2", "k3", "k4"]  # by their last second's calls
    assert learned[0] == {
        "key": "hot",
        "concurrency": None,  # not adaptive: the limit's (none) holds
        "rate": "5/s",
        "calls": 10,
        "seen": cut_at,
        "changed_at": cut_at,
        "in_use": 0,
    }
    assert learned[1]["rate"] == "10/s" and learned[1]["changed_at"] is None
    text = _run("limit", "show", "merchant", "--store", url).stdout
    assert "busiest learning keys: hot (5/s) 10 calls, changed " in text and "k1 (10/s) 7 calls, k2" in text
    assert _run("limit", "show", "nosuch", "--store", url).exit_code != 0


def test_the_limits_page_lists_a_keyed_adaptive_limits_busiest_keys(keyed):
    pytest.importorskip("starlette", reason="the dashboard extra is not installed")
    from corral.edges.dashboard import serve_background
    from test_dashboard import Client

    store, _, _ = keyed
    dash = serve_background(store)
    try:
        status, body = Client(dash.url).request("/limits")
    finally:
        dash.stop()
    assert status == 200
    (table,) = re.findall(r'<table class="learned-keys" data-learned-keys="merchant">.*?</table>', body, re.S)
    rows = re.findall(
        r'<tr data-key="([^"]+)"><td>[^<]*</td><td>([^<]*)</td><td>([^<]*)</td><td>(\d+)</td>'
        r"<td>\d+</td><td>([^<]*)</td></tr>",
        table,
    )
    assert [(k, conc, rate, int(calls)) for k, conc, rate, calls, _ in rows] == [
        ("hot", "–", "5/s", 10),
        ("k1", "–", "10/s", 7),
        ("k2", "–", "10/s", 6),
        ("k3", "–", "10/s", 5),
        ("k4", "–", "10/s", 4),
    ]
    changed = [c for *_, c in rows]
    assert changed[0] != "–" and changed[1:] == ["–"] * 4  # only the hot key's values changed
    assert "7 learning" in body and 'href="/events?kind=limit_key_adapted"' in body

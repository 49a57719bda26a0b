"""Limits changed while running, through the app, the CLI and the dashboard:
``corral limit set/show/reset``, one-line refusals, a redeclaring worker that
keeps the operator's change, the dashboard's form, and one worker process
obeying a lower and then a higher concurrency without a restart."""

from __future__ import annotations

import json
import logging
import time

import pytest
from click.testing import CliRunner

import corral
from corral.cli import cli
from corral.core.claims import ClaimRequest
from corral.core.events import LIMIT
from corral.core.gates import keyed_name
from corral.core.model import LimitSettings, NewTask
from corral.core.states import State
from corral.stores import open_store
from corral.testing import History
from helpers import ARGS, wait_for


def _run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def _one_line_error(result, *needles: str) -> str:
    assert result.exit_code != 0, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def store(sqlite_url):
    """A store with a plain limit, a keyed one, and places held by two keys."""
    app = corral.App(sqlite_url)
    app.limit("api", concurrency=4, rate="10/s")
    app.limit("merchant", concurrency=2, rate="5/s", per_key=True)
    app.close()
    s = open_store(sqlite_url)
    s.migrate()
    s.submit([NewTask(name="t", args=ARGS, limits=(keyed_name("merchant", k),)) for k in ("m-1", "m-1", "m-2")])
    assert len(s.claim("w", ClaimRequest(("default",), 10))) == 3
    yield s
    s.close()


def test_limit_set_changes_only_what_it_names_and_show_says_so(store, sqlite_url):
    got = _run("limit", "set", "merchant", "--concurrency", "3", "--rate", "8/s", "--store", sqlite_url)
    assert got.exit_code == 0, got.output
    assert "merchant: concurrency 3, rate 8/s" in got.stdout
    assert _run("limit", "set", "api", "--rate", "none", "--store", sqlite_url).exit_code == 0
    shown = json.loads(_run("limit", "show", "--json", "--store", sqlite_url).stdout)["limits"]
    by_name = {r["name"]: r for r in shown}
    api, merchant = by_name["api"], by_name["merchant"]
    assert (api["concurrency"], api["rate"], api["set_by"], api["per_key"]) == (4, None, "cli", False)
    assert api["declared"] == {"concurrency": 4, "rate": "10/s", "burst": None}
    assert (merchant["concurrency"], merchant["rate"], merchant["per_key"]) == (3, "8/s", True)
    assert merchant["in_use"] == 3 and merchant["active_keys"] == 2
    assert merchant["busiest_keys"] == [{"key": "m-1", "in_use": 2}, {"key": "m-2", "in_use": 1}]
    assert merchant["paused"] is False and merchant["tokens"] is not None
    text = _run("limit", "--store", sqlite_url).stdout
    assert "merchant (keyed)  3 held, 3 per key  rate 8/s per key" in text
    assert "api  0 of 4 held  no rate" in text
    assert "keys holding places: 2; busiest: m-1 2, m-2 1" in text
    assert "set by cli" in text and "(declared: concurrency 4, rate 10/s)" in text
    whos = [(json.loads(e.data)["action"], json.loads(e.data)["by"]) for e in store.events(LIMIT)]
    assert whos[:2] == [("set", "cli"), ("set", "cli")]
    # handed back: the declared settings are in force again
    assert _run("limit", "reset", "api", "--store", sqlite_url).exit_code == 0
    api = store.limits()["api"]
    assert (api.concurrency, api.rate, api.set_by) == (4, "10/s", None)


@pytest.mark.parametrize(
    "args, needles",
    [
        (("nope", "--concurrency", "2"), ("no limit named 'nope'; known: api, merchant",)),
        (("api", "--rate", "8/q"), ("cannot parse rate '8/q'",)),
        (("api", "--concurrency", "0"), ("concurrency must be an integer from 1 to",)),
        (("api", "--concurrency", "two"), ("concurrency must be a whole number or 'none'",)),
        (("api", "--burst", "5", "--rate", "none"), ("a burst needs a rate",)),
        (("api",), ("name what to change",)),
    ],
    ids=["unknown", "bad-rate", "zero", "not-a-number", "burst-without-rate", "nothing"],
)
def test_limit_set_refuses_in_one_line_and_writes_nothing(store, sqlite_url, args, needles):
    _one_line_error(_run("limit", "set", *args, "--store", sqlite_url), *needles)
    api = store.limits()["api"]
    assert (api.concurrency, api.rate, api.set_by) == (4, "10/s", None)
    assert [e for e in store.events(LIMIT) if json.loads(e.data)["action"] != "declare"] == []


def test_a_worker_that_declares_again_keeps_the_operators_change(sqlite_url, caplog):
    first = corral.App(sqlite_url)
    first.limit("api", concurrency=4, rate="10/s")
    first.set_limit("api", concurrency=1)
    first.close()
    again = corral.App(sqlite_url)  # a restart, with a new declaration
    with caplog.at_level(logging.WARNING, logger="corral.app"):
        again.limit("api", concurrency=8, rate="10/s")
    assert "stays in force, not the declared concurrency 8" in caplog.text
    spec = again.store.limits()["api"]
    assert (spec.concurrency, spec.set_by, spec.declared) == (1, "app", LimitSettings(8, "10/s", None))
    assert again.reset_limit("api").concurrency == 8
    again.close()


def test_the_dashboard_shows_limits_and_changes_one(store):
    pytest.importorskip("starlette", reason="the dashboard extra is not installed")
    from corral.edges.dashboard import serve_background
    from test_dashboard import Client

    dash = serve_background(store)
    try:
        c = Client(dash.url)
        status, body = c.request("/limits")
        assert status == 200
        assert 'action="/actions/limit"' in body and "2 per key" in body
        assert "keys holding places: 2" in body and "m-1" in body
        # no CSRF token: refused, nothing changed
        assert c.request("/actions/limit", {"name": "api", "concurrency": "2"})[0] == 403
        assert store.limits()["api"].concurrency == 4
        form = {"name": "api", "concurrency": "2", "rate": "", "burst": "", "csrf": c.csrf(), "next": "/limits"}
        assert c.request("/actions/limit", form)[0] == 303
        api = store.limits()["api"]
        assert (api.concurrency, api.rate, api.set_by) == (2, "10/s", "dashboard")
        assert json.loads(store.events(LIMIT, limit=1)[0].data)["by"] == "dashboard"
        body = c.request("/limits")[1]
        assert "dashboard at" in body and "Reset to declared" in body
        # a bad rate: the page says why, nothing changed
        status, _ = c.request("/actions/limit", {**form, "concurrency": "", "rate": "fast"})
        assert status == 303
        assert store.limits()["api"].rate == "10/s"
        assert c.request("/actions/limit", {"name": "api", "reset": "1", "csrf": c.csrf(), "next": "/limits"})[0] == 303
        assert store.limits()["api"].concurrency == 4
    finally:
        dash.stop()


@pytest.mark.slow
def test_a_worker_process_obeys_a_lower_then_a_higher_concurrency_without_a_restart(durable_url, tmp_path):
    from faults import AppWorker

    app = corral.App(durable_url)
    app.limit("live", concurrency=4)
    call = app.task(name="call", limits=["live"])(lambda ctx, dur: 0)
    runs = tmp_path / "runs.jsonl"
    worker = AppWorker(durable_url, runs, tmp_path / "w.log", concurrency=4)
    try:
        worker.wait_ready()
        ids = [h.id for h in call.submit_many([{"args": [0.2]} for _ in range(200)])]

        def running() -> int:
            return app.counts().get(State.RUNNING.value, 0)

        wait_for(lambda: running() == 4, timeout=30, message="4 in flight under concurrency 4")
        got = _run("limit", "set", "live", "--concurrency", "1", "--store", durable_url)
        assert got.exit_code == 0, got.output
        lowered = time.monotonic()
        wait_for(lambda: running() <= 1, timeout=10, message="at most 1 in flight after the change")
        wait_for(lambda: app.counts().get(State.SUCCESS.value, 0) >= 8, timeout=30, message="work goes on")
        got = _run("limit", "set", "live", "--concurrency", "3", "--store", durable_url)
        assert got.exit_code == 0, got.output
        raised = time.monotonic()
        wait_for(lambda: running() == 3, timeout=10, message="3 in flight after the raise")
        seen3 = time.monotonic() - raised
        # the runs are recorded as they end: let the three under the raised cap end first
        done = app.counts().get(State.SUCCESS.value, 0)
        wait_for(lambda: app.counts().get(State.SUCCESS.value, 0) >= done + 3, timeout=30, message="the three end")
    finally:
        worker.close()
        app.close(5)
    history = History.load(runs)
    history.assert_ok()

    def beside(at: float) -> int:
        """Runs in flight at ``at``, the one starting then included."""
        return sum(1 for r in history.runs if r.start <= at < r.until())

    # every start a second or more after the change had no other run beside it
    under_one = [r.start for r in history.runs if lowered + 1.0 <= r.start < raised]
    assert under_one, "tasks ran under the lowered limit"
    assert max(map(beside, under_one)) == 1
    assert max(beside(r.start) for r in history.runs if r.start >= raised) == 3
    print(f"3 in flight {seen3 * 1000:.0f} ms after the raise")
    assert len(ids) == 200

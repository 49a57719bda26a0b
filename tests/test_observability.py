"""Logs and tracing: task log lines carry their task's trace id, id and
attempt (JSON lines from a real worker), ``ctx.trace_headers()`` reaches the
partner API as W3C trace context, OpenTelemetry spans per attempt, and
``corral events --follow`` prints the stream as it grows."""

from __future__ import annotations

import json
import logging
import subprocess
import time
from pathlib import Path

import pytest

import corral
from corral.cli import load_app
from corral.core import tracing as w3c
from corral.edges.partner import PartnerServer, call
from corral.engine.logs import JsonFormatter, TaskFilter, TextFormatter
from faults import CORRAL
from helpers import wait_for

REPO = Path(__file__).resolve().parent.parent
OBSERVED = "tests.apps.observed_app:app"


@pytest.fixture
def app():
    a = corral.App("memory://")
    yield a
    a.close(timeout=10)


# ---- W3C trace context (pure) ---------------------------------------------------------
def test_trace_ids_become_w3c_trace_ids():
    hex32 = "4bf92f3577b34da6a3ce929d0e0e4736"
    assert w3c.w3c_trace_id(hex32) == hex32
    parent = f"00-{hex32}-00f067aa0ba902b7-01"
    assert w3c.w3c_trace_id(parent) == hex32
    assert w3c.parse_traceparent(parent) == w3c.Parent(hex32, "00f067aa0ba902b7", True)
    derived = w3c.w3c_trace_id("sku_sync_0801_001")
    assert len(derived) == 32 and int(derived, 16) and derived == w3c.w3c_trace_id("sku_sync_0801_001")
    for bad in ("", "00-" + "0" * 32 + "-00f067aa0ba902b7-01", f"ff-{hex32}-00f067aa0ba902b7-01", "00-xyz"):
        assert w3c.parse_traceparent(bad) is None


def test_trace_ids_given_by_corral_begin_with_the_submit_time(app):
    """A task submitted without a trace id gets one that begins with the
    time in milliseconds: the trace-id index grows at its end, not all over
    it (at a million tasks, random ids slowed every submit)."""

    @app.task
    def noop():
        return None

    before = time.time_ns() // 1_000_000
    ids = [h.get().trace_id for h in noop.submit_many([() for _ in range(300)])]
    ids += [noop.submit().get().trace_id for _ in range(20)]
    after = time.time_ns() // 1_000_000
    assert all(len(t) == 32 and int(t, 16) for t in ids) and len(set(ids)) == len(ids)
    stamps = [int(t[:12], 16) for t in ids]
    assert stamps == sorted(stamps) and before <= stamps[0] and stamps[-1] <= after


def test_headers_name_the_trace_and_the_attempt():
    h1 = w3c.headers("sku_sync_0801_001", 7, 1)
    h2 = w3c.headers("sku_sync_0801_001", 7, 2)
    p1, p2 = w3c.parse_traceparent(h1["traceparent"]), w3c.parse_traceparent(h2["traceparent"])
    assert p1 is not None and p2 is not None
    assert p1.trace_id == p2.trace_id == w3c.w3c_trace_id("sku_sync_0801_001")
    assert p1.span_id != p2.span_id  # each attempt is its own span
    assert h1["X-Corral-Trace-Id"] == "sku_sync_0801_001"
    unsampled = w3c.headers("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", 1, 1)
    assert unsampled["traceparent"].endswith("-00")  # the caller's sampling decision is kept


# ---- trace headers reach the partner ----------------------------------------------------
@pytest.mark.parametrize(
    "given",
    [None, "sku_sync_0801_001", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"],
)
def test_trace_headers_reach_the_partner_api(app, given):
    with PartnerServer(cap=100, latency=0.0) as partner:

        @app.task
        def fetch(ctx, sku):
            call(partner.url, sku, headers=ctx.trace_headers())
            return ctx.trace_headers()

        h = fetch.submit("A1") if given is None else fetch.submit("A1", trace_id=given)
        app.start(workers=1)
        sent = h.result(timeout=10)
        (seen,) = partner.state.calls_log()
    trace_id = h.get().trace_id
    assert given is None or trace_id == given
    assert seen.trace_id == trace_id and seen.traceparent == sent["traceparent"]
    parent = w3c.parse_traceparent(seen.traceparent)
    assert parent is not None and parent.trace_id == w3c.w3c_trace_id(trace_id)
    if given is not None and given.startswith("00-"):
        assert parent.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"  # the caller's trace is kept


# ---- log records --------------------------------------------------------------------------
def test_every_line_about_a_task_carries_its_fields(app, caplog):
    @app.task(retries=1)
    def shaky(ctx):
        ctx.log.info("step")
        logging.getLogger("user.code").info("plain logger")
        if ctx.attempt == 1:
            raise ConnectionError("down")
        return "ok"

    h = shaky.submit(trace_id="trace-xyz")
    handler = caplog.handler
    handler.addFilter(TaskFilter())
    with caplog.at_level(logging.INFO):
        app.start(workers=1)
        assert h.result(timeout=10) == "ok"
    mine = [r for r in caplog.records if getattr(r, "task_id", None) == h.id]
    by_text = {(r.getMessage(), r.attempt) for r in mine}
    assert {("step", 1), ("step", 2), ("plain logger", 1), ("plain logger", 2)} <= by_text
    retry_lines = [r for r in mine if r.name == "corral.worker" and "will run again" in r.getMessage()]
    assert len(retry_lines) == 1 and retry_lines[0].attempt == 1
    assert all(r.trace_id == "trace-xyz" and r.task_name == h.get().name for r in mine)
    line = JsonFormatter().format(retry_lines[0])
    assert json.loads(line)["trace_id"] == "trace-xyz"
    first, below = TextFormatter().format(retry_lines[0]).split("\n", 1)
    assert first.endswith(f"[trace_id=trace-xyz task={h.id} attempt=1]")
    assert below.startswith("Traceback (most recent call last):")  # the failed attempt's, below its line


def test_a_worker_writes_json_log_lines(processes, sqlite_url, monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("CORRAL_STORE", sqlite_url)
    observed = load_app(OBSERVED, sqlite_url)
    h = observed.registry["flaky_step"].submit("A1", trace_id="sync-0801-A1")
    proc = processes.start(  # its log: stderr alone
        [*CORRAL, "worker", OBSERVED, "--store", sqlite_url, "--log-format", "json"],
        store=sqlite_url,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
    )
    assert h.result(timeout=30) == "A1"
    wait_for(lambda: proc.log.count("own logger line") >= 2, timeout=20)
    proc.stop()
    lines = [json.loads(ln) for ln in proc.log.splitlines() if ln.strip()]
    assert all({"time", "level", "logger", "message"} <= set(d) for d in lines)
    about = [d for d in lines if d.get("task_id") == h.id]
    assert {(d["message"], d["attempt"]) for d in about} >= {
        ("syncing A1", 1),
        ("syncing A1", 2),
        ("own logger line for A1", 1),
        ("own logger line for A1", 2),
    }
    assert all(d["trace_id"] == "sync-0801-A1" and d["task"] == "flaky_step" for d in about)
    retried = [d for d in about if d["logger"] == "corral.worker"]
    assert retried and "partner unreachable" in retried[0]["message"] and retried[0]["level"] == "INFO"


# ---- corral events --follow ------------------------------------------------------------
def test_corral_events_follow_prints_new_events(processes, sqlite_url):
    app = corral.App(sqlite_url)

    @app.task
    def noop(x):
        return x

    noop.submit(0)  # before the follower's starting point: not printed
    (last,) = list(app.events())
    proc = processes.start(
        [*CORRAL, "events", "--follow", "--since", str(last.id), "--json"], "events", store=sqlite_url, cwd=REPO
    )
    try:
        h = noop.submit(1)
        app.store.cancel(h.id)

        def printed() -> list[dict]:
            return [json.loads(ln) for ln in proc.log.splitlines() if ln.startswith("{")]

        wait_for(lambda: [e["kind"] for e in printed()] == ["submitted", "canceled"], timeout=20)
    finally:
        proc.stop()
        app.close()
    events = printed()
    assert [e["subject"] for e in events] == [f"task:{h.id}"] * 2
    assert events[1]["data"]["from"] == "PENDING" and events[0]["id"] < events[1]["id"]


def test_corral_events_lists_what_is_kept_and_refuses_unknown_kinds(sqlite_url):
    from click.testing import CliRunner

    from corral.cli import cli

    app = corral.App(sqlite_url)

    @app.task
    def noop(x):
        return x

    ids = [noop.submit(i).id for i in range(3)]
    app.cancel(ids[0])
    app.close()
    out = CliRunner().invoke(cli, ["events", "--store", sqlite_url])
    assert out.exit_code == 0, out.output
    assert [ln.split()[3] for ln in out.output.splitlines()] == ["submitted"] * 3 + ["canceled"]
    out = CliRunner().invoke(cli, ["events", "--store", sqlite_url, "--last", "1", "--kind", "submitted", "--json"])
    assert out.exit_code == 0 and json.loads(out.output)["subject"] == f"task:{ids[2]}"
    out = CliRunner().invoke(cli, ["events", "--store", sqlite_url, "--kind", "exploded"])
    assert out.exit_code != 0 and "unknown event kind 'exploded'" in out.output

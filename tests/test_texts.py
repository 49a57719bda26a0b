"""Texts a task produces, end to end: NUL characters and megabytes in errors,
progress messages and checkpoints; a failed attempt's traceback in the store,
`corral show`, the dashboard and the worker's log."""

from __future__ import annotations

import json
import logging
import urllib.request

import pytest
from click.testing import CliRunner

import corral
from corral import State
from corral.core import texts
from corral.core.model import Outcome
from corral.engine.logs import JsonFormatter, TextFormatter
from corral.errors import PermanentError
from helpers import wait_for

BIG = 20 * 1024 * 1024


def _ended(app, ids, timeout=30.0):
    return wait_for(
        lambda: all(app.get(i).status.final for i in ids) and [app.get(i) for i in ids],
        timeout=timeout,
        message="the tasks end",
    )


# ---- the pure rules -----------------------------------------------------------------------------
def test_safe_replaces_nul_and_lone_surrogates_and_cuts_with_the_length():
    assert texts.safe("a\x00b", 100) == "a\ufffdb"
    assert texts.safe("é\udcff\x00", 100) == "é\ufffd\ufffd"
    assert texts.safe("plain", 100) == "plain"
    cut = texts.safe("x" * 1000, 100)
    assert len(cut) <= 100 and cut.startswith("xxx") and cut.endswith("[... cut: 1000 characters in all]")
    both = texts.safe("head" + "m" * 1000 + "tail", 100, keep_tail=True)
    assert len(both) <= 100 and both.startswith("head") and both.endswith("tail") and "cut: 1008" in both


def test_an_outcome_refused_by_a_store_becomes_a_failure_that_says_why():
    o = Outcome(1, "tok", 3, State.RETRYING, error="e", run_at=float("nan"), attempt=2, traceback="tb")
    texts.refused(o, "DataError: bad value")
    assert (o.task_id, o.token, o.version, o.attempt) == (1, "tok", 3, 2)
    assert o.status is State.FAILED and o.run_at is None and o.traceback is None
    assert o.error == "the store refused this attempt's outcome (RETRYING): DataError: bad value"


def test_checkpoints_are_bounded_as_one_object():
    sizes: dict[str, int] = {}
    problem, size = texts.checkpoint_problem("a", json.dumps("x" * 500), sizes, 1_100)
    assert problem is None
    sizes["a"] = size
    assert 2 + size == len(json.dumps({"a": "x" * 500}, separators=(",", ":")))
    problem, _ = texts.checkpoint_problem("b", json.dumps("y" * 600), sizes, 1_100)
    assert problem and "checkpoint 'b'" in problem and "over the limit of 1100 bytes" in problem
    # the same stage again replaces its own data: only the new data counts
    assert texts.checkpoint_problem("a", json.dumps("z" * 900), sizes, 1_100)[0] is None


def test_log_formatters_cut_a_huge_message():
    record = logging.LogRecord("corral.task", logging.INFO, __file__, 1, "%s", ("m" * BIG,), None)
    for fmt in (TextFormatter(), JsonFormatter()):
        line = fmt.format(record)
        assert len(line) < texts.MAX_LOG_MESSAGE_CHARS + 1_000 and f"cut: {BIG} characters in all" in line


# ---- through a worker, on every store ---------------------------------------------------------------
def test_nul_in_error_progress_and_checkpoint_fails_no_other_task(url):
    app = corral.App(url)

    @app.task(retries=1)
    def step(ctx, n):
        ctx.progress(0.5, f"half\x00way {n}")
        if ctx.attempt == 1:
            ctx.checkpoint("fetched", {"raw": f"a\x00b{n}"})
            if n % 2:
                raise ConnectionError(f"bad\x00value {n}")  # retried: the next attempt reads the checkpoint
        return ctx.checkpoints["fetched"]["raw"]

    @app.task
    def broken(n):
        raise PermanentError(f"no\x00good {n}")

    good = [step.submit(n) for n in range(8)]
    bad = [broken.submit(n) for n in range(4)]
    app.start(workers=4)
    try:
        recs = _ended(app, [h.id for h in good + bad])
        for n, rec in enumerate(recs[:8]):
            assert rec.status is State.SUCCESS, (rec.status, rec.error)
            assert rec.result_value == f"a\x00b{n}"  # checkpoint data is kept exactly
            assert rec.attempt == (2 if n % 2 else 1)
            assert rec.progress_message == f"half\ufffdway {n}"
            if n % 2:
                assert rec.error is None  # the retry's success clears the first attempt's error
        for n, rec in enumerate(recs[8:]):
            assert rec.status is State.FAILED and rec.attempt == 1
            assert rec.error == f"corral.errors.PermanentError: no\ufffdgood {n}"
    finally:
        app.close(10)


def test_20_mb_of_progress_error_and_checkpoint_are_bounded(url, caplog):
    app = corral.App(url)

    @app.task
    def chatty():
        raise RuntimeError("e" * BIG)

    @app.task
    def hoarder(ctx):
        ctx.progress(0.1, "p" * BIG)
        ctx.checkpoint("small", "fine")
        ctx.checkpoint("big", "c" * BIG)
        return "never"

    @app.task
    def piles(ctx):
        for i in range(4):  # 4 x 300 kB: together over the 1 MiB bound
            ctx.checkpoint(f"part{i}", "d" * 300_000)

    caplog.set_level(logging.INFO, logger="corral")
    ids = [chatty.submit().id, hoarder.submit().id, piles.submit().id]
    app.start(workers=3)
    try:
        chatty_rec, hoarder_rec, piles_rec = _ended(app, ids, timeout=60)
        assert chatty_rec.status is State.FAILED
        assert len(chatty_rec.error) <= texts.MAX_ERROR_CHARS
        assert chatty_rec.error.startswith("RuntimeError: eee") and f"cut: {BIG + 14} characters" in chatty_rec.error
        assert len(chatty_rec.traceback) <= texts.MAX_TRACEBACK_CHARS
        assert hoarder_rec.status is State.FAILED
        assert hoarder_rec.error.startswith("corral.errors.PermanentError: the data of checkpoint 'big':")
        assert "over the limit of 1048576 bytes (App(max_payload_bytes=...) sets it)" in hoarder_rec.error
        assert json.loads(hoarder_rec.checkpoint) == {"small": "fine"}
        message = hoarder_rec.progress_message
        assert len(message) <= texts.MAX_PROGRESS_MESSAGE_CHARS and message.endswith(f"cut: {BIG} characters in all]")
        assert piles_rec.status is State.FAILED and "the task's checkpoints would take" in piles_rec.error
        assert list(json.loads(piles_rec.checkpoint)) == ["part0", "part1", "part2"]
        longest = max(len(r.getMessage()) for r in caplog.records)
        assert longest < texts.MAX_ERROR_CHARS + texts.MAX_TRACEBACK_CHARS + 1_000
    finally:
        app.close(10)


def _deep_failure():
    raise ValueError("nope: the partner said no")


def _tracebacked(url, caplog):
    app = corral.App(url)

    @app.task
    def fails():
        _deep_failure()

    caplog.set_level(logging.WARNING, logger="corral.worker")
    h = fails.submit()
    app.start(workers=1)
    (rec,) = _ended(app, [h.id])
    return app, rec


def test_a_failed_attempt_keeps_its_traceback_shown_by_the_log_and_the_dashboard(url, caplog):
    pytest.importorskip("starlette", reason="the dashboard extra is not installed")
    from corral.edges.dashboard import serve_background

    app, rec = _tracebacked(url, caplog)
    try:
        assert rec.status is State.FAILED and rec.error == "ValueError: nope: the partner said no"
        assert rec.traceback.startswith("Traceback (most recent call last):")
        assert "in _deep_failure" in rec.traceback and rec.traceback.endswith("ValueError: nope: the partner said no")
        line = next(r.getMessage() for r in caplog.records if f"task {rec.id} (" in r.getMessage())
        assert "ended FAILED: ValueError: nope" in line and "in _deep_failure" in line
        dash = serve_background(app.store)
        try:
            with urllib.request.urlopen(f"{dash.url}/tasks/{rec.id}", timeout=10) as resp:
                page = resp.read().decode()
        finally:
            dash.stop()
        assert "Traceback (most recent call last):" in page and "in _deep_failure" in page
    finally:
        app.close(10)


def test_corral_show_prints_the_traceback(durable_url, caplog):
    from corral.cli import cli

    app, rec = _tracebacked(durable_url, caplog)
    app.close(10)
    out = CliRunner().invoke(cli, ["show", str(rec.id), "--store", durable_url], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    assert "Traceback (most recent call last):" in out.output and "in _deep_failure" in out.output
    assert "ValueError: nope: the partner said no" in out.output
    as_json = CliRunner().invoke(cli, ["show", str(rec.id), "--store", durable_url, "--json"], catch_exceptions=False)
    assert "in _deep_failure" in json.loads(as_json.output)["traceback"]


def test_a_process_task_keeps_the_traceback_of_its_child():
    app = corral.App("memory://")

    @app.task(isolation="process")
    def in_child(permanent):
        if permanent:
            _deep_failure()  # ValueError: never retried
        raise ConnectionError("the partner hung up")

    hs = [in_child.submit(True), in_child.submit(False)]
    app.start(workers=2)
    try:
        permanent, transient = _ended(app, [h.id for h in hs])
        assert permanent.status is State.FAILED and permanent.error.endswith("ValueError: nope: the partner said no")
        assert "in _deep_failure" in permanent.traceback and permanent.traceback.startswith("Traceback")
        assert transient.status is State.FAILED and transient.error == "ConnectionError: the partner hung up"
        assert "in in_child" in transient.traceback and transient.traceback.endswith(transient.error)
    finally:
        app.close(10)

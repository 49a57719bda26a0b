"""The command line on big or odd values: ``show`` and ``tasks`` cut big
fields to a readable length and note their full size, ``--json`` carries a
field whole only up to a bound, and ``worker -c`` is bounded."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from corral.cli import cli, render
from corral.core.claims import ClaimRequest
from corral.core.model import NewTask, Outcome, dumps
from corral.core.states import State
from corral.stores import open_store
from helpers import ARGS

REPO = Path(__file__).resolve().parent.parent


def run(*args: str, code: int = 0):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result


@pytest.fixture
def big_task(sqlite_url):
    """A finished task whose arguments, result and error are far past what a
    table shows (written straight to the store, as by an app with a raised
    payload cap; an error is kept up to corral.core.texts.MAX_ERROR_CHARS),
    and one due in a year no calendar shows."""
    store = open_store(sqlite_url)
    store.migrate()
    args = dumps({"args": ["a" * (render.JSON_FIELD_CHARS + 10)], "kwargs": {}})
    (res,) = store.submit([NewTask(name="big", args=args)])
    (claim,) = store.claim("w", ClaimRequest(["default"], 1, lease_seconds=30))
    rec = claim.tasks[0]
    store.complete(
        [Outcome(rec.id, claim.token, rec.version, State.FAILED, result=dumps("r" * 50_000), error="E" * 5_000 + "\n")]
    )
    (far,) = store.submit([NewTask(name="far", args=ARGS, run_at=1e12)])
    store.close()
    return sqlite_url, res.id, len(args), far.id


def test_show_cuts_big_fields_and_notes_their_size(big_task):
    url, tid, args_len, _ = big_task
    out = run("show", str(tid), "--store", url).stdout
    flat = re.sub(r"[\s│]", "", out)  # the table folds long values across lines
    assert f"[truncated:{args_len}charactersinall" in flat
    assert "[truncated:50002charactersinall" in flat  # the result, as JSON
    assert "[truncated:5001charactersinall" in flat  # the error
    assert len(out) < 20 * render.TABLE_FIELD_CHARS


def test_show_json_carries_a_field_whole_only_up_to_a_bound(big_task):
    url, tid, args_len, _ = big_task
    d = json.loads(run("show", str(tid), "--store", url, "--json").stdout)
    assert d["truncated"] == {"args": args_len}
    assert len(d["args"]) == render.JSON_FIELD_CHARS and d["args"].startswith('{"args":["aaa')
    assert d["result"] == "r" * 50_000 and len(d["error"]) == 5_001  # under the bound: whole, decoded
    assert str(render.JSON_FIELD_CHARS) in run("show", "--help").stdout


def test_tasks_lists_big_rows_briefly(big_task):
    url, tid, args_len, _ = big_task
    out = run("tasks", "--store", url).stdout
    assert "E" * 80 in out and "E" * 81 not in out
    rows = {r["id"]: r for r in json.loads(run("tasks", "--store", url, "--json").stdout)}
    assert rows[tid]["truncated"] == {"args": args_len}


def test_show_prints_a_time_past_the_calendar(big_task):
    url, _, _, far = big_task
    assert "1000000000000.0 (epoch seconds)" in run("show", str(far), "--store", url).stdout


def test_worker_concurrency_is_bounded(sqlite_url, monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("CORRAL_STORE", raising=False)
    result = run("worker", "examples.shop:app", "--store", sqlite_url, "-c", "100000", code=2)
    assert "100000 is not in the range 1<=x<=1000" in result.output
    assert "1 to 1000 per process" in " ".join(run("worker", "--help").stdout.split())


def test_worker_prefetch_is_bounded_and_documented(sqlite_url, monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("CORRAL_STORE", raising=False)
    result = run("worker", "examples.shop:app", "--store", sqlite_url, "--prefetch", "-1", code=2)
    assert "-1 is not in the range 0<=x<=10000" in result.output
    help_text = " ".join(run("worker", "--help").stdout.split())
    assert "--prefetch" in help_text and "never tasks under a limit" in help_text

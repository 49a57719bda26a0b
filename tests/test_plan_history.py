"""``corral plan --from-history``: the formulas filled in with what a store
measured, on a store seeded with known durations (a fake clock moves time)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from corral.cli import cli
from corral.core.claims import ClaimRequest
from corral.core.clock import FakeClock
from corral.core.model import NewTask, Outcome
from corral.core.states import State
from corral.stores import open_store
from helpers import ARGS


@pytest.fixture
def seeded(sqlite_url):
    """Task ``sync``: 10 runs of 1..10 s one after another (the 3rd and 8th
    fail); task ``other``: 2 runs; ``sync`` runs are in batch ``b``."""
    clock = FakeClock(start=1_000_000.0)
    store = open_store(sqlite_url, clock=clock)
    store.submit([NewTask("sync", ARGS, batch="b") for _ in range(10)] + [NewTask("other", ARGS) for _ in range(2)])
    for i in range(12):
        (c,) = store.claim("w", ClaimRequest(["default"], 1))
        t = c.tasks[0]
        clock.advance(i + 1 if i < 10 else 100)
        status = State.FAILED if i in (2, 7) else State.SUCCESS
        assert store.complete([Outcome(t.id, c.token, t.version, status)]) == [True]
    store.close()
    return sqlite_url


def run(*args):
    return CliRunner().invoke(cli, ["plan", *args])


def test_json_shows_every_measured_value_and_the_filled_formulas(seeded):
    result = run(
        "--from-history", "sync", "--store", seeded, "--qps", "10", "--target", "720", "--target-hours", "1", "--json"
    )
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    h = d["history"]
    assert (h["read"], h["successes"], h["failures"]) == (10, 8, 2)
    assert (h["p50_s"], h["p99_s"], h["mean_s"], h["window_s"]) == (5.0, 10.0, 5.5, 55.0)
    assert h["success_rate"] == 0.8
    # Little's law: 720/h = 0.2/s x 5.5 s = 1.1 -> 2; with 80% success 1.375 -> 2
    assert d["required"]["required_concurrency"] == pytest.approx(1.1) and d["required"]["required_workers"] == 2
    assert d["required_with_retries"] == pytest.approx(1.375) and d["workers_with_retries"] == 2
    # the limit: 10 QPS x 5.5 s x 0.7 = 38.5 -> 38
    assert d["limit"]["theoretical"] == pytest.approx(55.0) and d["limit"]["limit"] == 38


def test_text_shows_the_formulas_and_the_limit_line(seeded):
    result = run("--from-history", "sync", "--store", seeded, "--qps", "10")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "p50 duration" in out and "5 s" in out and "8 / 10 = 80.0%" in out
    assert "10 QPS x 5.5s = 55" in out and "55 x 0.7 = 38.5 -> 38" in out
    assert 'app.limit("sync", concurrency=110, rate="7/s")' in out


def test_a_batch_is_measured_alone(seeded):
    result = run("--batch", "b", "--store", seeded, "--json")
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    assert d["history"]["read"] == 10 and d["history"]["subject"] == "batch 'b'" and d["qps_measured"]
    text = run("--batch", "b", "--store", seeded).stdout
    assert 'app.batch("b", concurrency=' in text


def test_the_sample_bounds_what_is_read(seeded):
    d = json.loads(run("--from-history", "sync", "--store", seeded, "--sample", "4", "--json").stdout)
    # the newest four: runs of 7..10 s, one of them failed
    assert d["history"]["read"] == 4 and d["history"]["mean_s"] == 8.5 and d["history"]["failures"] == 1


def test_unknown_task_and_mixed_options_are_one_line_errors(seeded):
    result = run("--from-history", "nope", "--store", seeded)
    assert result.exit_code == 1 and "has no finished task" in result.output
    result = run("--from-history", "sync", "--store", seeded, "--done", "5")
    assert result.exit_code == 2 and "--done does not go with --from-history" in result.output

"""``corral pause`` / ``corral resume``: one of --queue, --group, --limit;
what is paused shows in ``corral status`` (and --json) and in the events;
bad input is a one-line error with a non-zero exit."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import corral
from corral.cli import cli


@pytest.fixture
def url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'pauses.db'}"


def run(url: str, *args: str):
    return CliRunner().invoke(cli, [*args, "--store", url], catch_exceptions=False)


def test_pause_shows_in_status_and_resume_ends_it(url):
    got = run(url, "pause", "--queue", "emails", "--by", "ops")
    assert got.exit_code == 0 and got.stdout.strip() == "queue emails paused"
    assert run(url, "pause", "--queue", "emails").stdout.strip() == "queue emails was already paused"
    assert run(url, "pause", "--limit", "partner_api").exit_code == 0
    status = json.loads(run(url, "status", "--json").stdout)
    assert [(p["kind"], p["name"], p["by"]) for p in status["paused"]] == [
        ("queue", "emails", "ops"),
        ("limit", "partner_api", status["paused"][1]["by"]),
    ]
    assert "paused: queue emails since " in run(url, "status").stdout
    got = run(url, "resume", "--queue", "emails")
    assert got.exit_code == 0 and got.stdout.strip() == "queue emails resumed"
    assert [p["name"] for p in json.loads(run(url, "status", "--json").stdout)["paused"]] == ["partner_api"]
    with corral.App(url) as app:
        kinds = [json.loads(e.data) for e in app.store.events("pause")]
    assert [(d["name"], d["paused"]) for d in reversed(kinds)] == [
        ("emails", True),
        ("partner_api", True),
        ("emails", False),
    ]


def test_resuming_what_is_not_paused_says_so_and_succeeds(url):
    got = run(url, "resume", "--group", "g1")
    assert got.exit_code == 0
    assert got.stdout.strip() == "group g1 is not paused: nothing to resume"


@pytest.mark.parametrize(
    "args",
    [
        ("pause",),
        ("pause", "--queue", "a", "--group", "b"),
        ("resume", "--limit", ""),
        ("resume",),
        ("pause", "--limit", "merchant\x1fm-1"),
    ],
    ids=["none", "two", "empty", "resume-none", "one-key"],
)
def test_bad_targets_are_one_line_errors(url, args):
    assert run(url, "pause", "--queue", "kept").exit_code == 0
    got = CliRunner().invoke(cli, [*args, "--store", url])
    assert got.exit_code != 0
    assert len(got.output.strip().splitlines()) == 1, got.output
    assert got.output.startswith("error: ")
    assert [p["name"] for p in json.loads(run(url, "status", "--json").stdout)["paused"]] == ["kept"]

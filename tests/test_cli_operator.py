"""What an operator reads on the command line says what the dashboard says:
every read command prints JSON with ``--json``, titles fit the terminal, and
a level prints its name."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import corral
from corral.cli import cli

#: Every command that only reads, with the arguments it needs on the store the test fills.
READS = [
    ("status",),
    ("tasks",),
    ("show", "1"),
    ("why", "2"),
    ("dead",),
    ("events",),
    ("periodic",),
    ("breaker",),
    ("breaker", "show"),
    ("level",),
    ("level", "show"),
    ("limit",),
    ("limit", "show"),
    ("batch", "show", "b1", "--once"),
    ("plan", "--qps", "100", "--latency-ms", "200"),
    ("workers",),
]


@pytest.fixture
def url(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'ops.db'}"
    app = corral.App(url)
    app.limit("partner_api", concurrency=2)
    app.breaker("partner_api", min_calls=5)

    @app.task
    def t(x: int) -> int:
        return x

    for i in range(3):
        t.submit(i, batch="b1")
    app.close()
    return url


@pytest.mark.parametrize("cmd", READS, ids=" ".join)
def test_every_read_command_prints_json(cmd, url):
    got = CliRunner().invoke(cli, [*cmd, "--json", "--store", url], catch_exceptions=False)
    assert got.exit_code == 0, got.output
    if cmd == ("events",):  # one object a line, so that --follow streams them
        # the limit's declaration, then the tasks
        assert [json.loads(ln)["kind"] for ln in got.stdout.splitlines()] == ["limit"] + ["submitted"] * 3
    else:
        json.loads(got.stdout)


def test_breaker_show_json_says_what_the_table_says(url):
    run = CliRunner()
    run.invoke(cli, ["breaker", "open", "partner_api", "--reason", "partner outage", "--store", url])
    data = json.loads(run.invoke(cli, ["breaker", "show", "--json", "--store", url]).stdout)
    b = data["breakers"]["partner_api"]
    assert b["state"] == "OPEN" and b["forced"] is True and b["config"]["min_calls"] == 5
    assert [(c["before"], c["after"], c["reason"]) for c in data["changes"]] == [("CLOSED", "OPEN", "partner outage")]


def test_the_status_title_fits_a_wide_terminal(tmp_path):
    deep = tmp_path / ("a-long-directory-name-" * 3) / "and-deeper-still"
    deep.mkdir(parents=True)
    url = f"sqlite:///{deep / 'ops.db'}"
    corral.App(url).close()
    got = CliRunner().invoke(cli, ["status", "--store", url], env={"COLUMNS": "200"}, catch_exceptions=False)
    assert got.exit_code == 0, got.output
    assert f"store {url}" in got.stdout.splitlines()  # one line, not pieces as wide as the table


def test_a_level_prints_its_name_and_still_compares_as_a_number(url):
    app = corral.App(url)
    try:
        assert str(app.level()) == "L0 NORMAL" and f"{app.level()}" == "L0 NORMAL"
        app.set_level("DEGRADED", reason="test")
        lv = app.level()
        assert str(lv) == "L2 DEGRADED" and lv == 2 and lv > corral.Level.WARNING
    finally:
        app.close()
    out = CliRunner().invoke(cli, ["level", "--store", url]).stdout
    assert out.startswith("L2 DEGRADED (set by hand)")

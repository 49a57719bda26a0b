"""The ``corral`` command line as a whole: every command is listed and has
help, user-facing text says what the rules are, and the worker's and the
sweeper's wait for SIGTERM neither polls nor loses a signal."""

from __future__ import annotations

import os
import re
import signal

import click
import pytest
from click.testing import CliRunner

from corral.cli import cli, main
from corral.engine.foreground import StopSignals

COMMANDS = [
    "batch",
    "bench",
    "breaker",
    "cancel",
    "dashboard",
    "dead",
    "demo",
    "events",
    "level",
    "limit",
    "pause",
    "periodic",
    "plan",
    "prune",
    "resume",
    "retry",
    "show",
    "status",
    "submit",
    "sweep",
    "tasks",
    "why",
    "worker",
    "workers",
]


def _all_commands(group: click.Group, prefix: tuple[str, ...] = ()):
    for name, command in sorted(group.commands.items()):
        yield (*prefix, name), command
        if isinstance(command, click.Group):
            yield from _all_commands(command, (*prefix, name))


def test_help_lists_every_command():
    out = CliRunner().invoke(cli, ["--help"]).stdout
    listed = re.findall(r"^  (\w+)  ", out.split("Commands:", 1)[1], flags=re.MULTILINE)
    assert listed == COMMANDS
    assert sorted(cli.commands) == COMMANDS


@pytest.mark.parametrize("path", [p for p, _ in _all_commands(cli)], ids=" ".join)
def test_every_command_has_help(path):
    result = CliRunner().invoke(cli, [*path, "--help"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("Usage: ")


def test_no_help_text_cites_design_notes():
    for path, _command in [((), cli), *_all_commands(cli)]:
        text = CliRunner().invoke(cli, [*path, "--help"]).stdout
        assert not re.search(r"seeds? \d{3}|seeds'|§", text, flags=re.IGNORECASE), (path, text)


def test_plan_output_cites_no_design_notes():
    text = CliRunner().invoke(cli, ["plan"]).stdout
    assert not re.search(r"seeds? \d{3}|seeds'|§", text, flags=re.IGNORECASE), text


def test_plan_with_a_known_mean_keeps_an_exact_integer():
    # 10 tasks in 1 h at 30 min each is 5 in flight, not 6.
    result = CliRunner().invoke(cli, ["plan", "--target", "10", "--target-hours", "1", "--mean", "30m", "--json"])
    assert '"required_workers": 5' in result.stdout


def test_main_takes_argv(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["plan", "--qps", "100"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip() == "error: (a) needs both --qps and --latency-ms"


# ---- StopSignals: what `corral worker` and `corral sweep --loop` wait on -------------------------
def test_a_signal_before_wait_is_not_lost_and_handlers_come_back():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    seen = []
    with StopSignals(seen.append) as signals:
        os.kill(os.getpid(), signal.SIGTERM)  # handled at once, in this (the main) thread
        signals.wait()  # returns: the signal came before the wait
        os.kill(os.getpid(), signal.SIGINT)
        signals.wait()
    assert seen == ["SIGTERM", "SIGINT"]
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_the_forced_exit_code_is_the_foreground_runs():
    from corral.cli import EXIT_FORCED
    from corral.engine import foreground

    assert EXIT_FORCED == foreground.EXIT_FORCED == 3


def test_plan_prints_the_limit_line_to_paste():
    from click.testing import CliRunner

    from corral.cli import cli

    out = CliRunner().invoke(cli, ["plan", "--qps", "100", "--latency-ms", "120"]).output
    # the rate holds the safety margin (70 % of the cap) in any sliding second,
    # with no burst; the concurrency twice what is in flight at the cap
    assert 'app.limit("downstream", concurrency=24, rate="70/s")' in out


def test_breaker_open_show_close(tmp_path):
    from click.testing import CliRunner

    import corral
    from corral.cli import cli

    url = f"sqlite:///{tmp_path}/b.db"
    app = corral.App(url)
    app.breaker("partner_api", min_calls=5)
    app.close()
    run = CliRunner()
    opened = run.invoke(cli, ["breaker", "open", "partner_api", "--reason", "partner outage", "--store", url])
    assert opened.exit_code == 0 and "CLOSED -> OPEN" in opened.output
    shown = run.invoke(cli, ["breaker", "show", "--store", url]).output
    assert "partner_api: OPEN (forced)" in shown and "partner outage" in shown
    closed = run.invoke(cli, ["breaker", "close", "partner_api", "--store", url])
    assert closed.exit_code == 0 and "OPEN -> CLOSED" in closed.output
    unknown = run.invoke(cli, ["breaker", "close", "nope", "--store", url])
    assert unknown.exit_code == 1 and "no breaker named 'nope'" in unknown.output


def test_plan_shows_the_numbers_of_the_limit_it_advises():
    """Every number of the advised app.limit line is the result of a row of
    the table above it: the table and the advice never disagree."""
    import re

    from click.testing import CliRunner

    from corral.cli import cli

    for args in (["--qps", "100", "--latency-ms", "120"], []):
        out = CliRunner().invoke(cli, ["plan", *args]).output
        line = next(ln for ln in out.splitlines() if "app.limit(" in ln and "concurrency=" in ln)
        advised = dict(re.findall(r'(\w+)="?(\d+)', line.split("#")[0]))
        results = {}
        for row in out.splitlines():
            cells = [c.strip() for c in row.strip("│ ").split("│")]
            if len(cells) == 2 and "->" in cells[1]:
                results[cells[0]] = cells[1].split("->")[1].split()[0].rstrip("/s")
        assert results["concurrency"] == advised["concurrency"], out
        assert results["rate (holds the safety margin)"] == advised["rate"], out
        assert "burst" not in advised and "burst" not in results, out

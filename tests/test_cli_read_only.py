"""Commands that only read never create a store: run in the wrong directory,
or given a mistyped path, they say so in one line and exit non-zero, and no
file (nor, on PostgreSQL, no table) is left behind."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

import corral
from corral.cli import cli

#: Every command that only reads, with the arguments it needs.
READ_ONLY = [
    ("status",),
    ("tasks",),
    ("show", "1"),
    ("why", "1"),
    ("dead",),
    ("events",),
    ("periodic",),
    ("breaker",),
    ("breaker", "show"),
    ("level",),
    ("level", "show"),
    ("limit",),
    ("limit", "show"),
    ("batch", "show", "b"),
    ("workers",),
    ("plan", "--from-history", "t"),
    # not reads, but deleting from or changing a store that is not there is a mistake too
    ("prune", "--older-than", "7d"),
    ("limit", "set", "api", "--concurrency", "2"),
    ("limit", "reset", "api"),
]


def _ids(cmd: tuple[str, ...]) -> str:
    return " ".join(cmd)


def _one_line_error(result, *needles: str) -> str:
    assert result.exit_code != 0, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _run(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False, env=env)


@pytest.mark.parametrize("cmd", READ_ONLY, ids=_ids)
def test_in_the_wrong_directory_a_read_creates_no_store(cmd, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CORRAL_STORE", raising=False)
    got = _run(*cmd)
    _one_line_error(got, "no corral store", str(tmp_path / "corral.db"), "does not exist")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("cmd", READ_ONLY, ids=_ids)
def test_a_mistyped_absolute_path_creates_no_store(cmd, tmp_path):
    wrong = tmp_path / "corall.db"
    got = _run("--store", f"sqlite:///{wrong}", *cmd)
    _one_line_error(got, "does not exist")
    assert not wrong.exists()
    got = _run(*cmd, env={"CORRAL_STORE": f"sqlite:///{wrong}"})
    _one_line_error(got, "does not exist")
    assert not wrong.exists()


def test_a_file_that_is_not_a_store_is_left_alone(tmp_path):
    other = tmp_path / "notes.db"
    other.write_bytes(b"")
    _one_line_error(_run("--store", f"sqlite:///{other}", "status"), "holds no corral tables")
    assert other.read_bytes() == b""


def test_an_existing_store_is_read(sqlite_url):
    corral.App(sqlite_url).close()
    for cmd in READ_ONLY:
        got = _run("--store", sqlite_url, *cmd)
        assert "no corral store" not in got.output, (cmd, got.output)


def test_a_postgresql_database_without_corral_gets_no_tables(pg_empty_url):
    import psycopg

    for cmd in READ_ONLY:
        _one_line_error(_run("--store", pg_empty_url, *cmd), "no corral store", "no corral tables")
    with psycopg.connect(pg_empty_url) as conn:
        tables = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()").fetchone()[0]
    assert tables == 0
    corral.App(pg_empty_url).close()
    assert "no corral store" not in _run("--store", pg_empty_url, "status").output

"""Debounce and newest-wins through an app: options checked at @app.task and
at submit, one run per debounce group (also from several submitting
processes), and a newer submit stopping a running task of its key."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest
from click.testing import CliRunner

import corral
from corral import State
from corral.cli import cli
from corral.core.model import SUPERSEDED
from corral.errors import BadArguments, ConfigError
from helpers import wait_for

APPS = os.path.join(os.path.dirname(__file__), "apps")


@pytest.fixture
def app(url):
    a = corral.App(url)
    yield a
    a.close(timeout=10)


# ---- checks ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"debounce_max": "1m"}, "debounce_max needs debounce"),
        ({"debounce": "1m", "debounce_max": "5s"}, "debounce_max (5s) must be at least debounce (60s)"),
        ({"debounce": "soon"}, "debounce must be seconds or a duration"),
        ({"debounce": -1}, "debounce"),
        ({"debounce": 0}, "debounce"),
    ],
)
def test_bad_debounce_options_are_refused_in_one_line(options, says):
    app = corral.App("memory://")
    with pytest.raises(ConfigError) as err:
        app.task(name="t", **options)(lambda: None)
    assert says in str(err.value) and "\n" not in str(err.value)
    assert "t" not in app.task_names


def test_bad_keys_are_refused_in_one_line():
    app = corral.App("memory://")
    plain = app.task(name="plain")(lambda: None)
    deb = app.task(name="deb", debounce="5s")(lambda: None)
    cases = [
        (lambda: plain.submit(debounce_key="k"), "task plain has no debounce"),
        (lambda: deb.submit(), "submit it with debounce_key="),
        (lambda: deb.submit(debounce_key="a\x00b"), "debounce_key must not contain a NUL"),
        (lambda: deb.submit(debounce_key="k" * 300), "debounce_key must be 1 to 255 characters"),
        (lambda: deb.submit(debounce_key=7), "debounce_key must be a string"),
        (lambda: deb.submit(debounce_key="k", delay=5), "takes no delay"),
        (lambda: plain.submit(supersede_key=""), "supersede_key must be 1 to 255 characters"),
        (lambda: plain.submit(supersede_key="a\x00"), "supersede_key must not contain a NUL"),
    ]
    for call, says in cases:
        with pytest.raises(BadArguments) as err:
            call()
        assert says in str(err.value) and "\n" not in str(err.value)
    assert app.tasks() == []


# ---- debounce -------------------------------------------------------------------------


def test_every_submit_of_a_debounce_group_returns_the_one_task_that_runs(app):
    runs: list[int] = []

    @app.task(debounce="0.3s", debounce_max="1m")
    def reindex(shop, n):
        runs.append(n)
        return n

    handles = [reindex.submit(7, n, debounce_key="shop-7") for n in range(5)]
    assert len({h.id for h in handles}) == 1
    assert handles[0].created and not any(h.created for h in handles[1:])
    app.start(workers=2)
    assert handles[0].result(timeout=10) == 4
    assert runs == [4]
    assert [t.id for t in app.tasks(name="reindex")] == [handles[0].id]


# ---- newest wins ----------------------------------------------------------------------


def test_a_newer_submit_cancels_the_queued_ones_with_a_reason(app):
    @app.task
    def render(doc, version):
        return version

    old = [render.submit("doc-9", v, supersede_key="doc-9") for v in range(3)]
    newest = render.submit("doc-9", 3, supersede_key="doc-9")
    for h in old:
        rec = h.get()
        assert rec.status is State.CANCELED and rec.error == SUPERSEDED
    app.start(workers=1)
    assert newest.result(timeout=10) == 3


def test_a_newer_submit_stops_a_running_task_that_checks(app):
    started = threading.Event()
    stopped = threading.Event()

    @app.task
    def render(ctx, doc, version):
        if version > 1:
            return version
        started.set()
        deadline = time.monotonic() + 30  # the workload: it polls until told to stop
        while time.monotonic() < deadline:
            try:
                ctx.check_cancelled()
            except BaseException:
                stopped.set()
                raise
            time.sleep(0.01)
        return "ran to the end"

    first = render.submit("doc-9", 1, supersede_key="doc-9")
    app.start(workers=2)
    wait_for(started.is_set, message="the first render started")
    newest = render.submit("doc-9", 2, supersede_key="doc-9")
    wait_for(lambda: first.status() is State.CANCELED, timeout=20, message="the running render stopped")
    assert stopped.is_set()
    assert first.get().error == SUPERSEDED  # not a plain "canceled": why it stopped
    assert newest.result(timeout=20) == 2


def _write_pid_then_hang(path):
    """A task body that never returns on its own (it is the workload, not a wait)."""
    with open(path, "w") as f:
        f.write(str(os.getpid()))
    while True:
        time.sleep(0.05)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie counts as dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_newer_submit_kills_a_running_process_task(app, tmp_path):
    render = app.task(isolation="process", name="render")(_write_pid_then_hang)
    pidfile = tmp_path / "pid"
    first = render.submit(str(pidfile), supersede_key="doc-9")
    app.start(workers=1)
    pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text(), timeout=20, message="the child started"))
    render.submit(str(tmp_path / "pid2"), supersede_key="doc-9")
    wait_for(lambda: first.status() is State.CANCELED, timeout=20, message="the process task was canceled")
    assert first.get().error == SUPERSEDED
    wait_for(lambda: not _pid_alive(pid), timeout=20, message="its child process was killed")


# ---- across processes -----------------------------------------------------------------


@pytest.mark.parametrize("submitters", [2, 3])
def test_submitting_processes_hammering_one_key_get_one_run_with_the_last_arguments(
    durable_url, processes, tmp_path, submitters
):
    count = 60
    procs = [
        processes.start(
            [sys.executable, os.path.join(APPS, "debounce_submitter.py")],
            name=f"submitter-{i}",
            store=durable_url,
            env={"TAG": f"p{i}", "COUNT": count, "IDS": tmp_path / f"ids-{i}"},
        )
        for i in range(submitters)
    ]
    for p in procs:
        assert p.wait(timeout=120) == 0, p.log
    ids = {int(x) for i in range(submitters) for x in (tmp_path / f"ids-{i}").read_text().split()}
    assert len(ids) == 1, f"{len(ids)} tasks for one debounce group"
    (task_id,) = ids

    app = corral.App(durable_url)

    @app.task(debounce="1s", debounce_max="2s")
    def reindex(tag, n):
        return [tag, n]

    try:
        app.start(workers=2)
        assert app.wait(task_id, timeout=30).status is State.SUCCESS
        assert [t.id for t in app.tasks(name="reindex")] == [task_id]
        tag, n = app.get(task_id).result_value
        # the last submit committed is the last of one of the processes
        assert n == count - 1 and tag in {f"p{i}" for i in range(submitters)}
    finally:
        app.close(timeout=10)


def test_corral_show_says_a_task_was_superseded(sqlite_url):
    app = corral.App(sqlite_url)
    render = app.task(name="render")(lambda doc: doc)
    try:
        old = render.submit("doc-9", supersede_key="doc-9")
        render.submit("doc-9", supersede_key="doc-9")
    finally:
        app.close(timeout=10)
    result = CliRunner().invoke(cli, ["show", str(old.id), "--store", sqlite_url], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "CANCELED" in result.output and SUPERSEDED in result.output

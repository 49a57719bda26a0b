"""``corral why ID``: the main reason first, then the others; JSON with
``--json``; an unknown id is one line and a non-zero exit."""

from __future__ import annotations

import json

from click.testing import CliRunner

from corral.cli import cli
from corral.core.claims import ClaimRequest
from corral.core.model import LimitSpec, NewTask, WorkerInfo
from corral.stores import open_store
from helpers import wait_for


def test_why_names_the_head_its_dead_worker_and_the_full_limit(tmp_path):
    url = f"sqlite:///{tmp_path / 'why.db'}"
    store = open_store(url)
    store.migrate()
    store.set_limit(LimitSpec("partner", concurrency=1))
    store.report_worker(WorkerInfo("vm-2:7:ok", "vm-2", 7, ("default",), 4, 0, "1.0", 5.0))
    head, behind = (r.id for r in store.submit([NewTask("charge", "{}", group="acct-1", limits=("partner",))] * 2))
    store.claim("vm-1:99:gone", ClaimRequest(("default",), 1, lease_seconds=0.05))
    wait_for(lambda: store.now() > store.get(head).lease_expires_at, timeout=5)
    store.close()

    got = CliRunner().invoke(cli, ["why", str(behind), "--store", url], catch_exceptions=False)
    assert got.exit_code == 0, got.output
    lines = got.stdout.splitlines()
    assert lines[0] == f"task {behind} (charge) PENDING, queue default"
    assert lines[1].startswith(
        f"why: behind its group's head, task {head} (charge), RUNNING on worker vm-1:99:gone (dead: lease lost"
    )
    assert lines[2] == "also: limit 'partner' full: 1 of 1 running"

    got = CliRunner().invoke(cli, ["why", str(behind), "--json", "--store", url], catch_exceptions=False)
    data = json.loads(got.stdout)
    assert [r["kind"] for r in data["reasons"]] == ["group", "limit"]
    assert (data["reasons"][0]["head_id"], data["reasons"][0]["worker_alive"]) == (head, False)

    got = CliRunner().invoke(cli, ["why", "999", "--store", url], catch_exceptions=False)
    assert got.exit_code == 1
    assert got.stderr.strip().splitlines() == ["error: no task with id 999"]


def test_a_list_of_waiting_tasks_says_why_each_waits_within_the_terminal(tmp_path):
    url = f"sqlite:///{tmp_path / 'list.db'}"
    store = open_store(url)
    store.migrate()
    store.set_limit(LimitSpec("partner", concurrency=1))
    store.report_worker(WorkerInfo("vm-2:7:ok", "vm-2", 7, ("default",), 4, 0, "1.0", 5.0))
    store.submit([NewTask("charge", "{}", limits=("partner",))])
    store.claim("vm-2:7:ok", ClaimRequest(("default",), 1))
    full, paused, ready = (
        r.id
        for r in store.submit(
            [
                NewTask("charge", "{}", limits=("partner",)),
                NewTask("mail", "{}", queue="emails"),
                NewTask("sync", "{}"),
            ]
        )
    )
    store.report_worker(WorkerInfo("vm-2:7:ok", "vm-2", 7, ("default", "emails"), 4, 0, "1.0", 5.0))
    store.pause("queue", "emails", "ops")
    store.close()
    run = ["tasks", "--status", "PENDING", "--store", url]

    got = CliRunner().invoke(cli, [*run, "--json"], catch_exceptions=False)
    rows = {r["id"]: r for r in json.loads(got.stdout)}
    assert rows[full]["why"] == "limit 'partner' full: 1 of 1 running"
    assert rows[paused]["reasons"][0]["kind"] == "paused" and rows[ready]["why"] == "ready: next to be claimed"
    got = CliRunner().invoke(cli, [*run, "--sort", "age", "--json"], catch_exceptions=False)
    assert [r["why"] for r in json.loads(got.stdout)][0] == "limit 'partner' full: 1 of 1 running"

    for width in (80, 200):
        got = CliRunner().invoke(cli, run, env={"COLUMNS": str(width)}, catch_exceptions=False)
        lines = got.stdout.splitlines()
        assert max(map(len, lines)) <= width
        assert "Why" in lines[2] and "Created" not in got.stdout
        assert "full: 1 of 1" in got.stdout and "paused by hand" in got.stdout
    wide = " ".join(CliRunner().invoke(cli, run, env={"COLUMNS": "200"}).stdout.split())
    assert "queue 'emails' paused by hand by ops" in wide and "ready: next to be claimed" in wide

    got = CliRunner().invoke(cli, ["tasks", "--status", "RUNNING", "--store", url, "--json"], catch_exceptions=False)
    assert "why" not in json.loads(got.stdout)[0]  # a list of work under way says nothing of waiting

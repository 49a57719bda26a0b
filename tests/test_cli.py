"""The ``corral`` command line: one-line errors, and a round trip on SQLite.

Each invocation opens the store afresh, so state seen by a later command was
really persisted by an earlier one.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import corral
from corral.cli import cli
from corral.core.claims import ClaimRequest
from corral.core.clock import FakeClock
from corral.core.model import NewTask, Outcome, dumps
from corral.core.states import State
from corral.stores import open_store
from helpers import ARGS, wait_for

REPO = Path(__file__).resolve().parent.parent
SHOP = "examples.shop:app"


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    """Commands import APP from the current directory, like `corral worker` run from the repo root.
    CORRAL_STORE is restored afterwards (loading an APP with --store sets it)."""
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("CORRAL_STORE", raising=False)


def run(*args: str, ok: bool = True):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    if ok:
        assert result.exit_code == 0, f"corral {' '.join(args)} -> {result.exit_code}\n{result.output}"
    return result


def run_json(*args: str):
    return json.loads(run(*args, "--json").stdout)


def assert_one_line_error(result, *needles: str) -> str:
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one error line, got: {result.stderr!r}"
    assert lines[0].startswith("error: "), lines
    for needle in needles:
        assert needle.lower() in lines[0].lower(), lines[0]
    assert result.stdout == ""
    return lines[0]


# ---- bad input: non-zero exit, one line, no traceback ------------------------------------
@pytest.mark.parametrize(
    "args,needle",
    [
        (["show", "999"], "no task with id 999"),
        (["cancel", "999"], "no task with id 999"),
        (["retry", "999"], "no task with id 999"),
        (["show", "abc"], "not a valid integer"),
        (["retry"], "a task ID, --batch B, --stale"),
        (["retry", "1", "--batch", "b"], "give one of"),
        (["retry", "--batch", "nope"], "no batch named 'nope'"),
        (["status", "--batch", "nope"], "no batch named 'nope'"),
        (["tasks", "--status", "BOGUS"], "invalid value"),
        (["worker", "examples.shop"], "module:attribute"),
        (["worker", "no_such_module_xyz:app"], "no module named 'no_such_module_xyz'"),
        (["worker", "examples.shop:nope"], "no attribute 'nope'"),
        (["worker", "json:dumps"], "not a corral.App"),
        (["worker", SHOP, "--lease", "soon"], "cannot parse duration"),
        (["submit", "no_such_task", "[]", "--app", SHOP], "unknown task 'no_such_task'"),
        (["submit", "sync_sku", "[not json", "--app", SHOP], "ARGS_JSON is not valid JSON"),
        (["submit", "sync_sku", '{"sku_id": "A1"}', "--app", SHOP], "must be a JSON array"),
        (["submit", "sync_sku", '["A1"]', "--app", SHOP, "--kwargs", "[1]"], "must be a JSON object"),
        (["submit", "sync_sku", '["A1"]'], "missing option '--app'"),
        (["submit", "sync_sku", '["A1"]', "--app", SHOP, "--delay", "later"], "cannot parse duration"),
        (["sweep", "--stale-pending-age", "old"], "cannot parse duration"),
        (["dashboard", "--host", "0.0.0.0"], "without --token"),
        (["plan", "--qps", "100"], "needs both --qps and --latency-ms"),
        (["plan", "--qps", "100", "--latency-ms", "200", "--safety", "3"], "safety factor"),
        (["nosuchcommand"], "no such command"),
    ],
)
def test_bad_input_is_one_line_and_non_zero(sqlite_url, args, needle):
    corral.App(sqlite_url).close()  # the store exists: commands that only read never create one
    result = run(*args, "--store", sqlite_url, ok=False) if args[0] != "nosuchcommand" else run(*args, ok=False)
    assert_one_line_error(result, needle)


@pytest.mark.parametrize(
    "url,needle",
    [
        ("bogus", "cannot parse store URL"),
        ("redis://localhost/0", "cannot parse store URL"),
        ("sqlite:///no/such/dir/corral.db", "does not exist"),
    ],
)
def test_bad_or_unreachable_store_is_one_line(url, needle):
    for args in (["status"], ["tasks"], ["show", "1"], ["sweep"]):
        assert_one_line_error(run(*args, "--store", url, ok=False), needle)


def test_unreachable_postgres_is_one_line():
    # Nothing listens on port 1: the connection is refused at once.
    result = run("status", "--store", "postgresql://corral@127.0.0.1:1/corral?connect_timeout=2", ok=False)
    assert_one_line_error(result)


def test_broken_app_module_is_one_line(tmp_path, monkeypatch, sqlite_url):
    (tmp_path / "broken_app.py").write_text(
        "import corral\napp = corral.App()\nraise RuntimeError('boom\\nsecond line')\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    line = assert_one_line_error(run("worker", "broken_app:app", "--store", sqlite_url, ok=False), "RuntimeError: boom")
    assert "second line" not in line


def test_help_and_no_arguments_exit_zero():
    assert "worker" in run("--help").stdout
    assert "Usage" in run().stdout
    assert "--grace" in run("worker", "--help").stdout


def test_python_dash_m_corral_is_the_same_cli(sqlite_url):
    corral.App(sqlite_url).close()
    proc = subprocess.run(
        [sys.executable, "-m", "corral", "show", "12345", "--store", sqlite_url],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip() == "error: no task with id 12345"
    assert proc.stdout == ""


# ---- round trip on SQLite -----------------------------------------------------------------
def test_submit_status_tasks_show_cancel_retry_round_trip(sqlite_url):
    s = ("--store", sqlite_url)
    first = run(
        "submit",
        "sync_sku",
        '["A1", "tmall"]',
        "--app",
        SHOP,
        *s,
        "--group",
        "merchant-1001",
        "--batch",
        "b1",
        "--key",
        "A1:tmall",
        "--priority",
        "5",
        "--delay",
        "1h",
        "--kwargs",
        '{"latency": 0.01}',
    )
    tid = int(first.stdout.strip())
    again = run("submit", "sync_sku", '["A1", "tmall"]', "--app", SHOP, *s, "--key", "A1:tmall")
    assert int(again.stdout.strip()) == tid, "an idempotency key returns the first task"
    assert "matched existing task" in again.stderr
    other = int(run("submit", "notify_merchant", '["m1", "hello"]', "--app", SHOP, *s, "--batch", "b1").stdout)
    assert other != tid

    status = run_json("status", *s)
    assert status["counts"]["PENDING"] == 2 and status["total"] == 2
    assert status["limits"]["partner_api"]["concurrency"] == 14  # declared by the app at import
    assert run_json("status", *s, "--batch", "b1")["batch"]["status"] == "RUNNING"

    rows = run_json("tasks", *s, "--batch", "b1")
    assert sorted(r["id"] for r in rows) == sorted([tid, other])
    assert [r["id"] for r in run_json("tasks", *s, "--group", "merchant-1001")] == [tid]
    assert [r["id"] for r in run_json("tasks", *s, "--name", "notify_merchant")] == [other]
    assert run_json("tasks", *s, "--status", "success") == []
    assert len(run_json("tasks", *s, "--limit", "1")) == 1

    shown = run_json("show", str(tid), *s)
    assert shown["status"] == "PENDING"
    assert shown["args"] == {"args": ["A1", "tmall"], "kwargs": {"latency": 0.01}}
    assert (shown["group"], shown["batch"], shown["key"], shown["priority"]) == ("merchant-1001", "b1", "A1:tmall", 5)
    assert shown["limits"] == ["partner_api"] and shown["max_retries"] == 3 and shown["timeout"] == 60
    assert shown["run_at"] - shown["created_at"] == pytest.approx(3600, abs=5)
    text = run("show", str(tid), *s).stdout
    for needle in ("merchant-1001", "A1:tmall", "PENDING", "checkpoint", "trace_id"):
        assert needle in text
    assert "sync_sku" in run("tasks", *s).stdout and "PENDING" in run("status", *s).stdout

    assert run("cancel", str(tid), *s).stdout.strip() == f"task {tid} canceled"
    assert run_json("show", str(tid), *s)["status"] == "CANCELED"
    assert_one_line_error(run("cancel", str(tid), *s, ok=False), "already ended CANCELED")
    assert_one_line_error(run("retry", str(other), *s, ok=False), "is PENDING", "only FAILED, TIMEOUT or CANCELED")

    assert run("retry", str(tid), *s).stdout.strip() == f"task {tid} queued again"
    back = run_json("show", str(tid), *s)
    assert back["status"] == "PENDING" and back["attempt"] == 0


def test_retry_batch_requeues_only_failed_timeout_canceled(sqlite_url):
    s = ("--store", sqlite_url)
    ids = [
        int(
            run(
                "submit",
                "check_price",
                json.dumps([f"S{i}", -1 if i < 3 else 1]),
                "--app",
                SHOP,
                *s,
                "--batch",
                "prices",
            ).stdout
        )
        for i in range(5)
    ]
    keep = int(run("submit", "check_price", '["X", -1]', "--app", SHOP, *s, "--batch", "other").stdout)
    # A worker in this process runs them: three fail (negative price, never retried), two succeed.
    app = corral.App(sqlite_url)

    @app.task(name="check_price")
    def check_price(sku_id, price):
        if price < 0:
            raise ValueError(f"negative price {price} for {sku_id}")
        return price

    app.start(workers=4, poll_interval=0.02)
    assert app.drain(timeout=20)
    app.close()
    assert run_json("status", *s, "--batch", "prices")["batch"]["counts"] == {"FAILED": 3, "SUCCESS": 2}
    failed = run_json("tasks", *s, "--status", "FAILED", "--batch", "prices")
    assert "negative price" in failed[0]["error"]

    out = run("retry", "--batch", "prices", *s).stdout
    assert out.strip() == "batch prices: 3 task(s) queued again"
    after = {r["id"]: r["status"] for r in run_json("tasks", *s, "--batch", "prices")}
    assert after == {i: ("PENDING" if n < 3 else "SUCCESS") for n, i in enumerate(ids)}
    assert run_json("show", str(keep), *s)["status"] == "FAILED", "another batch is left alone"


def test_sweep_one_pass_recovers_a_lost_lease(sqlite_url):
    s = ("--store", sqlite_url)
    # Submitted and claimed an hour ago (a store whose clock is set back by
    # hand), with a 30 s lease, by a worker that died without a word.
    store = open_store(sqlite_url, clock=FakeClock(start=time.time() - 3600))
    [sub] = store.submit([NewTask("sync_sku", dumps({"args": ["L1", "jd"], "kwargs": {}}), max_retries=2)])
    tid = sub.id
    empty = run_json("sweep", *s)
    assert empty["total"] == 0
    assert "nothing to do" in run("sweep", *s).stdout
    [claim] = store.claim("ghost", ClaimRequest(["default"], 1, lease_seconds=30))
    assert claim.tasks[0].id == tid

    report = run_json("sweep", *s)
    assert report["lost_leases_retried"] == [tid]
    assert report["total"] == 1
    rec = store.get(tid)
    assert rec.status is State.RETRYING and "worker crashed" in rec.error
    # The dead worker's late outcome is discarded by the version check.
    assert store.complete([Outcome(tid, claim.token, claim.tasks[0].version, State.SUCCESS, result="1")]) == [False]
    store.close()


def test_sweep_stale_pending_age_cancels_old_pending(sqlite_url):
    s = ("--store", sqlite_url)
    tid = int(run("submit", "notify_merchant", '["m", "x"]', "--app", SHOP, *s).stdout)
    assert run_json("sweep", *s, "--stale-pending-age", "off")["total"] == 0
    assert run_json("sweep", *s)["total"] == 0  # default: 24 h
    report = wait_for(
        lambda: (r := run_json("sweep", *s, "--stale-pending-age", "0s"))["stale_pending_canceled"] and r,
        timeout=5,
        message="stale pending canceled",
    )
    assert report["stale_pending_canceled"] == [tid]
    assert run_json("show", str(tid), *s)["status"] == "CANCELED"


# ---- plan -------------------------------------------------------------------------------------
def test_plan_prints_the_seed_numbers():
    a = run_json("plan", "--qps", "100", "--latency-ms", "200")
    assert a["concurrency_limit"]["limit"] == 14 and a["example"] is False
    assert run_json("plan", "--qps", "100", "--latency", "0.2s", "--safety", "1")["concurrency_limit"]["limit"] == 20

    b = run_json("plan", "--done", "392", "--hours", "48", "--workers", "4", "--target", "720")
    assert b["littles_law"]["mean_duration_s"] / 60 == pytest.approx(29, abs=0.5)
    assert b["littles_law"]["required_workers"] == 8
    assert (
        run_json("plan", "--done", "392", "--window", "2d", "--workers", "4", "--target", "720")["littles_law"][
            "required_workers"
        ]
        == 8
    )
    assert (
        run_json("plan", "--target", "720", "--target-hours", "48", "--mean", "29m")["required"]["required_workers"]
        == 8
    )

    c = run_json("plan", "--io-minutes", "25", "--cpu-minutes", "4")
    assert c["workers_per_process"]["workers"] == 7

    d = run_json(
        "plan",
        "--done",
        "392",
        "--hours",
        "48",
        "--workers",
        "4",
        "--target",
        "720",
        "--io-minutes",
        "25",
        "--cpu-minutes",
        "4",
        "--cap",
        "2",
    )
    assert d["layout"] == {
        "concurrency": 8,
        "max_per_process": 2,
        "processes": 4,
        "per_process": 2,
        "total_slots": 8,
        "lanes": 10,
    }

    example = run_json("plan")
    assert example["example"] is True and example["concurrency_limit"]["limit"] == 14
    text = run("plan").stdout
    assert "14" in text and "29.4 min" in text and "7.35 -> 8" in text


# ---- demo -------------------------------------------------------------------------------------
def test_demo_leaves_results_for_status_and_tasks(sqlite_url):
    out = run(
        "demo",
        "--quick",
        "--store",
        sqlite_url,
        "--skus",
        "40",
        "--merchants",
        "4",
        "--latency-ms",
        "20",
        "--qps",
        "1000",
        "--seed",
        "7",
    ).stdout
    assert "PARTIAL_SUCCESS" in out
    assert "inspect with: corral status --store" in out and "corral tasks" in out and "corral show" in out

    # A second command, a fresh connection: the results are in the database.
    status = run_json("status", "--store", sqlite_url)
    assert status["counts"]["SUCCESS"] == 39 and status["counts"]["FAILED"] == 1 and status["total"] == 40
    rows = run_json("tasks", "--store", sqlite_url, "--limit", "100", "--oldest-first")
    assert len(rows) == 40 and len({r["batch"] for r in rows}) == 1
    [failed] = [r for r in rows if r["status"] == "FAILED"]
    assert "negative price" in failed["error"] and failed["attempt"] == 1, "a validation error is not retried"
    assert any(r["attempt"] > 1 and r["status"] == "SUCCESS" for r in rows), "a transient failure retried"
    assert all(r["progress"] == 1.0 for r in rows if r["status"] == "SUCCESS")
    # Seed 003: within a merchant, SKUs ran one at a time in submit order.
    by_group: dict[str, list[dict]] = {}
    for r in rows:
        by_group.setdefault(r["group"], []).append(r)
    assert len(by_group) == 4
    for group_rows in by_group.values():
        ordered = sorted(group_rows, key=lambda r: r["id"])
        for prev, nxt in zip(ordered, ordered[1:]):
            assert prev["finished_at"] <= nxt["started_at"], (prev["id"], nxt["id"])
    assert f"batch {rows[0]['batch']}" in out


# ---- the Sweeper loop behind `sweep --loop` and `worker --sweep` --------------------------------
def test_sweeper_only_the_leader_sweeps(sqlite_url):
    from corral.maintenance import Sweeper

    store = open_store(sqlite_url)
    a = Sweeper(store, interval=10, holder="a")
    b = Sweeper(store, interval=10, holder="b")
    assert a.tick() is not None and a.is_leader
    assert b.tick() is None and not b.is_leader, "one sweeper at a time across the fleet"
    assert a.tick() is not None, "the leader renews its lead"
    assert Sweeper(store, interval=0.05).lead_ttl == pytest.approx(0.1), "a dead leader is replaced within 3 ticks"
    with pytest.raises(ValueError):
        Sweeper(store, interval=0)
    store.close()


def test_sweeper_thread_recovers_and_stops(sqlite_url):
    from corral.maintenance import Sweeper

    past = open_store(sqlite_url, clock=FakeClock(start=time.time() - 3600))  # an hour ago
    [sub] = past.submit([NewTask("notify_merchant", dumps({"args": ["m", "x"], "kwargs": {}}), max_retries=2)])
    tid = sub.id
    past.claim("ghost", ClaimRequest(["default"], 1, lease_seconds=30))
    past.close()
    store = open_store(sqlite_url)
    reports = []
    sweeper = Sweeper(store, interval=0.05, on_report=reports.append).start()
    try:
        # the report is handed over after the sweep committed: wait for it, not just the row
        wait_for(
            lambda: any(tid in r.lost_leases_retried for r in reports), timeout=10, message="recovered by the loop"
        )
        assert store.get(tid).status is State.RETRYING
    finally:
        sweeper.stop()
    assert sweeper.stopped and sweeper.ticks >= 1
    store.close()


def test_cli_works_without_the_bench_package(sqlite_url):
    corral.App(sqlite_url).close()
    code = "import sys; sys.modules['corral.bench'] = None\nfrom corral.cli import main\nmain(sys.argv[1:])"
    status = subprocess.run(
        [sys.executable, "-c", code, "status", "--json", "--store", sqlite_url],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["total"] == 0
    bench = subprocess.run(
        [sys.executable, "-c", code, "bench", "groups"], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert bench.returncode == 1
    assert bench.stderr.strip().startswith("error: benchmarks are not available")
    assert len(bench.stderr.strip().splitlines()) == 1


def test_store_may_be_given_before_the_command(sqlite_url):
    tid = int(run("--store", sqlite_url, "submit", "notify_merchant", '["m", "x"]', "--app", SHOP).stdout)
    assert run_json("show", str(tid), "--store", sqlite_url)["name"] == "notify_merchant"
    assert json.loads(run("--store", sqlite_url, "status", "--json").stdout)["total"] == 1


def test_tasks_by_worker_age_and_sort_page_by_position(tmp_path):
    from corral.core.model import NewTask
    from corral.stores import open_store

    url = f"sqlite:///{tmp_path / 'pos.db'}"
    store = open_store(url)
    store.migrate()
    ids = [r.id for r in store.submit([NewTask(name="t", args=ARGS) for _ in range(5)])]
    store.claim("vm-1:7:w", ClaimRequest(["default"], 2))
    store.close()
    s = ("--store", url)
    assert [r["id"] for r in run_json("tasks", *s, "--worker", "vm-1:7:w")] == ids[1::-1]
    assert [r["id"] for r in run_json("tasks", *s, "--sort", "age", "--limit", "2")] == ids[:2]
    first = run("tasks", *s, "--sort", "age", "--limit", "2")
    assert f"more: --after {ids[1]}" in first.stderr
    assert [r["id"] for r in run_json("tasks", *s, "--sort", "age", "--limit", "2", "--after", str(ids[1]))] == ids[2:4]
    assert [r["id"] for r in run_json("tasks", *s, "--sort", "status", "--limit", "3")] == [ids[4], ids[3], ids[2]]
    assert run_json("tasks", *s, "--older", "1h") == []
    assert len(run_json("tasks", *s, "--newer", "1h")) == 5
    assert_one_line_error(run("tasks", *s, "--older", "soon", ok=False), "not an age")
    assert run("tasks", *s, "--sort", "age", "--offset", "3", ok=False).exit_code != 0


def test_dead_pages_by_position(tmp_path):
    url = f"sqlite:///{tmp_path / 'dead.db'}"
    store = open_store(url)
    store.migrate()
    ids = [r.id for r in store.submit([NewTask(name="t", args=ARGS) for _ in range(5)])]
    claims = store.claim("w", ClaimRequest(["default"], 5))
    store.complete([Outcome(t.id, c.token, t.version, State.FAILED, error="boom") for c in claims for t in c.tasks])
    s = ("--store", url)
    first = run("dead", *s, "--limit", "2")
    assert f"more: --after {ids[1]}" in first.stderr
    # one of the first page retried before the next is read: the next page skips none
    store.retry(ids[0])
    store.close()
    assert [r["id"] for r in run_json("dead", *s, "--limit", "2", "--after", str(ids[1]))] == ids[2:4]
    last = run("dead", *s, "--limit", "2", "--after", str(ids[3]))
    assert str(ids[4]) in last.stdout and "more:" not in last.stderr
    assert run("dead", *s, "--after", "1", "--offset", "1", ok=False).exit_code != 0

"""Kill -9 the worker that leads the sweepers, with default settings.

Three `corral worker` processes (default lease, sweep interval, everything)
run grouped tasks with ``retries=0`` and ``timeout=4``. The one holding the
store's sweeper lead is killed. Its groups must run again within about the
lease and an interval (the other workers take the lead or back it up), none
of its tasks may end FAILED (a crash is not the task's failure, however long
ago the task started), nothing is lost and every group keeps its order.

Run as a script to measure the recovery time with defaults:
``python tests/test_leader_kill.py STORE_URL [RUNS]`` prints, per run, the
seconds from the kill until every group the killed worker held ran again.
"""

from __future__ import annotations

import random
import sqlite3
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

import corral
from corral.core.model import DEFAULT_LEASE_SECONDS
from corral.core.states import State
from corral.testing import History, HistoryLog

sys.path.insert(0, str(Path(__file__).parent))
from faults import CORRAL, TESTS, Process, Processes  # noqa: E402
from helpers import order_violations_past_a_crash, wait_for  # noqa: E402

GROUPS, PER_GROUP = 24, 60
#: The test's deadline for the killed worker's groups to run again: generous
#: against a loaded machine, and still short of what a dead leader's lead
#: used to cost (at least twice the lease).
DEADLINE = DEFAULT_LEASE_SECONDS + 30


def _worker(processes: Processes, url: str, history: Path, name: str) -> Process:
    """`corral worker` with every default (only the store and the app named)."""
    return processes.start(
        [*CORRAL, "worker", "apps.history_app:app", "--store", url],
        name,
        store=url,
        env={"HISTORY_LOG": history},
        cwd=TESTS,
    )


def _leader(url: str) -> str | None:
    """The holder of the store's sweeper lead (``host:pid:random``), if any."""
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as con:
            row = con.execute("SELECT holder FROM leadership WHERE role = 'sweeper'").fetchone()
    else:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SELECT holder FROM corral_leaders WHERE role = 'sweeper'").fetchone()
    return row[0] if row else None


def _holds(app: corral.App, holder_pid: str) -> bool:
    """Whether the worker of this pid holds a task now (running or reserved)."""
    return any(
        f":{holder_pid}:" in (t.worker_id or "")
        for state in (State.RUNNING, State.RESERVED)
        for t in app.tasks(status=state, limit=10_000)
    )


def run_leader_kill(url: str, tmp: Path, kill_after: float = 0.0) -> float:
    """The scenario; returns the seconds from the kill until every group the
    killed worker held had a run started by another worker. The kill comes
    ``kill_after`` seconds after the work is under way (the script draws it
    at random, so the kill falls anywhere between two lease renewals)."""
    submitter = corral.App(url)
    submitter.task(name="step", retries=0, timeout=4)(lambda ctx, group, seq, dur: seq)
    rng = random.Random(5)
    calls = [
        {"args": [f"g{g}", i, rng.uniform(0.2, 0.4)], "group": f"g{g}"} for i in range(PER_GROUP) for g in range(GROUPS)
    ]
    submitter.submit_many("step", calls)
    history_path = tmp / "runs.jsonl"
    processes = Processes(tmp)
    workers = {}
    try:
        for i in range(3):
            p = _worker(processes, url, history_path, f"w{i}")
            workers[str(p.pid)] = p
        pid_of = lambda holder: holder.split(":")[1] if holder and holder.count(":") >= 2 else None  # noqa: E731
        leader = wait_for(
            lambda: (pid := pid_of(_leader(url))) in workers and pid,
            timeout=60,
            interval=0.05,
            message="a worker leads the sweepers",
        )
        wait_for(
            lambda: sum(r.end is not None for r in History.load(history_path).runs) >= 200,
            timeout=60,
            interval=0.05,
            message="work under way",
        )
        # on a loaded machine the leader may be between units at this instant:
        # the kill must land while it holds work, or the scenario proves nothing
        wait_for(
            lambda: _holds(submitter, leader),
            timeout=60,
            interval=0.02,
            message="the leader holds work in flight",
        )
        time.sleep(kill_after)
        victim = workers[leader]
        killed_at = time.monotonic()
        victim.kill()
        HistoryLog(history_path).died(leader, killed_at)
        held = [
            t
            for state in (State.RUNNING, State.RESERVED)
            for t in submitter.tasks(status=state, limit=10_000)
            if f":{leader}:" in (t.worker_id or "")
        ]
        assert held, "the kill hit nothing in flight; the scenario proved nothing"
        groups = {t.group for t in held}

        def restarted() -> float | None:
            runs = [r for r in History.load(history_path).runs if r.worker != leader and r.start > killed_at]
            firsts = {}
            for r in runs:
                if r.group in groups:
                    firsts[r.group] = min(firsts.get(r.group, r.start), r.start)
            return max(firsts.values()) - killed_at if len(firsts) == len(groups) else None

        recovery = wait_for(
            restarted, timeout=DEADLINE, interval=0.1, message="the killed leader's groups ran again elsewhere"
        )
        wait_for(
            lambda: submitter.counts().get("SUCCESS", 0) == len(calls) or submitter.counts().get("FAILED", 0) > 0,
            timeout=120,
            interval=0.1,
            message="every task ended",
        )
    finally:
        processes.close()
    counts = submitter.counts()
    failed = submitter.tasks(status=State.FAILED, limit=20)
    assert counts == {"SUCCESS": len(calls)}, f"{counts}; failed: {[(t.id, t.error) for t in failed]}"
    for t in held:
        rec = submitter.get(t.id)
        assert rec.crashes <= 1 and rec.attempt == 1, rec  # a crash re-run: the attempt given back

    history = History.load(history_path)
    assert len({r.task_id for r in history.runs}) == len(calls)  # nothing lost: every task ran
    for task_id in {r.task_id for r in history.runs}:
        runs = history.runs_of(task_id)
        assert all(r.worker == leader for r in runs[:-1]), f"task {task_id} ran twice off the killed worker: {runs}"
    bad = order_violations_past_a_crash(history, leader)
    assert not bad, "\n".join(str(v) for v in bad[:20])
    submitter.close()
    return recovery


@pytest.mark.slow
@pytest.mark.postgres
def test_a_killed_leader_s_groups_run_again_within_the_lease_and_nothing_fails(sqlite_url, pg_url, tmp_path):
    """On SQLite and PostgreSQL side by side: each scenario waits out a whole
    default lease, so together they cost the suite one."""
    urls = {"sqlite": sqlite_url, "postgres": pg_url}
    for kind in urls:
        (tmp_path / kind).mkdir()
    with ThreadPoolExecutor(len(urls)) as pool:
        runs = {kind: pool.submit(run_leader_kill, url, tmp_path / kind) for kind, url in urls.items()}
    for kind, run in runs.items():
        print(f"recovery after killing the leader ({kind}): {run.result():.1f}s")


def _fresh_pg(admin_url: str):
    """A new database on the server of ``admin_url``: (its URL, a function that drops it)."""
    import secrets

    import psycopg

    name = f"corral_lk_{secrets.token_hex(6)}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE template0")

    def drop() -> None:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    parts = urlsplit(admin_url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment)), drop


if __name__ == "__main__":
    # STORE_URL: sqlite (a new file each run) or a PostgreSQL server (a new database each run)
    store_url, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1
    for i in range(n):
        with tempfile.TemporaryDirectory() as d:
            drop = None
            if store_url.startswith("sqlite"):
                url = f"sqlite:///{d}/corral.db"
            else:
                url, drop = _fresh_pg(store_url)
            try:
                kill_after = random.uniform(0, DEFAULT_LEASE_SECONDS / 3)  # anywhere between two renewals
                print(f"run {i + 1}: {run_leader_kill(url, Path(d), kill_after):.1f}s", flush=True)
            finally:
                if drop is not None:
                    drop()

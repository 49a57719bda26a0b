"""PostgreSQL restarted under load, cleanly and as a crash, while two worker
processes run short grouped tasks recorded in a shared history.

The server is the throwaway one the test run owns (``scripts/with-postgres.sh``
exports how to drive it). When the run uses an outside server (whose owner
may not want it restarted), or runs its tests in several processes, these
tests start a throwaway server of their own with the same script; only without PostgreSQL's binaries do they skip,
and in CI they fail then. The test database commits synchronously, as a
production server does, so only what corral itself commits asynchronously
(claims) can be forgotten by a crash.
"""

from __future__ import annotations

import os
import random
import secrets
import shlex
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

import corral
from corral.core.claims import ClaimRequest
from corral.core.states import State
from corral.testing import History
from faults import AppWorker
from helpers import missing, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

GROUPS, PER_GROUP = 30, 10
WORKER = {"concurrency": 4, "chunk_size": 2, "lease_seconds": 2.0, "poll_interval": 0.05, "sweep_interval": 0.25}


ROOT = Path(__file__).resolve().parent.parent
#: The variables scripts/with-postgres.sh exports for a server this run owns.
OWNED = ("CORRAL_TEST_PG_URL", "CORRAL_TEST_PG_CTL", "CORRAL_TEST_PG_DATA", "CORRAL_TEST_PG_LOG", "CORRAL_TEST_PG_AS")
#: The owned server's settings (OWNED's names), set by the ``server`` fixture.
_server: dict[str, str] = {}


@pytest.fixture(scope="module")
def server():
    """A PostgreSQL server this run may stop, crash and restart: the one
    scripts/with-postgres.sh started for the run, or else one of its own,
    started by the same script and removed when the module ends. A run in
    several processes (pytest-xdist) always starts one of its own: the
    run's server serves the other processes' tests meanwhile."""
    parallel = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1) > 1
    if os.environ.get("CORRAL_TEST_PG_CTL") and os.environ.get("CORRAL_TEST_PG_DATA") and not parallel:
        _server.update({k: os.environ.get(k, "") for k in OWNED})
        yield _server
        _server.clear()
        return
    with tempfile.TemporaryDirectory() as tmp:
        found = Path(tmp) / "env"
        env = {k: v for k, v in os.environ.items() if k not in OWNED}
        # the script runs this command while its server lives: write the settings, wait for stdin to close
        hold = 'env > "$1.tmp" && mv "$1.tmp" "$1" && exec cat > /dev/null'
        proc = subprocess.Popen(
            [str(ROOT / "scripts" / "with-postgres.sh"), "sh", "-c", hold, "hold", str(found)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
        )
        try:
            wait_for(lambda: found.exists() or proc.poll() is not None, timeout=180, interval=0.1)
            if not found.exists():
                err = (proc.communicate(timeout=30)[1] or b"").decode(errors="replace").strip().splitlines()
                missing(f"no PostgreSQL server of its own could be started: {err[-1] if err else 'no reason given'}")
            got = dict(line.split("=", 1) for line in found.read_text().splitlines() if line.startswith(OWNED))
            _server.update({k: got.get(k, "") for k in OWNED})
            yield _server
        finally:
            _server.clear()
            if proc.stdin is not None:
                proc.stdin.close()  # the held command ends: the script stops and removes its server
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def pg_ctl(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run pg_ctl on the server this test run owns."""
    ctl, data = _server["CORRAL_TEST_PG_CTL"], _server["CORRAL_TEST_PG_DATA"]
    prefix = shlex.split(_server.get("CORRAL_TEST_PG_AS", ""))
    cmd = [*prefix, ctl, "-D", data, "-w", "-t", "60", *args]
    # a started server keeps pg_ctl's output open: send it to a file, never to a pipe
    with open(Path(data).parent / "pg_ctl.out", "ab") as out:
        done = subprocess.run(cmd, cwd=str(Path(data).parent), stdout=out, stderr=out, timeout=90)
    if check and done.returncode != 0:
        raise AssertionError(f"pg_ctl {' '.join(args)} failed ({done.returncode})")
    return done


def server_log() -> str:
    return _server.get("CORRAL_TEST_PG_LOG") or os.devnull


def start_server(url: str) -> None:
    port = urlsplit(url).port
    pg_ctl("-l", server_log(), "-o", f"-p {port}", "start")


@pytest.fixture
def owned_pg(server):
    """A fresh database on the owned server, committing synchronously."""
    from psycopg import sql

    pg_ctl("status")
    admin = server["CORRAL_TEST_PG_URL"]
    name = f"corral_t_{secrets.token_hex(6)}"
    with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(name)))
        conn.execute(sql.SQL("ALTER DATABASE {} SET synchronous_commit = on").format(sql.Identifier(name)))
    parts = urlsplit(admin)
    url = urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))
    try:
        yield url
    finally:
        if pg_ctl("status", check=False).returncode != 0:  # never leave the run without its server
            start_server(url)
        with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def run_under_restart(url: str, tmp_path: Path, restart) -> History:
    app = corral.App(url)
    app.task(name="step", retries=5)(lambda ctx, group, seq, dur, fail_first=False: seq)
    rng = random.Random(7)
    app.submit_many(
        "step",
        [
            {"args": [f"g{g}", i, rng.uniform(0.01, 0.03)], "group": f"g{g}"}
            for i in range(PER_GROUP)
            for g in range(GROUPS)
        ],
    )
    total = GROUPS * PER_GROUP
    runs = tmp_path / "runs.jsonl"
    workers = [AppWorker(url, runs, tmp_path / f"w{i}.log", **WORKER) for i in range(2)]
    try:
        for w in workers:
            w.wait_ready()
        wait_for(lambda: len(History.load(runs).runs) >= total // 3, timeout=60, message="work under way")
        restart()
        wait_for(
            lambda: app.counts().get(State.SUCCESS.value, 0) == total,
            timeout=120,
            interval=0.2,
            message="every task SUCCESS after the restart",
        )
        assert all(w.proc.poll() is None for w in workers), "a worker died with the server"
    finally:
        for w in workers:
            w.close()
        app.close(5)
    history = History.load(runs)
    assert {r.task_id for r in history.runs} == set(range(1, total + 1)), "a task was lost"
    return history


def test_a_clean_restart_under_load_loses_nothing_and_runs_nothing_twice(owned_pg, tmp_path):
    history = run_under_restart(owned_pg, tmp_path, lambda: pg_ctl("-l", server_log(), "-m", "fast", "restart"))
    history.assert_ok()
    twice = [r.task_id for r in history.runs if len(history.runs_of(r.task_id)) > 1]
    assert not twice, f"ran more than once after a clean restart: {sorted(set(twice))}"


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_an_outage_longer_than_the_lease_runs_no_finished_work_again(owned_pg, tmp_path, mode):
    """The server away (stopped cleanly, or crashed) for over twice the lease:
    the workers go on with what they hold and keep its outcomes; once it is
    back they renew their leases and write them (fenced by their lease
    tokens) before any sweeper takes a lease that ran out meanwhile. Nothing
    runs twice, and no sweep counts a lost lease (lost leases raise the
    fleet's level).

    The clean stop also lasts long enough (16 s) to check that an idle store
    reconnects within seconds of the server's return, however long it was
    away: the pool tries at least every second. Its own backoff doubles (1, 2,
    4, 8, 16 s ...): after 16 s away its next attempt came about 15 s after
    the server was back, longer than a call waits for a connection and than a
    lease, so another worker's sweeper took this worker's leases first. (One
    outage for both: each costs the suite its seconds away.)"""
    from corral.stores.postgres import PostgresStore

    lease = 2.0
    away = 16.0 if mode == "fast" else 11.0
    app = corral.App(owned_pg)
    app.task(name="step", retries=5)(lambda ctx, group, seq, dur, fail_first=False: seq)
    groups, per_group = 40, 10
    app.submit_many(
        "step",
        [{"args": [f"g{g}", i, 0.2], "group": f"g{g}"} for i in range(per_group) for g in range(groups)],
    )
    total = groups * per_group
    runs = tmp_path / "runs.jsonl"
    options = dict(WORKER, lease_seconds=lease)
    workers = [AppWorker(owned_pg, runs, tmp_path / f"w{i}.log", **options) for i in range(2)]
    idle = PostgresStore(owned_pg) if mode == "fast" else None
    try:
        for w in workers:
            w.wait_ready()
        if idle is not None:
            idle.now()
        wait_for(lambda: len(History.load(runs).runs) >= total // 4, timeout=60, message="work under way")
        pg_ctl("-m", mode, "stop")
        down = time.monotonic()
        if idle is not None:
            with pytest.raises(corral.StoreUnavailable):
                idle.now()  # finds its connections broken: the pool starts reconnecting
        # longer than the lease, and than a call waits for a connection (twice the
        # store's connect timeout): calls fail, rather than wait for the server's return
        wait_for(
            lambda: time.monotonic() - down > away and all("heartbeat failed" in w.log for w in workers),
            timeout=60,
            message="an outage longer than a call's wait, seen by both workers",
        )
        start_server(owned_pg)
        back = time.monotonic()
        if idle is not None:
            # a call waits up to twice the connect timeout for a connection: it gets one
            # once the pool's next attempt reaches the server
            idle.now()
            assert time.monotonic() - back < 8.0, "the pool reconnected long after the server was back"
        wait_for(
            lambda: app.counts().get(State.SUCCESS.value, 0) == total,
            timeout=120,
            interval=0.2,
            message="every task SUCCESS after the outage",
        )
        rescued = [line for w in workers for line in w.log.splitlines() if "sweeper recovered" in line]
        assert not rescued, rescued
    finally:
        for w in workers:
            w.close()
        if idle is not None:
            idle.close()
        app.close(5)
    history = History.load(runs)
    assert {r.task_id for r in history.runs} == set(range(1, total + 1)), "a task was lost"
    twice = sorted({r.task_id for r in history.runs if len(history.runs_of(r.task_id)) > 1})
    assert not twice, f"{len(twice)} task(s) ran again after the outage: {twice[:20]}"
    history.assert_ok()


def test_a_crash_under_load_loses_nothing(owned_pg, tmp_path):
    """A crash may forget the last claims (committed asynchronously): their
    tasks run again. Nothing may be lost; overlaps are the subject of
    ``test_a_claim_forgotten_by_a_crash_is_not_claimed_again_while_it_runs``."""

    def crash():
        pg_ctl("-m", "immediate", "stop")
        start_server(owned_pg)

    history = run_under_restart(owned_pg, tmp_path, crash)
    overlaps = [v for v in history.check() if v.rule in ("self-overlap", "group-overlap")]
    print(f"overlapping runs after the crash: {len(overlaps)}")


def test_a_claim_forgotten_by_a_crash_is_not_claimed_again_while_it_runs(owned_pg):
    """Deterministic: the WAL writer is slowed so the crash surely comes before the claim's flush."""
    with psycopg.connect(owned_pg, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET wal_writer_delay = '10s'")
        conn.execute("SELECT pg_reload_conf()")
    app = corral.App(owned_pg)
    try:
        app.task(name="step")(lambda: None)
        first = app.submit("step", group="g").id
        app.submit("step", group="g")
        (held,) = app.store.claim("worker-a", ClaimRequest(["default"], 1))  # worker A now runs the group's head
        assert [t.id for t in held.tasks] == [first]
        pg_ctl("-m", "immediate", "stop")
        start_server(owned_pg)
        (again,) = wait_for(lambda: _claim_after_restart(app), timeout=30, message="the store answers again")
        assert again == [], f"claimed again while worker A still runs task {first}: {again}"
    finally:
        app.close(5)
        with psycopg.connect(owned_pg, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM RESET wal_writer_delay")
            conn.execute("SELECT pg_reload_conf()")


def _claim_after_restart(app) -> tuple[list[int]] | None:
    """What worker B claims, once the store answers (None while it does not)."""
    from corral.errors import StoreError

    try:
        return ([t.id for c in app.store.claim("worker-b", ClaimRequest(["default"], 1)) for t in c.tasks],)
    except StoreError:
        return None

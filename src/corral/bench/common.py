"""Shared pieces of the benchmarks: the simulated downstream, compact
per-task bookkeeping, statistics, child processes and temporary stores.

Bookkeeping is kept in flat arrays (``array.array`` in one process,
``multiprocessing`` shared ``RawArray`` across processes), never in dicts of
objects, so a variant's peak RSS reflects the scheduler it measures and not
the benchmark's own notes.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import random
import resource
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from corral.core.claims import ClaimRequest
from corral.core.stats import percentile

# counters[...] slots
ACTIVE, SEQ, REJECTED, DONE, DUPLICATES, PEAK, CLAIMS, CLAIM_NS = range(8)
_NCOUNTERS = 8

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
PROGRESS_PREFIX = "@progress "


class DownstreamRejected(Exception):
    """The simulated downstream refused a call: too many in flight (retryable)."""

    status_code = 429


def spawn_context():
    return mp.get_context("spawn")


class Recorder:
    """Per-task notes of one run, plus the simulated downstream.

    ``call(i)`` is the downstream: it rejects a call when ``limit`` calls are
    already in flight (counted under a lock), otherwise sleeps the task's
    planned duration and records when it finished, in which order, and for
    how long it really slept.
    """

    def __init__(self, n: int, limit: int, sleeps: Sequence[float] | None = None, *, shared: bool = False):
        self.n = n
        self.limit = limit
        self.shared = shared
        if shared:
            ctx = spawn_context()
            self.lock = ctx.Lock()
            self.counters = ctx.RawArray("q", _NCOUNTERS)
            self.submit_ts = ctx.RawArray("d", n)
            self.start_ts = ctx.RawArray("d", n)
            self.finish_ts = ctx.RawArray("d", n)
            self.dur = ctx.RawArray("d", n)
            self.finish_seq = ctx.RawArray("q", n)
        else:
            self.lock = threading.Lock()
            self.counters = array("q", bytes(8 * _NCOUNTERS))
            self.submit_ts = array("d", bytes(8 * n))
            self.start_ts = array("d", bytes(8 * n))
            self.finish_ts = array("d", bytes(8 * n))
            self.dur = array("d", bytes(8 * n))
            self.finish_seq = array("q", bytes(8 * n))
        self.sleeps = sleeps  # set per process (recomputed from the seed, not shared)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["sleeps"] = None  # every process rebuilds the plan from the seed
        return state

    # ---- the simulated downstream ------------------------------------------
    def call(self, i: int) -> None:
        c = self.counters
        with self.lock:
            if c[ACTIVE] >= self.limit:
                c[REJECTED] += 1
                raise DownstreamRejected("downstream busy: too many concurrent calls")
            c[ACTIVE] += 1
            if c[ACTIVE] > c[PEAK]:
                c[PEAK] = c[ACTIVE]
        assert self.sleeps is not None, "each process sets its plan of sleeps before running"
        self._timed(i, self.sleeps[i], active=True)

    def time_claims(self, store, delay: float = 0.0) -> None:
        """Count the claims ``store`` makes and the time they take (a worker's
        side of the claim round trip); ``delay`` adds a simulated round trip
        of that many seconds to each (the GIL is free meanwhile, as on a wire)."""
        inner = store.claim
        c = self.counters

        def claim(worker_id: str, request: ClaimRequest) -> list:
            t0 = time.perf_counter_ns()
            got = inner(worker_id, request)
            if delay:
                time.sleep(delay)
            dt = time.perf_counter_ns() - t0
            with self.lock:
                c[CLAIMS] += 1
                c[CLAIM_NS] += dt
            return got

        store.claim = claim

    def claim_stats(self) -> tuple[int, float]:
        """(claims, mean milliseconds per claim) since the counters were zero."""
        n = self.counters[CLAIMS]
        return n, (self.counters[CLAIM_NS] / n / 1e6 if n else 0.0)

    def noop(self, i: int, sleep: float = 0.0) -> None:
        """A call that never rejects: note start, (sleep,) note end."""
        self._timed(i, sleep, active=False)

    def _timed(self, i: int, sleep: float, *, active: bool) -> None:
        """Note the start, sleep, note the end, the finishing order and duplicates."""
        t0 = time.monotonic()
        if self.start_ts[i] == 0.0:
            self.start_ts[i] = t0
        if sleep:
            time.sleep(sleep)
        t1 = time.monotonic()
        c = self.counters
        with self.lock:
            if active:
                c[ACTIVE] -= 1
            c[SEQ] += 1
            if self.finish_seq[i]:
                c[DUPLICATES] += 1
            else:
                c[DONE] += 1
            self.finish_seq[i] = c[SEQ]
        self.finish_ts[i] = t1
        self.dur[i] += t1 - t0

    @property
    def done(self) -> int:
        return self.counters[DONE]

    def wait_done(self, target: int, timeout: float | None = None, tick: float = 0.005, progress: Any = None) -> bool:
        end = None if timeout is None else time.monotonic() + timeout
        last_report = 0.0
        while self.counters[DONE] < target:
            now = time.monotonic()
            if end is not None and now > end:
                return False
            if progress is not None and now - last_report >= 0.5:
                progress(self.counters[DONE], target)
                last_report = now
            time.sleep(tick)
        if progress is not None:
            progress(self.counters[DONE], target)
        return True


def plan(n: int, groups: int, seed: int) -> tuple[array, array]:
    """Deterministic workload: each task's group and its downstream sleep
    (5 ms + uniform(0, 10) ms), identical for every variant."""
    rng = random.Random(seed)
    grp = array("i", (rng.randrange(groups) for _ in range(n)))
    sleeps = array("d", (0.005 + rng.uniform(0.0, 0.010) for _ in range(n)))
    return grp, sleeps


# ---- statistics -----------------------------------------------------------------
def out_of_order(finish_seq: Sequence[int], grp: Sequence[int], groups: int) -> int:
    """Tasks that finished before an earlier-submitted task of their group
    (tasks are submitted in index order)."""
    runmax = array("q", bytes(8 * groups))
    bad = 0
    for i in range(len(finish_seq)):
        g = grp[i]
        s = finish_seq[i]
        if s < runmax[g]:
            bad += 1
        else:
            runmax[g] = s
    return bad


def peak_rss_mb(who: int = resource.RUSAGE_SELF) -> float:
    return resource.getrusage(who).ru_maxrss / 1024.0  # Linux: KiB


def summarize(
    rec: Recorder, t0: float, *, grp: Sequence[int] | None = None, groups: int = 0, slots: int | None = None
) -> dict[str, Any]:
    """Figures shared by every scenario, from a finished run's notes."""
    n = rec.n
    finish = rec.finish_ts
    end = max(finish) if n else t0
    wall = max(1e-9, end - t0)
    total = math.fsum(rec.dur)
    slots = slots or rec.limit
    ideal = total / slots
    lat = [finish[i] - rec.submit_ts[i] for i in range(n) if finish[i]]
    out = {
        "tasks": n,
        "completed": rec.counters[DONE],
        "wall_s": round(wall, 4),
        "ideal_s": round(ideal, 4),
        "efficiency": round(ideal / wall, 4),
        "p50_latency_ms": ms(percentile(lat, 0.50)),
        "p95_latency_ms": ms(percentile(lat, 0.95)),
        "rejections": rec.counters[REJECTED],
        "duplicates": rec.counters[DUPLICATES],
        "peak_downstream_concurrency": rec.counters[PEAK],
        "out_of_order": out_of_order(rec.finish_seq, grp, groups) if grp is not None else None,
    }
    return out


def ms(v: float | None) -> float | None:
    """Seconds to milliseconds, rounded for a report (None stays None)."""
    return None if v is None else round(v * 1000.0, 3)


def child_argv(module: str, *head: str, **opts: Any) -> list[str]:
    """``python`` arguments running ``module`` with ``opts`` as its flags
    (``chunk_size=5`` -> ``--chunk-size 5``; True -> a bare flag; None and
    False are left out)."""
    argv = ["-m", module, *head]
    for k, v in opts.items():
        if v is None or v is False:
            continue
        flag = "--" + k.replace("_", "-")
        argv += [flag] if v is True else [flag, str(v)]
    return argv


def child_main(parser, run, argv: list[str] | None = None) -> None:
    """Body of a benchmark child process: parse, run, print one JSON object."""
    result = run(parser().parse_args(argv))
    sys.stdout.write(dumps(result) + "\n")
    sys.stdout.flush()


def emit_progress(done: int, total: int) -> None:
    """Child side: one progress line on stderr for the parent to draw."""
    sys.stderr.write(f"{PROGRESS_PREFIX}{done} {total}\n")
    sys.stderr.flush()


# ---- child processes --------------------------------------------------------------
def run_child(
    argv: list[str], label: str, *, show_progress: bool = True, env: dict | None = None, timeout: float | None = None
) -> dict[str, Any]:
    """Run ``python -m ...`` as a child, draw its progress lines, return its JSON."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    cmd = [sys.executable, *argv]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}
    )
    other: list[str] = []

    def pump(progress=None, task=None):
        assert proc.stderr is not None
        for line in proc.stderr:
            if line.startswith(PROGRESS_PREFIX):
                if progress is not None:
                    done, total = (int(x) for x in line[len(PROGRESS_PREFIX) :].split())
                    progress.update(task, completed=done, total=total)
                continue
            other.append(line)
            console.print(line.rstrip("\n"), markup=False, highlight=False)

    def collect() -> str:
        assert proc.stdout is not None
        out = proc.stdout.read()
        proc.wait(timeout)
        return out

    if show_progress:
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as progress:
            task = progress.add_task(label, total=None)
            t = threading.Thread(target=pump, args=(progress, task), daemon=True)
            t.start()
            out = collect()
            t.join(5)
    else:
        t = threading.Thread(target=pump, daemon=True)
        t.start()
        out = collect()
        t.join(5)
    if proc.returncode != 0:
        tail = "".join(other[-20:]).strip()
        raise RuntimeError(f"{label}: child exited with {proc.returncode}: {tail}")
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        raise RuntimeError(f"{label}: child printed no JSON result ({exc}): {out[-500:]!r}") from None


# ---- temporary stores -----------------------------------------------------------------
def pg_default_url() -> str:
    return os.environ.get("CORRAL_BENCH_PG_URL") or DEFAULT_PG_URL


def _pg_with_db(url: str, dbname: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + dbname, parts.query, parts.fragment))


@contextmanager
def temp_store_url(store: str, pg_url: str | None = None):
    """A fresh, empty store URL for one run, removed afterwards."""
    if store == "memory":
        yield "memory://"
        return
    if store == "sqlite":
        d = tempfile.mkdtemp(prefix="corral-bench-")
        path = os.path.join(d, "bench.db")
        try:
            yield f"sqlite:///{path}"
        finally:
            for suffix in ("", "-wal", "-shm", "-journal"):
                try:
                    os.unlink(path + suffix)
                except FileNotFoundError:
                    pass
            os.rmdir(d)
        return
    if store in ("postgres", "postgresql"):
        import psycopg
        from psycopg import sql

        admin = pg_url or pg_default_url()
        dbname = f"corral_bench_{secrets.token_hex(4)}"
        with psycopg.connect(admin, autocommit=True) as con:
            con.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
        try:
            yield _pg_with_db(admin, dbname)
        finally:
            with psycopg.connect(admin, autocommit=True) as con:
                con.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))
        return
    raise ValueError(f"unknown store {store!r}: expected memory, sqlite or postgres")


def store_kind(url: str) -> str:
    scheme = url.split(":", 1)[0].lower()
    return {"postgresql": "postgres"}.get(scheme, scheme)


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))

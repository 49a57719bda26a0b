"""``corral bench scale`` and ``corral bench processes``: does a claim stay
as cheap at a million queued tasks as at ten thousand, and how do claims per
second grow with worker processes.

``scale`` (one fresh store):

1. idle submit-to-start latency on the fresh store: W worker processes wait
   idle, tasks are submitted one at a time (one ``submit`` call each, about
   every 25 ms); latency = task start - the moment before its submit;
2. ``--tasks`` no-op tasks in ``--groups`` groups (task i in group i mod G)
   submitted with ``submit_many`` in batches of 1 000, workers stopped: the
   submit rate of every slice of ``--slice`` tasks;
3. W worker processes (``--workers`` x ``--concurrency`` slots, the worker's
   defaults otherwise) drain ``--drain`` of them: per slice of tasks claimed,
   the time of each claim that brought work (p50/p99), and the workers'
   resident memory when the slice ends;
4. when everything was drained, the idle latency again, on the same store
   and the same workers: after a loaded run.

Figures are given for the slices ending at 10 k, 100 k and the last task,
with the ratio last / first: flat is 1.0. The submit rate is also given per
tenth of the tasks (a first slice alone is mostly a cold start), and on
SQLite beside the same rows inserted into a bare table whose only index is
keyed by group and id, as the line index a claim needs: a B-tree that takes
10 000 interleaved groups grows slower per row written, and that reference
shows how much of the submit's slowdown is the index's own.

``processes`` (PostgreSQL): for each count P of worker processes, a queue
pre-filled with ``--tasks`` no-op tasks is drained by P fresh processes;
tasks and claims per second from the moment they are let go, and what the
server spent on them: transactions, WAL records and flushes (``pg_stat_wal``:
meaningful on a server the run has to itself) and, when the server runs on
this machine and its processes can be read, its CPU time.
"""

from __future__ import annotations

import argparse
import os
import time
from array import array
from typing import Any

from corral.bench import common
from corral.bench.common import emit_progress
from corral.core.claims import ClaimRequest
from corral.core.stats import percentile

SUBMIT_BATCH = 1000
DONE, CLAIMED, CLAIMS, EMPTY = range(4)

_COUNTERS: Any = None
_LOCK: Any = None
_STARTS: Any = None


# ---- the tasks (run in the worker processes) --------------------------------------------
def noop(i: int) -> None:
    """Count itself done; nothing else (no per-task notes that would grow a worker)."""
    with _LOCK:
        _COUNTERS[DONE] += 1


def probe(i: int) -> None:
    """Note when it started (the idle-latency tasks)."""
    _STARTS[i] = time.monotonic()


def build_app(url: str):
    from corral.app import App

    app = App(url)
    app.task(name="scale.noop")(noop)
    app.task(name="scale.probe")(probe)
    return app


def _time_claims(store, slice_size: int, keep: set[int], out: dict[int, array]) -> None:
    """Time every claim of ``store``: the ones that brought work go to the
    bucket of the tasks claimed before them (fleet-wide, // slice_size), kept
    only for the buckets in ``keep`` (memory of the worker stays flat), as
    pairs (seconds, tasks claimed): a worker sizes its claims by itself, so
    a claim's time is compared per task it brought."""
    inner = store.claim

    def claim(worker_id: str, request: ClaimRequest) -> list:
        t0 = time.perf_counter()
        got = inner(worker_id, request)
        dt = time.perf_counter() - t0
        k = sum(len(c.tasks) for c in got)
        with _LOCK:
            if k:
                before = _COUNTERS[CLAIMED]
                _COUNTERS[CLAIMED] += k
                _COUNTERS[CLAIMS] += 1
            else:
                _COUNTERS[EMPTY] += 1
        if k:
            b = before // slice_size
            if b in keep:
                out.setdefault(b, array("d")).extend((dt, k))
        return got

    store.claim = claim


def worker_process(url, counters, lock, starts, opts, slice_size, keep, ready, go, stop, results) -> None:
    """A worker process: a Worker with ``opts`` from ``go`` until ``stop``;
    then its claim times go back through ``results``."""
    global _COUNTERS, _LOCK, _STARTS
    _COUNTERS, _LOCK, _STARTS = counters, lock, starts
    app = build_app(url)
    times: dict[int, array] = {}
    _time_claims(app.store, slice_size, set(keep), times)
    worker = app.worker(**opts)
    ready.set()
    go.wait()
    worker.start()
    stop.wait()
    worker.stop(grace=30.0)
    results.put({b: a.tolist() for b, a in times.items()})


def rss_mb(pid: int) -> float | None:
    """Resident memory of process ``pid`` now (Linux /proc), in MB."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


class Fleet:
    """W worker processes on ``url``, started ready and let go together."""

    def __init__(self, url: str, n: int, opts: dict[str, Any], *, slice_size: int = 1, keep=(), probes: int = 1):
        ctx = common.spawn_context()
        self.lock = ctx.Lock()
        self.counters = ctx.RawArray("q", 4)
        self.starts = ctx.RawArray("d", max(1, probes))
        self.go, self.stop = ctx.Event(), ctx.Event()
        self.results = ctx.Queue()
        readies = [ctx.Event() for _ in range(n)]
        self.procs = [
            ctx.Process(
                target=worker_process,
                name=f"corral-bench-scale-{k}",
                args=(
                    url,
                    self.counters,
                    self.lock,
                    self.starts,
                    opts,
                    slice_size,
                    tuple(keep),
                    readies[k],
                    self.go,
                    self.stop,
                    self.results,
                ),
            )
            for k in range(n)
        ]
        for p in self.procs:
            p.start()
        for ev in readies:
            if not ev.wait(120):
                self.close()
                raise RuntimeError("a worker process did not start")
        self.claim_times: dict[int, list[float]] = {}

    def let_go(self) -> float:
        t = time.monotonic()
        self.go.set()
        return t

    def rss(self) -> list[float | None]:
        return [rss_mb(p.pid) for p in self.procs if p.pid is not None]

    def close(self) -> None:
        self.go.set()
        self.stop.set()
        got = 0
        deadline = time.monotonic() + 90
        while got < len(self.procs) and time.monotonic() < deadline:
            try:
                part = self.results.get(timeout=max(0.1, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - a worker that died sends nothing
                break
            got += 1
            for b, ts in part.items():
                self.claim_times.setdefault(b, []).extend(ts)
        for p in self.procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join()


def idle_latency(app, fleet: Fleet, n: int, spacing: float) -> dict[str, Any]:
    """Submit ``n`` probe tasks one at a time (one ``submit`` each, about every
    ``spacing`` s, not waiting for each); latency = start - before submit."""
    import random

    rng = random.Random(3)
    tdef = app.registry["scale.probe"]
    sent = array("d", bytes(8 * n))
    for i in range(n):
        fleet.starts[i] = 0.0
    # warm-up: a few tasks, then a quiet second, as a worker that waits for work
    for i in range(min(n, 20)):
        app.submit_many(tdef, [{"args": (i,)}])
    common_wait(lambda: all(fleet.starts[i] for i in range(min(n, 20))), 30)
    for i in range(n):
        fleet.starts[i] = 0.0
    time.sleep(1.0)
    for i in range(n):
        sent[i] = time.monotonic()
        app.submit_many(tdef, [{"args": (i,)}])
        time.sleep(spacing * rng.uniform(0.5, 1.5))
    common_wait(lambda: all(fleet.starts[i] for i in range(n)), 30)
    lat = [fleet.starts[i] - sent[i] for i in range(n) if fleet.starts[i]]
    return {
        "tasks": n,
        "measured": len(lat),
        "p50_ms": common.ms(percentile(lat, 0.50)),
        "p99_ms": common.ms(percentile(lat, 0.99)),
    }


def common_wait(cond, timeout: float, tick: float = 0.005) -> bool:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(tick)
    return True


def checkpoints(total: int, slice_size: int) -> list[int]:
    """Ends of the reported slices: the first, 10 k, 100 k and the last (those that fit)."""
    out = [min(slice_size, total)]
    out += [c for c in (10_000, 100_000) if out[-1] < c < total]
    if total not in out:
        out.append(total)
    return out


def _us(v: float | None) -> float | None:
    return None if v is None else round(v * 1e6, 1)


def ratio(first: float | None, last: float | None) -> float | None:
    if not first or last is None:
        return None
    return round(last / first, 3)


def tenths(rates: list[float], sizes: list[int]) -> list[float]:
    """Rates per tenth of the slices (tasks over seconds within each)."""
    k = max(1, len(rates) // 10)
    out = []
    for i in range(0, len(rates) - len(rates) % k if len(rates) >= 10 else len(rates), k):
        tasks = sum(sizes[i : i + k])
        secs = sum(n / r for n, r in zip(sizes[i : i + k], rates[i : i + k]) if r)
        out.append(round(tasks / secs, 1) if secs else 0.0)
    return out


def bare_line_index(n: int, groups: int, batch: int) -> list[float]:
    """Insert rates per tenth of ``n`` rows (task i in group i mod
    ``groups``, ``batch`` a transaction) into a fresh SQLite table with one
    index, on (group, id) as the store's line index, with the store's journal
    and cache settings: what that B-tree alone costs as it grows."""
    import sqlite3
    import tempfile

    with tempfile.TemporaryDirectory(prefix="corral-bare-") as d:
        con = sqlite3.connect(os.path.join(d, "bare.db"), isolation_level=None)
        try:
            for pragma in ("journal_mode = WAL", "synchronous = NORMAL", "cache_size = -16000"):
                con.execute(f"PRAGMA {pragma}")
            con.execute(
                "CREATE TABLE tasks (id INTEGER PRIMARY KEY, name TEXT, args TEXT, group_key TEXT,"
                " status TEXT, run_at REAL, trace_id TEXT)"
            )
            con.execute("CREATE INDEX tasks_line ON tasks (group_key, id) WHERE group_key IS NOT NULL")
            tenth = max(batch, n // 10)
            rates: list[float] = []
            spent = 0.0
            for b in range(0, n, batch):
                rows = [
                    ("scale.noop", f"[{i}]", f"g{i % groups}", "PENDING", time.time(), f"{i:032x}")
                    for i in range(b, min(n, b + batch))
                ]
                t0 = time.perf_counter()
                con.execute("BEGIN IMMEDIATE")
                con.executemany(
                    "INSERT INTO tasks (name, args, group_key, status, run_at, trace_id) VALUES (?, ?, ?, ?, ?, ?)",
                    rows,
                )
                con.execute("COMMIT")
                spent += time.perf_counter() - t0
                if (b + batch) % tenth == 0 or b + batch >= n:
                    rates.append(round(min(tenth, n - len(rates) * tenth) / spent, 1))
                    spent = 0.0
            return rates[:10]
        finally:
            con.close()


def run_scale(args) -> dict[str, Any]:
    prog = emit_progress if args.progress else (lambda *a: None)
    n, groups, sl = args.tasks, args.groups, args.slice
    drain = min(n, args.drain or n)
    sub_cps = checkpoints(n, sl)
    drain_cps = checkpoints(drain, sl)
    keep = [(c - 1) // sl for c in drain_cps]
    opts = {"concurrency": args.concurrency, "poll_interval": args.poll_interval}
    total_work = n + drain
    out: dict[str, Any] = {
        "scenario": "scale",
        "store": args.store,
        "tasks": n,
        "groups": groups,
        "slice": sl,
        "drained": drain,
        "workers": args.workers,
        "concurrency": args.concurrency,
        "cpus": os.cpu_count(),
        "load_avg_1m_start": round(os.getloadavg()[0], 2),
    }
    with common.temp_store_url(args.store, args.pg_url) as url:
        app = build_app(url)
        try:
            if args.latency_tasks:
                fleet = Fleet(url, args.workers, opts, probes=args.latency_tasks)
                try:
                    fleet.let_go()
                    out["latency_fresh"] = idle_latency(app, fleet, args.latency_tasks, args.spacing)
                finally:
                    fleet.close()

            # 2. submit, workers stopped
            tdef = app.registry["scale.noop"]
            slice_s: list[float] = []
            t_slice = 0.0
            sub_rss: dict[int, float | None] = {}
            batch = min(SUBMIT_BATCH, sl)  # no batch crosses the end of a slice
            e = 0
            while e < n:
                b, e = e, min(n, e + batch, (e // sl + 1) * sl)
                items = [{"args": (i,), "group": f"g{i % groups}"} for i in range(b, e)]
                t0 = time.perf_counter()
                app.submit_many(tdef, items)
                t_slice += time.perf_counter() - t0
                if e % sl == 0 or e == n:
                    slice_s.append(t_slice)
                    t_slice = 0.0
                    prog(e, total_work)
                if e in sub_cps:
                    sub_rss[e] = rss_mb(os.getpid())
            sizes = [sl] * (n // sl) + ([n % sl] if n % sl else [])
            rates = [round(k / s, 1) for k, s in zip(sizes, slice_s)]
            out["submit"] = {
                "batch": batch,
                "seconds": round(sum(slice_s), 3),
                "rate": round(n / sum(slice_s), 1),
                "slices": [
                    {"at": c, "rate": rates[(c - 1) // sl], "submitter_rss_mb": _r(sub_rss.get(c))} for c in sub_cps
                ],
                "slice_rates": rates,
            }
            reported = out["submit"]["slices"]
            out["submit"]["ratio_last_first"] = ratio(reported[0]["rate"], reported[-1]["rate"])
            out["submit"]["tenths"] = by_tenth = tenths(rates, sizes)
            out["submit"]["ratio_tenths"] = ratio(by_tenth[0], by_tenth[-1])

            # 3. drain
            fleet = Fleet(url, args.workers, opts, slice_size=sl, keep=keep, probes=args.latency_tasks)
            drain_rss: dict[int, list[float | None]] = {}
            drain_at: dict[int, float] = {}
            try:
                t_go = fleet.let_go()
                pending = list(drain_cps)
                end = t_go + args.timeout
                last_report = 0.0
                while pending:
                    done = fleet.counters[DONE]
                    now = time.monotonic()
                    while pending and done >= pending[0]:
                        c = pending.pop(0)
                        drain_rss[c] = fleet.rss()
                        drain_at[c] = now - t_go
                    if now - last_report > 0.5:
                        prog(n + min(done, drain), total_work)
                        last_report = now
                    if now > end:
                        raise RuntimeError(f"drain timed out: {done}/{drain} in {args.timeout:.0f} s")
                    time.sleep(0.02)
                drained_s = time.monotonic() - t_go
                prog(total_work, total_work)
                if drain == n and args.latency_tasks:
                    out["latency_after"] = idle_latency(app, fleet, args.latency_tasks, args.spacing)
            finally:
                fleet.close()
            times = fleet.claim_times
            slices: list[dict[str, Any]] = []
            for c in drain_cps:
                pairs = times.get((c - 1) // sl, [])
                ts, ks = list(pairs[0::2]), list(pairs[1::2])
                per_task = [t / k for t, k in zip(ts, ks)]
                rss = [r for r in drain_rss.get(c, []) if r is not None]
                slices.append(
                    {
                        "at": c,
                        "claims": len(ts),
                        "claim_p50_ms": common.ms(percentile(ts, 0.50)),
                        "claim_p99_ms": common.ms(percentile(ts, 0.99)),
                        "tasks_per_claim": round(sum(ks) / len(ks), 1) if ks else None,
                        "claim_us_per_task_p50": _us(percentile(per_task, 0.50)),
                        "worker_rss_mb": [round(r, 1) for r in rss],
                        "worker_rss_max_mb": round(max(rss), 1) if rss else None,
                        "elapsed_s": round(drain_at.get(c, 0.0), 2),
                    }
                )
            first, last = slices[0], slices[-1]
            out["drain"] = {
                "tasks": drain,
                "seconds": round(drained_s, 2),
                "rate": round(drain / drained_s, 1),
                "claims": fleet.counters[CLAIMS],
                "empty_claims": fleet.counters[EMPTY],
                "slices": slices,
                "ratio_claim_p50": ratio(first["claim_p50_ms"], last["claim_p50_ms"]),
                "ratio_claim_p99": ratio(first["claim_p99_ms"], last["claim_p99_ms"]),
                "ratio_claim_per_task": ratio(first["claim_us_per_task_p50"], last["claim_us_per_task_p50"]),
                "ratio_rss": ratio(first["worker_rss_max_mb"], last["worker_rss_max_mb"]),
            }
        finally:
            app.store.close()
    if args.store == "sqlite" and args.reference:
        bare = bare_line_index(n, groups, batch)
        out["submit"]["bare_line_index_tenths"] = bare
        out["submit"]["bare_ratio_tenths"] = ratio(bare[0], bare[-1])
    out["load_avg_1m_end"] = round(os.getloadavg()[0], 2)
    return out


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 1)


# ---- processes ---------------------------------------------------------------------------------
def _server_snapshot(url: str, dbname: str) -> dict[str, Any]:
    """What the server has done so far: this database's commits, the cluster's
    WAL, and the CPU time of the server's processes (when readable here)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as con:
        row = con.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (dbname,)).fetchone()
        (xact,) = row or (0,)
        try:
            wal = con.execute("SELECT wal_records, wal_bytes, wal_write, wal_sync FROM pg_stat_wal").fetchone()
        except psycopg.Error:
            wal = None
        (mine,) = con.execute("SELECT pg_backend_pid()").fetchone()  # type: ignore[misc]
        pids = [pid for (pid,) in con.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", (dbname,))]
    server_cpu = None
    backends_cpu = 0.0
    try:
        with open(f"/proc/{mine}/stat") as f:
            postmaster = int(f.read().rsplit(")", 1)[1].split()[1])
        server_cpu = _cpu_s(postmaster, children_of=True)
        backends_cpu = sum(_cpu_s(p) or 0.0 for p in pids if p != mine)
    except (OSError, ValueError, IndexError):
        pass
    return {
        "xact": int(xact),
        "wal": None if wal is None else [int(x) for x in wal],
        "server_cpu_s": server_cpu,
        "backends_cpu_s": backends_cpu if server_cpu is not None else None,
    }


def _cpu_s(pid: int, *, children_of: bool = False) -> float | None:
    """CPU seconds (user + system) of ``pid``, or of all its children."""
    tick = os.sysconf("SC_CLK_TCK")
    if not children_of:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / tick
        except (OSError, ValueError, IndexError):
            return None
    total = 0.0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            # the process's own time and that of its finished children (backends that exited)
            total += (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / tick
    return total


def run_processes(args) -> dict[str, Any]:
    prog = emit_progress if args.progress else (lambda *a: None)
    counts = [int(x) for x in args.processes.split(",")]
    n = args.tasks
    opts = {"concurrency": args.concurrency, "poll_interval": args.poll_interval}
    out: dict[str, Any] = {
        "scenario": "processes",
        "store": args.store,
        "tasks": n,
        "concurrency": args.concurrency,
        "cpus": os.cpu_count(),
        "load_avg_1m_start": round(os.getloadavg()[0], 2),
        "runs": [],
    }
    with common.temp_store_url(args.store, args.pg_url) as url:
        dbname = url.rsplit("/", 1)[1].split("?", 1)[0]
        app = build_app(url)
        tdef = app.registry["scale.noop"]
        try:
            for k, p in enumerate(counts):
                for b in range(0, n, SUBMIT_BATCH):
                    app.submit_many(tdef, [{"args": (i,)} for i in range(b, min(n, b + SUBMIT_BATCH))])
                fleet = Fleet(url, p, opts)
                try:
                    pg = args.store == "postgres"
                    before = _server_snapshot(url, dbname) if pg else None
                    t0 = fleet.let_go()
                    counters = fleet.counters
                    if not common_wait(lambda c=counters: c[DONE] >= n, args.timeout, tick=0.002):
                        raise RuntimeError(f"{p} processes: {fleet.counters[DONE]}/{n} done in {args.timeout} s")
                    dt = time.monotonic() - t0
                    after = _server_snapshot(url, dbname) if pg else None
                    claims = fleet.counters[CLAIMS]
                    run = {
                        "processes": p,
                        "seconds": round(dt, 3),
                        "tasks_per_s": round(n / dt, 1),
                        "claims": claims,
                        "claims_per_s": round(claims / dt, 1),
                        "tasks_per_claim": round(n / max(1, claims), 2),
                        "empty_claims": fleet.counters[EMPTY],
                    }
                    if before and after:
                        run.update(_costs(before, after, n, claims))
                    out["runs"].append(run)
                finally:
                    fleet.close()
                prog(k + 1, len(counts))
        finally:
            app.store.close()
    out["load_avg_1m_end"] = round(os.getloadavg()[0], 2)
    return out


def _costs(before: dict, after: dict, tasks: int, claims: int) -> dict[str, Any]:
    """Server work per task and per claim between two snapshots."""
    out: dict[str, Any] = {"xact_per_task": round((after["xact"] - before["xact"]) / tasks, 3)}
    if before["wal"] and after["wal"]:
        d = [a - b for a, b in zip(after["wal"], before["wal"])]
        out.update(
            wal_records_per_task=round(d[0] / tasks, 2),
            wal_bytes_per_task=round(d[1] / tasks, 1),
            wal_flushes_per_task=round(d[3] / tasks, 3),
            wal_flushes_per_claim=round(d[3] / max(1, claims), 3),
        )
    if before["server_cpu_s"] is not None and after["server_cpu_s"] is not None:
        cpu = after["server_cpu_s"] - before["server_cpu_s"]
        out.update(
            server_cpu_s=round(cpu, 2),
            server_cpu_ms_per_task=round(cpu * 1000 / tasks, 4),
            server_cpu_ms_per_claim=round(cpu * 1000 / max(1, claims), 4),
        )
    return out


# ---- tables ----------------------------------------------------------------------------------------
def _f(v: Any, fmt: str = "{:,.2f}") -> str:
    return "—" if v is None else fmt.format(v)


def render_scale(r: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(100, Console().width))
    sub, dr = r["submit"], r["drain"]
    t = Table(
        title=f"scale: {r['tasks']:,} tasks in {r['groups']:,} groups on {r['store']}, "
        f"{r['workers']} worker processes x {r['concurrency']} slots; slices of {r['slice']:,}"
    )
    cols = ("slice ending at", "submit tasks/s", "claim p50 ms", "claim p99 ms", "tasks a claim", "claim us a task")
    for col in (*cols, "worker RSS MB (max)"):
        t.add_column(col, justify="right")
    claims = {s["at"]: s for s in dr["slices"]}
    rows = sorted({s["at"] for s in sub["slices"]} | set(claims))
    subs = {s["at"]: s for s in sub["slices"]}
    for at in rows:
        s, c = subs.get(at, {}), claims.get(at, {})
        t.add_row(
            f"{at:,}",
            _f(s.get("rate"), "{:,.0f}"),
            _f(c.get("claim_p50_ms")),
            _f(c.get("claim_p99_ms")),
            _f(c.get("tasks_per_claim"), "{:,.1f}"),
            _f(c.get("claim_us_per_task_p50"), "{:,.1f}"),
            _f(c.get("worker_rss_max_mb"), "{:,.1f}"),
        )
    t.add_row(
        "last / first",
        _f(sub.get("ratio_last_first")),
        _f(dr.get("ratio_claim_p50")),
        _f(dr.get("ratio_claim_p99")),
        "",
        _f(dr.get("ratio_claim_per_task")),
        _f(dr.get("ratio_rss")),
    )
    console.print(t)
    if sub.get("tenths"):
        console.print(
            "submit tasks/s per tenth of the tasks: "
            + ", ".join(f"{v:,.0f}" for v in sub["tenths"])
            + f" (last / first {_f(sub.get('ratio_tenths'))})"
        )
    if sub.get("bare_line_index_tenths"):
        console.print(
            "the same rows into a bare SQLite table with only a (group, id) index: "
            + ", ".join(f"{v:,.0f}" for v in sub["bare_line_index_tenths"])
            + f" (last / first {_f(sub.get('bare_ratio_tenths'))}): the index's own slowdown"
        )
    console.print(
        f"submit {sub['rate']:,.0f} tasks/s overall ({sub['seconds']:.1f} s); drained {dr['tasks']:,} of "
        f"{r['tasks']:,} in {dr['seconds']:.1f} s ({dr['rate']:,.0f} tasks/s, {dr['claims']:,} claims)"
        + ("" if dr["tasks"] == r["tasks"] else "; a bounded drain: its last slice is the last one drained")
    )
    for key, label in (("latency_fresh", "fresh store"), ("latency_after", "after the drain")):
        la = r.get(key)
        if la:
            console.print(
                f"idle submit-to-start latency, {label}: p50 {_f(la['p50_ms'])} ms, p99 {_f(la['p99_ms'])} ms"
                f" ({la['measured']} tasks)"
            )
    console.print(f"load average (1 min) at start / end: {r['load_avg_1m_start']} / {r['load_avg_1m_end']}")


def render_processes(r: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(100, Console().width))
    t = Table(
        title=f"processes: {r['tasks']:,} no-op tasks on {r['store']}, {r['concurrency']} slots per process, "
        f"{r['cpus']} CPUs"
    )
    cols = ("processes", "tasks/s", "claims/s", "tasks/claim", "xact/task", "WAL flushes/task", "server CPU ms/task")
    for col in cols:
        t.add_column(col, justify="right")
    for run in r["runs"]:
        t.add_row(
            str(run["processes"]),
            _f(run["tasks_per_s"], "{:,.0f}"),
            _f(run["claims_per_s"], "{:,.0f}"),
            _f(run["tasks_per_claim"]),
            _f(run.get("xact_per_task")),
            _f(run.get("wal_flushes_per_task"), "{:.3f}"),
            _f(run.get("server_cpu_ms_per_task"), "{:.3f}"),
        )
    console.print(t)
    console.print(f"load average (1 min) at start / end: {r['load_avg_1m_start']} / {r['load_avg_1m_end']}")


# ---- child entry points --------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m corral.bench.scale")
    p.add_argument("what", choices=["scale", "processes"])
    p.add_argument("--store", default="sqlite", choices=["sqlite", "postgres"])
    p.add_argument("--pg-url", default=None)
    p.add_argument("--tasks", type=int, default=1_000_000)
    p.add_argument("--groups", type=int, default=10_000)
    p.add_argument("--slice", type=int, default=10_000)
    p.add_argument("--drain", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--processes", default="1,2,4,8")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--poll-interval", type=float, default=0.5)
    p.add_argument("--latency-tasks", type=int, default=200)
    p.add_argument("--spacing", type=float, default=0.025)
    p.add_argument("--timeout", type=float, default=3600.0)
    p.add_argument("--progress", action="store_true")
    p.add_argument("--no-reference", dest="reference", action="store_false")
    return p


def run(args) -> dict[str, Any]:
    return run_scale(args) if args.what == "scale" else run_processes(args)


def child_argv(what: str, **opts: Any) -> list[str]:
    return common.child_argv("corral.bench.scale", what, **opts)


def main(argv: list[str] | None = None) -> None:
    common.child_main(parser, run, argv)


if __name__ == "__main__":
    main()

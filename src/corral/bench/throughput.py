"""``corral bench throughput``: raw rates of one store.

Parts (all on one fresh store, in this order):

- ``enqueue``: no-op tasks submitted with ``submit_many`` in batches of 1000;
  tasks/s.
- ``process``: N queued no-op tasks run by P worker processes (each with
  ``--concurrency`` slots; with ``--groups G`` task i is in group i mod G,
  to show claim cost against the number of groups), for each P of ``--processes``; tasks/s from the
  first task's start to the last task's end (workers are started and ready
  before they are let go). ``--layout cli`` (the default) runs each process
  as ``corral worker`` does (``App.run``: the sweeper beside it, the fleet
  level followed, stopped by SIGTERM); ``--layout engine`` runs a bare
  :class:`~corral.engine.worker.Worker`. ``memory://`` is one process: its
  worker runs in process and P > 1 is skipped.
- ``io``: 10 ms sleeping tasks, ``--io-processes`` worker processes (2, in
  ``--layout``) with ``--io-concurrency`` slots each (10: the 2 x 10 layout
  of the peers' W2; memory:// runs one in-process worker with all the slots);
  efficiency = (sum of measured task durations / slots) / wall. Also the
  claims the worker made and their mean time. ``--claim-delay-ms 0,0.2,0.5``
  (``memory://`` only) repeats it with that much simulated round trip added
  to every claim: the ceiling a worker that never claims more than its free
  slots can reach against a store of that claim latency.
- ``latency``: tasks submitted one at a time with a pause between, an idle
  worker waiting; submit-to-start latency p50/p99 (from before the submit
  call to the first line of the task).

``--finished-rows N`` first fills the store with N finished rows (straight
through its SQL for the durable stores), to show claim cost does not grow
with history.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from typing import Any

from corral.bench import common
from corral.bench.common import Recorder, emit_progress
from corral.bench.profile import backend_cpu, summarize
from corral.core.claims import ClaimRequest
from corral.core.stats import percentile

PARTS = ("enqueue", "process", "io", "latency")
SUBMIT_BATCH = 1000


class _Workers:
    """P worker processes (durable stores) or one in-process worker (memory)."""

    def __init__(
        self,
        app,
        url: str,
        rec: Recorder,
        processes: int,
        opts: dict[str, Any],
        claim_delay: float = 0.0,
        layout: str = "engine",
        profile_dir: str | None = None,
    ):
        self.app, self.url, self.rec, self.processes, self.opts = app, url, rec, processes, opts
        self.profile_dir = profile_dir
        self.claim_delay = claim_delay
        self.layout = layout
        self.memory = common.store_kind(url) == "memory"
        self.procs: list = []

    def __enter__(self):
        if self.memory:
            return self
        from corral.bench import tasks

        ctx = common.spawn_context()
        self.stop, self.go = ctx.Event(), ctx.Event()
        readies = [ctx.Event() for _ in range(self.processes)]
        if self.layout == "cli":
            self.procs = [
                ctx.Process(
                    target=tasks.cli_worker_process,
                    name=f"corral-bench-worker-{k}",
                    args=(self.url, self.rec, self.rec.n, 1, 0, self.opts, readies[k], self.go, self.stop),
                    kwargs={"profile_to": self.profile_path(k)},
                )
                for k in range(self.processes)
            ]
        else:
            self.procs = [
                ctx.Process(
                    target=tasks.worker_process,
                    name=f"corral-bench-worker-{k}",
                    args=(self.url, self.rec, self.rec.n, 1, 0, self.opts, readies[k], self.stop, self.go),
                )
                for k in range(self.processes)
            ]
        for p in self.procs:
            p.start()
        for ev in readies:
            if not ev.wait(120):
                raise RuntimeError("a worker process did not start")
        return self

    def profile_path(self, k: int) -> str | None:
        return None if self.profile_dir is None else os.path.join(self.profile_dir, f"worker-{k}.json")

    def profiles(self) -> list[dict[str, Any]]:
        """The worker processes' profiles written so far (all of them once each has seen the stop)."""
        out = []
        for k in range(self.processes):
            path = self.profile_path(k)
            if path is not None and os.path.exists(path):
                with open(path) as f:
                    out.append(json.load(f))
        return out

    def go_now(self) -> None:
        if self.memory:
            from corral.bench import tasks

            tasks.set_recorder(self.rec)
            self.rec.time_claims(self.app.store, self.claim_delay)
            self.worker = self.app.worker(**self.opts).start()
        else:
            self.go.set()

    def __exit__(self, *exc) -> None:
        if self.memory:
            w = getattr(self, "worker", None)
            if w is not None:
                w.stop(grace=30.0)
                del self.app.store.claim  # the timing wrapper: back to the store's own
            return
        self.stop.set()
        if self.profile_dir is not None:  # each profile read before the SIGTERM stops its threads
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and len(self.profiles()) < self.processes:
                time.sleep(0.01)
        if self.layout == "cli":
            for p in self.procs:
                p.terminate()  # SIGTERM, as a supervisor stops `corral worker`
        for p in self.procs:
            p.join(60)
            if p.is_alive():
                p.kill()
                p.join()


def _submit(
    app, name: str, start: int, end: int, kwargs: dict | None = None, rec: Recorder | None = None, groups: int = 0
) -> None:
    """Submit tasks ``start..end``; with ``groups``, task i joins group i mod groups."""
    tdef = app.registry[name]
    for b in range(start, end, SUBMIT_BATCH):
        e = min(end, b + SUBMIT_BATCH)
        items = [{"args": (i - start,), "kwargs": kwargs or {}} for i in range(b, e)]
        if groups:
            for i, item in zip(range(b, e), items):
                item["group"] = f"g{i % groups}"
        if rec is not None:
            ts = time.monotonic()
            for i in range(b - start, e - start):
                rec.submit_ts[i] = ts
        app.submit_many(tdef, items)


def _span(rec: Recorder) -> tuple[float, float]:
    first = min(x for x in rec.start_ts if x)
    last = max(rec.finish_ts)
    return first, last


def prefill(app, url: str, rows: int, progress) -> float:
    """Add ``rows`` finished (SUCCESS) tasks; returns the seconds it took."""
    t0 = time.monotonic()
    kind = common.store_kind(url)
    if kind == "memory":
        store = app.store
        tdef = app.registry["bench.noop"]
        done = 0
        while done < rows:
            k = min(SUBMIT_BATCH, rows - done)
            app.submit_many(tdef, [{"args": (0,)} for _ in range(k)])
            claims = store.claim("prefill", ClaimRequest(("default",), k, names=None, lease_seconds=60))
            from corral.core.model import Outcome
            from corral.core.states import State

            store.complete(
                [Outcome(t.id, c.token, t.version, State.SUCCESS, result="null") for c in claims for t in c.tasks]
            )
            done += k
            progress(done, rows)
        return time.monotonic() - t0
    # durable: one real row, made SUCCESS, then doubled with INSERT ... SELECT
    h = app.submit_many(app.registry["bench.noop"], [{"args": (0,)}])[0]
    now = time.time()
    candidates = ("corral_tasks", "tasks")  # the stores' task table, whichever this schema uses
    if kind == "sqlite":
        import sqlite3

        from corral.stores.sqlite import parse_url

        con = sqlite3.connect(parse_url(url)[0], isolation_level=None, timeout=60)
        ph = "?"

        def columns(table: str) -> list[str]:
            return [name for _, name, *_ in con.execute(f"PRAGMA table_info({table})")]
    else:
        import psycopg

        con = psycopg.connect(url, autocommit=True)  # type: ignore[assignment]
        ph = "%s"

        def columns(table: str) -> list[str]:
            return [
                name
                for (name,) in con.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
                    "AND table_schema = current_schema() ORDER BY ordinal_position",
                    (table,),
                )
            ]

    try:
        table, cols = next(((t, c) for t in candidates if (c := columns(t))), (None, []))
        if table is None:
            raise RuntimeError("cannot find the store's task table")
        con.execute(
            f"UPDATE {table} SET status = 'SUCCESS', attempt = 1, started_at = {ph}, finished_at = {ph}, "
            f"result = 'null', version = version + 2 WHERE id = {ph}",
            (now, now, h.id),
        )
        cols = [c for c in cols if c != "id"]
        col_list = ", ".join(cols)
        have = 1
        while have < rows:
            k = min(have, rows - have, 200_000)
            con.execute(
                f"INSERT INTO {table} ({col_list}) SELECT {col_list} FROM {table} WHERE status = 'SUCCESS' LIMIT {ph}",
                (k,),
            )
            have += k
            progress(have, rows)
        con.execute(f"ANALYZE {table}" if kind != "sqlite" else "ANALYZE")
    finally:
        con.close()
    return time.monotonic() - t0


def run(args) -> dict[str, Any]:
    from corral.bench import tasks

    parts = args.only.split(",")
    procs = [int(x) for x in args.processes.split(",")]
    prog = emit_progress if args.progress else (lambda *a: None)
    out: dict[str, Any] = {
        "scenario": "throughput",
        "store": args.store,
        "finished_rows": args.finished_rows,
        "tasks": args.tasks,
    }
    with common.temp_store_url(args.store, args.pg_url) as url:
        app = tasks.build_app(url, limit=None)
        memory = args.store == "memory"
        try:
            if args.finished_rows:
                out["prefill_s"] = round(prefill(app, url, args.finished_rows, prog), 3)

            def opts(conc: int) -> dict[str, Any]:
                o: dict[str, Any] = {"concurrency": conc, "poll_interval": args.poll_interval, "lease_seconds": 60.0}
                if args.prefetch is not None:
                    o["prefetch"] = args.prefetch
                return o

            def run_away(queued: int) -> int:
                """Run the enqueue part's tasks away, untimed; returns the tasks left queued (0)."""
                if queued:
                    rec0 = Recorder(queued, 1 << 30, shared=not memory)
                    with _Workers(app, url, rec0, 1, opts(args.concurrency)) as w:
                        w.go_now()
                        if not rec0.wait_done(queued, timeout=args.timeout):
                            raise RuntimeError(f"enqueued tasks did not run away: {rec0.done}/{queued}")
                return 0

            if "enqueue" in parts:
                n = args.tasks
                t0 = time.perf_counter()
                _submit(app, "bench.noop", 0, n)
                dt = time.perf_counter() - t0
                out["enqueue"] = {"tasks": n, "batch": SUBMIT_BATCH, "seconds": round(dt, 4), "rate": round(n / dt, 1)}
                # these tasks are run away (untimed) before the next part
                queued = n
            else:
                queued = 0

            if "process" in parts:
                out["process"] = []
                for p in procs:
                    if memory and p > 1:
                        out["process"].append({"processes": p, "skipped": "memory:// is one process"})
                        continue
                    n = args.tasks
                    queued = run_away(queued)
                    rec = Recorder(n, 1 << 30, shared=not memory)
                    _submit(app, "bench.noop", 0, n, groups=args.groups)
                    profiling = args.profile and not memory and args.layout == "cli"
                    pdir = tempfile.mkdtemp(prefix="corral-profile-") if profiling else None
                    server0 = None
                    with _Workers(app, url, rec, p, opts(args.concurrency), layout=args.layout, profile_dir=pdir) as w:
                        if profiling and args.store == "postgres":
                            server0 = backend_cpu(url)
                        w.go_now()
                        if not rec.wait_done(n, timeout=args.timeout, progress=prog if args.progress else None):
                            raise RuntimeError(f"process run timed out: {rec.done}/{n}")
                        server1 = backend_cpu(url) if server0 is not None else None
                    first, last = _span(rec)
                    profile = None
                    if pdir is not None:
                        server = None
                        if server0 is not None and server1 is not None:
                            server = sum(cpu - server0.get(pid, 0.0) for pid, cpu in server1.items())
                        profile = summarize(w.profiles(), n, server)
                        profile["wall_us_per_task"] = round((last - first) * 1e6 / n, 1)
                        shutil.rmtree(pdir, ignore_errors=True)
                    out["process"].append(
                        {
                            **({"profile": profile} if profile is not None else {}),
                            "processes": p if not memory else 1,
                            "in_process": memory,
                            "layout": "in process" if memory else args.layout,
                            "groups": args.groups,
                            "concurrency": args.concurrency,
                            "tasks": n,
                            "seconds": round(last - first, 4),
                            "rate": round(n / (last - first), 1),
                            "duplicates": rec.counters[common.DUPLICATES],
                        }
                    )

            queued = run_away(queued)  # a later part must start on an empty queue

            if "io" in parts:
                out["io"] = []
                for delay_ms in args.claim_delay_ms:
                    n = args.io_tasks
                    rec = Recorder(n, 1 << 30, shared=not memory)
                    _submit(app, "bench.io_sleep", 0, n, {"ms": 10.0})
                    io_procs = 1 if memory else args.io_processes
                    slots = args.io_concurrency * args.io_processes
                    per_proc = slots if memory else args.io_concurrency
                    with _Workers(
                        app, url, rec, io_procs, opts(per_proc), claim_delay=delay_ms / 1000, layout=args.layout
                    ) as w:
                        w.go_now()
                        if not rec.wait_done(n, timeout=args.timeout, progress=prog if args.progress else None):
                            raise RuntimeError(f"io run timed out: {rec.done}/{n}")
                    first, last = _span(rec)
                    ideal = sum(rec.dur) / slots
                    claims, claim_ms = rec.claim_stats()
                    out["io"].append(
                        {
                            "tasks": n,
                            "sleep_ms": 10.0,
                            "concurrency": per_proc,
                            "processes": io_procs,
                            "layout": "in process" if memory else args.layout,
                            "wall_s": round(last - first, 4),
                            "ideal_s": round(ideal, 4),
                            "efficiency": round(ideal / (last - first), 4),
                            "claims": claims,
                            "claim_ms": round(claim_ms, 3),
                            "claim_delay_ms": delay_ms,
                        }
                    )

            if "latency" in parts:
                n = args.latency_tasks
                rec = Recorder(n, 1 << 30, shared=not memory)
                tdef = app.registry["bench.noop"]
                lat = []
                with _Workers(app, url, rec, 1, opts(args.concurrency)) as w:
                    w.go_now()
                    time.sleep(0.5)  # let it settle into waiting for work
                    for i in range(n):
                        t0 = time.monotonic()
                        rec.submit_ts[i] = t0
                        app.submit_many(tdef, [{"args": (i,)}])
                        end = t0 + 30
                        while rec.start_ts[i] == 0.0 and time.monotonic() < end:
                            time.sleep(0.0002)
                        if rec.start_ts[i]:
                            lat.append(rec.start_ts[i] - t0)
                        if args.progress and i % 20 == 0:
                            prog(i, n)
                        time.sleep(args.pause)
                    rec.wait_done(n, timeout=30)
                out["latency"] = {
                    "tasks": n,
                    "measured": len(lat),
                    "pause_s": args.pause,
                    "p50_ms": common.ms(percentile(lat, 0.50)),
                    "p99_ms": common.ms(percentile(lat, 0.99)),
                    "max_ms": common.ms(max(lat) if lat else None),
                }
        finally:
            app.store.close()
    out["peak_rss_mb"] = round(common.peak_rss_mb(), 1)
    if not memory:
        out["worker_peak_rss_mb"] = round(common.peak_rss_mb(common.resource.RUSAGE_CHILDREN), 1)
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m corral.bench.throughput")
    p.add_argument("--store", default="sqlite", choices=["memory", "sqlite", "postgres"])
    p.add_argument("--tasks", type=int, default=20_000)
    p.add_argument("--io-tasks", type=int, default=2_000)
    p.add_argument("--latency-tasks", type=int, default=200)
    p.add_argument("--pause", type=float, default=0.02)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--layout", default="cli", choices=["cli", "engine"])
    p.add_argument("--prefetch", type=int, default=None)
    p.add_argument("--io-concurrency", type=int, default=10)
    p.add_argument("--io-processes", type=int, default=2)
    p.add_argument("--processes", default="1,2")
    p.add_argument("--finished-rows", type=int, default=0)
    p.add_argument("--groups", type=int, default=0)
    p.add_argument("--claim-delay-ms", type=lambda v: [float(x) for x in v.split(",")], default=[0.0])
    p.add_argument("--only", default=",".join(PARTS))
    p.add_argument("--poll-interval", type=float, default=0.5)
    p.add_argument("--pg-url", default=None)
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--progress", action="store_true")
    p.add_argument(
        "--profile",
        action="store_true",
        help="process part, --layout cli: CPU microseconds a task by part of the worker "
        "(claim, complete, dispatch, the slots, ...) and of the PostgreSQL server",
    )
    return p


def child_argv(**opts: Any) -> list[str]:
    return common.child_argv("corral.bench.throughput", **opts)


def render(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(100, Console().width))
    t = Table(
        title=f"throughput: {report['store']}"
        + (f", {report['finished_rows']:,} finished rows pre-filled" if report.get("finished_rows") else "")
    )
    t.add_column("measure")
    t.add_column("value", justify="right")
    if "enqueue" in report:
        e = report["enqueue"]
        t.add_row(f"enqueue (submit_many x{e['batch']})", f"{e['rate']:,.0f} tasks/s")
    for p in report.get("process", []):
        if "skipped" in p:
            t.add_row(f"no-op processing, {p['processes']} processes", f"skipped ({p['skipped']})")
        else:
            if p.get("in_process"):
                who = "in-process worker"
            elif p.get("layout") == "engine":
                who = f"{p['processes']} bare Worker proc"
            else:
                who = f"{p['processes']} x `corral worker`"
            grouped = f", {p['groups']:,} groups" if p.get("groups") else ""
            t.add_row(f"no-op processing, {who} x{p['concurrency']} slots{grouped}", f"{p['rate']:,.0f} tasks/s")
            prof = p.get("profile")
            if prof:
                t.add_row(
                    f"  CPU a task (wall {prof['wall_us_per_task']:.0f} us x 2 cores; "
                    f"{prof['tasks_per_claim'] or 0:.0f} tasks a claim)",
                    f"{prof['total_us_per_task']:.0f} us",
                )
                for part, us in prof["us_per_task"].items():
                    t.add_row(f"    {part}", f"{us:.1f} us")
    for io in report.get("io", []):
        added = f" +{io['claim_delay_ms']:g} ms/claim" if io["claim_delay_ms"] else ""
        t.add_row(
            f"I/O 10 ms x{io['tasks']:,}, {io.get('processes', 1)} x {io['concurrency']} slots{added}: efficiency",
            f"{io['efficiency']:.3f} ({io['wall_s']:.2f}s vs ideal {io['ideal_s']:.2f}s)",
        )
        t.add_row(
            "  its claims",
            f"{io['claims']:,} x {io['claim_ms']:.2f} ms ({io['tasks'] / max(1, io['claims']):.1f} tasks each)",
        )
    if "latency" in report:
        la = report["latency"]
        t.add_row(
            f"idle submit-to-start latency p50 / p99 ({la['measured']} tasks)",
            f"{la['p50_ms']:.2f} / {la['p99_ms']:.2f} ms",
        )
    t.add_row("peak RSS (bench process)", f"{report['peak_rss_mb']:.1f} MB")
    console.print(t)


def main(argv: list[str] | None = None) -> None:
    common.child_main(parser, run, argv)


if __name__ == "__main__":
    main()

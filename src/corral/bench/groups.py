"""``corral bench groups``: ordered groups under a shared downstream cap.

N tasks in G groups; each calls a simulated downstream that sleeps
5 ms + uniform(0, 10) ms and rejects any call beyond 20 in flight. Three ways
to run them, each in its own child process (``python -m corral.bench.groups
--variant X``) so that peak RSS is per variant:

A. one global queue + ThreadPoolExecutor(20); a rejected task is resubmitted
   (the naive first version);
B. per-group locks + ThreadPoolExecutor(20): a task takes its group's lock
   before calling (a rejected call is retried inside the lock);
C. corral: ``app.limit("downstream", concurrency=20)``, tasks submitted with
   ``group=`` and run by a worker with 20 slots and otherwise the defaults a
   user gets (chunk size and prefetch chosen by the worker, unless given), on
   ``memory://`` or, with ``--store sqlite|postgres --workers P``, on a
   durable store with P worker processes.
"""

from __future__ import annotations

import argparse
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from corral.bench import common
from corral.bench.common import DownstreamRejected, Recorder, emit_progress, plan

VARIANTS = {
    "A": "global queue + ThreadPoolExecutor",
    "B": "per-group locks + ThreadPoolExecutor",
    "C": "corral",
}
SUBMIT_BATCH = 1000


def run_a(rec: Recorder, grp, args) -> float:
    pool = ThreadPoolExecutor(max_workers=args.concurrency)

    def run(i: int) -> None:
        try:
            rec.call(i)
        except DownstreamRejected:
            pool.submit(run, i)  # back of the global queue, as the naive first version did

    return _drive(pool, run, rec, args)


def _drive(pool: ThreadPoolExecutor, run, rec: Recorder, args) -> float:
    """Submit every task to ``pool`` (noting submit times), wait until all are
    done, and return the start time."""
    t0 = time.monotonic()
    submit_ts = rec.submit_ts
    for i in range(rec.n):
        submit_ts[i] = time.monotonic()
        pool.submit(run, i)
    rec.wait_done(rec.n, progress=_progress(args))
    pool.shutdown(wait=True)
    return t0


def run_b(rec: Recorder, grp, args) -> float:
    pool = ThreadPoolExecutor(max_workers=args.concurrency)
    locks = [threading.Lock() for _ in range(args.groups)]

    def run(i: int) -> None:
        with locks[grp[i]]:
            delay = 0.001
            while True:
                try:
                    rec.call(i)
                    return
                except DownstreamRejected:
                    time.sleep(delay)
                    delay = min(0.05, delay * 2)

    return _drive(pool, run, rec, args)


def _submit_all(app, rec: Recorder, grp, args) -> float:
    tdef = app.registry["bench.downstream_call"]
    names = [f"g{g}" for g in range(args.groups)]
    submit_ts = rec.submit_ts
    t0 = time.monotonic()
    for start in range(0, rec.n, SUBMIT_BATCH):
        end = min(rec.n, start + SUBMIT_BATCH)
        items = [{"args": (i,), "group": names[grp[i]]} for i in range(start, end)]
        ts = time.monotonic()
        for i in range(start, end):
            submit_ts[i] = ts
        app.submit_many(tdef, items)
    return t0


def worker_opts(args) -> dict[str, Any]:
    """The worker's options: what the command line gave, the defaults otherwise."""
    opts: dict[str, Any] = {"concurrency": args.concurrency, "poll_interval": args.poll_interval}
    if args.chunk_size is not None:
        opts["chunk_size"] = args.chunk_size
    if args.prefetch is not None:
        opts["prefetch"] = args.prefetch
    return opts


def run_c_memory(rec: Recorder, grp, args) -> float:
    from corral.bench import tasks

    tasks.set_recorder(rec)
    app = tasks.build_app("memory://", limit=args.limit)
    app.start(**{("workers" if k == "concurrency" else k): v for k, v in worker_opts(args).items()})
    t0 = _submit_all(app, rec, grp, args)
    rec.wait_done(rec.n, progress=_progress(args))
    app.close(timeout=60)
    return t0


def run_c_durable(rec: Recorder, grp, args, url: str) -> float:
    from corral.bench import tasks

    ctx = common.spawn_context()
    app = tasks.build_app(url, limit=args.limit)
    stop = ctx.Event()
    readies = [ctx.Event() for _ in range(args.workers)]
    procs = [
        ctx.Process(
            target=tasks.worker_process,
            name=f"corral-bench-worker-{k}",
            args=(url, rec, rec.n, args.groups, args.seed, worker_opts(args), readies[k], stop),
        )
        for k in range(args.workers)
    ]
    for p in procs:
        p.start()
    try:
        for ev in readies:
            if not ev.wait(120):
                raise RuntimeError("a worker process did not start")
        t0 = _submit_all(app, rec, grp, args)
        if not rec.wait_done(rec.n, timeout=args.timeout, progress=_progress(args)):
            raise RuntimeError(f"timed out: {rec.done}/{rec.n} tasks done")
    finally:
        stop.set()
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
                p.join()
        app.store.close()
    return t0


def _progress(args):
    return emit_progress if args.progress else None


def run_variant(args) -> dict[str, Any]:
    grp, sleeps = plan(args.tasks, args.groups, args.seed)
    durable = args.variant == "C" and args.store != "memory"
    rec = Recorder(args.tasks, args.limit, sleeps, shared=durable)
    if args.variant == "A":
        t0 = run_a(rec, grp, args)
    elif args.variant == "B":
        t0 = run_b(rec, grp, args)
    elif not durable:
        t0 = run_c_memory(rec, grp, args)
    else:
        with common.temp_store_url(args.store, args.pg_url) as url:
            t0 = run_c_durable(rec, grp, args, url)
    out: dict[str, Any] = {
        "variant": args.variant,
        "label": VARIANTS[args.variant],
        "store": args.store if args.variant == "C" else None,
        "workers": args.workers if durable else 1,
        "concurrency": args.concurrency,
        "chunk_size": args.chunk_size if args.variant == "C" else None,
        "groups": args.groups,
    }
    out.update(common.summarize(rec, t0, grp=grp, groups=args.groups, slots=args.limit))
    out["peak_rss_mb"] = round(common.peak_rss_mb(), 1)
    if durable:
        out["worker_peak_rss_mb"] = round(common.peak_rss_mb(common.resource.RUSAGE_CHILDREN), 1)
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m corral.bench.groups", description=__doc__.splitlines()[0])
    p.add_argument("--variant", choices=sorted(VARIANTS), required=True)
    p.add_argument("--tasks", type=int, default=100_000)
    p.add_argument("--groups", type=int, default=200)
    p.add_argument("--limit", type=int, default=20, help="downstream concurrency cap")
    p.add_argument("--concurrency", type=int, default=20, help="threads (A, B) or worker slots (C)")
    p.add_argument("--chunk-size", type=int, default=None)
    p.add_argument("--prefetch", type=int, default=None)
    p.add_argument("--poll-interval", type=float, default=0.5)
    p.add_argument("--store", default="memory", choices=["memory", "sqlite", "postgres"])
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--pg-url", default=None)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--timeout", type=float, default=3600.0)
    p.add_argument("--progress", action="store_true")
    return p


def child_argv(variant: str, **opts: Any) -> list[str]:
    return common.child_argv("corral.bench.groups", "--variant", variant, **opts)


def main(argv: list[str] | None = None) -> None:
    common.child_main(parser, run_variant, argv)


if __name__ == "__main__":
    main()

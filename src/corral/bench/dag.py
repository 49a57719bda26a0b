"""``corral bench dag``: how close a 1 000-node graph comes to the most
parallelism the slots allow.

The graph is layered and random with a fixed seed: ``--layers`` layers of
equal width, each node of a layer after the first depending on 1 to
``--fan-in`` nodes of the layer before. Every task sleeps ``--duration``
seconds. The whole graph is submitted in one ``submit_many`` call (by refs)
and run by one in-process worker with ``--slots`` slots.

No schedule on ``slots`` slots can finish sooner than

    ideal = max(critical path, total work / slots)

(the longest chain of work, and all the work spread evenly over every slot).
The report gives the makespan (first start to last finish, store clock), the
ratio ``ideal / makespan`` (1.0: as fast as the slots allow), and the
achieved parallelism ``total work / makespan`` beside its bound
``total work / ideal``.
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

from corral.bench import common
from corral.bench.common import emit_progress
from corral.core import dag


def layered_graph(nodes: int, layers: int, fan_in: int, seed: int) -> list[list[int]]:
    """``after`` lists of a layered random DAG: node i's dependencies, all in
    the layer just before its own (nodes numbered layer by layer)."""
    if nodes < 1 or layers < 1 or fan_in < 1:
        raise ValueError("nodes, layers and fan-in must be at least 1")
    layers = min(layers, nodes)
    rnd = random.Random(seed)
    bounds = [nodes * k // layers for k in range(layers + 1)]
    after: list[list[int]] = []
    for k in range(layers):
        prev = range(bounds[k - 1], bounds[k]) if k else range(0)
        for _ in range(bounds[k], bounds[k + 1]):
            after.append(sorted(rnd.sample(prev, min(len(prev), rnd.randint(1, fan_in)))) if k else [])
    return after


def run(args) -> dict[str, Any]:
    import corral

    after = layered_graph(args.nodes, args.layers, args.fan_in, args.seed)
    n = len(after)
    durations = [args.duration] * n
    ideal = dag.ideal_makespan(durations, after, args.slots)
    crit = dag.critical_path(durations, after)
    work = sum(durations)
    prog = emit_progress if args.progress else (lambda *a: None)
    with common.temp_store_url(args.store, args.pg_url) as url:
        app = corral.App(url)
        try:

            @app.task(name="bench.dag_node")
            def node(i: int) -> int:
                time.sleep(args.duration)
                return i

            graph = [node.node(i, ref=f"n{i}", depends_on=[f"n{j}" for j in deps]) for i, deps in enumerate(after)]
            t0 = time.perf_counter()
            handles = app.submit_many(graph)
            submit_s = time.perf_counter() - t0
            app.start(workers=args.slots, lease_seconds=60.0)
            ids = [h.id for h in handles]
            deadline = time.monotonic() + args.timeout
            done = 0
            while done < n:
                counts = app.counts()
                done = counts.get("SUCCESS", 0)
                bad = sum(counts.get(s, 0) for s in ("FAILED", "TIMEOUT", "CANCELED"))
                if bad:
                    raise RuntimeError(f"{bad} graph tasks did not succeed: {counts}")
                prog(done, n)
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the graph did not finish in {args.timeout}s: {counts}")
                if done < n:
                    app.store.wait_for_work(0.05)
            wall_s = time.perf_counter() - t0
            recs = [app.get(i) for i in ids]
        finally:
            app.close(timeout=30)
    starts = [r.started_at for r in recs if r.started_at is not None]
    ends = [r.finished_at for r in recs if r.finished_at is not None]
    makespan = max(ends) - min(starts)
    return {
        "scenario": "dag",
        "store": args.store,
        "nodes": n,
        "edges": sum(map(len, after)),
        "layers": max(dag.depths(after)) + 1,
        "slots": args.slots,
        "duration_s": args.duration,
        "seed": args.seed,
        "critical_path_s": round(crit, 4),
        "total_work_s": round(work, 4),
        "ideal_makespan_s": round(ideal, 4),
        "makespan_s": round(makespan, 4),
        "ratio": round(ideal / makespan, 3),
        "parallelism": round(work / makespan, 2),
        "parallelism_bound": round(work / ideal, 2),
        "submit_s": round(submit_s, 4),
        "wall_s": round(wall_s, 4),
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m corral.bench.dag")
    p.add_argument("--store", default="memory", choices=["memory", "sqlite", "postgres"])
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--layers", type=int, default=20)
    p.add_argument("--fan-in", type=int, default=3)
    p.add_argument("--slots", type=int, default=16)
    p.add_argument("--duration", type=float, default=0.02)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--pg-url", default=None)
    p.add_argument("--progress", action="store_true")
    return p


def child_argv(**opts: Any) -> list[str]:
    return common.child_argv("corral.bench.dag", **opts)


def render(reports: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    first = reports[0]
    t = Table(
        title=(
            f"dag: {first['nodes']} nodes, {first['edges']} edges, {first['layers']} layers, "
            f"{first['slots']} slots, {first['duration_s'] * 1000:g} ms tasks (seed {first['seed']})"
        ),
        caption="ideal = max(critical path, total work / slots); ratio = ideal / makespan (1.0 is the best possible)",
    )
    for col in (
        "store",
        "critical path s",
        "work / slots s",
        "ideal s",
        "makespan s",
        "ratio",
        "parallelism",
        "bound",
        "submit s",
    ):
        t.add_column(col, justify="left" if col == "store" else "right")
    for r in reports:
        t.add_row(
            r["store"],
            f"{r['critical_path_s']:.3f}",
            f"{r['total_work_s'] / r['slots']:.3f}",
            f"{r['ideal_makespan_s']:.3f}",
            f"{r['makespan_s']:.3f}",
            f"{r['ratio']:.3f}",
            f"{r['parallelism']:.2f}",
            f"{r['parallelism_bound']:.2f}",
            f"{r['submit_s']:.3f}",
        )
    Console(width=max(110, Console().width)).print(t)


def main(argv: list[str] | None = None) -> None:
    common.child_main(parser, run, argv)


if __name__ == "__main__":
    main()

"""``corral plan``: the capacity planner. This module reads the options and
checks which go together; :func:`corral.core.planning.capacity_plan` does the
arithmetic and :mod:`corral.cli.render` prints it."""

from __future__ import annotations

from typing import Any

import click

from corral.cli import render
from corral.cli.common import CLIError, duration_arg, json_option, store_option
from corral.core import planning


@click.command()
@store_option
@click.option("--qps", type=float, help="(a) Downstream QPS cap.")
@click.option("--latency-ms", type=float, help="(a) Mean latency of one downstream request, in ms.")
@click.option("--latency", "latency_text", metavar="DURATION", help="(a) The same as a duration (200ms, 0.2s).")
@click.option(
    "--safety", type=float, default=planning.DEFAULT_SAFETY, show_default=True, help="(a) Safety factor, 0.6-0.8."
)
@click.option("--done", type=int, help="(b) Tasks finished in the measured window.")
@click.option("--hours", type=float, help="(b) Measured window in hours.")
@click.option("--window", "window_text", metavar="DURATION", help="(b) The same as a duration (48h, 2d).")
@click.option("--workers", type=float, help="(b) Concurrency during the measured window.")
@click.option(
    "--mean", "mean_text", metavar="DURATION", help="(b) Known mean task duration instead of --done/--hours/--workers."
)
@click.option("--target", type=int, help="(b) Tasks to finish in the target window.")
@click.option("--target-hours", type=float, help="(b) Target window in hours (default: the measured window).")
@click.option("--io-minutes", type=float, help="(c) I/O wait per task (any unit, same as --cpu-minutes).")
@click.option("--cpu-minutes", type=float, help="(c) CPU time per task.")
@click.option(
    "--cap",
    type=click.IntRange(min=1),
    default=planning.DEFAULT_WORKER_CAP,
    show_default=True,
    help="(c) Most workers per process.",
)
@click.option("--concurrency", type=click.IntRange(min=1), help="(d) Target concurrency (default: from (b)).")
@click.option("--per-process", type=click.IntRange(min=1), help="(d) Workers per process (default: from (c)).")
@click.option(
    "--from-history",
    "history_name",
    metavar="TASKNAME",
    help="Measure this task's finished runs in the store and fill the formulas in (with --qps, --target).",
)
@click.option("--batch", "history_batch", metavar="B", help="Measure this batch's finished tasks instead.")
@click.option(
    "--sample",
    type=click.IntRange(min=1, max=1_000_000),
    default=planning.DEFAULT_HISTORY_SAMPLE,
    show_default=True,
    help="Newest finished tasks read with --from-history/--batch.",
)
@json_option
def plan(
    store_url,
    qps,
    latency_ms,
    latency_text,
    safety,
    done,
    hours,
    window_text,
    workers,
    mean_text,
    target,
    target_hours,
    io_minutes,
    cpu_minutes,
    cap,
    concurrency,
    per_process,
    history_name,
    history_batch,
    sample,
    as_json,
):
    """Capacity planner: how many tasks may run at once, and on how many processes.

    Pure arithmetic, except with --from-history/--batch (which read --store).

    \b
    (a) limit: rate = QPS x safety, concurrency = 2 x QPS x latency (s)   --qps 100 --latency-ms 200
    (b) Little  = throughput x mean duration                --done 392 --hours 48 --workers 4 --target 720
    (c) workers per process = 1 + io wait / cpu time, capped  --io-minutes 25 --cpu-minutes 4
    (d) processes and lanes (sub-groups) for the concurrency
    With no option at all, shows worked examples (the numbers above).

    \b
    --from-history TASKNAME (or --batch B) measures finished tasks in --store:
    p50/p99/mean duration, success rate, throughput; then Little's law and the
    limit with those numbers (--qps: the downstream's cap; --target N
    --target-hours H: the workers to finish N tasks in H hours).
    """
    if history_name is not None or history_batch is not None:
        others = {
            "--latency-ms": latency_ms,
            "--latency": latency_text,
            "--done": done,
            "--hours": hours,
            "--window": window_text,
            "--workers": workers,
            "--mean": mean_text,
            "--io-minutes": io_minutes,
            "--cpu-minutes": cpu_minutes,
            "--concurrency": concurrency,
            "--per-process": per_process,
        }
        extra = [k for k, v in others.items() if v is not None]
        if extra:
            raise click.UsageError(f"{extra[0]} does not go with --from-history/--batch: the store measures it")
        _from_history(store_url, history_name, history_batch, sample, qps, safety, target, target_hours, as_json)
        return
    given = any(
        v is not None
        for v in (
            qps,
            latency_ms,
            latency_text,
            done,
            hours,
            window_text,
            workers,
            mean_text,
            target,
            target_hours,
            io_minutes,
            cpu_minutes,
            concurrency,
            per_process,
        )
    )
    inputs: dict[str, Any]
    if not given:
        inputs = dict(planning.WORKED_EXAMPLE)
    else:
        latency = (
            duration_arg(latency_text, "--latency", "ms")
            if latency_text
            else latency_ms / 1000.0
            if latency_ms is not None
            else None
        )
        window = (
            duration_arg(window_text, "--window", "h") if window_text else hours * 3600.0 if hours is not None else None
        )
        inputs = {
            "qps": qps,
            "latency_s": latency,
            "done": done,
            "window_s": window,
            "workers": workers,
            "target": target,
            "target_window_s": target_hours * 3600.0 if target_hours is not None else None,
            "mean_duration_s": duration_arg(mean_text, "--mean", "m") if mean_text else None,
            "io_wait": io_minutes,
            "cpu_time": cpu_minutes,
            "concurrency": concurrency,
            "per_process": per_process,
        }
        _check_together(inputs)
    try:
        result = planning.capacity_plan(safety=safety, cap=cap, **inputs)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    if result.empty:
        raise click.UsageError(
            "nothing to plan: give --qps/--latency-ms, --done/--hours/--workers, or --io-minutes/--cpu-minutes"
        )
    if as_json:
        render.print_json(render.plan_dict(result, example=not given))
    else:
        render.print_plan(result, example=not given)


def _from_history(store_url, name, batch, sample, qps, safety, target, target_hours, as_json) -> None:
    """The plan with measured numbers: the store's newest finished tasks of
    ``name`` (or of ``batch``) fill the formulas in."""
    from corral.cli.common import open_given_store

    if target_hours is not None and target is None:
        raise click.UsageError("--target-hours needs --target")
    subject = f"batch {batch!r}" if batch is not None else f"task {name!r}"
    if batch is not None and name is not None:
        subject = f"task {name!r} in batch {batch!r}"
    store = open_given_store(store_url, create=False)
    try:
        rows = store.finished_history(name=name, batch=batch, limit=sample)
    finally:
        store.close()
    if not rows:
        raise CLIError(f"{subject} has no finished task (SUCCESS, FAILED or TIMEOUT) in the store to measure")
    h = planning.history(subject, rows, sample)
    try:
        hp = planning.history_plan(
            h,
            qps=qps,
            safety=safety,
            target=target,
            target_window_s=target_hours * 3600.0 if target_hours is not None else None,
        )
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    if as_json:
        render.print_json(hp.as_dict())
    else:
        render.print_history_plan(hp, name or "downstream", batch)


def _check_together(inputs: dict) -> None:
    """Options of one part are given all together or not at all."""

    def some(*names: str) -> bool:
        return any(inputs[n] is not None for n in names)

    def every(*names: str) -> bool:
        return all(inputs[n] is not None for n in names)

    if some("qps", "latency_s") and not every("qps", "latency_s"):
        raise click.UsageError("(a) needs both --qps and --latency-ms")
    if some("done", "window_s", "workers"):
        if not every("done", "window_s", "workers"):
            raise click.UsageError("(b) needs --done, --hours (or --window) and --workers together")
    elif inputs["target"] is not None:
        if inputs["mean_duration_s"] is None:
            raise click.UsageError("(b) --target needs --done/--hours/--workers or --mean")
        if not (inputs["target_window_s"] or inputs["window_s"]):
            raise click.UsageError("(b) --target needs --target-hours")
    if some("io_wait", "cpu_time") and not every("io_wait", "cpu_time"):
        raise click.UsageError("(c) needs both --io-minutes and --cpu-minutes")

"""``corral plan``: the capacity planner. This module reads the options and
checks which go together; :func:`corral.core.planning.capacity_plan` does the
arithmetic and :mod:`corral.cli.render` prints it."""

from __future__ import annotations

from typing import Any

import click

from corral.cli import CLIError, duration_arg, json_option, render, store_option
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
    as_json,
):
    """Capacity planner: how many tasks may run at once, and on how many processes.

    Pure arithmetic: --store is accepted, like everywhere, and not used.

    \b
    (a) limit   = downstream QPS x latency (s) x safety     --qps 100 --latency-ms 200
    (b) Little  = throughput x mean duration                --done 392 --hours 48 --workers 4 --target 720
    (c) workers per process = 1 + io wait / cpu time, capped  --io-minutes 25 --cpu-minutes 4
    (d) processes and lanes (sub-groups) for the concurrency
    With no option at all, shows worked examples (the numbers above).
    """
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

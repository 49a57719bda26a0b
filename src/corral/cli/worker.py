"""``corral worker`` and ``corral sweep``: the long-running processes.

Both run until SIGTERM or SIGINT. ``corral worker`` is ``App.run`` with
options from the command line; signals are handled in ``engine/foreground.py``.
"""

from __future__ import annotations

import logging
import sys

import click

from corral.cli import render
from corral.cli.common import (
    CLIError,
    duration_arg,
    given_store,
    json_option,
    load_app,
    log_level_option,
    open_given_store,
    store_option,
    store_url_of,
)
from corral.core.model import new_holder_id
from corral.core.slots import parse_queues
from corral.core.validation import CONCURRENCY_RANGE, DEFAULT_RETRY_SHARE
from corral.errors import ConfigError

log = logging.getLogger("corral.cli")
#: Most slots one worker process runs.
MAX_SLOTS = CONCURRENCY_RANGE[1]


def _setup_logging(level: str, fmt: str = "text") -> None:
    from corral.engine import logs

    logs.setup(level, fmt, sys.stderr)


def log_format_option(f):
    return click.option(
        "--log-format",
        type=click.Choice(["text", "json"], case_sensitive=False),
        default="text",
        show_default=True,
        help="json: one JSON object per line (time, level, logger, message, and trace_id, task_id,"
        " attempt, task for lines about a task).",
    )(f)


# ---- worker ------------------------------------------------------------------------------
@click.command()
@click.argument("app_spec", metavar="APP")
@store_option
@click.option(
    "-c",
    "--concurrency",
    type=click.IntRange(min=1, max=MAX_SLOTS),
    default=10,
    show_default=True,
    help=f"Worker slots (tasks or chunks in flight), 1 to {MAX_SLOTS} per process: each is a thread; "
    "for more, run more processes.",
)
@click.option(
    "-q",
    "--queues",
    default="default",
    show_default=True,
    help="Comma-separated queues to serve, sharing the slots; or each with its own slots, "
    "e.g. default:8,bulk:2 (then the worker has their sum and -c is not used), so a flooded queue "
    "cannot take every slot.",
)
@click.option(
    "--chunk-size",
    type=click.IntRange(min=1),
    default=None,
    help="Tasks of one group taken together and run in order. Default: sized by itself, so one claim"
    " brings about a second of a group's work (1 for tasks that take that long).",
)
@click.option(
    "--prefetch",
    type=click.IntRange(min=0, max=10_000),
    default=None,
    help="Units held beyond the free slots, so a freed slot need not wait for a claim; never tasks"
    " under a limit. Default: twice the slots, at most 64; for quick tasks about 20 ms of each"
    " slot's work, at most 256. 0: claim only into free slots.",
)
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Seconds in-flight tasks get to finish after SIGTERM.",
)
@click.option(
    "--sweep/--no-sweep",
    default=True,
    show_default=True,
    help="Run the sweeper beside the worker: one leader across every worker of the store"
    " recovers tasks of dead workers, so their groups move on, and the others recover what a dead leader left."
    " --no-sweep leaves that to `corral sweep --loop`.",
)
@click.option("--sweep-interval", default="5s", show_default=True, help="How often the sweeper runs (e.g. 5s, 1m).")
@click.option(
    "--periodic/--no-periodic",
    default=True,
    show_default=True,
    help="Enqueue the ticks of APP's periodic tasks (@app.periodic): every worker may, one wins each tick."
    " --no-periodic leaves them to other workers.",
)
@click.option(
    "--lease",
    "lease",
    default="30s",
    show_default=True,
    help="Lease a running task holds; a crashed worker's tasks are recovered after it.",
)
@click.option(
    "--max-abandoned-threads",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Timed-out task threads still running at which the worker stops and exits 4 to be restarted.",
)
@click.option(
    "--retry-share",
    type=click.FloatRange(min=0.0, max=1.0, min_open=True),
    default=DEFAULT_RETRY_SHARE,
    show_default=True,
    help="While fresh work waits, at most this share of each claim (at least one task) goes to retries,"
    " so a flood of failing tasks cannot delay fresh work; retries take what fresh work leaves.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(min=1, max=65535),
    help="Serve Prometheus metrics at http://127.0.0.1:PORT/metrics (this process's counters; "
    "the store-wide gauges from one worker of the fleet at a time).",
)
@log_level_option
@log_format_option
def worker(
    app_spec,
    store_url,
    concurrency,
    queues,
    chunk_size,
    prefetch,
    grace,
    sweep,
    sweep_interval,
    periodic,
    lease,
    max_abandoned_threads,
    retry_share,
    metrics_port,
    log_level,
    log_format,
):
    """Run tasks of APP (module:attribute, a corral.App) until SIGTERM.

    SIGTERM (or Ctrl-C) stops claiming, lets in-flight tasks finish within
    --grace seconds, hands back what did not finish, and exits 0. A second
    SIGTERM or SIGINT during the grace period stops at once (exit 3); the
    sweeper then recovers the unfinished tasks when their leases expire.

    A store that is damaged, not a database or of a newer corral stops the
    worker with one error line and exit status 1 (a locked or unreachable
    one is retried).

    A thread cannot be killed: a timed-out thread task keeps its lease until
    its thread ends. With --max-abandoned-threads such threads running, the
    worker stops the same way as on SIGTERM and exits 4, for its supervisor
    to restart it (isolation="process" tasks are killed on timeout instead).

    An `App()` built without a URL reads $CORRAL_STORE, which --store sets.
    """
    _setup_logging(log_level, log_format.lower())
    lease_s = duration_arg(lease, "--lease")
    sweep_s = duration_arg(sweep_interval, "--sweep-interval")
    if lease_s <= 0 or sweep_s <= 0:
        raise CLIError("--lease and --sweep-interval must be > 0")
    try:
        queue_list, queue_slots = parse_queues(queues)
    except ConfigError as exc:
        raise CLIError(f"--queues: {exc}") from None
    if queue_slots is not None and sum(queue_slots.values()) > CONCURRENCY_RANGE[1]:
        raise CLIError(
            f"--queues: {sum(queue_slots.values())} slots in all; at most {CONCURRENCY_RANGE[1]} per process"
        )
    app = load_app(app_spec, given_store(store_url))
    if not app.registry:
        raise CLIError(f"APP {app_spec!r} registers no task; nothing to run")
    if not getattr(app.store, "shared", True):
        log.warning(
            "store %s lives in this process only: tasks submitted elsewhere never reach this worker", app.store.url
        )
    holder = new_holder_id()
    extra = []
    if metrics_port is not None:
        try:
            from corral.edges import metrics
        except ImportError:
            raise CLIError("--metrics-port needs prometheus_client: pip install 'corral[metrics]'") from None
        registry, watcher = metrics.worker_registry(app.store, holder)
        try:
            metrics.serve(registry, metrics_port)
        except OSError as exc:
            raise CLIError(f"--metrics-port {metrics_port}: {exc.strerror or exc}") from None
        extra.append(watcher)
        log.info("metrics at http://127.0.0.1:%d/metrics", metrics_port)
    app.run(
        concurrency,
        worker_id=holder,
        extra_hooks=extra,
        queues=queue_slots if queue_slots is not None else queue_list,
        chunk_size=chunk_size,
        prefetch=prefetch,
        lease_seconds=lease_s,
        grace=grace,
        sweep_interval=sweep_s if sweep else None,  # on by default: a dead worker's group must not stay blocked
        max_abandoned_threads=max_abandoned_threads,
        retry_share=retry_share,
        **({} if periodic else {"schedules": ()}),
    )
    # The store is left open: the worker's daemon threads may still be in a
    # store call (Worker.stop does not join them); the process exit closes it.


# ---- sweep --------------------------------------------------------------------------------
@click.command()
@store_option
@click.option(
    "--loop", is_flag=True, help="Keep sweeping every --interval until SIGTERM (one leader across the fleet)."
)
@click.option("--interval", default="5s", show_default=True, help="Time between passes with --loop.")
@click.option(
    "--stale-pending-age",
    default="24h",
    show_default=True,
    help="Cancel PENDING tasks no worker took for this long ('off' to keep them); see `corral tasks --stale`.",
)
@click.option(
    "--max-rows",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="At most this many tasks changed per pass.",
)
@click.option(
    "--level-calm-period",
    default="60s",
    show_default=True,
    help="With --loop: how long the health signals must stay below the fleet's level before it steps down one.",
)
@click.option(
    "--retention/--no-retention",
    default=True,
    show_default=True,
    help="With --loop, the leader also deletes old finished tasks: SUCCESS and CANCELED after 7 days, "
    "FAILED and TIMEOUT after 30 (`corral prune` does it once, with other ages).",
)
@log_level_option
@log_format_option
@json_option
def sweep(
    store_url, loop, interval, stale_pending_age, max_rows, level_calm_period, retention, log_level, log_format, as_json
):
    """Recover what crashed workers left: one pass, or --loop.

    A RUNNING task whose lease expired lost its worker: it runs again with
    its attempt given back, up to 3 crashes, then on its retries (failed
    when none is left); a PENDING
    task a worker could have taken for longer than --stale-pending-age is
    canceled, its error saying so (`corral tasks --stale` lists them,
    `corral retry --stale` queues them again). A task waiting behind its
    group's head, on a dependency or for its delay is never canceled. Every
    change is guarded, so sweepers racing each other change a task at most once.
    """
    from corral.engine.foreground import StopSignals
    from corral.maintenance import Sweeper
    from corral.maintenance.recovery import sweep_once

    stale = (
        None
        if stale_pending_age.strip().lower() in ("off", "none", "never")
        else duration_arg(stale_pending_age, "--stale-pending-age")
    )
    every = duration_arg(interval, "--interval")
    if every <= 0:
        raise CLIError("--interval must be > 0")
    calm = duration_arg(level_calm_period, "--level-calm-period")
    if calm <= 0:
        raise CLIError("--level-calm-period must be > 0")
    store = open_given_store(store_url)
    url = store_url_of(store_url)
    if not loop:
        report = sweep_once(store, stale_pending_age=stale, max_rows=max_rows)
        if as_json:
            render.print_json(render.sweep_dict(report))
        else:
            click.echo(render.sweep_line(url, report))
        return
    _setup_logging(log_level, log_format.lower())
    from corral.core.retention import policy
    from corral.maintenance.level_keeper import LevelKeeper
    from corral.maintenance.retention import Retention

    sweeper = Sweeper(
        store,
        interval=every,
        stale_pending_age=stale,
        max_rows=max_rows,
        levels=LevelKeeper(store, calm_period=calm),
        retention=Retention(store, policy(True)) if retention else None,
    )
    from corral.maintenance.adaptive_keeper import AdaptiveKeeper

    adaptive = AdaptiveKeeper(store, sweeper)
    with StopSignals() as signals:
        sweeper.start()
        adaptive.start()
        log.info(
            "sweeper %s started: store=%s interval=%gs stale_pending_age=%s",
            sweeper.holder,
            url,
            every,
            "off" if stale is None else f"{stale:g}s",
        )
        signals.wait()
        adaptive.stop()
        sweeper.stop()
        log.info("sweeper %s stopped after %d tick(s)", sweeper.holder, sweeper.ticks)

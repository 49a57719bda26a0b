"""``corral bench``: reproducible benchmarks (see docs/benchmarks.md).

``groups``      ordered groups under a shared downstream cap, corral
                against two thread-pool baselines;
``throughput``  enqueue and processing rates, I/O efficiency and idle
                submit-to-start latency of one store;
``latency``     submit-to-start at a steady rate of single submits, into
                ``corral worker`` processes;
``overload``    1.5x the fleet's capacity offered for two minutes: throughput,
                backlog, pickup and the degradation level per 10 s, then the
                drain against the capacity;
``limits``      rate limits, circuit breakers and the retry path against a
                simulated partner API, with ``corral worker`` processes;
``limit-change`` how soon running workers obey a limit changed while they run;
``dashboard``   the dashboard's pages on a store of a million finished tasks;
``scale``       a million queued tasks: submit rate, claim time and worker
                memory from the first slice to the last;
``processes``   claims per second with 1, 2, 4, 8 worker processes, and
                what each costs the PostgreSQL server;
``dag``         a 1 000-node graph against the most parallelism its slots allow;
``retention``   the PostgreSQL tasks table (live and dead tuples, size) over a
                long steady run with retention on;
``soak``        steady single submits on PostgreSQL with the xmin horizon
                pinned mid-run: throughput, pickup, sizes and the claim's cost;
``keys``        keyed limits across worker processes: each key's bounds checked
                exactly, throughput against what the keys allow, and the
                claim's cost with 10 000 active keys.

Each measured run happens in a child process; progress goes to stderr and
``--json`` keeps stdout to one JSON object.
"""

from __future__ import annotations

from typing import Any

import click

from corral.bench import common

STORES = ("memory", "sqlite", "postgres")
SHORT = {"A": "queue + pool", "B": "group locks + pool", "C": "corral"}


@click.group()
def bench() -> None:
    """Benchmarks: `groups` (ordered groups under a downstream cap), `throughput`, `latency`, `overload`,
    `limits`, `limit-change`, `dashboard`, `scale`, `processes`, `dag`, `retention`, `soak` and `keys`."""


class StoreParam(click.ParamType):
    """A store kind (memory, sqlite, postgres) or a store URL.

    Benchmarks always run on a fresh store: a ``sqlite:///`` URL picks the
    kind (the file is a temporary one), a ``postgresql://`` URL names the
    server on which a throwaway database is created (like ``--pg-url``)."""

    name = "store"

    def convert(self, value, param, ctx):
        if value in STORES:
            return value, None
        scheme = value.split("://", 1)[0].lower() if "://" in value else ""
        kind = {"memory": "memory", "sqlite": "sqlite", "postgresql": "postgres", "postgres": "postgres"}.get(scheme)
        if kind is None:
            self.fail(f"{value!r} is neither memory, sqlite, postgres nor a store URL", param, ctx)
        return kind, value if kind == "postgres" else None


def store_option(default: str, help: str):
    """``--store``: a store kind or URL (see :class:`StoreParam`)."""
    return click.option("--store", type=StoreParam(), default=default, show_default=True, help=help)


#: ``--store``, repeatable: each store a scenario runs on, SQLite by default
stores_option = click.option(
    "--store",
    type=StoreParam(),
    multiple=True,
    default=("sqlite",),
    show_default=True,
    help="sqlite, postgres, or a store URL (a fresh store is used either way); repeat it for both.",
)
pg_url_option = click.option("--pg-url", default=None, help="Admin URL of a PostgreSQL server (see `bench groups`).")
json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table(s).")
no_progress_option = click.option("--no-progress", is_flag=True, help="No progress bars on stderr.")


def _store(store: tuple[str, str | None], pg_url: str | None) -> tuple[str, str | None]:
    kind, url = store
    return kind, pg_url or url


def _shared_store(store: tuple[str, str | None], pg_url: str | None) -> tuple[str, str | None]:
    """The store of a benchmark that runs worker processes: not memory://."""
    kind, pg_url = _store(store, pg_url)
    if kind == "memory":
        raise click.BadParameter("worker processes need a shared store: sqlite or postgres", param_hint="--store")
    return kind, pg_url


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


#: `corral worker` processes a benchmark starts, and their slots.
workers_option = click.option("--workers", default=2, show_default=True, help="`corral worker` processes.")
concurrency_option = click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=None,
    help="Slots per worker process. Default: `corral worker`'s own default.",
)


@bench.command("groups")
@click.option("--tasks", default=100_000, show_default=True, help="Number of tasks.")
@click.option("--groups", "n_groups", default=200, show_default=True, help="Number of groups.")
@click.option(
    "--variants",
    default="A,B,C",
    show_default=True,
    help="Which to run: A (global queue + pool), B (group locks + pool), C (corral).",
)
@click.option(
    "--chunk-size",
    type=int,
    default=None,
    help="corral: tasks of one group taken per claim. Default: the worker's own default (sized from the"
    " tasks' durations), as a user who sets nothing gets.",
)
@click.option(
    "--prefetch",
    type=int,
    default=None,
    help="corral: units a worker holds beyond its free slots. Default: the worker's own default.",
)
@click.option("--concurrency", default=20, show_default=True, help="Pool threads (A, B) / worker slots (C).")
@click.option("--limit", default=20, show_default=True, help="Downstream cap on concurrent calls.")
@store_option("memory", "corral's store (C): memory, sqlite, postgres, or a store URL.")
@click.option("--workers", default=1, show_default=True, help="Worker processes for a durable store (C).")
@click.option(
    "--pg-url",
    default=None,
    help=f"Admin URL of a PostgreSQL server (default $CORRAL_BENCH_PG_URL or {common.DEFAULT_PG_URL}); "
    "a fresh database is created for the run and dropped after.",
)
@click.option("--poll-interval", default=0.5, show_default=True, help="corral worker poll interval (s).")
@click.option("--seed", default=3, show_default=True, help="Seed of the workload plan.")
@json_option
@no_progress_option
def groups_cmd(
    tasks: int,
    n_groups: int,
    variants: str,
    chunk_size: int | None,
    prefetch: int | None,
    concurrency: int,
    limit: int,
    store: tuple[str, str | None],
    workers: int,
    pg_url: str | None,
    poll_interval: float,
    seed: int,
    as_json: bool,
    no_progress: bool,
) -> None:
    """Ordered groups under a downstream cap: A, B and C side by side."""
    from corral.bench.groups import VARIANTS, child_argv

    kind, pg_url = _store(store, pg_url)
    chosen = [v.strip().upper() for v in variants.split(",") if v.strip()]
    bad = [v for v in chosen if v not in VARIANTS]
    if bad or not chosen:
        raise click.BadParameter(
            f"unknown variant(s) {', '.join(bad) or '(none)'}; choose from A, B, C", param_hint="--variants"
        )
    if tasks < 1 or n_groups < 1 or (chunk_size or 1) < 1 or concurrency < 1 or limit < 1 or workers < 1:
        raise click.UsageError("--tasks, --groups, --chunk-size, --concurrency, --limit and --workers must be >= 1")
    if prefetch is not None and prefetch < 0:
        raise click.UsageError("--prefetch must be >= 0")
    results = []
    for v in chosen:
        argv = child_argv(
            v,
            tasks=tasks,
            groups=n_groups,
            chunk_size=chunk_size,
            prefetch=prefetch,
            concurrency=concurrency,
            limit=limit,
            store=kind,
            workers=workers,
            pg_url=pg_url,
            poll_interval=poll_interval,
            seed=seed,
            progress=not no_progress,
        )
        label = f"{v}: {VARIANTS[v]}" + (f" ({kind}, {workers} proc)" if v == "C" else "")
        try:
            results.append(common.run_child(argv, label, show_progress=not no_progress))
        except RuntimeError as exc:
            raise click.ClickException(str(exc)) from None
    report = {"scenario": "groups", "tasks": tasks, "groups": n_groups, "limit": limit, "variants": results}
    if as_json:
        click.echo(common.dumps(report))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"groups: {tasks:,} tasks, {n_groups} groups, downstream cap {limit}")
    for col in (
        "variant",
        "wall s",
        "ideal s",
        "efficiency",
        "p95 latency ms",
        "out of order",
        "rejections",
        "peak RSS MB",
    ):
        table.add_column(col, justify="left" if col == "variant" else "right")
    for r in results:
        name = f"{r['variant']} {SHORT[r['variant']]}"
        if r["variant"] == "C":
            name += f" [{r['store']}, chunk {r['chunk_size'] or 'auto'}" + (
                f", {r['workers']} proc]" if r["store"] != "memory" else "]"
            )
        rss = _fmt(r["peak_rss_mb"], 1)
        if r.get("worker_peak_rss_mb") is not None:
            rss += f" (+workers {_fmt(r['worker_peak_rss_mb'], 1)})"
        table.add_row(
            name,
            _fmt(r["wall_s"], 2),
            _fmt(r["ideal_s"], 2),
            _fmt(r["efficiency"], 3),
            _fmt(r["p95_latency_ms"], 0),
            _fmt(r["out_of_order"]),
            _fmt(r["rejections"]),
            rss,
        )
    Console(width=max(120, Console().width)).print(table)


@bench.command("throughput")
@store_option("sqlite", "memory, sqlite, postgres, or a store URL (a fresh store is used either way).")
@click.option("--tasks", default=20_000, show_default=True, help="No-op tasks per enqueue/processing run.")
@click.option("--io-tasks", default=2_000, show_default=True, help="10 ms tasks for the I/O efficiency run.")
@click.option("--latency-tasks", default=200, show_default=True, help="Tasks for the idle latency run.")
@click.option("--pause", default=0.02, show_default=True, help="Pause between idle-latency submits (s).")
@click.option("--concurrency", default=8, show_default=True, help="Worker slots per process for no-op tasks.")
@click.option("--io-concurrency", default=10, show_default=True, help="Worker slots per process for the I/O run.")
@click.option(
    "--io-processes",
    default=2,
    show_default=True,
    help="Worker processes for the I/O run (memory: one process with all their slots).",
)
@click.option("--processes", default="1,2", show_default=True, help="Worker process counts to measure.")
@click.option(
    "--layout",
    type=click.Choice(["cli", "engine"]),
    default="cli",
    show_default=True,
    help="cli: each worker process runs as `corral worker` does (App.run, with the sweeper and the fleet"
    " level, stopped by SIGTERM); engine: a bare Worker, nothing beside it.",
)
@click.option(
    "--prefetch",
    type=click.IntRange(min=0),
    default=None,
    help="Units each worker holds beyond its free slots. Default: the worker's own default.",
)
@click.option("--finished-rows", default=0, show_default=True, help="Pre-fill this many finished rows first.")
@click.option(
    "--groups",
    default=0,
    show_default=True,
    help="Put the no-op processing run's tasks in this many groups (task i in group i mod N).",
)
@click.option(
    "--only", default="enqueue,process,io,latency", show_default=True, help="Which parts to run (comma-separated)."
)
@click.option("--poll-interval", default=0.5, show_default=True)
@click.option(
    "--claim-delay-ms",
    default="0",
    show_default=True,
    metavar="MS[,MS...]",
    help="memory only: repeat the I/O run with this simulated round trip added to every claim "
    "(the efficiency ceiling against a store of that claim latency).",
)
@click.option(
    "--profile",
    is_flag=True,
    help="With the process part (--layout cli): where a task's CPU goes, in microseconds a task, "
    "by part of the worker (the store's claim and complete calls, the dispatcher, the completer, "
    "the slots, ...) and, on PostgreSQL, the server's processes for the run's database.",
)
@pg_url_option
@json_option
@no_progress_option
def throughput_cmd(
    store: tuple[str, str | None],
    tasks: int,
    io_tasks: int,
    latency_tasks: int,
    pause: float,
    concurrency: int,
    io_concurrency: int,
    io_processes: int,
    processes: str,
    layout: str,
    prefetch: int | None,
    finished_rows: int,
    groups: int,
    only: str,
    poll_interval: float,
    claim_delay_ms: str,
    profile: bool,
    pg_url: str | None,
    as_json: bool,
    no_progress: bool,
) -> None:
    """Enqueue/processing rates, I/O efficiency and idle latency of one store."""
    from corral.bench.throughput import PARTS, child_argv, render

    kind, pg_url = _store(store, pg_url)
    parts = [p.strip() for p in only.split(",") if p.strip()]
    bad = [p for p in parts if p not in PARTS]
    if bad:
        raise click.BadParameter(
            f"unknown part(s) {', '.join(bad)}; choose from {', '.join(PARTS)}", param_hint="--only"
        )
    try:
        procs = [int(x) for x in processes.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter("a comma-separated list of integers", param_hint="--processes") from None
    if groups < 0:
        raise click.BadParameter("a number of groups >= 0", param_hint="--groups")
    if not procs or min(procs) < 1 or tasks < 1:
        raise click.UsageError("--processes and --tasks must be >= 1")
    try:
        delays = [float(x) for x in claim_delay_ms.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter("a comma-separated list of milliseconds", param_hint="--claim-delay-ms") from None
    if not delays or min(delays) < 0:
        raise click.BadParameter("milliseconds >= 0", param_hint="--claim-delay-ms")
    if any(delays) and kind != "memory":
        raise click.BadParameter(
            "a simulated claim round trip is for --store memory only", param_hint="--claim-delay-ms"
        )
    argv = child_argv(
        store=kind,
        tasks=tasks,
        io_tasks=io_tasks,
        latency_tasks=latency_tasks,
        pause=pause,
        concurrency=concurrency,
        io_concurrency=io_concurrency,
        io_processes=io_processes,
        processes=",".join(map(str, procs)),
        layout=layout,
        prefetch=prefetch,
        finished_rows=finished_rows,
        groups=groups,
        only=",".join(parts),
        poll_interval=poll_interval,
        claim_delay_ms=",".join(f"{d:g}" for d in delays),
        pg_url=pg_url,
        progress=not no_progress,
        profile=profile,
    )
    _run_and_show(argv, f"throughput ({kind})", render, as_json=as_json, progress=not no_progress)


@bench.command("limit-change")
@stores_option
@pg_url_option
@workers_option
@click.option("--slots", default=4, show_default=True, help="Slots per worker process.")
@click.option("--high", default=4, show_default=True, help="The concurrency each raise sets (a lowering sets 1).")
@click.option("--rounds", default=20, show_default=True, help="Lowerings and raises.")
@click.option("--task-seconds", default=0.5, show_default=True, help="How long each task runs.")
@json_option
@no_progress_option
def limit_change_cmd(
    store: tuple[tuple[str, str | None], ...],
    pg_url: str | None,
    workers: int,
    slots: int,
    high: int,
    rounds: int,
    task_seconds: float,
    as_json: bool,
    no_progress: bool,
) -> None:
    """How soon running workers obey a limit changed while they run.

    Each round lowers the limit's concurrency to 1 (as `corral limit set` does),
    then raises it to --high; measured from the store's records: after a raise,
    the first new start and the start filling the last new place; after a
    lowering, starts beside the new cap (none allowed) and how long running
    tasks kept more than it in flight (they finish)."""
    from corral.bench.limit_change import run

    if workers < 1 or slots < 1 or high < 2 or rounds < 1 or task_seconds <= 0 or workers * slots < high:
        raise click.UsageError(
            "--workers, --slots and --rounds >= 1, --high from 2 to the slots in all, --task-seconds > 0"
        )
    reports = []
    for one in dict.fromkeys(store):
        kind, url = _shared_store(one, pg_url)
        click.echo(f"limit-change on {kind} ...", err=True)
        try:
            reports.append(
                run(
                    kind,
                    url,
                    workers=workers,
                    slots=slots,
                    high=high,
                    rounds=rounds,
                    task_seconds=task_seconds,
                    progress=False,
                )
            )
        except RuntimeError as exc:
            raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(common.dumps({"scenario": "limit-change", "runs": reports}))
        return
    for r in reports:
        click.echo(
            f"{r['store']}: {r['workers']} workers x {r['slots']} slots, {r['rounds']} rounds of 1 <-> {r['high']},"
            f" tasks of {r['task_seconds']:g}s"
        )
        click.echo(
            f"  raise: first new start p50 {r['raise_first_start_ms']['p50']} ms, max"
            f" {r['raise_first_start_ms']['max']} ms; every new place taken p50 {r['raise_all_places_ms']['p50']} ms,"
            f" max {r['raise_all_places_ms']['max']} ms ({r['raises_measured']} raises)"
        )
        click.echo(
            f"  lower: starts beside the new cap {r['lower_starts_over_cap']}; running tasks above it for p50"
            f" {r['lower_running_over_cap_ms']['p50']} ms, max {r['lower_running_over_cap_ms']['max']} ms (they finish)"
        )


@bench.command("latency")
@stores_option
@pg_url_option
@click.option("--rates", default="100,300,1000", show_default=True, help="Submits per second, comma-separated.")
@click.option("--seconds", default=60.0, show_default=True, help="Seconds of submits at each rate.")
@click.option(
    "--warmup", default=2.0, show_default=True, help="Seconds of submits at the start of each rate not measured."
)
@workers_option
@concurrency_option
@click.option(
    "--submitters",
    type=click.IntRange(min=1),
    default=None,
    help="Processes sharing each rate's schedule of single submits. Default: one per 150 submits/s of the rate"
    " (1 at 100/s, 2 at 300/s, 7 at 1 000/s), so that the rate is reached: one process submits one task at"
    " a time, and reaches only 130-300 durable commits a second on PostgreSQL on a small machine.",
)
@json_option
@no_progress_option
def latency_cmd(
    store: tuple[tuple[str, str | None], ...],
    pg_url: str | None,
    rates: str,
    seconds: float,
    warmup: float,
    workers: int,
    concurrency: int | None,
    submitters: int | None,
    as_json: bool,
    no_progress: bool,
) -> None:
    """Submit-to-start latency at a steady rate of single submits.

    For each rate, on a fresh store, --workers `corral worker` processes (their
    defaults) are started; --submitters processes share a schedule of single
    submits, task i due at i / rate seconds, for --seconds, each submitting one
    task at a time (open-loop: behind schedule a process submits at once, and
    the rate reached is reported beside the rate asked). Each task records when
    it started; reported per store and rate: p50, p95, p99 and max of submit to
    start (the first --warmup seconds left out), the rate reached, and the
    pickup after the submit call returned."""
    from corral.bench.latency import child_argv, render

    try:
        rate_list = [float(r) for r in rates.split(",") if r.strip()]
    except ValueError:
        rate_list = []
    if not rate_list or min(rate_list) <= 0:
        raise click.BadParameter("submits per second > 0, comma-separated", param_hint="--rates")
    if seconds <= 0 or workers < 1 or not 0 <= warmup < seconds:
        raise click.UsageError("--seconds must be > 0, --warmup from 0 to less than --seconds, --workers >= 1")
    reports = []
    for one in dict.fromkeys(store):
        kind, url = _shared_store(one, pg_url)
        argv = child_argv(
            store=kind,
            pg_url=url,
            rates=",".join(f"{r:g}" for r in rate_list),
            seconds=seconds,
            warmup=warmup,
            workers=workers,
            concurrency=concurrency,
            submitters=submitters,
            progress=not no_progress,
        )
        try:
            reports.append(common.run_child(argv, f"latency ({kind})", show_progress=not no_progress))
        except RuntimeError as exc:
            raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(common.dumps({"scenario": "latency", "runs": reports}))
        return
    render(reports)


@bench.command("overload")
@stores_option
@pg_url_option
@click.option("--seconds", default=120.0, show_default=True, help="Seconds of offered load above capacity.")
@click.option("--factor", default=1.5, show_default=True, help="Offered load as a multiple of the capacity measured.")
@click.option(
    "--task-ms",
    default=100.0,
    show_default=True,
    help="How long each task runs (a sleep), ms: 1.5x the capacity must be within what single submits reach.",
)
@click.option(
    "--capacity-tasks", default=4_000, show_default=True, help="Tasks run in bulk first to measure the capacity."
)
@workers_option
@concurrency_option
@click.option(
    "--submitters",
    type=click.IntRange(min=1),
    default=None,
    help="Processes sharing the schedule of single submits. Default: one per 150 submits/s (as `bench latency`).",
)
@click.option(
    "--max-queued",
    type=click.IntRange(min=0),
    default=None,
    help="The app's queue bound (App(max_queued=)), the degradation level's backlog signal; 0: none."
    " Default: --bound-seconds of the capacity.",
)
@click.option("--bound-seconds", default=30.0, show_default=True, help="Seconds of capacity the default bound holds.")
@click.option("--window", default=10.0, show_default=True, help="Seconds per reported window.")
@json_option
@no_progress_option
def overload_cmd(
    store: tuple[tuple[str, str | None], ...],
    pg_url: str | None,
    seconds: float,
    factor: float,
    task_ms: float,
    capacity_tasks: int,
    workers: int,
    concurrency: int | None,
    submitters: int | None,
    max_queued: int | None,
    bound_seconds: float,
    window: float,
    as_json: bool,
    no_progress: bool,
) -> None:
    """Offered load above what the fleet can run, then the drain.

    Per store, on a fresh store: the fleet's capacity for the task shape (tasks
    of --task-ms, run in bulk by --workers `corral worker` processes); then
    --factor times it offered for --seconds as single submits from other
    processes (as `bench latency`), into a fleet whose app has a queue bound
    (--max-queued), the degradation level's backlog signal; then the backlog
    run to the end. Reported per --window: throughput against the capacity,
    submits, backlog, p50/p95 pickup and the fleet's level; then the drain's
    rate against the capacity and each change of level."""
    from corral.bench.overload import child_argv, render

    if seconds <= 0 or factor <= 0 or task_ms < 0 or workers < 1 or capacity_tasks < 100 or window <= 0:
        raise click.UsageError(
            "--seconds, --factor and --window > 0, --task-ms >= 0, --workers >= 1, --capacity-tasks >= 100"
        )
    reports = []
    for one in dict.fromkeys(store):
        kind, url = _shared_store(one, pg_url)
        argv = child_argv(
            store=kind,
            pg_url=url,
            seconds=seconds,
            factor=factor,
            task_ms=task_ms,
            capacity_tasks=capacity_tasks,
            workers=workers,
            concurrency=concurrency,
            submitters=submitters,
            max_queued=max_queued,
            bound_seconds=bound_seconds,
            window=window,
            progress=not no_progress,
        )
        try:
            reports.append(common.run_child(argv, f"overload ({kind})", show_progress=not no_progress))
        except RuntimeError as exc:
            raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(common.dumps({"scenario": "overload", "runs": reports}))
        return
    render(reports)


@bench.command("limits")
@store_option("sqlite", "sqlite, postgres, or a store URL (a fresh store is used either way).")
@pg_url_option
@workers_option
@click.option("--concurrency", default=20, show_default=True, help="Slots per worker process.")
@click.option("--tasks", default=3000, show_default=True, help="SKU syncs of the rate scenario (advised limit).")
@click.option(
    "--hand-tasks",
    default=1000,
    show_default=True,
    help="SKU syncs under the limit written by hand (concurrency from the cap x latency x 0.7, "
    "rate = the cap, default burst); 0 skips that run.",
)
@click.option("--breaker-tasks", default=600, show_default=True, help="SKU syncs of the breaker scenario.")
@click.option("--outage", default=20.0, show_default=True, help="Seconds the partner answers 503 from its first call.")
@click.option(
    "--retry-tasks", default=1000, show_default=True, help="Fresh tasks, and failing ones, of the retry scenario."
)
@click.option("--fresh-rate", default=200.0, show_default=True, help="Fresh tasks submitted per second.")
@click.option("--cap", default=100, show_default=True, help="The partner's cap: calls in any sliding second.")
@click.option("--latency-ms", default=200.0, show_default=True, help="The partner's time per call.")
@click.option(
    "--rates",
    default="20,60,200",
    show_default=True,
    help="The sustain scenario's rates (N/s, comma-separated), each with the default burst.",
)
@click.option("--sustain-seconds", default=10, show_default=True, help="Seconds of work at each rate (sustain).")
@click.option("--sustain-latency-ms", default=20.0, show_default=True, help="The partner's time per call (sustain).")
@click.option(
    "--scenarios",
    default=",".join(("rate", "breaker", "retry", "sustain")),
    show_default=True,
    help="Which to run (comma-separated): rate, breaker, retry, sustain, adaptive.",
)
@click.option(
    "--adaptive",
    is_flag=True,
    help='Run only the adaptive scenario: rate="auto" finds the partner\'s --cap from a twentieth of it, '
    "then the cap halves.",
)
@click.option(
    "--adaptive-phases",
    default="40,30",
    show_default=True,
    help="Seconds at the cap, then at half of it (adaptive).",
)
@click.option("--adaptive-latency-ms", default=50.0, show_default=True, help="The partner's time per call (adaptive).")
@click.option(
    "--adaptive-compare/--no-adaptive-compare",
    default=True,
    show_default=True,
    help="Also run the first part under the fixed rate of the cap, the best fixed limit in hindsight (adaptive).",
)
@click.option(
    "--kill-leader",
    is_flag=True,
    help="SIGKILL the worker that leads (runs the controller) halfway through the first part, "
    "and measure the effective rate across the change of leader (adaptive).",
)
@click.option("--timeout", default=600.0, show_default=True, help="Seconds one run may take before it is abandoned.")
@json_option
@no_progress_option
def limits_cmd(
    store: tuple[str, str | None],
    pg_url: str | None,
    workers: int,
    concurrency: int,
    tasks: int,
    hand_tasks: int,
    breaker_tasks: int,
    outage: float,
    retry_tasks: int,
    fresh_rate: float,
    cap: int,
    latency_ms: float,
    rates: str,
    sustain_seconds: int,
    sustain_latency_ms: float,
    scenarios: str,
    adaptive: bool,
    adaptive_phases: str,
    adaptive_latency_ms: float,
    adaptive_compare: bool,
    kill_leader: bool,
    timeout: float,
    as_json: bool,
    no_progress: bool,
) -> None:
    """Rate limits, circuit breakers and the retry path against a simulated partner API.

    The partner (at most --cap calls in any sliding second, 429 with
    Retry-After over it) runs in this process; the tasks run in --workers
    `corral worker` processes on a fresh store. Every figure comes from the
    partner's call log and the store's records."""
    from corral.bench.limits import SCENARIOS, child_argv, render

    kind, pg_url = _shared_store(store, pg_url)
    chosen = ["adaptive"] if adaptive else [s.strip() for s in scenarios.split(",") if s.strip()]
    bad = [s for s in chosen if s not in SCENARIOS]
    try:
        phases = [int(x) for x in adaptive_phases.split(",")]
    except ValueError:
        phases = []
    if len(phases) != 2 or min(phases) < 10 or adaptive_latency_ms <= 0:
        raise click.UsageError(
            "--adaptive-phases is two whole numbers of seconds >= 10 (e.g. 40,30) and --adaptive-latency-ms > 0"
        )
    if bad or not chosen:
        raise click.BadParameter(
            f"unknown scenario(s) {', '.join(bad) or '(none)'}; choose from {', '.join(SCENARIOS)}",
            param_hint="--scenarios",
        )
    if min(workers, concurrency, tasks, breaker_tasks, retry_tasks, cap) < 1 or hand_tasks < 0:
        raise click.UsageError(
            "--workers, --concurrency, --tasks, --breaker-tasks, --retry-tasks and --cap must be >= 1"
            " (--hand-tasks >= 0)"
        )
    if outage <= 0 or fresh_rate <= 0 or latency_ms <= 0 or timeout <= 0 or sustain_latency_ms <= 0:
        raise click.UsageError("--outage, --fresh-rate, --latency-ms, --sustain-latency-ms and --timeout must be > 0")
    try:
        rate_list = [int(r) for r in rates.split(",") if r.strip()]
    except ValueError:
        rate_list = []
    if not rate_list or min(rate_list) < 1 or sustain_seconds < 1:
        raise click.UsageError("--rates must be whole numbers >= 1, comma-separated, and --sustain-seconds >= 1")
    results = []
    for scenario in chosen:
        argv = child_argv(
            scenario,
            store=kind,
            pg_url=pg_url,
            workers=workers,
            concurrency=concurrency,
            tasks=tasks,
            hand_tasks=hand_tasks,
            breaker_tasks=breaker_tasks,
            outage=outage,
            retry_tasks=retry_tasks,
            fresh_rate=fresh_rate,
            cap=cap,
            latency_ms=latency_ms,
            rates=",".join(str(r) for r in rate_list),
            sustain_seconds=sustain_seconds,
            sustain_latency_ms=sustain_latency_ms,
            adaptive_phases=adaptive_phases,
            adaptive_latency_ms=adaptive_latency_ms,
            adaptive_compare=adaptive_compare,
            kill_leader=kill_leader or None,
            timeout=timeout,
            progress=not no_progress,
        )
        try:
            results.append(common.run_child(argv, f"limits: {scenario} ({kind})", show_progress=not no_progress))
        except RuntimeError as exc:
            raise click.ClickException(str(exc)) from None
    report = {"scenario": "limits", "store": kind, "workers": workers, "concurrency": concurrency, "results": results}
    if as_json:
        click.echo(common.dumps(report))
        return
    render(report)


@bench.command("scale")
@store_option("sqlite", "sqlite, postgres, or a store URL (a fresh store is used either way).")
@pg_url_option
@click.option("--tasks", default=1_000_000, show_default=True, help="No-op tasks queued before the workers start.")
@click.option("--groups", "n_groups", default=10_000, show_default=True, help="Groups (task i in group i mod N).")
@click.option("--slice", "slice_size", default=10_000, show_default=True, help="Tasks per measured slice.")
@click.option(
    "--drain",
    default=0,
    show_default=True,
    help="Tasks the workers run before the figures are taken (0: all of them; fewer bounds the run, and the "
    "last slice is then the last one drained).",
)
@click.option("--workers", default=2, show_default=True, help="Worker processes.")
@click.option("--concurrency", default=8, show_default=True, help="Slots per worker process.")
@click.option(
    "--latency-tasks",
    default=200,
    show_default=True,
    help="Idle-latency tasks, on the fresh store and after the drain (0 skips both).",
)
@click.option("--timeout", default=3600.0, show_default=True, help="Seconds the drain may take.")
@click.option(
    "--no-reference",
    is_flag=True,
    help="SQLite: skip inserting the same rows into a bare table with only a (group, id) index "
    "(the reference for the submit's slowdown; about 10 s at a million tasks).",
)
@json_option
@no_progress_option
def scale_cmd(
    store: tuple[str, str | None],
    pg_url: str | None,
    tasks: int,
    n_groups: int,
    slice_size: int,
    drain: int,
    workers: int,
    concurrency: int,
    latency_tasks: int,
    timeout: float,
    no_reference: bool,
    as_json: bool,
    no_progress: bool,
) -> None:
    """A million queued tasks: do submit rate, claim time and worker memory stay flat?

    Queues --tasks no-op tasks in --groups groups (submit_many, 1 000 a call),
    then --workers processes drain them; reports the slices ending at 10 k,
    100 k and the last task, and the ratio last / first (flat is 1.0); the
    submit rate also per tenth of the tasks, and on SQLite beside the same
    rows in a bare table with only a (group, id) index, the part of the
    slowdown that is the B-tree's own. The idle submit-to-start latency is
    measured on the fresh store and again after the drain."""
    from corral.bench.scale import child_argv, render_scale

    kind, pg_url = _shared_store(store, pg_url)
    if min(tasks, n_groups, slice_size, workers, concurrency) < 1 or drain < 0 or latency_tasks < 0:
        raise click.UsageError("--tasks, --groups, --slice, --workers and --concurrency must be >= 1")
    if timeout <= 0:
        raise click.UsageError("--timeout must be > 0")
    argv = child_argv(
        "scale",
        store=kind,
        pg_url=pg_url,
        tasks=tasks,
        groups=n_groups,
        slice=slice_size,
        drain=drain,
        workers=workers,
        concurrency=concurrency,
        latency_tasks=latency_tasks,
        timeout=timeout,
        no_reference=no_reference,
        progress=not no_progress,
    )
    _run_and_show(argv, f"scale ({kind})", render_scale, as_json=as_json, progress=not no_progress)


@bench.command("processes")
@store_option("postgres", "postgres (or sqlite), or a store URL (a fresh store is used either way).")
@pg_url_option
@click.option("--processes", default="1,2,4,8", show_default=True, help="Worker process counts to measure.")
@click.option("--tasks", default=20_000, show_default=True, help="No-op tasks queued before each run.")
@click.option("--concurrency", default=8, show_default=True, help="Slots per worker process.")
@click.option("--timeout", default=600.0, show_default=True, help="Seconds one run may take.")
@json_option
@no_progress_option
def processes_cmd(
    store: tuple[str, str | None],
    pg_url: str | None,
    processes: str,
    tasks: int,
    concurrency: int,
    timeout: float,
    as_json: bool,
    no_progress: bool,
) -> None:
    """Claims per second with more worker processes, from a pre-filled queue of no-op tasks.

    On PostgreSQL it also gives what the server spent per task and per
    claim: transactions, WAL records and flushes, and CPU time when the
    server runs on this machine (WAL figures are the whole server's: use a
    server the run has to itself)."""
    from corral.bench.scale import child_argv, render_processes

    kind, pg_url = _shared_store(store, pg_url)
    try:
        counts = [int(x) for x in processes.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter("a comma-separated list of integers", param_hint="--processes") from None
    if not counts or min(counts) < 1 or tasks < 1 or concurrency < 1 or timeout <= 0:
        raise click.UsageError("--processes, --tasks and --concurrency must be >= 1, --timeout > 0")
    argv = child_argv(
        "processes",
        store=kind,
        pg_url=pg_url,
        processes=",".join(map(str, counts)),
        tasks=tasks,
        concurrency=concurrency,
        timeout=timeout,
        progress=not no_progress,
    )
    _run_and_show(argv, f"processes ({kind})", render_processes, as_json=as_json, progress=not no_progress)


@bench.command("dag")
@click.option(
    "--stores",
    default="memory,sqlite",
    show_default=True,
    help="Stores to run on, comma-separated (postgres is added when --pg-url is given).",
)
@pg_url_option
@click.option("--nodes", default=1000, show_default=True, help="Tasks in the graph.")
@click.option("--layers", default=20, show_default=True, help="Layers of the graph (equal widths).")
@click.option("--fan-in", default=3, show_default=True, help="Most upstream tasks per node (from the layer before).")
@click.option("--slots", default=16, show_default=True, help="Worker slots.")
@click.option("--duration", default=0.02, show_default=True, help="Seconds each task sleeps.")
@click.option("--seed", default=7, show_default=True, help="Seed of the random graph.")
@json_option
@no_progress_option
def dag_cmd(
    stores: str,
    pg_url: str | None,
    nodes: int,
    layers: int,
    fan_in: int,
    slots: int,
    duration: float,
    seed: int,
    as_json: bool,
    no_progress: bool,
) -> None:
    """A layered random graph submitted in one call: makespan against
    ideal = max(critical path, total work / slots)."""
    from corral.bench.dag import child_argv, render

    kinds = [k.strip() for k in stores.split(",") if k.strip()]
    if pg_url and "postgres" not in kinds:
        kinds.append("postgres")
    bad = [k for k in kinds if k not in STORES]
    if bad or not kinds:
        raise click.BadParameter(
            f"choose from {', '.join(STORES)}, not {', '.join(bad) or 'nothing'}", param_hint="--stores"
        )
    if min(nodes, layers, fan_in, slots) < 1 or duration < 0:
        raise click.UsageError("--nodes, --layers, --fan-in and --slots must be >= 1, --duration >= 0")
    reports = []
    for kind in kinds:
        argv = child_argv(
            store=kind,
            nodes=nodes,
            layers=layers,
            fan_in=fan_in,
            slots=slots,
            duration=duration,
            seed=seed,
            pg_url=pg_url if kind == "postgres" else None,
            progress=not no_progress,
        )
        try:
            reports.append(common.run_child(argv, f"dag ({kind})", show_progress=not no_progress))
        except RuntimeError as exc:
            raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(common.dumps({"scenario": "dag", "runs": reports}))
        return
    render(reports)


@bench.command("retention")
@pg_url_option
@click.option("--rate", default=200.0, show_default=True, help="Tasks submitted per second.")
@click.option("--duration", default="10m", show_default=True, help="Length of the run.")
@click.option("--keep", default="60s", show_default=True, help="Age kept in every final state ('off': no retention).")
@click.option("--sweep", default="5s", show_default=True, help="Sweep interval (retention runs after each sweep).")
@click.option("--sample", default="30s", show_default=True, help="Time between two readings of the table.")
@click.option("--workers", default=8, show_default=True, help="Worker slots.")
@json_option
def retention_cmd(
    pg_url: str | None, rate: float, duration: str, keep: str, sweep: str, sample: str, workers: int, as_json: bool
) -> None:
    """The PostgreSQL tasks table over a long steady run with retention on:
    rows per state, n_live_tup, n_dead_tup and size over time."""
    from corral.bench import retention as ret
    from corral.core.planning import parse_duration

    try:
        keep_s = None if keep.strip().lower() == "off" else parse_duration(keep)
        run_s, sweep_s, sample_s = parse_duration(duration), parse_duration(sweep), parse_duration(sample)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if rate <= 0 or workers < 1 or min(run_s, sweep_s, sample_s) <= 0 or keep_s == 0:
        raise click.UsageError("--rate, --duration, --keep, --sweep, --sample and --workers must be > 0")

    def progress(row: dict[str, Any]) -> None:
        if not as_json:
            click.echo(
                f"{row['t_s']:.0f}s: {row['rows']:,} rows, live {row['n_live_tup']:,}, dead {row['n_dead_tup']:,}",
                err=True,
            )

    with common.temp_store_url("postgres", pg_url) as url:
        report = ret.run(
            url,
            rate=rate,
            duration=run_s,
            keep=keep_s,
            sweep=sweep_s,
            sample=sample_s,
            workers=workers,
            on_sample=progress,
        )
    if as_json:
        click.echo(common.dumps(report))
        return
    ret.render(report, click.echo)


@bench.command("soak")
@pg_url_option
@click.option("--rate", default=200.0, show_default=True, help="Single submits per second (e.g. 200, 1000).")
@click.option(
    "--duration", default="10m", show_default=True, help="Length of the run (the issue's soak: 30m; 10m by default)."
)
@click.option(
    "--pin-minutes", default=3.0, show_default=True, help="Minutes the horizon is pinned, mid-run (0: never)."
)
@click.option(
    "--readers", default=4, show_default=True, help="REPEATABLE READ sessions scanning the tasks table while pinned."
)
@click.option("--keep", default="60s", show_default=True, help="Age retention keeps in every final state.")
@click.option(
    "--events-keep",
    type=click.IntRange(min=0),
    default=None,
    help="Events the leader keeps (default: the worker's own, 100 000; fewer reach the trimming sooner).",
)
@click.option("--sample", default="60s", show_default=True, help="Time between two rows.")
@workers_option
@concurrency_option
@click.option(
    "--submitters", type=click.IntRange(min=1), default=None, help="Submitting processes (as `bench latency`)."
)
@json_option
def soak_cmd(
    pg_url: str | None,
    rate: float,
    duration: str,
    pin_minutes: float,
    readers: int,
    keep: str,
    events_keep: int | None,
    sample: str,
    workers: int,
    concurrency: int | None,
    submitters: int | None,
    as_json: bool,
) -> None:
    """Steady single submits on PostgreSQL with the xmin horizon pinned mid-run:
    per minute, throughput against offered, pickup p50/p95, the tasks table's
    and indexes' size, n_dead_tup, the event stream's dead rows and size and
    the claim's index reads."""
    from corral.bench import soak
    from corral.core.planning import parse_duration

    try:
        run_s, keep_s, sample_s = parse_duration(duration), parse_duration(keep), parse_duration(sample)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    pin_s = pin_minutes * 60.0
    if rate <= 0 or workers < 1 or min(run_s, keep_s, sample_s) <= 0 or not 0 <= pin_s < run_s or readers < 0:
        raise click.UsageError("--rate, --duration, --keep, --sample > 0; --pin-minutes from 0 to less than --duration")

    def progress(row: dict[str, Any]) -> None:
        if not as_json:
            click.echo(soak.sample_line(row), err=True)

    if not as_json:
        click.echo(soak.HEAD, err=True)
    with common.temp_store_url("postgres", pg_url) as url:
        try:
            report = soak.run(
                url,
                rate=rate,
                duration=run_s,
                pin=pin_s,
                readers=readers,
                keep=keep_s,
                sample=sample_s,
                workers=workers,
                concurrency=concurrency,
                submitters=submitters,
                events_keep=events_keep,
                on_sample=progress,
            )
        except RuntimeError as exc:
            raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(common.dumps(report))
        return
    soak.render(report, click.echo)


@bench.command("keys")
@store_option("sqlite", "sqlite, postgres, or a store URL (a fresh store is used either way).")
@pg_url_option
@click.option("--keys", "n_keys", default=1000, show_default=True, help="Keys of the keyed limit.")
@click.option(
    "--tasks-per-key",
    type=click.IntRange(min=1),
    default=None,
    help="Tasks of each key. Default: enough to keep a key busy --seconds at its bound.",
)
@click.option("--seconds", default=10.0, show_default=True, help="Seconds each key is busy at its bound (sizes N).")
@click.option("--duration", default=0.25, show_default=True, help="Seconds each task sleeps (d).")
@click.option("--concurrency", default=2, show_default=True, help="Each key's concurrency (C).")
@click.option("--rate", default=5, show_default=True, help="Each key's rate: R starts in any sliding second.")
@click.option("--workers", default=3, show_default=True, help="`corral worker` processes.")
@click.option(
    "--slots",
    type=click.IntRange(min=1, max=1000),
    default=None,
    help="Slots per worker process. Default: enough that every key can hold its C at once"
    " (keys x C / workers, at most 1 000), so the keys bind, not the slots.",
)
@click.option("--no-plain", is_flag=True, help="Skip the same tasks run with no limit.")
@click.option(
    "--w1",
    is_flag=True,
    help="The peers' W1 with every task keyed: 1 000 keys x 20 (or --tasks-per-key) no-op tasks into"
    " 2 workers x 8 slots, a keyed limit that never binds (concurrency 1 000 000, no rate), against no limit.",
)
@click.option("--timeout", default=900.0, show_default=True, help="Seconds one run may take.")
@click.option(
    "--claim-cost",
    is_flag=True,
    help="Instead of the fleet run: the claim's cost with --active-keys keys holding a place, against no limit.",
)
@click.option("--active-keys", default=10_000, show_default=True, help="Claim cost: keys with a task running.")
@click.option("--queued", default=5_000, show_default=True, help="Claim cost: tasks queued behind them.")
@click.option("--claims", default=200, show_default=True, help="Claim cost: claims timed (the median is reported).")
@click.option("--warmup", default=20, show_default=True, help="Claim cost: claims made first, not timed.")
@click.option(
    "--batch",
    default=10,
    show_default=True,
    help="Claim cost: units a claim asks for (a worker's free slots; its default slots are 10).",
)
@click.option(
    "--claim-limits",
    default="none,limit,keyed,keyed_rate",
    show_default=True,
    help="Claim cost: which to time: no limit, one plain limit, a keyed limit, a keyed limit with a rate.",
)
@json_option
@no_progress_option
def keys_cmd(
    store: tuple[str, str | None],
    pg_url: str | None,
    n_keys: int,
    tasks_per_key: int | None,
    seconds: float,
    duration: float,
    concurrency: int,
    rate: int,
    workers: int,
    slots: int | None,
    no_plain: bool,
    w1: bool,
    timeout: float,
    claim_cost: bool,
    active_keys: int,
    queued: int,
    claims: int,
    warmup: int,
    batch: int,
    claim_limits: str,
    as_json: bool,
    no_progress: bool,
) -> None:
    """Keyed limits held by a fleet: each key's bounds checked exactly, and throughput against what they allow.

    --keys keys, N tasks each of d seconds, under one keyed limit (C at once,
    R starts in any sliding second, per key), queued in one submit into
    --workers `corral worker` processes; then the same tasks with no limit.
    Each task records its body's start and end; the store gives the start it
    charged. The worst key's most in flight (bodies) must be <= C and its most
    starts in any sliding second (store starts) <= R: the command exits 1 if
    either is broken.

    What the keys allow: a key's starts s_0 <= s_1 <= ... obey s_i >= s_(i-R) + 1 s
    (R + 1 starts never fit in a second) and s_i >= s_(i-C) + d (one of the C
    started before must have ended). Starting each task as early as both allow
    is feasible and meets both, so the ideal time of a key is that schedule's
    last start + d, about max(N / R, N x d / C) seconds for large N (defaults:
    d = 0.25, C = 2, R = 5: the rate binds, N / 5). Keys run side by side, so
    throughput / allowed = ideal / (last end - first start), target >= 0.9.

    --claim-cost: the median time of a worker's claim (--batch units) with
    --active-keys keys each holding a running task and --queued tasks queued
    under them, a keyed limit that never binds (concurrency only, and with a
    rate too), against the same tasks under no limit; target <= 1.2 x."""
    from corral.bench.keys import CLAIM_VARIANTS, child_argv, render, tasks_for

    kind, pg_url = _store(store, pg_url)
    if claim_cost:
        chosen = [v.strip() for v in claim_limits.split(",") if v.strip()]
        bad = [v for v in chosen if v not in CLAIM_VARIANTS]
        if bad or not chosen:
            raise click.BadParameter(
                f"unknown {', '.join(bad) or '(none)'}; choose from {', '.join(CLAIM_VARIANTS)}",
                param_hint="--claim-limits",
            )
        if min(active_keys, queued, claims, batch) < 1 or warmup < 0:
            raise click.UsageError("--active-keys, --queued, --claims and --batch must be >= 1, --warmup >= 0")
        if queued < (claims + warmup) * batch:
            raise click.UsageError("--queued must hold every claim: at least (--claims + --warmup) x --batch")
        argv = child_argv(
            claim_cost=True,
            store=kind,
            pg_url=pg_url,
            active=active_keys,
            queued=queued,
            claims=claims,
            warmup=warmup,
            batch=batch,
            variants=",".join(chosen),
            progress=not no_progress,
        )
        _run_and_show(argv, f"keys: claim cost ({kind})", render, as_json=as_json, progress=not no_progress)
        return
    if kind == "memory":
        raise click.BadParameter("worker processes need a shared store: sqlite or postgres", param_hint="--store")
    if w1:
        n_keys, duration, concurrency, rate, workers, slots = 1000, 0.0, 1_000_000, 0, 2, 8
        tasks_per_key = tasks_per_key or 20
    elif min(n_keys, concurrency, rate, workers) < 1 or duration < 0 or seconds <= 0 or timeout <= 0:
        raise click.UsageError(
            "--keys, --concurrency, --rate and --workers must be >= 1, --duration >= 0, --seconds and --timeout > 0"
        )
    n = tasks_per_key or tasks_for(seconds, duration, concurrency, rate)  # --w1 sets it
    slots = slots or max(1, min(1000, -(-n_keys * concurrency // workers)))
    argv = child_argv(
        store=kind,
        pg_url=pg_url,
        keys=n_keys,
        tasks_per_key=n,
        duration=duration,
        concurrency=concurrency,
        rate=rate,
        workers=workers,
        slots=slots,
        no_plain=no_plain,
        timeout=timeout,
        progress=not no_progress,
    )
    try:
        report = common.run_child(argv, f"keys ({kind})", show_progress=not no_progress)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(common.dumps(report))
    else:
        render(report)
    if report["broken"]:
        raise click.ClickException("a key broke its bounds: " + "; ".join(report["broken"]))


def main() -> None:  # pragma: no cover - `python -m corral.bench`
    bench(prog_name="corral bench")


__all__ = ["bench", "main"]

if __name__ == "__main__":  # pragma: no cover
    main()


@bench.command("dashboard")
@store_option("sqlite", "sqlite, postgres, or a store URL (a fresh store is used either way).")
@pg_url_option
@click.option("--tasks", default=1_000_000, show_default=True, help="Finished tasks seeded before timing.")
@click.option("--queued", default=10_000, show_default=True, help="Queued tasks seeded beside them.")
@click.option("--repeat", default=20, show_default=True, help="Fetches of each page.")
@click.option(
    "--live-cost",
    is_flag=True,
    help="Instead: W1 in turns without and with a dashboard process whose live stream a client reads.",
)
@click.option(
    "--rounds", default=10, show_default=True, help="--live-cost: pairs of turns, without and with (order alternates)."
)
@click.option("--w1-tasks", default=20_000, show_default=True, help="--live-cost: no-op tasks a turn.")
@click.option("--processes", default=2, show_default=True, help="--live-cost: worker processes.")
@json_option
def dashboard_cmd(
    store: tuple[str, str | None],
    pg_url: str | None,
    tasks: int,
    queued: int,
    repeat: int,
    live_cost: bool,
    rounds: int,
    w1_tasks: int,
    processes: int,
    as_json: bool,
) -> None:
    """Dashboard pages on a store of N finished tasks: p50 and max per page.

    With --live-cost: what an open dashboard costs the claim/complete path
    (W1 with and without it, side by side)."""
    from corral.bench import dashboard as dash_bench

    kind, pg_url = _store(store, pg_url)
    if kind == "memory":
        raise click.UsageError("the dashboard bench seeds a durable store: sqlite or postgres")
    if tasks < 1 or repeat < 1 or rounds < 1 or w1_tasks < 1 or processes < 1:
        raise click.UsageError("--tasks, --repeat, --rounds, --w1-tasks and --processes must be at least 1")
    if queued < 0:
        raise click.UsageError("--queued must not be negative")
    if live_cost:
        _live_cost(kind, pg_url, w1_tasks, processes, rounds, as_json)
        return

    def progress(done: int, total: int) -> None:
        if not as_json:
            click.echo(f"seeded {done:,} of {total:,} finished tasks", err=True)

    with common.temp_store_url(kind, pg_url) as url:
        report = dash_bench.run(url, tasks, repeat, queued, progress)
    report["store"] = kind
    if as_json:
        click.echo(common.dumps(report))
        return
    click.echo(
        f"dashboard on {kind}, {tasks:,} finished and {queued:,} queued tasks (seeded in {report['seed_s']} s; "
        f"started with its first look in {report['start_s']} s); {repeat} fetches per page"
    )
    width = max(len(p["page"]) for p in report["pages"])
    click.echo(f"{'page':<{width}}  {'p50 ms':>8}  {'max ms':>8}")
    for p in report["pages"]:
        status = "" if p["status"] == 200 else f"  (status {p['status']})"
        click.echo(f"{p['page']:<{width}}  {p['p50_ms']:>8.1f}  {p['max_ms']:>8.1f}{status}")


def _live_cost(kind: str, pg_url: str | None, tasks: int, processes: int, rounds: int, as_json: bool) -> None:
    from corral.bench import live_cost

    def progress(turn: dict[str, Any]) -> None:
        if not as_json:
            side = "with the live stream" if turn["live"] else "without a dashboard"
            click.echo(f"pair {turn['pair']}, {side}: {turn['rate']:,.0f} tasks/s", err=True)

    report = live_cost.run(kind, pg_url, tasks, processes, rounds, progress)
    if as_json:
        click.echo(common.dumps(report))
        return
    r = report["ratio"]
    calls = ", ".join(f"{k} {v:g}" for k, v in report["store_calls"].items())
    click.echo(
        f"W1 on {kind} ({tasks:,} no-op tasks, {processes} worker processes), {rounds} pairs of turns "
        f"without / with a dashboard streaming live: median {report['median_off']:,.0f} / {report['median_on']:,.0f} "
        f"tasks/s; with / without per pair: median {r['median']:.3f} (quartiles {r['q1']:.3f}-{r['q3']:.3f}, "
        f"extremes {r['min']:.3f}-{r['max']:.3f}), cost {report['cost_pct']:.1f} %\n"
        f"the dashboard process: {report['dashboard_cpu_s']:.2f} CPU s in its turns "
        f"({100 * report['dashboard_core_share']:.1f} % of one core), {report['store_calls_per_s']:g} store calls/s "
        f"({calls}); load average {report['load_before'][0]:.1f} before, {report['load_after'][0]:.1f} after"
    )


def _run_and_show(argv: list[str], label: str, render: Any, *, as_json: bool, progress: bool) -> None:
    """Run one measured child and print its report (a table, or one JSON object)."""
    try:
        report = common.run_child(argv, label, show_progress=progress)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(common.dumps(report))
        return
    render(report)

"""The ``corral`` command line.

One entry point; every command takes ``--store URL`` (default ``$CORRAL_STORE``,
else ``sqlite:///corral.db``) and, on bad input, exits non-zero with a single
``error: ...`` line on stderr and no traceback (set ``CORRAL_DEBUG=1`` to see
the traceback of an unexpected error).

Commands: ``worker APP``, ``submit``, ``status``, ``tasks``, ``show ID``,
``cancel ID``, ``retry ID|--batch B``, ``sweep``, ``dashboard``, ``demo``,
``plan`` and ``bench``. ``APP`` is ``module:attribute`` naming a
:class:`corral.App`; the current directory is importable, like other tools do.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import click

from corral.core.model import TaskFilter, TaskRecord, loads
from corral.core.states import FINAL, State
from corral.errors import CorralError, TaskNotFound
from corral.stores import default_url, open_store

log = logging.getLogger("corral.cli")

#: Exit code of a worker stopped at once by a second signal during its grace period.
EXIT_FORCED = 3
#: States ``retry`` moves back to PENDING.
RETRYABLE_BY_HAND = (State.FAILED, State.TIMEOUT, State.CANCELED)
_STATE_ORDER = [State.WAITING, State.PENDING, State.RETRYING, State.RUNNING,
                State.SUCCESS, State.FAILED, State.TIMEOUT, State.CANCELED]
_STATE_STYLE = {
    State.WAITING: "dim", State.PENDING: "cyan", State.RETRYING: "yellow", State.RUNNING: "blue",
    State.SUCCESS: "green", State.FAILED: "red", State.TIMEOUT: "magenta", State.CANCELED: "bright_black",
}


# ---- errors: one line, no traceback --------------------------------------------------
class CLIError(click.ClickException):
    """A user-facing failure: printed as one line, exit status 1."""


def _one_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[0] if lines else "unknown error"


def _debug() -> bool:
    return os.environ.get("CORRAL_DEBUG", "").strip().lower() not in ("", "0", "false", "no")


_NoArgsIsHelp = getattr(click.exceptions, "NoArgsIsHelpError", ())  # click >= 8.2


class CorralGroup(click.Group):
    """A click group whose every failure is one ``error:`` line on stderr."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name or "corral", complete_var, standalone_mode=False, **extra)
        except click.exceptions.Abort:
            _fail("interrupted", 130)
        except _NoArgsIsHelp as exc:  # `corral` or `corral bench` alone: show the help
            click.echo(exc.format_message())
            sys.exit(0)
        except click.ClickException as exc:
            _fail(exc.format_message(), exc.exit_code)
        except CorralError as exc:
            _fail(str(exc) or type(exc).__name__, 1)
        except KeyboardInterrupt:
            _fail("interrupted", 130)
        except Exception as exc:  # noqa: BLE001 - the contract is one line, not a traceback
            if _debug():
                raise
            _fail(f"{type(exc).__name__}: {exc}", 1)
        sys.exit(rv if isinstance(rv, int) else 0)


def _fail(message: str, code: int) -> None:
    click.echo(f"error: {_one_line(message)}", err=True)
    sys.exit(code or 1)


# ---- shared helpers -----------------------------------------------------------------
def store_option(f: Callable) -> Callable:
    return click.option(
        "--store", "store_url", metavar="URL", default=None,
        help="memory://, sqlite:///path or postgresql://... (default: $CORRAL_STORE, else sqlite:///corral.db)",
    )(f)


def json_option(f: Callable) -> Callable:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")(f)


def _given(store_url: str | None) -> str | None:
    """The URL given on the command line (``corral --store X cmd`` or ``cmd --store X``), if any."""
    ctx = click.get_current_context(silent=True)
    group_url = ctx.find_root().params.get("store_url") if ctx is not None else None
    return store_url or group_url


def _url(store_url: str | None) -> str:
    return _given(store_url) or default_url()


def _open(store_url: str | None):
    store = open_store(_url(store_url))
    store.migrate()
    return store


def _console():
    from rich.console import Console

    # Piped output keeps whole rows rather than wrapping at rich's default 80 columns.
    width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160
    return Console(highlight=False, soft_wrap=False, width=width)


def _print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))


def _when(ts: float | None) -> str:
    if ts is None:
        return ""
    return _dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _took(rec: TaskRecord) -> float | None:
    if rec.started_at is None:
        return None
    end = rec.finished_at if rec.finished_at is not None else time.time()
    return max(0.0, end - rec.started_at)


def _secs(value: float | None) -> str:
    if value is None:
        return ""
    from corral.core.planning import format_duration

    return format_duration(value)


def _duration_arg(text: str | None, what: str, default_unit: str = "s") -> float | None:
    if text is None:
        return None
    from corral.core.planning import parse_duration

    try:
        return parse_duration(text, default_unit)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=what) from None


def _json_arg(text: str, what: str, kind: type) -> Any:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CLIError(f"{what} is not valid JSON ({exc.msg} at char {exc.pos}): {text!r}") from None
    if not isinstance(value, kind):
        want = "a JSON array, e.g. '[\"A1\", \"tmall\"]'" if kind is list else "a JSON object, e.g. '{\"channel\": \"tmall\"}'"
        raise CLIError(f"{what} must be {want}, not {type(value).__name__}")
    return value


def load_app(spec: str, store_url: str | None = None):
    """Import ``module:attribute`` and return the App it names.

    With ``store_url``, ``$CORRAL_STORE`` is set before the import, so an
    ``App()`` built with no URL opens that store; an app that names its own
    store is moved to ``store_url`` (its declared limits are copied).
    """
    from corral.app import App

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise CLIError(f"bad APP {spec!r}: expected module:attribute, e.g. examples.shop:app")
    if store_url:
        os.environ["CORRAL_STORE"] = store_url
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise CLIError(f"bad APP {spec!r}: no module named {exc.name!r} (run from the directory that holds it, or set PYTHONPATH)") from None
        raise CLIError(f"bad APP {spec!r}: importing {module_name} failed: {exc}") from None
    except CorralError as exc:
        raise CLIError(f"bad APP {spec!r}: {_one_line(str(exc))}") from None
    except Exception as exc:  # noqa: BLE001 - any import-time failure is the APP's
        raise CLIError(f"bad APP {spec!r}: importing {module_name} failed: {type(exc).__name__}: {_one_line(str(exc))}") from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CLIError(f"bad APP {spec!r}: module {module_name!r} has no attribute {attr!r}") from None
    if not isinstance(obj, App):
        raise CLIError(f"bad APP {spec!r}: {attr} is a {type(obj).__name__}, not a corral.App")
    if store_url and getattr(obj.store, "url", store_url) != store_url:
        new = open_store(store_url)
        new.migrate()
        for spec_ in obj.store.limits().values():
            new.set_limit(spec_)
        log.warning("app %s names store %s; using %s as --store asks", spec, obj.store.url, store_url)
        obj.store = new
    return obj


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )


# ---- the group ------------------------------------------------------------------------
@click.group(cls=CorralGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="corral", prog_name="corral")
@store_option
def cli(store_url: str | None) -> None:
    """corral: parallel task management. Who runs, how many run, in what
    order, and what happens when a run dies half-way.

    Try `corral demo`, then `corral status` and `corral tasks`.
    """


# ---- worker ------------------------------------------------------------------------------
@cli.command()
@click.argument("app_spec", metavar="APP")
@store_option
@click.option("-c", "--concurrency", type=click.IntRange(min=1), default=10, show_default=True, help="Worker slots (tasks or chunks in flight).")
@click.option("-q", "--queues", default="default", show_default=True, help="Comma-separated queues to serve.")
@click.option("--chunk-size", type=click.IntRange(min=1), default=1, show_default=True, help="Tasks of one group taken together and run in order.")
@click.option("--grace", type=click.FloatRange(min=0), default=30.0, show_default=True, help="Seconds in-flight tasks get to finish after SIGTERM.")
@click.option("--sweep/--no-sweep", default=False, show_default=True, help="Also run the sweeper (one leader at a time across the fleet).")
@click.option("--sweep-interval", default="30s", show_default=True, help="How often the sweeper runs (e.g. 30s, 5m).")
@click.option("--lease", "lease", default="30s", show_default=True, help="Lease a running task holds; a crashed worker's tasks are recovered after it.")
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False), default="INFO", show_default=True)
def worker(app_spec, store_url, concurrency, queues, chunk_size, grace, sweep, sweep_interval, lease, log_level):
    """Run tasks of APP (module:attribute, a corral.App) until SIGTERM.

    SIGTERM (or Ctrl-C) stops claiming, lets in-flight tasks finish within
    --grace seconds, hands back what did not finish, and exits 0. A second
    SIGTERM or SIGINT during the grace period stops at once (exit 3); the
    sweeper then recovers the unfinished tasks when their leases expire.

    An `App()` built without a URL reads $CORRAL_STORE, which --store sets.
    """
    _setup_logging(log_level)
    lease_s = _duration_arg(lease, "--lease")
    sweep_s = _duration_arg(sweep_interval, "--sweep-interval")
    if lease_s <= 0 or sweep_s <= 0:
        raise CLIError("--lease and --sweep-interval must be > 0")
    queue_list = tuple(q.strip() for q in queues.split(",") if q.strip())
    if not queue_list:
        raise CLIError("--queues names no queue")
    app = load_app(app_spec, _given(store_url))
    if not app.registry:
        raise CLIError(f"APP {app_spec!r} registers no task; nothing to run")
    if not getattr(app.store, "shared", True):
        log.warning("store %s lives in this process only: tasks submitted elsewhere never reach this worker", app.store.url)
    app.run(concurrency, queues=queue_list, chunk_size=chunk_size, lease_seconds=lease_s, grace=grace,
            sweep_interval=sweep_s if sweep else None)
    # The store is left open: the worker's daemon threads may still be in a
    # store call (Worker.stop does not join them); the process exit closes it.


# ---- submit ----------------------------------------------------------------------------
@cli.command()
@click.argument("task_name", metavar="TASK")
@click.argument("args_json", metavar="[ARGS_JSON]", required=False)
@click.option("--app", "app_spec", envvar="CORRAL_APP", required=True, metavar="APP", help="module:attribute of the App that defines TASK (or $CORRAL_APP).")
@store_option
@click.option("--kwargs", "kwargs_json", metavar="JSON", help="Keyword arguments as a JSON object.")
@click.option("--group", help="FIFO lane: one in flight per group, in submit order.")
@click.option("--batch", help="Batch id (aggregate status in `corral status --batch`).")
@click.option("--key", help="Idempotency key: a second submit with it returns the first task.")
@click.option("--delay", metavar="DURATION", help="Run no earlier than this from now (e.g. 30s, 5m).")
@click.option("--priority", type=int, help="Higher runs first.")
@click.option("--queue", help="Queue (default: the task's).")
@click.option("--timeout", metavar="DURATION", help="Override the task's timeout.")
@click.option("--retries", type=click.IntRange(min=0), help="Override the task's retries.")
@click.option("--depends-on", "depends_on", multiple=True, type=int, metavar="ID", help="Run after this task succeeds (repeatable).")
@click.option("--trace-id", help="Trace id (default: a new one).")
@json_option
def submit(task_name, args_json, app_spec, store_url, kwargs_json, group, batch, key, delay, priority,
           queue, timeout, retries, depends_on, trace_id, as_json):
    """Queue one run of TASK with ARGS_JSON (a JSON array); print its id.

    Example: corral submit sync_sku '["A1", "tmall"]' --app examples.shop:app --group merchant-1001
    """
    args = _json_arg(args_json, "ARGS_JSON", list) if args_json is not None else []
    kwargs = _json_arg(kwargs_json, "--kwargs", dict) if kwargs_json is not None else {}
    options: dict[str, Any] = {}
    for name, value in (("group", group), ("batch", batch), ("key", key), ("priority", priority),
                        ("queue", queue), ("retries", retries), ("trace_id", trace_id)):
        if value is not None:
            options[name] = value
    if delay is not None:
        options["delay"] = _duration_arg(delay, "--delay")
    if timeout is not None:
        options["timeout"] = _duration_arg(timeout, "--timeout")
    if depends_on:
        options["depends_on"] = list(depends_on)
    app = load_app(app_spec, _given(store_url))
    h = app.submit(task_name, args=args, kwargs=kwargs, **options)
    if as_json:
        _print_json({"id": h.id, "created": h.created})
    else:
        click.echo(h.id)
        if not h.created:
            click.echo(f"note: key {key!r} matched existing task {h.id}; nothing new was queued", err=True)


# ---- status -------------------------------------------------------------------------------
@cli.command()
@store_option
@click.option("--queue", help="Only this queue.")
@click.option("--batch", help="Also show this batch's aggregate status.")
@json_option
def status(store_url, queue, batch, as_json):
    """Task counts per state (and limits in use)."""
    store = _open(store_url)
    counts = store.counts(queue) if queue else store.counts()
    full = {s.value: int(counts.get(s.value, 0)) for s in _STATE_ORDER}
    specs = store.limits()
    usage = store.limit_usage()
    summary = store.batch_summary(batch) if batch else None
    if summary is not None and summary.total == 0:
        raise CLIError(f"no batch named {batch!r}")
    if as_json:
        out: dict[str, Any] = {"store": _url(store_url), "counts": full, "total": sum(full.values())}
        out["limits"] = {n: {"concurrency": s.concurrency, "rate": s.rate, "in_use": usage.get(n, 0)} for n, s in specs.items()}
        if summary is not None:
            out["batch"] = _batch_dict(summary)
        _print_json(out)
        return
    from rich.table import Table

    con = _console()
    t = Table(title=f"store {_url(store_url)}" + (f", queue {queue}" if queue else ""), title_justify="left")
    t.add_column("State")
    t.add_column("Tasks", justify="right")
    for s in _STATE_ORDER:
        n = full[s.value]
        t.add_row(f"[{_STATE_STYLE[s]}]{s.value}[/]", str(n) if n else "[dim]0[/]")
    t.add_section()
    t.add_row("[bold]total[/]", f"[bold]{sum(full.values())}[/]")
    con.print(t)
    if specs:
        lt = Table(title="limits", title_justify="left")
        for col in ("Limit", "In use", "Concurrency", "Rate"):
            lt.add_column(col, justify="right" if col != "Limit" else "left")
        for n, s in sorted(specs.items()):
            lt.add_row(n, str(usage.get(n, 0)), str(s.concurrency or "-"), s.rate or "-")
        con.print(lt)
    if summary is not None:
        con.print(_batch_table(summary))


def _batch_dict(summary) -> dict:
    return {
        "batch": summary.batch, "status": summary.status, "total": summary.total, "counts": summary.counts,
        "avg_duration": summary.avg_duration, "p99_duration": summary.p99_duration,
        "first_created_at": summary.first_created_at, "last_finished_at": summary.last_finished_at,
    }


def _batch_table(summary):
    from rich.table import Table

    t = Table(title=f"batch {summary.batch}: {summary.status}", title_justify="left")
    t.add_column("State")
    t.add_column("Tasks", justify="right")
    for s in _STATE_ORDER:
        n = summary.counts.get(s.value, 0)
        if n:
            t.add_row(f"[{_STATE_STYLE[s]}]{s.value}[/]", str(n))
    t.add_section()
    t.add_row("total", str(summary.total))
    t.add_row("avg duration", _secs(summary.avg_duration) or "-")
    t.add_row("p99 duration", _secs(summary.p99_duration) or "-")
    return t


# ---- tasks -------------------------------------------------------------------------------
_STATE_CHOICE = click.Choice([s.value for s in _STATE_ORDER], case_sensitive=False)


@cli.command()
@store_option
@click.option("--status", "state", type=_STATE_CHOICE, help="Only tasks in this state.")
@click.option("--batch", help="Only this batch.")
@click.option("--group", help="Only this group.")
@click.option("--name", help="Only this task name.")
@click.option("--queue", help="Only this queue.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--offset", type=click.IntRange(min=0), default=0)
@click.option("--oldest-first", is_flag=True, help="Oldest first (default: newest first).")
@json_option
def tasks(store_url, state, batch, group, name, queue, limit, offset, oldest_first, as_json):
    """List tasks, newest first."""
    store = _open(store_url)
    flt = TaskFilter(status=State(state.upper()) if state else None, queue=queue, batch=batch, group=group,
                     name=name, limit=limit, offset=offset, newest_first=not oldest_first)
    rows = store.list_tasks(flt)
    if as_json:
        _print_json([_record_dict(r) for r in rows])
        return
    from rich.table import Table

    con = _console()
    if not rows:
        con.print("no tasks match")
        return
    t = Table(title=f"{len(rows)} task(s)", title_justify="left")
    cols = [("ID", "right"), ("Task", "left"), ("Status", "left"), ("Group", "left"), ("Batch", "left"),
            ("Try", "right"), ("Progress", "right"), ("Created", "left"), ("Took", "right"), ("Error", "left")]
    # Leave out a column that says nothing: every row empty, or fixed by a filter.
    skip = {"Group"} if group or not any(r.group for r in rows) else set()
    if batch or not any(r.batch for r in rows):
        skip.add("Batch")
    for col, just in cols:
        if col not in skip:
            t.add_column(col, justify=just, no_wrap=col != "Error", overflow="fold" if col == "Error" else "ellipsis")
    for r in rows:
        progress = "" if r.progress is None else f"{r.progress * 100:.0f}%"
        cells = {
            "ID": str(r.id), "Task": r.name, "Status": f"[{_STATE_STYLE[r.status]}]{r.status.value}[/]",
            "Group": _escape(r.group or ""), "Batch": _escape(r.batch or ""), "Try": f"{r.attempt}/{r.max_retries + 1}",
            "Progress": progress, "Created": _when(r.created_at), "Took": _secs(_took(r)),
            "Error": _escape(_one_line(r.error)[:80] if r.error else ""),
        }
        t.add_row(*(cells[c] for c, _ in cols if c not in skip))
    con.print(t)


def _record_dict(rec: TaskRecord) -> dict:
    d = rec.as_dict()
    for f in ("args", "result", "checkpoint"):
        try:
            d[f] = loads(d[f])
        except (TypeError, ValueError):
            pass
    d["duration"] = _took(rec)
    return d


# ---- show -------------------------------------------------------------------------------
@cli.command()
@click.argument("task_id", metavar="ID", type=int)
@store_option
@json_option
def show(task_id, store_url, as_json):
    """Every field of one task: state, progress, checkpoint, error."""
    store = _open(store_url)
    rec = store.get(task_id)
    if rec is None:
        raise TaskNotFound(f"no task with id {task_id}")
    d = _record_dict(rec)
    if as_json:
        _print_json(d)
        return
    from rich.table import Table

    con = _console()
    t = Table(title=f"task {rec.id}: {rec.name}", title_justify="left", show_header=False)
    t.add_column("Field", style="bold")
    t.add_column("Value", overflow="fold")
    args, kwargs = rec.arguments
    rows = [
        ("status", f"[{_STATE_STYLE[rec.status]}]{rec.status.value}[/]"
                   + (" (cancel requested)" if rec.cancel_requested and rec.status not in FINAL else "")),
        ("args", json.dumps(args, ensure_ascii=False)),
        ("kwargs", json.dumps(kwargs, ensure_ascii=False)),
        ("queue", rec.queue), ("priority", str(rec.priority)),
        ("group", rec.group or ""), ("batch", rec.batch or ""), ("key", rec.key or ""),
        ("trace_id", rec.trace_id or ""),
        ("attempt", f"{rec.attempt} of {rec.max_retries + 1}"),
        ("timeout", _secs(rec.timeout) or "none"),
        ("limits", ", ".join(rec.limits)), ("depends_on", ", ".join(map(str, rec.depends_on))),
        ("created", _when(rec.created_at)), ("run_at", _when(rec.run_at)),
        ("started", _when(rec.started_at)), ("finished", _when(rec.finished_at)),
        ("duration", _secs(_took(rec))),
        ("progress", "" if rec.progress is None else f"{rec.progress * 100:.0f}% {rec.progress_message or ''}".rstrip()),
        ("checkpoint", json.dumps(d["checkpoint"], ensure_ascii=False) if rec.checkpoint else ""),
        ("result", rec.result or ""),
        ("error", rec.error or ""),
        ("worker", rec.worker_id or ""),
        ("lease expires", _when(rec.lease_expires_at)),
        ("version", str(rec.version)),
    ]
    for k, v in rows:
        t.add_row(k, v if k in ("status",) else _escape(v))
    con.print(t)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


# ---- cancel / retry ----------------------------------------------------------------------
@cli.command()
@click.argument("task_id", metavar="ID", type=int)
@store_option
def cancel(task_id, store_url):
    """Cancel a task: at once if queued, at its next ctx call if running."""
    store = _open(store_url)
    before = store.get(task_id)
    if before is None:
        raise TaskNotFound(f"no task with id {task_id}")
    if before.status in FINAL:
        raise CLIError(f"task {task_id} already ended {before.status.value}; nothing to cancel")
    rec = store.cancel(task_id)
    if rec is None:
        raise TaskNotFound(f"no task with id {task_id}")
    if rec.status is State.CANCELED:
        click.echo(f"task {task_id} canceled")
    elif rec.status is State.RUNNING:
        click.echo(f"task {task_id} is running; cancel requested (it stops at its next ctx call)")
    else:
        raise CLIError(f"task {task_id} is {rec.status.value}; it could not be canceled")


@cli.command()
@click.argument("task_id", metavar="ID", type=int, required=False)
@click.option("--batch", help="Retry every FAILED, TIMEOUT or CANCELED task of this batch.")
@store_option
def retry(task_id, batch, store_url):
    """Put a FAILED, TIMEOUT or CANCELED task (or a whole batch's) back in the queue."""
    if (task_id is None) == (batch is None):
        raise click.UsageError("give a task ID or --batch B (not both)")
    store = _open(store_url)
    if task_id is not None:
        rec = store.get(task_id)
        if rec is None:
            raise TaskNotFound(f"no task with id {task_id}")
        if rec.status not in RETRYABLE_BY_HAND or not store.retry(task_id):
            raise CLIError(f"task {task_id} is {rec.status.value}; only FAILED, TIMEOUT or CANCELED tasks can be retried")
        click.echo(f"task {task_id} queued again")
        return
    if store.batch_summary(batch).total == 0:
        raise CLIError(f"no batch named {batch!r}")
    ids: list[int] = []
    for state in RETRYABLE_BY_HAND:
        offset = 0
        while True:
            page = store.list_tasks(TaskFilter(status=state, batch=batch, limit=500, offset=offset, newest_first=False))
            ids.extend(r.id for r in page)
            if len(page) < 500:
                break
            offset += len(page)
    retried = [i for i in sorted(ids) if store.retry(i)]
    click.echo(f"batch {batch}: {len(retried)} task(s) queued again")


# ---- sweep --------------------------------------------------------------------------------
@cli.command()
@store_option
@click.option("--loop", is_flag=True, help="Keep sweeping every --interval until SIGTERM (one leader across the fleet).")
@click.option("--interval", default="30s", show_default=True, help="Time between passes with --loop.")
@click.option("--stale-pending-age", default="24h", show_default=True, help="Cancel PENDING tasks older than this ('off' to keep them).")
@click.option("--max-rows", type=click.IntRange(min=1), default=1000, show_default=True, help="At most this many tasks changed per pass.")
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False), default="INFO", show_default=True)
@json_option
def sweep(store_url, loop, interval, stale_pending_age, max_rows, log_level, as_json):
    """Recover what crashed workers left (seed 000 §5.2): one pass, or --loop."""
    from corral.maintenance import Sweeper
    from corral.maintenance.sweeper import describe

    stale = None if stale_pending_age.strip().lower() in ("off", "none", "never") else _duration_arg(stale_pending_age, "--stale-pending-age")
    every = _duration_arg(interval, "--interval")
    if every <= 0:
        raise CLIError("--interval must be > 0")
    store = _open(store_url)
    if not loop:
        report = store.sweep(stale_pending_age=stale, max_rows=max_rows)
        if as_json:
            data = {f: list(getattr(report, f)) for f in report.__dataclass_fields__}
            data["total"] = report.total
            _print_json(data)
        else:
            click.echo(f"swept {_url(store_url)}: {report.total} task(s) changed; {describe(report)}")
        return
    _setup_logging(log_level)
    sweeper = Sweeper(store, interval=every, stale_pending_age=stale, max_rows=max_rows)
    stopping = {"now": False}

    def on_signal(signum, _frame):
        stopping["now"] = True

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        sweeper.start()
        log.info("sweeper %s started: store=%s interval=%gs stale_pending_age=%s", sweeper.holder,
                 _url(store_url), every, "off" if stale is None else f"{stale:g}s")
        while not stopping["now"]:
            time.sleep(0.2)
        sweeper.stop()
        log.info("sweeper %s stopped after %d tick(s)", sweeper.holder, sweeper.ticks)
    finally:
        for s, h in old.items():
            signal.signal(s, h)


# ---- dashboard ------------------------------------------------------------------------------
@cli.command()
@store_option
def dashboard(store_url):
    """A live web dashboard (not in this release)."""
    raise CLIError("the dashboard comes in a later release; use `corral status` and `corral tasks` meanwhile")


# ---- demo -------------------------------------------------------------------------------------
@cli.command()
@store_option
@click.option("--skus", type=click.IntRange(min=1, max=100_000), default=300, show_default=True, help="SKUs to sync.")
@click.option("--merchants", type=click.IntRange(min=1), default=20, show_default=True, help="Merchants (ordered groups).")
@click.option("--workers", type=click.IntRange(min=1), default=16, show_default=True, help="Worker slots of the in-process worker.")
@click.option("--latency-ms", type=click.FloatRange(min=1), default=200.0, show_default=True, help="Simulated partner API latency.")
@click.option("--qps", type=click.FloatRange(min=1), default=100.0, show_default=True, help="Simulated partner API QPS cap.")
@click.option("--seed", type=int, default=None, help="Random seed, for a repeatable run.")
def demo(store_url, skus, merchants, workers, latency_ms, qps, seed):
    """Sync SKUs from a rate-capped partner API, in order per merchant (seeds 000, 003).

    Leaves the database in place: run `corral status` or `corral tasks` afterwards.
    """
    from corral.edges.demo import run_demo

    run_demo(_url(store_url), skus=skus, merchants=merchants, workers=workers,
             latency=latency_ms / 1000.0, qps=qps, seed=seed, console=_console(),
             hint_store=None if _url(store_url) == default_url() else _url(store_url))


# ---- plan ---------------------------------------------------------------------------------------
@cli.command()
@store_option
@click.option("--qps", type=float, help="(a) Downstream QPS cap.")
@click.option("--latency-ms", type=float, help="(a) Mean latency of one downstream request, in ms.")
@click.option("--latency", "latency_text", metavar="DURATION", help="(a) The same as a duration (200ms, 0.2s).")
@click.option("--safety", type=float, default=0.7, show_default=True, help="(a) Safety factor, 0.6-0.8.")
@click.option("--done", type=int, help="(b) Tasks finished in the measured window.")
@click.option("--hours", type=float, help="(b) Measured window in hours.")
@click.option("--window", "window_text", metavar="DURATION", help="(b) The same as a duration (48h, 2d).")
@click.option("--workers", type=float, help="(b) Concurrency during the measured window.")
@click.option("--mean", "mean_text", metavar="DURATION", help="(b) Known mean task duration instead of --done/--hours/--workers.")
@click.option("--target", type=int, help="(b) Tasks to finish in the target window.")
@click.option("--target-hours", type=float, help="(b) Target window in hours (default: the measured window).")
@click.option("--io-minutes", type=float, help="(c) I/O wait per task (any unit, same as --cpu-minutes).")
@click.option("--cpu-minutes", type=float, help="(c) CPU time per task.")
@click.option("--cap", type=click.IntRange(min=1), default=8, show_default=True, help="(c) Most workers per process.")
@click.option("--concurrency", type=click.IntRange(min=1), help="(d) Target concurrency (default: from (b)).")
@click.option("--per-process", type=click.IntRange(min=1), help="(d) Workers per process (default: from (c)).")
@json_option
def plan(store_url, qps, latency_ms, latency_text, safety, done, hours, window_text, workers, mean_text, target, target_hours,
         io_minutes, cpu_minutes, cap, concurrency, per_process, as_json):
    """Capacity planner: the seeds' formulas.

    Pure arithmetic: --store is accepted, like everywhere, and not used.

    \b
    (a) limit   = downstream QPS x latency (s) x safety     --qps 100 --latency-ms 200
    (b) Little  = throughput x mean duration                --done 392 --hours 48 --workers 4 --target 720
    (c) workers per process = 1 + io wait / cpu time, capped  --io-minutes 25 --cpu-minutes 4
    (d) processes and lanes (sub-groups) for the concurrency
    With no option at all, shows the seeds' worked examples.
    """
    from corral.core import planning as P

    given = any(v is not None for v in (qps, latency_ms, latency_text, done, hours, window_text, workers, mean_text,
                                        target, target_hours, io_minutes, cpu_minutes, concurrency, per_process))
    example = not given
    if example:
        qps, latency_ms, done, hours, workers, target, io_minutes, cpu_minutes = 100, 200, 392, 48, 4, 720, 25, 4
    out: dict[str, Any] = {}
    try:
        # (a)
        lat = _duration_arg(latency_text, "--latency", "ms") if latency_text else (latency_ms / 1000.0 if latency_ms is not None else None)
        if qps is not None or lat is not None:
            if qps is None or lat is None:
                raise click.UsageError("(a) needs both --qps and --latency-ms")
            out["concurrency_limit"] = P.concurrency_limit(qps, lat, safety)
        # (b)
        window = _duration_arg(window_text, "--window", "h") if window_text else (hours * 3600.0 if hours is not None else None)
        twindow = target_hours * 3600.0 if target_hours is not None else None
        mean = _duration_arg(mean_text, "--mean", "m") if mean_text else None
        measured = (done, window, workers)
        if any(v is not None for v in measured):
            if any(v is None for v in measured):
                raise click.UsageError("(b) needs --done, --hours (or --window) and --workers together")
            out["littles_law"] = P.littles_law(done, window, workers, target, twindow)
        elif target is not None:
            if mean is None:
                raise click.UsageError("(b) --target needs --done/--hours/--workers or --mean")
            tw = twindow or window
            if tw is None:
                raise click.UsageError("(b) --target needs --target-hours")
            need = P.required_concurrency(target, tw, mean)
            out["required"] = {"target": target, "window_s": tw, "mean_duration_s": mean,
                               "required_concurrency": need, "required_workers": max(1, -int(-need // 1))}
        # (c)
        if io_minutes is not None or cpu_minutes is not None:
            if io_minutes is None or cpu_minutes is None:
                raise click.UsageError("(c) needs both --io-minutes and --cpu-minutes")
            out["workers_per_process"] = P.workers_per_process(io_minutes, cpu_minutes, cap)
        # (d)
        conc = concurrency
        if conc is None:
            ll = out.get("littles_law")
            conc = ll.required_workers if ll is not None and ll.required_workers else (out.get("required") or {}).get("required_workers")
        per = per_process or (out["workers_per_process"].workers if "workers_per_process" in out else None)
        if conc is not None and per is not None:
            out["layout"] = P.process_layout(conc, per)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    if not out:
        raise click.UsageError("nothing to plan: give --qps/--latency-ms, --done/--hours/--workers, or --io-minutes/--cpu-minutes")
    if as_json:
        _print_json({k: (v.as_dict() if hasattr(v, "as_dict") else v) for k, v in out.items()} | {"example": example})
        return
    _print_plan(out, example)


def _print_plan(out: dict, example: bool) -> None:
    from rich.table import Table

    con = _console()
    if example:
        con.print("[dim]No inputs given: the seeds' worked examples. Pass your own numbers (see corral plan --help).[/]")

    def section(title: str, rows: list[tuple[str, str]]) -> None:
        con.print(f"[bold]{title}[/]")
        t = Table(show_header=False)
        t.add_column(style="bold")
        t.add_column()
        for k, v in rows:
            t.add_row(k, v)
        con.print(t)

    def hours(seconds: float) -> str:
        return f"{seconds / 3600:g} h"

    advice: list[str] = []
    if "concurrency_limit" in out:
        c = out["concurrency_limit"]
        section("(a) downstream concurrency limit = QPS x latency x safety (seed 000)", [
            ("one request in flight", f"1 / {c.latency_s * 1000:g}ms = {c.per_request_qps:g} req/s"),
            ("in flight at the cap", f"{c.qps:g} QPS x {c.latency_s:g}s = {c.theoretical:g}"),
            ("with safety factor", f"{c.theoretical:g} x {c.safety:g} = [bold green]{c.limit}[/]"),
        ])
        advice.append(f'app.limit("downstream", concurrency={c.limit})  # shared by every worker of the store')
    if "littles_law" in out:
        law = out["littles_law"]
        rows = [
            ("measured throughput", f"{law.done} / {hours(law.window_s)} = {law.throughput_per_h:.2f} tasks/h"),
            ("mean task duration", f"{law.workers:g} / {law.throughput_per_h:.2f} = {law.mean_duration_s / 3600:.3f} h "
                                   f"= [bold green]{law.mean_duration_s / 60:.1f} min[/]"),
        ]
        if law.target is not None:
            rows.append(("target throughput", f"{law.target} / {hours(law.target_window_s)} = {law.target_throughput_per_h:.2f} tasks/h"))
            rows.append(("needed concurrency", f"{law.target_throughput_per_h:.2f} x {law.mean_duration_s / 3600:.3f} h = "
                                               f"{law.required_concurrency:.2f} -> [bold green]{law.required_workers}[/]"))
        section("(b) Little's law: concurrency = throughput x mean duration (seed 002)", rows)
    if "required" in out:
        r = out["required"]
        section("(b) Little's law: concurrency = throughput x mean duration (seed 002)", [
            ("needed concurrency", f"{r['target']} / {hours(r['window_s'])} x {r['mean_duration_s'] / 3600:.3f} h "
                                   f"= {r['required_concurrency']:.2f} -> [bold green]{r['required_workers']}[/]"),
        ])
    if "workers_per_process" in out:
        w = out["workers_per_process"]
        section("(c) workers per process = 1 + io wait / cpu time, capped (seed 002)", [
            ("raw", f"1 + {w.io_wait:g} / {w.cpu_time:g} = {w.raw:.2f}"),
            ("workers per process", f"[bold green]{w.workers}[/]" + (f" (capped at {w.cap})" if w.capped else f" (cap {w.cap})")),
        ])
    if "layout" in out:
        lay = out["layout"]
        section("(d) processes and lanes", [
            ("processes", f"ceil({lay.concurrency} / {lay.max_per_process}) = [bold green]{lay.processes}[/]"),
            ("workers per process", f"ceil({lay.concurrency} / {lay.processes}) = [bold green]{lay.per_process}[/] "
                                    f"({lay.total_slots} in all)"),
            ("lanes (sub-groups)", f"concurrency {lay.concurrency} + head-room = [bold green]{lay.lanes}[/]"),
        ])
        advice.append(f"run {lay.processes} process(es): corral worker APP --concurrency {lay.per_process}")
        advice.append(f"a hot group: group=corral.subgroup(group, key, {lay.lanes}) (order then holds per key)")
    if advice:
        con.print("[bold]advice[/]")
        for line in advice:
            con.print(f"  {_escape(line)}")


# ---- bench (its own package; optional) ------------------------------------------------------------
def _add_bench() -> None:
    try:
        from corral.bench import bench as bench_command
    except ImportError as exc:
        reason = _one_line(str(exc))

        @cli.command(name="bench", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
        @click.argument("scenario", required=False)
        @store_option
        def bench_missing(scenario, store_url):
            """Benchmarks (not available in this installation)."""
            raise CLIError(f"benchmarks are not available in this installation ({reason})")

        return
    cli.add_command(bench_command, name="bench")


_add_bench()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    cli.main(args=argv, prog_name="corral")


if __name__ == "__main__":  # pragma: no cover
    main()

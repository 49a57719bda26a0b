"""What the ``corral`` commands print: rich tables, times and durations, JSON.

The commands gather the data; these functions only format it. Tables go to
a :func:`console` that keeps whole rows when the output is piped.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

import click

from corral.cli.common import one_line
from corral.core import planning
from corral.core.model import EXPIRED, TaskRecord, loads
from corral.core.states import FINAL, SHOWN_ORDER, State

#: The order states are listed in (queued, running, then how a task ended).
STATE_ORDER = list(SHOWN_ORDER)
#: Longest a big field (arguments, result, error, checkpoint) is printed in a table.
TABLE_FIELD_CHARS = 2_000
#: Longest a field is carried in ``--json`` output, in characters of its JSON text;
#: a longer one is cut to this and named, with its full length, under "truncated".
JSON_FIELD_CHARS = 1_048_576
#: The fields either bound applies to.
BIG_FIELDS = ("args", "result", "checkpoint", "error", "progress_message", "traceback")


def json_help(tail: str) -> str:
    """Help of a ``--json`` option that prints task fields: how big ones are cut."""
    return (
        f"Print JSON instead of a table. A field (args, result, error, checkpoint) longer than "
        f'{JSON_FIELD_CHARS} characters is cut to that and listed with its full length under "truncated"; {tail}'
    )


#: Where ``corral status`` counts rows whose stored status names no state.
UNKNOWN = "UNKNOWN"
STATE_STYLE = {
    State.WAITING: "dim",
    State.PENDING: "cyan",
    State.RETRYING: "yellow",
    State.RESERVED: "bright_blue",
    State.RUNNING: "blue",
    State.SUCCESS: "green",
    State.FAILED: "red",
    State.TIMEOUT: "magenta",
    State.CANCELED: "bright_black",
}


# ---- basics ---------------------------------------------------------------------------------
def console():
    from rich.console import Console

    # Piped output keeps whole rows rather than wrapping at rich's default 80 columns.
    width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160
    return Console(highlight=False, soft_wrap=False, width=width)


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))


def escape(text: str) -> str:
    """``text`` shown as is in rich markup (``[x]`` is not a style)."""
    from rich.markup import escape as _escape

    return _escape(text)


def when(ts: float | None) -> str:
    """A timestamp as local ``YYYY-MM-DD HH:MM:SS``; empty for None. One no
    calendar can show (a row written before delays were bounded) is printed
    as epoch seconds rather than ending the command."""
    if ts is None:
        return ""
    try:
        return _dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return f"{ts!r} (epoch seconds)"


def clip(text: str, limit: int = TABLE_FIELD_CHARS) -> str:
    """``text`` cut to ``limit`` characters, with a note of its full length:
    a table of a 100 MB field would take minutes to lay out and say nothing."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [truncated: {len(text)} characters in all; --json carries up to {JSON_FIELD_CHARS}]"


def secs(value: float | None) -> str:
    """A duration in a short human form (``450ms``, ``29.4 min``); empty for None."""
    if value is None:
        return ""
    from corral.core.planning import format_duration

    return format_duration(value)


def took(rec: TaskRecord) -> float | None:
    """How long a task ran (so far, if it still runs); None if it never started."""
    if rec.started_at is None:
        return None
    end = rec.finished_at if rec.finished_at is not None else time.time()
    return max(0.0, end - rec.started_at)


def titled(title: str, table):
    """``table`` under ``title`` as a line of its own: a title set on a rich
    table wraps at the table's width (a long store URL in pieces of a narrow
    table), a line wraps only at the terminal's."""
    from rich.console import Group
    from rich.text import Text

    return Group(Text(title, style="italic"), table)


def _state(s: State) -> str:
    return f"[{STATE_STYLE[s]}]{s.value}[/]"


# ---- status ---------------------------------------------------------------------------------
def status_dict(url: str, counts: dict[str, int], specs: dict, usage: dict, summary, keys: dict | None = None) -> dict:
    out: dict[str, Any] = {"store": url, "counts": counts, "total": sum(counts.values())}
    out["limits"] = {
        n: {"concurrency": s.concurrency, "rate": s.rate, "in_use": usage.get(n, 0)} for n, s in specs.items()
    }
    for n, busiest in (keys or {}).items():
        if n in out["limits"]:
            out["limits"][n]["busiest_keys"] = [{"key": k, "in_use": used} for k, used in busiest]
    if summary is not None:
        out["batch"] = batch_dict(summary)
    return out


def print_status(
    url: str, queue: str | None, counts: dict[str, int], specs: dict, usage: dict, summary, keys: dict | None = None
) -> None:
    from rich.markup import escape
    from rich.table import Table

    con = console()
    t = Table()
    t.add_column("State")
    t.add_column("Tasks", justify="right")
    for s in STATE_ORDER:
        n = counts[s.value]
        t.add_row(_state(s), str(n) if n else "[dim]0[/]")
    if counts.get(UNKNOWN):
        t.add_row("[bold red]unknown[/]", f"[bold red]{counts[UNKNOWN]}[/]")
    t.add_section()
    t.add_row("[bold]total[/]", f"[bold]{sum(counts.values())}[/]")
    con.print(titled(f"store {url}" + (f", queue {queue}" if queue else ""), t))
    if specs:
        lt = Table()
        for col in ("Limit", "In use", "Concurrency", "Rate"):
            lt.add_column(col, justify="right" if col != "Limit" else "left")
        for n, s in sorted(specs.items()):
            lt.add_row(n, str(usage.get(n, 0)), str(s.concurrency or "-"), s.rate or "-")
        con.print(titled("limits", lt))
    if keys:
        kt = Table()
        for col in ("Limit", "Key", "In use"):
            kt.add_column(col, justify="right" if col == "In use" else "left")
        for n, busiest in sorted(keys.items()):
            for k, used in busiest:
                kt.add_row(escape(n), escape(k), str(used))
        con.print(titled("busiest keys", kt))
    if summary is not None:
        con.print(batch_table(summary))


def print_health(health: dict) -> None:
    """Workers' reports: tasks nobody can run, threads nobody can stop."""
    if not health["reporting"]:
        return
    con = console()
    line = f"workers reporting in the last 10 min: {health['reporting']}"
    line += f"; timed-out threads still running: {health['abandoned_threads']}"
    con.print(line, markup=False)
    if health["unregistered"]:
        con.print("[bold yellow]pending tasks of names no worker registers[/] (they wait, and hold their groups):")
        for key, n in health["unregistered"].items():
            q, _, name = key.partition(":")
            con.print(f"  {n:>6}  {name}  (queue {q})", markup=False)


def batch_dict(summary) -> dict:
    return {
        "batch": summary.batch,
        "status": summary.status,
        "total": summary.total,
        "counts": summary.counts,
        "avg_duration": summary.avg_duration,
        "p99_duration": summary.p99_duration,
        "first_created_at": summary.first_created_at,
        "last_finished_at": summary.last_finished_at,
    }


def batch_line(summary) -> str:
    """One line: a batch's status and where its tasks are."""
    from corral.core.batches import progress

    p = progress(summary.counts)
    return f"batch {summary.batch}: {summary.status}, {p.ended}/{p.total} ended ({p.line()})"


def follow_batch(read, interval: float) -> None:
    """A live progress bar of a batch, read by ``read()`` every ``interval``
    seconds, until it reaches a final status; then its summary line."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from corral.core.batches import FINAL_STATUSES, progress

    summary = read()
    bar = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
        console=console(),
        transient=False,
    )
    with bar:
        p = progress(summary.counts)
        task = bar.add_task(f"batch {summary.batch}", total=p.total, completed=p.ended, detail=p.line())
        while summary.status not in FINAL_STATUSES:
            time.sleep(interval)  # the refresh of a live view, not a synchronisation
            summary = read()
            p = progress(summary.counts)
            bar.update(task, total=p.total, completed=p.ended, detail=p.line())
    console().print(batch_line(summary), markup=False)


def batch_table(summary):
    from rich.table import Table

    t = Table()
    t.add_column("State")
    t.add_column("Tasks", justify="right")
    for s in STATE_ORDER:
        n = summary.counts.get(s.value, 0)
        if n:
            t.add_row(_state(s), str(n))
    t.add_section()
    t.add_row("total", str(summary.total))
    t.add_row("avg duration", secs(summary.avg_duration) or "-")
    t.add_row("p99 duration", secs(summary.p99_duration) or "-")
    return titled(f"batch {summary.batch}: {summary.status}", t)


# ---- tasks and show -------------------------------------------------------------------------
def record_dict(rec: TaskRecord, limit: int = JSON_FIELD_CHARS) -> dict:
    """Every field of a task, its JSON payloads decoded, plus ``duration``.

    A big field longer than ``limit`` characters is left as its text cut to
    ``limit`` (not decoded), and ``truncated`` maps its name to its full length."""
    d = rec.as_dict()
    cut: dict[str, int] = {}
    for f in BIG_FIELDS:
        value = d[f]
        if value is None:
            continue
        if len(value) > limit:
            d[f] = value[:limit]
            cut[f] = len(value)
        elif f in ("args", "result", "checkpoint"):
            try:
                d[f] = loads(value)
            except (TypeError, ValueError):
                pass
    if cut:
        d["truncated"] = cut
    d["duration"] = took(rec)
    return d


def print_tasks(
    rows: list[TaskRecord],
    *,
    group_filtered: bool,
    batch_filtered: bool,
    now: float | None = None,
    why: Mapping[int, str] | None = None,
) -> None:
    """A table of tasks; ``now`` (the store's time) counts their ages. With
    ``why`` (a list of waiting tasks), a Why column, wrapped in its cell, takes
    the room of the columns a waiting task leaves empty or says otherwise
    (Created: its age says it; Took, Progress; Error: a retry's reason quotes it)."""
    from rich.table import Table

    now = time.time() if now is None else now
    con = console()
    if not rows:
        con.print("no tasks match")
        return
    t = Table(title=f"{len(rows)} task(s)", title_justify="left")
    cols = [
        ("ID", "right"),
        ("Task", "left"),
        ("Status", "left"),
        ("Group", "left"),
        ("Batch", "left"),
        ("Try", "right"),
        ("Progress", "right"),
        ("Created", "left"),
        ("Age", "right"),
        ("Took", "right"),
        ("Error", "left"),
        ("Why", "left"),
    ]
    # Leave out a column that says nothing: every row empty, or fixed by a filter.
    skip = {"Group"} if group_filtered or not any(r.group for r in rows) else set()
    if batch_filtered or not any(r.batch for r in rows):
        skip.add("Batch")
    if why is None:
        skip.add("Why")
    else:
        skip.update({"Created", "Took", "Error"})
        if not any(r.progress is not None for r in rows):
            skip.add("Progress")
    for col, just in cols:
        if col not in skip:
            wraps = col in ("Error", "Why")
            t.add_column(col, justify=just, no_wrap=not wraps, overflow="fold" if wraps else "ellipsis")  # type: ignore[arg-type]
    for r in rows:
        progress = "" if r.progress is None else f"{r.progress * 100:.0f}%"
        cells = {
            "ID": str(r.id),
            "Task": r.name,
            "Status": _state(r.status),
            "Group": escape(r.group or ""),
            "Batch": escape(r.batch or ""),
            "Try": f"{r.attempt}/{r.max_retries + 1}",
            "Progress": progress,
            "Created": when(r.created_at),
            "Age": ago(now - r.created_at),
            "Took": secs(took(r)),
            "Error": escape(one_line(r.error[:TABLE_FIELD_CHARS])[:80] if r.error else ""),
            "Why": escape((why or {}).get(r.id, "")),
        }
        t.add_row(*(cells[c] for c, _ in cols if c not in skip))
    con.print(t)


def print_task(rec: TaskRecord) -> None:
    """One task, a field a row; big fields cut to :data:`TABLE_FIELD_CHARS`."""
    from rich.table import Table

    con = console()
    t = Table(show_header=False)
    t.add_column("Field", style="bold")
    t.add_column("Value", overflow="fold")
    if len(rec.args) <= TABLE_FIELD_CHARS:
        args, kwargs = rec.arguments
        shown_args, shown_kwargs = json.dumps(args, ensure_ascii=False), json.dumps(kwargs, ensure_ascii=False)
    else:  # big: the stored JSON text, cut, rather than decoded and encoded again
        shown_args, shown_kwargs = rec.args, "(in args above)"
    rows = [
        (
            "status",
            _state(rec.status) + (" (cancel requested)" if rec.cancel_requested and rec.status not in FINAL else ""),
        ),
        ("args", clip(shown_args)),
        ("kwargs", clip(shown_kwargs)),
        ("queue", rec.queue),
        ("priority", str(rec.priority)),
        ("group", rec.group or ""),
        ("batch", rec.batch or ""),
        ("key", rec.key or ""),
        ("trace_id", rec.trace_id or ""),
        (
            "attempt",
            f"{rec.attempt} of {rec.max_retries + 1}"
            + (f" ({rec.crashes} lost with a crashed worker)" if rec.crashes else ""),
        ),
        ("timeout", secs(rec.timeout) or "none"),
        ("limits", ", ".join(rec.limits)),
        (
            "depends_on",
            ", ".join(map(str, rec.depends_on))
            + (" (runs even if one fails)" if rec.depends_on and rec.on_upstream_failure == "run" else ""),
        ),
        ("ref", rec.ref or ""),
        ("created", when(rec.created_at)),
        ("run_at", when(rec.run_at)),
        ("expires", _deadline(rec)),
        ("started", when(rec.started_at)),
        ("finished", when(rec.finished_at)),
        ("duration", secs(took(rec))),
        (
            "progress",
            "" if rec.progress is None else clip(f"{rec.progress * 100:.0f}% {rec.progress_message or ''}".rstrip()),
        ),
        ("checkpoint", clip(rec.checkpoint or "")),
        ("result", clip(rec.result or "")),
        ("error", clip(rec.error or "")),
        ("worker", rec.worker_id or ""),
        ("lease expires", when(rec.lease_expires_at)),
        ("version", str(rec.version)),
    ]
    for k, v in rows:
        t.add_row(k, v if k in ("status",) else escape(v))
    con.print(titled(f"task {rec.id}: {rec.name}", t))
    if rec.traceback:  # whole (it is bounded when stored), below the table: its lines stay lines
        con.print("traceback of the failed attempt:", style="bold")
        con.print(escape(rec.traceback), soft_wrap=True, highlight=False)


def _deadline(rec: TaskRecord) -> str:
    """The deadline of a task's first start (``expires=``), and whether it still binds."""
    if rec.expires_at is None:
        return ""
    if rec.attempt or rec.snoozes:
        return f"{when(rec.expires_at)} (it started: the deadline binds the first start only)"
    return when(rec.expires_at) + (" (not started by then: expired)" if rec.error == EXPIRED else "")


# ---- workers ----------------------------------------------------------------------------------
def ago(seconds: float | None) -> str:
    """An age as ``4s``, ``3m 20s``, ``2h 05m``, ``3d 04h``; empty for None."""
    return "" if seconds is None else planning.format_age(seconds)


def held_text(view, at_most: int = 8) -> str:
    """What a worker holds: ``12 sync_sku, 15 push (RESERVED)``, cut after ``at_most``."""
    parts = [f"{h.id} {h.name}" + (" (RESERVED)" if h.status == "RESERVED" else "") for h in view.held[:at_most]]
    if len(view.held) > at_most:
        parts.append(f"+{len(view.held) - at_most} more")
    return ", ".join(parts)


def print_workers(rows: list, now: float) -> None:
    from rich.table import Table

    con = console()
    if not rows:
        con.print("no worker has reported to this store (a stopped worker removes its row)")
        return
    dead = sum(not v.alive for v in rows)
    t = Table()
    for col, just in (
        ("Worker", "left"),
        ("State", "left"),
        ("Host", "left"),
        ("PID", "right"),
        ("Queues", "left"),
        ("Slots", "right"),
        ("Holds", "left"),
        ("Heartbeat", "right"),
        ("Version", "left"),
        ("Started", "left"),
    ):
        t.add_column(col, justify=just, overflow="fold")  # type: ignore[arg-type]
    for v in rows:
        state = "[green]alive[/]" if v.alive else f"[bold red]DEAD[/] [red]{escape(v.dead)}[/]"
        slots = "" if v.slots is None else f"{v.in_use or 0}/{v.slots}"
        beat = "" if v.heartbeat_at is None else f"{ago(now - v.heartbeat_at)} ago"
        held = escape(held_text(v))
        t.add_row(
            escape(v.id),
            state,
            escape(v.host),
            "" if v.pid is None else str(v.pid),
            escape(", ".join(v.queues)),
            slots,
            f"[red]{held}[/]" if not v.alive and held else held,
            beat,
            escape(v.version),
            when(v.started_at),
        )
    title = f"{len(rows)} worker(s)" + (f", {dead} dead" if dead else "")
    con.print(titled(title, t))


# ---- sweep ------------------------------------------------------------------------------------
def sweep_dict(report) -> dict:
    data = {f: list(getattr(report, f)) for f in report.__dataclass_fields__}
    data["total"] = report.total
    return data


def sweep_line(url: str, report) -> str:
    from corral.maintenance.sweeper import describe

    return f"swept {url}: {report.total} task(s) changed; {describe(report)}"


# ---- plan -------------------------------------------------------------------------------------
def plan_dict(plan, example: bool) -> dict:
    """The plan as JSON, with the ``app.limit`` to declare (the numbers the table shows)."""
    out = plan.as_dict() | {"example": example}
    c = plan.concurrency_limit
    if c is not None and c.qps >= 1:
        a = planning.limit_advice(c.qps, c.latency_s, c.safety)
        out["limit_advice"] = {"concurrency": a.concurrency, "rate": f"{a.rate_per_s}/s"}
    return out


def rate_text(qps: float) -> str:
    """A QPS cap as a limit's rate: ``"100/s"``, or per minute or hour when below one a second."""
    for per, unit in ((1, "s"), (60, "m"), (3600, "h")):
        n = qps * per
        if n >= 1 and abs(n - round(n)) < 1e-9:
            return f"{round(n)}/{unit}"
    return f"{max(1, int(qps * 3600))}/h"


#: The title of a plan's limit part: how each number of the ``app.limit`` line is made.
LIMIT_TITLE = "(a) a limit for a downstream capped at QPS: rate = QPS x safety, concurrency = 2 x in flight"


def limit_rows(c: planning.ConcurrencyLimit) -> list[tuple[str, str]]:
    """The limit part's rows: every number of the ``app.limit`` line to
    declare, each with the arithmetic that made it, and what a concurrency
    alone (no rate) would be. One source, :func:`corral.core.planning.limit_advice`,
    so the table and the line below it never disagree."""
    rows = [("in flight at the cap", f"{c.qps:.4g} QPS x {c.latency_s:.4g}s = {c.theoretical:.4g}")]
    least = "  (at least 1)" if c.theoretical * c.safety < 1 else ""
    alone = f"{c.theoretical:.4g} x {c.safety:g} = {c.theoretical * c.safety:.4g} -> "
    if c.qps < 1:
        rows.append(("rate", f"the cap itself, {rate_text(c.qps)}"))
        rows.append(("concurrency", f"{alone}[bold green]{c.limit}[/]{least}"))
        return rows
    alone += f"{c.limit}{least}"
    a = planning.limit_advice(c.qps, c.latency_s, c.safety)
    rows += [
        ("rate (holds the safety margin)", f"{c.qps:.4g} x {c.safety:g} -> [bold green]{a.rate_per_s}/s[/]"),
        (
            "concurrency",
            f"2 x {c.theoretical:.4g} -> [bold green]{a.concurrency}[/]"
            " (a task holds its place from claim to outcome, longer than its call)",
        ),
        ("concurrency with no rate", f"{alone} (a concurrency alone must keep the margin itself)"),
    ]
    return rows


def limit_lines(c: planning.ConcurrencyLimit, name: str = "downstream") -> list[str]:
    """The ``app.limit`` line(s) to declare, with the numbers of :func:`limit_rows`."""
    if c.qps < 1:
        return [
            f'app.limit("{name}", concurrency={c.limit}, rate="{rate_text(c.qps)}")'
            "  # shared by every worker of the store"
        ]
    a = planning.limit_advice(c.qps, c.latency_s, c.safety)
    return [
        a.line(name) + "  # shared by every worker of the store; the rate keeps the safety margin",
        f'or, with no rate: app.limit("{name}", concurrency={c.limit})',
    ]


def _section(con, title: str, rows: list[tuple[str, str]]) -> None:
    """One titled part of a plan: a two-column table of names and values."""
    from rich.table import Table

    con.print(f"[bold]{escape(title)}[/]")
    t = Table(show_header=False)
    t.add_column(style="bold")
    t.add_column()
    for k, v in rows:
        t.add_row(k, v)
    con.print(t)


def print_plan(plan, example: bool) -> None:
    """A :class:`corral.core.planning.CapacityPlan`, part by part, and what to do with it."""

    con = console()
    if example:
        con.print("[dim]No inputs given: worked examples. Pass your own numbers (see corral plan --help).[/]")

    section = functools.partial(_section, con)

    def hours(seconds: float) -> str:
        return f"{seconds / 3600:g} h"

    little = "(b) Little's law: concurrency = throughput x mean duration"
    advice: list[str] = []
    if plan.concurrency_limit is not None:
        c = plan.concurrency_limit
        rows = [("one request in flight", f"1 / {c.latency_s * 1000:g}ms = {c.per_request_qps:g} req/s")]
        rows += limit_rows(c)
        section(LIMIT_TITLE, rows)
        advice.extend(limit_lines(c))
    if plan.littles_law is not None:
        law = plan.littles_law
        rows = [
            ("measured throughput", f"{law.done} / {hours(law.window_s)} = {law.throughput_per_h:.2f} tasks/h"),
            (
                "mean task duration",
                f"{law.workers:g} / {law.throughput_per_h:.2f} = {law.mean_duration_s / 3600:.3f} h "
                f"= [bold green]{law.mean_duration_s / 60:.1f} min[/]",
            ),
        ]
        if law.target is not None:
            rows.append(
                (
                    "target throughput",
                    f"{law.target} / {hours(law.target_window_s)} = {law.target_throughput_per_h:.2f} tasks/h",
                )
            )
            rows.append(
                (
                    "needed concurrency",
                    f"{law.target_throughput_per_h:.2f} x {law.mean_duration_s / 3600:.3f} h = "
                    f"{law.required_concurrency:.2f} -> [bold green]{law.required_workers}[/]",
                )
            )
        section(little, rows)
    if plan.required is not None:
        r = plan.required
        section(
            little,
            [
                (
                    "needed concurrency",
                    f"{r.target} / {hours(r.window_s)} x {r.mean_duration_s / 3600:.3f} h "
                    f"= {r.required_concurrency:.2f} -> [bold green]{r.required_workers}[/]",
                ),
            ],
        )
    if plan.workers_per_process is not None:
        w = plan.workers_per_process
        section(
            "(c) workers per process = 1 + io wait / cpu time, capped",
            [
                ("raw", f"1 + {w.io_wait:g} / {w.cpu_time:g} = {w.raw:.2f}"),
                (
                    "workers per process",
                    f"[bold green]{w.workers}[/]" + (f" (capped at {w.cap})" if w.capped else f" (cap {w.cap})"),
                ),
            ],
        )
    if plan.layout is not None:
        lay = plan.layout
        section(
            "(d) processes and lanes",
            [
                ("processes", f"ceil({lay.concurrency} / {lay.max_per_process}) = [bold green]{lay.processes}[/]"),
                (
                    "workers per process",
                    f"ceil({lay.concurrency} / {lay.processes}) = [bold green]{lay.per_process}[/] "
                    f"({lay.total_slots} in all)",
                ),
                ("lanes (sub-groups)", f"concurrency {lay.concurrency} + head-room = [bold green]{lay.lanes}[/]"),
            ],
        )
        advice.append(f"run {lay.processes} process(es): corral worker APP --concurrency {lay.per_process}")
        advice.append(f"a hot group: group=corral.subgroup(group, key, {lay.lanes}) (order then holds per key)")
    if advice:
        con.print("[bold]advice[/]")
        for line in advice:
            con.print(f"  {escape(line)}")


def print_history_plan(hp, limit_name: str, batch: str | None = None) -> None:
    """A :class:`corral.core.planning.HistoryPlan`: every measured value, then
    each formula with those values, then the ``app.limit`` line to paste."""

    con = console()
    h = hp.history

    section = functools.partial(_section, con)

    def g(x: float | None, unit: str = "") -> str:
        return "-" if x is None else f"{x:.4g}{unit}"

    rate = "-" if h.success_rate is None else f"{h.successes} / {h.read} = {h.success_rate:.1%}"
    section(
        f"measured: the newest {h.read} finished tasks of {h.subject} (at most {h.sample} read)",
        [
            ("durations (end - start)", f"{h.timed} measured"),
            ("p50 duration", g(h.p50_s, " s")),
            ("p99 duration", g(h.p99_s, " s")),
            ("mean duration W", g(h.mean_s, " s")),
            ("success rate", f"{rate} ({h.failures} failed or timed out)"),
            ("attempts per task (mean)", g(h.mean_attempts)),
            ("window (first start to last end)", g(h.window_s, " s")),
            (
                "throughput λ",
                "-"
                if h.throughput_per_s is None
                else f"{h.read} / {h.window_s:.4g} s = {h.throughput_per_s:.4g} tasks/s",
            ),
        ],
    )
    rows: list[tuple[str, str]] = []
    if hp.in_flight is not None:
        rows.append(
            ("in flight on average L = λ x W", f"{g(h.throughput_per_s)}/s x {g(h.mean_s)} s = {hp.in_flight:.3g}")
        )
    if hp.required is not None:
        r = hp.required
        rows.append(
            (
                "target throughput",
                f"{r.target} / {r.window_s:.4g} s = {r.target / r.window_s:.4g} tasks/s",
            )
        )
        rows.append(
            (
                "workers = target / window x W",
                f"{r.target / r.window_s:.4g}/s x {g(h.mean_s)} s = {r.required_concurrency:.3g}"
                f" -> [bold green]{r.required_workers}[/]",
            )
        )
        if hp.required_with_retries is not None:
            rows.append(
                (
                    "with failures: / success rate",
                    f"{r.required_concurrency:.3g} x 1 / {h.success_rate:.3g} = {hp.required_with_retries:.3g}"
                    f" -> [bold green]{hp.workers_with_retries}[/]",
                )
            )
    else:
        rows.append(("workers for a target", "give --target N (and --target-hours H, default: the window measured)"))
    section("Little's law: concurrency = throughput x mean duration", rows)
    if hp.limit is not None and hp.advice is not None:
        c = hp.limit
        qps_from = "cap given by --qps"
        if hp.qps_measured:
            qps_from = "measured throughput (give --qps for the downstream's cap)"
        section(
            LIMIT_TITLE + " (latency: the mean duration W)",
            [("QPS", f"{c.qps:.4g}/s, the {qps_from}")] + limit_rows(c),
        )
        con.print("[bold]declare[/]")
        for line in limit_lines(c, limit_name):
            con.print("  " + line, markup=False, highlight=False)
        if batch is not None:
            con.print(f'  app.batch("{batch}", concurrency={c.limit})  # or cap the batch alone', markup=False)


def adaptive_line(row) -> str:
    """One line for ``corral limit show``: an adaptive limit's effective values
    against its bounds, e.g. ``partner_api  concurrency 12 (auto 1..40)  rate
    87/s (auto 1/s..200/s)  baseline 41.0 ms  last cut at 95.2/s``."""
    from corral.edges.limit_view import adaptive_dict

    d = adaptive_dict(row)
    parts = [row.name]
    for knob in ("concurrency", "rate"):
        value = d[knob] if d[knob] is not None else "-"
        bounds = d.get(f"{knob}_bounds")
        parts.append(f"{knob} {value}" + (f" (auto {bounds[0]}..{bounds[1]})" if bounds else " (fixed)"))
    if d.get("baseline_ms") is not None:
        parts.append(f"baseline {d['baseline_ms']:g} ms")
    if d.get("last_cut_rate") is not None:
        parts.append(f"last cut at {d['last_cut_rate']:g}/s")
    if row.state is None:
        parts.append("not adapted yet")
    return "  ".join(parts)

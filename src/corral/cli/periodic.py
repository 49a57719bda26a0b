"""``corral periodic``: the periodic schedules, their last and next ticks and last outcome.

Workers store their app's schedules when they start, so the list comes from
the store alone; given an APP, its schedules are listed too, even before any
worker of it ran."""

from __future__ import annotations

import datetime
from typing import Any

import click

from corral.cli import render
from corral.cli.common import CLIError, json_option, load_app, open_given_store, store_option, store_url_of
from corral.core.cron import SKIPPED, ScheduleState, zone
from corral.errors import ConfigError


def _at(ts: float | None, tz_name: str) -> str:
    """A tick in its schedule's time zone (``2026-12-01 02:30 CET``); empty for None."""
    if ts is None:
        return ""
    try:
        tz: Any = zone(tz_name)
    except ConfigError:
        tz = datetime.UTC
    return datetime.datetime.fromtimestamp(ts, tz).strftime("%Y-%m-%d %H:%M %Z")


def outcome(st: ScheduleState) -> str:
    """What the last tick did, in words."""
    if st.last_tick is None:
        return "no tick yet"
    if st.last_outcome == SKIPPED:
        return f"skipped: the previous run (task {st.last_task_id}) was still going"
    if st.last_task_id is None:
        return st.last_outcome or ""
    return f"task {st.last_task_id} {st.last_task_status or 'deleted'}"


def schedule_dict(st: ScheduleState, now: float) -> dict[str, Any]:
    return {
        "name": st.name,
        "task": st.task,
        "cron": st.expr,
        "timezone": st.timezone,
        "queue": st.queue,
        "group": st.group,
        "overlap": st.overlap,
        "catch_up": st.catch_up,
        "max_delay": st.max_delay,
        "last_tick": st.last_tick,
        "next_tick": st.next_tick(now),
        "last_outcome": st.last_outcome,
        "last_task_id": st.last_task_id,
        "last_task_status": st.last_task_status,
    }


@click.command()
@store_option
@json_option
@click.argument("app_spec", metavar="[APP]", required=False)
def periodic(store_url: str | None, as_json: bool, app_spec: str | None) -> None:
    """List periodic schedules: cron expression, time zone, last tick, next
    tick and what the last tick did. Read from the store, where workers keep
    their app's schedules; with APP (module:attribute), that app's schedules,
    stored or not yet (the app opens its store, as a worker would)."""
    app = load_app(app_spec, store_url_of(store_url)) if app_spec is not None else None
    store = app.store if app is not None else open_given_store(store_url, create=False)
    rows = store.schedules()
    if app is not None:
        stored = {r.name: r for r in rows}
        rows = [
            stored.get(s.name)
            or ScheduleState(
                name=s.name,
                task=s.task,
                expr=s.expr,
                timezone=s.timezone,
                queue=s.queue,
                group=s.group,
                overlap=s.overlap,
                catch_up=s.catch_up,
                max_delay=s.max_delay,
                created_at=0.0,
            )
            for s in sorted(app.schedules.values(), key=lambda s: s.name)
        ]
        if not rows:
            raise CLIError(f"app {app_spec} declares no periodic tasks (@app.periodic or @app.task(cron=...))")
    now = store.now()
    if as_json:
        render.print_json([schedule_dict(r, now) for r in rows])
        return
    if not rows:
        click.echo("no schedules stored (workers store their app's @app.periodic schedules when they start)")
        return
    from rich.table import Table

    t = Table(title=f"{len(rows)} schedule(s)", title_justify="left")
    for col in ("Schedule", "Task", "Cron", "Timezone", "Queue", "Overlap", "Last tick", "Next tick", "Last outcome"):
        t.add_column(col, no_wrap=col != "Last outcome")
    for r in rows:
        t.add_row(
            render.escape(r.name),
            render.escape(r.task),
            render.escape(r.expr),
            render.escape(r.timezone),
            render.escape(r.queue + (f" / {r.group}" if r.group else "")),
            "yes" if r.overlap else "no",
            _at(r.last_tick, r.timezone),
            _at(r.next_tick(now), r.timezone),
            render.escape(outcome(r)),
        )
    render.console().print(t)


__all__ = ["periodic"]

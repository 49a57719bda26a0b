"""``corral events``: the store's event stream, one line per event (or JSON
lines), optionally followed as it grows."""

from __future__ import annotations

import datetime
import json

import click

from corral.cli.common import CLIError, json_option, one_line, open_given_store, store_option
from corral.core.events import KNOWN_KINDS
from corral.stores.base import Event
from corral.stores.stream import iter_events


def summary(ev: Event) -> str:
    """What an event says, in a few words (user values cut to one line)."""
    d = ev.details
    if ev.kind == "progress":
        frac = d.get("fraction")
        text = f"{d.get('name')} {frac * 100:.0f}%" if isinstance(frac, int | float) else f"{d.get('name')}"
        return text + (f" {one_line(str(d['message']))}" if d.get("message") else "")
    if ev.subject.startswith("task:"):
        text = f"{d.get('name')} {d.get('from') or '-'} -> {d.get('status')} attempt {d.get('attempt')}"
        if d.get("queue") not in (None, "default"):
            text += f" queue {d['queue']}"
        if d.get("group"):
            text += f" group {d['group']}"
        if d.get("error") and d.get("status") in ("FAILED", "RETRYING", "TIMEOUT"):
            text += f": {one_line(str(d['error']))}"
        return text
    if "from" in d and "to" in d:
        return f"{d['from']} -> {d['to']}" + (f": {one_line(str(d['reason']))}" if d.get("reason") else "")
    return one_line(ev.data)


def line(ev: Event) -> str:
    when = datetime.datetime.fromtimestamp(ev.at).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    return f"{when}  {ev.id:>8}  {ev.kind:<10} {ev.subject:<14} {summary(ev)}"


def to_json(ev: Event) -> str:
    return json.dumps(
        {"id": ev.id, "at": ev.at, "kind": ev.kind, "subject": ev.subject, "data": ev.details}, ensure_ascii=False
    )


@click.command()
@store_option
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events as they come (Ctrl-C stops).")
@click.option(
    "--kind",
    "kinds",
    multiple=True,
    metavar="KIND",
    help=f"Only this kind (repeatable): {', '.join(sorted(KNOWN_KINDS))}.",
)
@click.option(
    "--since",
    type=click.IntRange(min=0),
    default=None,
    help="Start after the event with this id (0: the oldest kept). Default: every event kept, "
    "or with --follow only new ones.",
)
@click.option("--last", type=click.IntRange(min=1), default=None, help="Without --follow: only the newest N events.")
@json_option
def events(store_url=None, follow=False, kinds=(), since=None, last=None, as_json=False) -> None:
    """The event stream: tasks' state changes and progress, breaker and
    level changes, oldest first."""
    unknown = [k for k in kinds if k not in KNOWN_KINDS]
    if unknown:
        raise CLIError(f"unknown event kind {unknown[0]!r}; kinds are {', '.join(sorted(KNOWN_KINDS))}")
    if last is not None and follow:
        raise CLIError("--last lists what is kept; with --follow use --since ID")
    store = open_given_store(store_url, create=False)
    show = to_json if as_json else line
    try:
        if last is not None:
            newest = [e for k in (kinds or (None,)) for e in store.events(k, limit=last)]
            for ev in sorted(newest, key=lambda e: e.id)[-last:]:
                click.echo(show(ev))
            return
        for ev in iter_events(store, follow=follow, kinds=kinds or None, since=since):
            click.echo(show(ev))
    except KeyboardInterrupt:
        return
    finally:
        store.close()

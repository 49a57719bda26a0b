"""``corral pause`` and ``corral resume``: a queue, a group or a limit, for
the whole fleet (every worker process of the store obeys; see
:mod:`corral.core.pauses`)."""

from __future__ import annotations

import click

from corral.cli import render
from corral.cli.common import CLIError, open_given_store, store_option
from corral.core.pauses import Pause, check_target, who
from corral.errors import ConfigError


def _target(queue: str | None, group: str | None, limit: str | None) -> tuple[str, str]:
    try:
        return check_target(queue, group, limit)
    except ConfigError as exc:
        raise CLIError(f"{exc} (--queue Q, --group G or --limit L)") from None


def _options(f):
    for opt in reversed(
        (
            click.option("--queue", help="A queue: none of its tasks is claimed."),
            click.option("--group", help="A group: its head waits, nothing after it starts."),
            click.option("--limit", help="A limit: no task naming it (any key of a keyed one) is claimed."),
            click.option("--by", default=None, help="Who, kept with the pause and in the event (default: user@host)."),
            store_option,
        )
    ):
        f = opt(f)
    return f


@click.command()
@_options
def pause(queue: str | None, group: str | None, limit: str | None, by: str | None, store_url: str | None) -> None:
    """Pause a queue, a group or a limit (exactly one) for every worker.

    Stored: it holds until `corral resume`, across restarts. Paused work
    waits, attempts intact; running tasks finish; tasks a worker holds but
    has not started go back to the queue. Something with no tasks yet may
    be paused."""
    kind, name = _target(queue, group, limit)
    store = open_given_store(store_url)
    if store.pause(kind, name, who(by)):
        click.echo(f"{kind} {name} paused")
    else:
        click.echo(f"{kind} {name} was already paused")


@click.command()
@_options
def resume(queue: str | None, group: str | None, limit: str | None, by: str | None, store_url: str | None) -> None:
    """Resume a queue, a group or a limit paused by `corral pause`; waiting
    workers look again at once."""
    kind, name = _target(queue, group, limit)
    store = open_given_store(store_url)
    if store.resume(kind, name, who(by)):
        click.echo(f"{kind} {name} resumed")
    else:
        click.echo(f"{kind} {name} is not paused: nothing to resume")


def pauses_of(store) -> list[Pause]:
    """The pauses in force (none from a store that keeps none)."""
    try:
        return store.pauses()
    except NotImplementedError:
        return []


def print_pauses(paused: list[Pause]) -> None:
    """One line per pause, for ``corral status``: what, since when, by whom."""
    for p in paused:
        by = f" by {p.by}" if p.by else ""
        click.echo(f"paused: {p.kind} {p.name} since {render.when(p.paused_at)}{by}")


__all__ = ["pause", "resume", "pauses_of", "print_pauses"]

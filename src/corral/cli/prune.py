"""``corral prune``: delete old finished tasks now (what the sweeper's leader
does on its own by ``App(retention=)``)."""

from __future__ import annotations

import click

from corral.cli import render
from corral.cli.common import CLIError, json_option, open_given_store, store_option, store_url_of
from corral.core.planning import format_duration
from corral.core.retention import DEFAULT_PRUNE_STATES, age, final_states
from corral.errors import ConfigError
from corral.maintenance.retention import prune as prune_store


@click.command()
@store_option
@click.option(
    "--older-than",
    "older_than",
    required=True,
    metavar="AGE",
    help="Remove tasks that finished more than this long ago (e.g. 7d, 12h, 30m).",
)
@click.option(
    "--state",
    "states",
    multiple=True,
    metavar="STATE",
    help="Finished state to remove (repeatable; default SUCCESS and CANCELED: "
    "dead letters, FAILED and TIMEOUT, only when named).",
)
@json_option
def prune(store_url: str | None, older_than: str, states: tuple[str, ...], as_json: bool) -> None:
    """Delete finished tasks older than --older-than, in bounded batches.

    Kept whatever their age: an upstream of a task not ended (or of a dead
    letter, whose retry reads it), every task of a batch not finished or
    whose callback is not submitted yet, and a failure that halts its group
    with tasks behind it. An idempotency key of a removed task may be used
    again.
    """
    try:
        ttl = age(older_than, "--older-than")
        chosen = final_states(states or DEFAULT_PRUNE_STATES, "--state")
    except ConfigError as exc:
        raise CLIError(str(exc)) from None
    store = open_given_store(store_url, create=False)
    now = store.now()
    gone = prune_store(store, {s.value: now - ttl for s in chosen})
    names = [s.value for s in chosen]
    if as_json:
        render.print_json({"removed": gone, "states": names, "older_than_seconds": ttl})
        return
    click.echo(
        f"removed {gone} finished task(s) from {store_url_of(store_url)}: "
        f"{', '.join(names)} older than {format_duration(ttl)}"
    )


__all__ = ["prune"]

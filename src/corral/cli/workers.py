"""``corral workers``: the worker processes of a store (each ``corral worker``,
``App.run`` or ``App.start`` is one), what they hold, and which are dead."""

from __future__ import annotations

import click

from corral.cli import render
from corral.cli.common import json_option, open_given_store, store_option


@click.command()
@store_option
@json_option
def workers(store_url: str | None, as_json: bool) -> None:
    """Worker processes: host, pid, queues, slots in use, the tasks each
    holds, last heartbeat, version and start. A worker whose heartbeat
    stopped or whose lease ran out is DEAD, shown with what it held until
    the sweeper has taken its tasks back."""
    from corral.edges.workers import read_workers

    store = open_given_store(store_url, create=False)
    now, rows = read_workers(store)
    if as_json:
        render.print_json({"at": now, "workers": [v.as_dict(now) for v in rows]})
        return
    render.print_workers(rows, now)


__all__ = ["workers"]

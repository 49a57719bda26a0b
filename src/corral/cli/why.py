"""``corral why ID``: what holds a queued or held task, in one line (see
:mod:`corral.core.why`); read-only."""

from __future__ import annotations

import click

from corral.cli import render
from corral.cli.common import json_option, open_given_store, store_option
from corral.errors import TaskNotFound


@click.command()
@click.argument("task_id", metavar="ID", type=int)
@store_option
@json_option
def why(task_id: int, store_url: str | None, as_json: bool) -> None:
    """Why task ID is not running yet: behind its group's head (on which
    worker, alive or not), a limit or a key's budget full, a rate, a breaker,
    the fleet's level, a queue, group or limit paused by hand, a delay, a
    debounce window, a retry's backoff, a dependency, no live worker serving
    its queue; or ready. The first line is the main reason, the others hold
    it too; a deadline (expires=) is shown last, as a note."""
    from corral.edges.why import explain_one

    store = open_given_store(store_url, create=False)
    rec = store.get(task_id)
    if rec is None:
        raise TaskNotFound(f"no task with id {task_id}")
    reasons = explain_one(store, rec)
    if as_json:
        render.print_json(
            {
                "id": rec.id,
                "name": rec.name,
                "status": rec.status.value,
                "queue": rec.queue,
                "group": rec.group,
                "reasons": [r.as_dict() for r in reasons],
            }
        )
        return
    click.echo(f"task {rec.id} ({rec.name}) {rec.status.value}, queue {rec.queue}")
    for i, r in enumerate(reasons):
        click.echo(f"{'why' if i == 0 else 'also'}: {r.text}")


__all__ = ["why"]

"""``corral batch show B``: a batch's progress, live until it ends."""

from __future__ import annotations

import sys
import time

import click

from corral.cli import render
from corral.cli.common import CLIError, json_option, open_given_store, store_option
from corral.core.batches import FINAL_STATUSES


@click.group()
def batch() -> None:
    """Batches: their progress and aggregate status."""


@batch.command()
@click.argument("name")
@store_option
@click.option(
    "--follow/--once",
    default=None,
    help="Follow until the batch ends (default: on a terminal); --once prints one summary line.",
)
@click.option(
    "--interval", type=click.FloatRange(min=0.05), default=0.5, show_default=True, help="Seconds between reads."
)
@json_option
def show(name: str, store_url: str | None, follow: bool | None, interval: float, as_json: bool) -> None:
    """Show batch NAME: done, failed, running and queued tasks.

    On a terminal a live progress bar runs until the batch reaches a final
    status (ALL_SUCCESS, PARTIAL_SUCCESS or FAILED); elsewhere one summary
    line is printed, or one per change with --follow."""
    store = open_given_store(store_url, create=False)
    try:
        summary = store.batch_summary(name)
        if summary.total == 0:
            raise CLIError(f"no batch named {name!r}")
        if as_json:
            render.print_json(render.batch_dict(summary))
            return
        tty = sys.stdout.isatty()
        if follow is None:
            follow = tty
        if not follow or summary.status in FINAL_STATUSES:
            click.echo(render.batch_line(summary))
            return
        if tty:
            render.follow_batch(lambda: store.batch_summary(name), interval)
            return
        last = None
        while True:
            line = render.batch_line(summary)
            if line != last:
                click.echo(line)
                last = line
            if summary.status in FINAL_STATUSES:
                return
            time.sleep(interval)  # a pause between reads of a live view, not a synchronisation
            summary = store.batch_summary(name)
    finally:
        store.close()

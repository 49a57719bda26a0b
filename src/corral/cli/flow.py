"""``corral breaker``: circuit breakers' state and their last changes; open or
close one by hand."""

from __future__ import annotations

import datetime

import click

from corral.cli import CLIError, open_given_store, store_option
from corral.core.breaker import BreakerState
from corral.errors import ConfigError


def _when(at: float) -> str:
    return datetime.datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M:%S")


@click.group(invoke_without_command=True)
@click.pass_context
def breaker(ctx: click.Context) -> None:
    """Circuit breakers: show (default), open NAME, close NAME."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(show)


@breaker.command()
@store_option
@click.option("--last", type=click.IntRange(min=0), default=10, show_default=True, help="Changes to list.")
def show(store_url=None, last=10):
    """Each breaker's state, then its last changes with their reasons and counts."""
    store = open_given_store(store_url)
    rows = store.breakers()
    if not rows:
        click.echo("no breakers declared (app.breaker(name, ...))")
        return
    for name, (cfg, state) in sorted(rows.items()):
        now = store.now()
        calls, failures = state.counts(cfg, now)
        extra = " (forced)" if state.forced else ""
        reopen = state.reopens_at()
        if reopen is not None and not state.forced:
            extra += f", probes in {max(0.0, reopen - now):.0f}s"
        click.echo(f"{name}: {state.state.value}{extra}; {failures} of {calls} calls failed in {cfg.window:g}s")
    for ev in store.breaker_events(limit=last):
        click.echo(
            f"  {_when(ev.at)}  {ev.name}: {ev.before} -> {ev.after}  {ev.reason}"
            f" ({ev.failures} of {ev.calls} calls failed)"
        )


def _force(store_url, name: str, state: BreakerState, reason: str) -> None:
    store = open_given_store(store_url)
    try:
        ev = store.force_breaker(name, state, reason)
    except ConfigError as exc:
        raise CLIError(str(exc)) from None
    click.echo(f"{name}: {ev.before} -> {ev.after} ({reason})")


@breaker.command(name="open")
@store_option
@click.argument("name")
@click.option("--reason", default="opened by hand", show_default=True)
def open_(name, reason, store_url=None):
    """Open NAME and hold it open until it is closed by hand."""
    _force(store_url, name, BreakerState.OPEN, reason)


@breaker.command()
@store_option
@click.argument("name")
@click.option("--reason", default="closed by hand", show_default=True)
def close(name, reason, store_url=None):
    """Close NAME: its tasks are claimed again."""
    _force(store_url, name, BreakerState.CLOSED, reason)

"""The operator's controls: ``corral breaker`` (circuit breakers' state and
their last changes; open or close one by hand), ``corral level`` (the fleet's
degradation level) and ``corral dead`` (the dead-letter view; ``corral retry
--dead`` re-queues dead letters)."""

from __future__ import annotations

import dataclasses
import datetime

import click

from corral.cli import render
from corral.cli.common import CLIError, json_option, open_given_store, store_option
from corral.core.breaker import BreakerState
from corral.core.levels import Level
from corral.engine.level_follower import set_level
from corral.errors import ConfigError


def _when(at: float) -> str:
    return datetime.datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M:%S")


@click.group(invoke_without_command=True)
@store_option
@json_option
@click.option("--last", type=click.IntRange(min=0), default=10, show_default=True, help="Changes to list.")
@click.pass_context
def breaker(ctx: click.Context, store_url: str | None, as_json: bool, last: int) -> None:
    """Circuit breakers: show (default), open NAME, close NAME."""
    ctx.ensure_object(dict)
    ctx.obj["store_url"] = store_url
    if ctx.invoked_subcommand is None:
        _show_breakers(store_url, last, as_json)


def breakers_dict(store, last: int) -> dict:
    """Each breaker's state and settings, and its last changes (the JSON of ``breaker show``)."""
    now = store.now()
    out: dict = {"breakers": {}, "changes": []}
    for name, (cfg, state) in sorted(store.breakers().items()):
        calls, failures = state.counts(cfg, now)
        reopen = state.reopens_at()
        out["breakers"][name] = {
            "state": state.state.value,
            "forced": state.forced,
            "calls": calls,
            "failures": failures,
            "probes_in": None if reopen is None or state.forced else max(0.0, reopen - now),
            "opened_at": state.opened_at,
            "config": {
                "failure_ratio": cfg.failure_ratio,
                "min_calls": cfg.min_calls,
                "window": cfg.window,
                "cooldown": cfg.cooldown,
                "probes": cfg.probes,
            },
        }
    out["changes"] = [dataclasses.asdict(ev) for ev in store.breaker_events(limit=last)]
    return out


def _show_breakers(store_url: str | None, last: int, as_json: bool) -> None:
    store = open_given_store(store_url, create=False)
    data = breakers_dict(store, last)
    if as_json:
        render.print_json(data)
        return
    if not data["breakers"]:
        click.echo("no breakers declared (app.breaker(name, ...))")
        return
    for name, b in data["breakers"].items():
        extra = " (forced)" if b["forced"] else ""
        if b["probes_in"] is not None:
            extra += f", probes in {b['probes_in']:.0f}s"
        click.echo(
            f"{name}: {b['state']}{extra}; {b['failures']} of {b['calls']} calls failed in {b['config']['window']:g}s"
        )
    for ev in data["changes"]:
        click.echo(
            f"  {_when(ev['at'])}  {ev['name']}: {ev['before']} -> {ev['after']}  {ev['reason']}"
            f" ({ev['failures']} of {ev['calls']} calls failed)"
        )


@breaker.command()
@store_option
@json_option
@click.option("--last", type=click.IntRange(min=0), default=10, show_default=True, help="Changes to list.")
@click.pass_context
def show(ctx: click.Context, store_url=None, as_json=False, last=10):
    """Each breaker's state, then its last changes with their reasons and counts."""
    _show_breakers(_url(ctx, store_url), last, as_json)


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
@click.pass_context
def open_(ctx: click.Context, name, reason, store_url=None):
    """Open NAME and hold it open until it is closed by hand."""
    _force(_url(ctx, store_url), name, BreakerState.OPEN, reason)


@breaker.command()
@store_option
@click.argument("name")
@click.option("--reason", default="closed by hand", show_default=True)
@click.pass_context
def close(ctx: click.Context, name, reason, store_url=None):
    """Close NAME: its tasks are claimed again."""
    _force(_url(ctx, store_url), name, BreakerState.CLOSED, reason)


def _level_dict(store) -> dict:
    lv = store.fleet_level()
    return {
        "level": Level(lv.level).name,
        "value": lv.level,
        "manual": lv.manual,
        "reason": lv.reason,
        "changed_at": lv.changed_at,
    }


def _print_level(store) -> None:
    d = _level_dict(store)
    how = "set by hand" if d["manual"] else "automatic"
    since = f" since {render.when(d['changed_at'])}" if d["changed_at"] is not None else ""
    reason = f": {d['reason']}" if d["reason"] else ""
    click.echo(f"{Level(d['value'])} ({how}){since}{reason}")


@click.group(invoke_without_command=True)
@store_option
@json_option
@click.pass_context
def level(ctx: click.Context, store_url: str | None, as_json: bool) -> None:
    """Show or set the fleet's degradation level (default: show).

    Levels: NORMAL (L0) everything runs; WARNING (L1) smaller claims and an
    alert; DEGRADED (L2) half the slots, critical work only; CIRCUIT_OPEN
    (L3) only retries run; EMERGENCY (L4) nothing is dispatched. Workers
    follow a change within about a second.
    """
    ctx.ensure_object(dict)
    ctx.obj["store_url"] = store_url
    if ctx.invoked_subcommand is None:
        store = open_given_store(store_url, create=False)
        if as_json:
            render.print_json(_level_dict(store))
        else:
            _print_level(store)


def _url(ctx: click.Context, store_url: str | None) -> str | None:
    return store_url if store_url is not None else (ctx.obj or {}).get("store_url")


@level.command("show")
@store_option
@json_option
@click.pass_context
def level_show(ctx: click.Context, store_url: str | None, as_json: bool) -> None:
    """The level, whether it was set by hand, since when and why."""
    store = open_given_store(_url(ctx, store_url), create=False)
    if as_json:
        render.print_json(_level_dict(store))
    else:
        _print_level(store)


@level.command("set")
@click.argument("name", metavar="LEVEL")
@click.option("--reason", required=True, help="Why (kept with the level and in the event log).")
@store_option
@click.pass_context
def level_set(ctx: click.Context, name: str, reason: str, store_url: str | None) -> None:
    """Set the level by hand (a name, or L0-L4); it stays until set again or `corral level auto`."""
    if name.strip().lower() == "auto":
        raise click.UsageError("use `corral level auto` to hand the level back")
    store = open_given_store(_url(ctx, store_url))
    lv = set_level(store, name, reason=reason)
    click.echo(f"level set to L{lv.value} {lv.name} by hand: {reason}")


@level.command("auto")
@click.option("--reason", default="", help="Why (kept in the event log).")
@store_option
@click.pass_context
def level_auto(ctx: click.Context, reason: str, store_url: str | None) -> None:
    """Hand the level back to the automatic rules.

    The sweeper leader's next evaluation sets what the signals call for, at once."""
    store = open_given_store(_url(ctx, store_url))
    lv = set_level(store, "auto", reason=reason)
    click.echo(
        f"level handed back to the automatic rules: L{lv.value} {lv.name} until the sweeper leader's"
        " next evaluation sets what the signals call for"
    )


@click.command()
@store_option
@click.option("--batch", help="Only this batch.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--offset", type=click.IntRange(min=0), default=0)
@click.option("--after", metavar="POS", type=int, help="The page after this position (printed under a full page).")
@json_option
def dead(store_url: str | None, batch: str | None, limit: int, offset: int, after: int | None, as_json: bool) -> None:
    """Dead letters: tasks that ended FAILED or TIMEOUT and were not retried
    since (retries spent, a permanent error, arguments that cannot be
    decoded), oldest first. `corral retry --dead` queues them again.

    With --after, pages go by position (a deep page costs what the first
    does), as on the dashboard's Dead letters page."""
    if after is not None and offset:
        raise click.UsageError("--offset does not go with --after")
    rows = open_given_store(store_url, create=False).dead_letters(batch, limit + 1, offset, after_id=after)
    more, rows = len(rows) > limit, rows[:limit]
    if as_json:
        render.print_json([render.record_dict(r) for r in rows])
        return
    if not rows:
        click.echo("no dead letters" + (f" in batch {batch}" if batch else ""))
        return
    for r in rows:
        error = render.clip((r.error or "").replace("\n", " "), 120)
        click.echo(
            f"{r.id}  {r.name}  {r.status.value}  attempts {r.attempt}  trace {r.trace_id or '-'}"
            + (f"  batch {r.batch}" if r.batch else "")
            + (f"  group {r.group}" if r.group else "")
            + f"  {error}"
        )
    if more:
        click.echo(f"more: --after {rows[-1].id}", err=True)


__all__ = ["breaker", "level", "dead"]

"""``corral limit``: named limits while the fleet runs.

``show`` (the default, read-only: never creates a store) lists each limit's
settings in force and who set them, the places held now, the starts its rate
allows now, whether it is paused, for a keyed limit its active keys and
busiest keys, and for an adaptive limit what its controller set within the
bounds. ``set NAME`` changes some settings fleet-wide (every worker
obeys at its next claim, within a second); ``reset NAME`` hands the declared
settings back (:mod:`corral.core.limits` says who wins)."""

from __future__ import annotations

from typing import Any

import click

from corral.cli import render
from corral.cli.common import CLIError, json_option, open_given_store, store_option
from corral.core.limits import describe_settings, parse_changes
from corral.core.model import LimitSettings, LimitSpec
from corral.edges.limit_view import limits_report
from corral.errors import ConfigError


def _url(ctx: click.Context, store_url: str | None) -> str | None:
    return store_url if store_url is not None else (ctx.obj or {}).get("store_url")


@click.group(invoke_without_command=True)
@store_option
@json_option
@click.pass_context
def limit(ctx: click.Context, store_url: str | None, as_json: bool) -> None:
    """Named limits: show (default), set NAME, reset NAME.

    A change made here stays in force over the settings the app declares
    (`app.limit`), across restarts, until `corral limit reset NAME`."""
    ctx.ensure_object(dict)
    ctx.obj["store_url"] = store_url
    if ctx.invoked_subcommand is None:
        _show(store_url, as_json)


@limit.command("show")
@click.argument("name", required=False)
@store_option
@json_option
@click.pass_context
def limit_show(ctx: click.Context, name: str | None, store_url: str | None, as_json: bool) -> None:
    """Each limit (or only NAME): settings in force and who set them, places
    held, starts its rate allows now, paused or not, and a keyed limit's active
    and busiest keys. An adaptive limit adds the effective values beside its
    bounds, the latency baseline and the rate of the last cut; a keyed one its
    busiest keys' learned values and when they last changed."""
    _show(_url(ctx, store_url), as_json, name)


def _show(store_url: str | None, as_json: bool, name: str | None = None) -> None:
    store = open_given_store(store_url, create=False)
    rows = limits_report(store)
    if name is not None:
        rows = [r for r in rows if r["name"] == name]
        if not rows:
            raise CLIError(f"no limit {name!r} (corral limit show lists them)")
    if as_json:
        render.print_json({"limits": rows})
        return
    if not rows:
        click.echo("no limits declared (app.limit(name, concurrency=..., rate=...))")
        return
    adaptive = store.adaptive_limits() if any(r["adaptive"] for r in rows) else {}
    for r in rows:
        click.echo(_line(r))
        if r["name"] in adaptive:  # the effective values the controller set, beside the user's bounds
            click.echo("    adaptive: " + render.adaptive_line(adaptive[r["name"]]))
        if r["per_key"]:
            busiest = ", ".join(f"{k['key']} {k['in_use']}{_learned(k)}" for k in r["busiest_keys"]) or "-"
            learning = f"; keys learning: {r['learning_keys']}" if "learning_keys" in r else ""
            click.echo(f"    keys holding places: {r['active_keys']}{learning}; busiest: {busiest}")
        if r.get("learned_keys"):
            click.echo("    busiest learning keys: " + ", ".join(_learning(k) for k in r["learned_keys"]))


def _learning(key: dict[str, Any]) -> str:
    """A learning key: its own values, its last second's calls and its last change."""
    changed = f", changed {render.when(key['changed_at'])}" if key["changed_at"] is not None else ""
    return f"{key['key']}{_learned({'learned': key})} {key['calls']} calls{changed}"


def _learned(key: dict[str, Any]) -> str:
    """A busiest key's own values, where its controller set them (a keyed adaptive limit)."""
    got = key.get("learned")
    if not got:
        return ""
    n = got["concurrency"]
    parts = ["" if n is None else f"{n} place" + ("s" if n != 1 else ""), got["rate"] or ""]
    return " (" + ", ".join(p for p in parts if p) + ")"


def _line(r: dict[str, Any]) -> str:
    if r["concurrency"] is None:
        held = f"{r['in_use']} held"
    elif r["per_key"]:  # the keys' places summed; the cap is each key's
        held = f"{r['in_use']} held, {r['concurrency']} per key"
    else:
        held = f"{r['in_use']} of {r['concurrency']} held"
    parts = [r["name"] + (" (keyed)" if r["per_key"] else ""), held]
    if r["rate"]:
        rate = f"rate {r['rate']}" + (" per key" if r["per_key"] else "")
        rate += f" burst {r['burst']}" if r["burst"] is not None else ""
        if r["tokens"] is not None:
            rate += f", {r['tokens']:g} may start now"
        parts.append(rate)
    else:
        parts.append("no rate")
    if r["paused"]:
        parts.append(f"paused until {render.when(r['paused_until'])}")
    if r["set_by"] is not None:
        declared = LimitSettings(**r["declared"]) if r["declared"] else None
        parts.append(
            f"set by {r['set_by']} at {render.when(r['changed_at'])}"
            + (f" (declared: {describe_settings(declared)})" if declared is not None else "")
        )
    return "  ".join(parts)


def _said(spec: LimitSpec) -> str:
    return f"{spec.name}: {describe_settings(spec.settings())}"


@limit.command("set")
@click.argument("name")
@click.option("--concurrency", metavar="N|none", help="Claims running at once, fleet-wide; 'none': no cap.")
@click.option("--rate", metavar="R|none", help="Starts per period ('8/s', '500/m', '20/h'); 'none': no rate.")
@click.option("--burst", metavar="B|none", help="A token bucket of B tokens instead of a sliding window.")
@store_option
@click.pass_context
def limit_set(
    ctx: click.Context,
    name: str,
    concurrency: str | None,
    rate: str | None,
    burst: str | None,
    store_url: str | None,
) -> None:
    """Change NAME's settings while the fleet runs; those not given stay.

    Every worker obeys at its next claim (within a second). A lower
    concurrency lets running work finish and starts nothing new until under
    it; a higher one wakes waiting workers at once. A keyed limit's keys all
    follow. Example: corral limit set merchant_api --concurrency 3 --rate 8/s"""
    try:
        changes = parse_changes(concurrency, rate, burst)
        if not changes:
            raise CLIError("name what to change: --concurrency N, --rate R or --burst B ('none' clears one)")
        spec = open_given_store(_url(ctx, store_url), create=False).change_limit(name, changes, by="cli")
    except ConfigError as exc:
        raise CLIError(str(exc)) from None
    click.echo(f"{_said(spec)} (set by cli; `corral limit reset {name}` hands back the declared settings)")


@limit.command("reset")
@click.argument("name")
@store_option
@click.pass_context
def limit_reset(ctx: click.Context, name: str, store_url: str | None) -> None:
    """Hand NAME back to the settings the app declares (undo `limit set`)."""
    try:
        spec = open_given_store(_url(ctx, store_url), create=False).change_limit(name, {}, by="cli", reset=True)
    except ConfigError as exc:
        raise CLIError(str(exc)) from None
    click.echo(f"{_said(spec)} (as declared)")


__all__ = ["limit"]

"""``corral demo`` (the scenario itself is :mod:`corral.edges.demo`) and the
``dashboard`` placeholder."""

from __future__ import annotations

import click

from corral.cli import CLIError, render, store_option, store_url_of
from corral.stores import default_url


@click.command()
@store_option
@click.option("--skus", type=click.IntRange(min=1, max=100_000), default=300, show_default=True, help="SKUs to sync.")
@click.option(
    "--merchants", type=click.IntRange(min=1), default=20, show_default=True, help="Merchants (ordered groups)."
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="Worker slots of the in-process worker.",
)
@click.option(
    "--latency-ms",
    type=click.FloatRange(min=1),
    default=200.0,
    show_default=True,
    help="Simulated partner API latency.",
)
@click.option(
    "--qps", type=click.FloatRange(min=1), default=100.0, show_default=True, help="Simulated partner API QPS cap."
)
@click.option("--seed", type=int, default=None, help="Random seed, for a repeatable run.")
def demo(store_url, skus, merchants, workers, latency_ms, qps, seed):
    """Sync SKUs from a rate-capped partner API, in order per merchant.

    Leaves the database in place: run `corral status` or `corral tasks` afterwards.
    """
    from corral.edges.demo import run_demo

    url = store_url_of(store_url)
    run_demo(
        url,
        skus=skus,
        merchants=merchants,
        workers=workers,
        latency=latency_ms / 1000.0,
        qps=qps,
        seed=seed,
        console=render.console(),
        hint_store=None if url == default_url() else url,
    )


@click.command()
@store_option
def dashboard(store_url):
    """A live web dashboard (not in this release)."""
    raise CLIError("the dashboard comes in a later release; use `corral status` and `corral tasks` meanwhile")

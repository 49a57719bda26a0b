"""``corral demo`` (the scenario itself is :mod:`corral.edges.demo`) and the
``dashboard`` (served by :mod:`corral.edges.dashboard`)."""

from __future__ import annotations

import click

from corral.cli import CLIError, open_given_store, render, store_option, store_url_of
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
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (others need --token).")
@click.option("--port", type=click.IntRange(min=0, max=65535), default=8484, show_default=True, help="Port.")
@click.option(
    "--token",
    envvar="CORRAL_DASHBOARD_TOKEN",
    default=None,
    help="Every request must carry it (login form, or Authorization: Bearer). Also $CORRAL_DASHBOARD_TOKEN.",
)
@click.option("--read-only", is_flag=True, help="Show everything, change nothing (no action buttons).")
def dashboard(store_url, host, port, token, read_only):
    """A live web dashboard of the store, with actions and /metrics."""
    try:
        from corral.edges.dashboard import check_bind, serve
    except ImportError:
        raise CLIError("the dashboard needs its extra: pip install 'corral[dashboard]'") from None
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise CLIError("the dashboard needs its extra: pip install 'corral[dashboard]'") from None
    check_bind(host, token)  # before the store is opened: a refused bind stores nothing
    _check_free(host, port)
    store = open_given_store(store_url)
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"corral dashboard of {store.url} on http://{shown}:{port}/ (Ctrl-C to stop)")
    serve(store, host=host, port=port, token=token, read_only=read_only)


def _check_free(host: str, port: int) -> None:
    """Fail in one line when the address cannot be listened on (in use, or not this machine's)."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise CLIError(f"cannot listen on {host}:{port}: {exc}") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
        except OSError as exc:
            raise CLIError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None

"""``corral demo`` (the scenario itself is :mod:`corral.edges.demo`) and the
``dashboard`` (served by :mod:`corral.edges.dashboard`)."""

from __future__ import annotations

import time
from pathlib import Path

import click

from corral.cli import render
from corral.cli.common import CLIError, given_store, open_given_store, store_option, store_url_of
from corral.stores import default_url


@click.command()
@store_option
@click.option(
    "--quick",
    is_flag=True,
    help="The small run instead: 300 SKUs, one task each, in this process, on the default store.",
)
@click.option(
    "--skus",
    type=click.IntRange(min=1, max=100_000),
    default=None,
    help="SKUs to sync.  [default: 3000; 300 with --quick]",
)
@click.option(
    "--merchants", type=click.IntRange(min=1), default=20, show_default=True, help="Merchants (ordered groups)."
)
@click.option(
    "--workers",
    type=click.IntRange(min=1, max=1000),
    default=None,
    help="Worker slots per worker process (or of the in-process worker).  [default: 32; 16 with --quick]",
)
@click.option(
    "--processes",
    type=click.IntRange(min=0, max=16),
    default=2,
    show_default=True,
    help="`corral worker` processes to run the work in; 0 runs it in this process (not with --quick).",
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
@click.option(
    "--flaky",
    type=click.FloatRange(min=0, max=0.5),
    default=0.05,
    show_default=True,
    help="Share of the partner's answers that are 503 or 429 anyway (not with --quick).",
)
@click.option("--seed", type=int, default=None, help="Random seed, for a repeatable run.")
@click.option(
    "--hold",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Seconds to keep the web dashboard up after the run (when it is installed).",
)
def demo(store_url, quick, skus, merchants, workers, processes, latency_ms, qps, flaky, seed, hold):
    """Sync SKUs from a rate-capped partner API, in order per merchant.

    The main run: 3000 SKUs of 20 merchants, each fetched in two steps
    (detail, then images) from a partner that takes at most --qps calls a
    second and answers some with 503/429, then announced to its merchant in
    order. corral holds the partner to the limit the planner advises, with a
    breaker on it; a live view shows each phase, the throughput, the retries
    and the rate at the partner, and a report ends the run. Without --store (or
    $CORRAL_STORE) it writes a fresh SQLite file under ./.corral/. The web dashboard's address
    is printed while the run lasts, when it is installed.

    Leaves the database in place: run `corral status` or `corral tasks` afterwards.
    """
    if quick:
        from corral.edges.demo import run_demo

        url = store_url_of(store_url)
        run_demo(
            url,
            skus=300 if skus is None else skus,
            merchants=merchants,
            workers=16 if workers is None else workers,
            latency=latency_ms / 1000.0,
            qps=qps,
            seed=seed,
            console=render.console(),
            hint_store=None if url == default_url() else url,
        )
        return

    from corral.edges.demo_sync import run_main_demo

    given = given_store(store_url)
    if given is not None:
        url = given
    else:
        folder = Path(".corral")
        folder.mkdir(exist_ok=True)
        url = f"sqlite:///{folder / time.strftime('demo-%Y%m%d-%H%M%S.db')}"
    if processes and url.startswith("memory:"):
        raise CLIError(
            "worker processes cannot share a memory:// store: give --processes 0, or a SQLite or PostgreSQL store"
        )
    try:
        report = run_main_demo(
            url,
            skus=3000 if skus is None else skus,
            merchants=merchants,
            processes=processes,
            slots=32 if workers is None else workers,
            latency=latency_ms / 1000.0,
            qps=qps,
            flaky=flaky,
            seed=seed,
            hold=hold,
            console=render.console(),
            hint_store=url,
        )
    except RuntimeError as exc:  # a worker process that would not start or died
        raise CLIError(f"the demo stopped: {exc}") from None
    if not report.finished:
        raise CLIError(f"the run did not finish in time; what it did is in {url}")


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

"""``corral worker`` and ``corral sweep``: the long-running processes.

Both run until SIGTERM or SIGINT; :class:`StopSignals` waits for those
without polling and puts the previous handlers back afterwards.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Callable

import click

from corral.cli import (
    EXIT_FORCED,
    CLIError,
    duration_arg,
    given_store,
    json_option,
    load_app,
    log_level_option,
    open_given_store,
    render,
    store_option,
    store_url_of,
)

log = logging.getLogger("corral.cli")


class StopSignals:
    """SIGTERM and SIGINT handled while a long-running command runs.

    ``with StopSignals(on_signal) as signals:`` calls ``on_signal(name)`` in
    the main thread for each signal; ``signals.wait()`` returns once a
    signal has been handled since the previous wait. The handler only
    writes a byte to a socket the waiter selects on: no lock is taken in the
    handler, and a signal that arrives before ``wait()`` is not lost.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, on_signal: Callable[[str], None] | None = None):
        self.on_signal = on_signal
        self._old: dict = {}

    def __enter__(self) -> StopSignals:
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_w.setblocking(False)
        self._old = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._wake_r.close()
        self._wake_w.close()

    def _handle(self, signum, _frame) -> None:
        if self.on_signal is not None:
            self.on_signal(signal.Signals(signum).name)
        try:
            self._wake_w.send(b"\0")
        except OSError:  # the buffer is full: the waiter has bytes to read anyway
            pass

    def wait(self) -> None:
        """Block until a signal has been handled (at once if one already was)."""
        select.select([self._wake_r], [], [])
        self._wake_r.recv(4096)


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )


# ---- worker ------------------------------------------------------------------------------
@click.command()
@click.argument("app_spec", metavar="APP")
@store_option
@click.option("-c", "--concurrency", type=click.IntRange(min=1), default=10, show_default=True, help="Worker slots (tasks or chunks in flight).")
@click.option("-q", "--queues", default="default", show_default=True, help="Comma-separated queues to serve.")
@click.option("--chunk-size", type=click.IntRange(min=1), default=1, show_default=True, help="Tasks of one group taken together and run in order.")
@click.option("--grace", type=click.FloatRange(min=0), default=30.0, show_default=True, help="Seconds in-flight tasks get to finish after SIGTERM.")
@click.option("--sweep/--no-sweep", default=False, show_default=True, help="Also run the sweeper (one leader at a time across the fleet).")
@click.option("--sweep-interval", default="30s", show_default=True, help="How often the sweeper runs (e.g. 30s, 5m).")
@click.option("--lease", "lease", default="30s", show_default=True, help="Lease a running task holds; a crashed worker's tasks are recovered after it.")
@log_level_option
def worker(app_spec, store_url, concurrency, queues, chunk_size, grace, sweep, sweep_interval, lease, log_level):
    """Run tasks of APP (module:attribute, a corral.App) until SIGTERM.

    SIGTERM (or Ctrl-C) stops claiming, lets in-flight tasks finish within
    --grace seconds, hands back what did not finish, and exits 0. A second
    SIGTERM or SIGINT during the grace period stops at once (exit 3); the
    sweeper then recovers the unfinished tasks when their leases expire.

    An `App()` built without a URL reads $CORRAL_STORE, which --store sets.
    """
    from corral.engine.worker import Worker
    from corral.maintenance import Sweeper

    _setup_logging(log_level)
    lease_s = duration_arg(lease, "--lease")
    sweep_s = duration_arg(sweep_interval, "--sweep-interval")
    if lease_s <= 0 or sweep_s <= 0:
        raise CLIError("--lease and --sweep-interval must be > 0")
    queue_list = tuple(q.strip() for q in queues.split(",") if q.strip())
    if not queue_list:
        raise CLIError("--queues names no queue")
    app = load_app(app_spec, given_store(store_url))
    if not app.registry:
        raise CLIError(f"APP {app_spec!r} registers no task; nothing to run")
    if not getattr(app.store, "shared", True):
        log.warning("store %s lives in this process only: tasks submitted elsewhere never reach this worker", app.store.url)
    w = Worker(app, concurrency=concurrency, queues=queue_list, chunk_size=chunk_size, lease_seconds=lease_s)
    sweeper = Sweeper(app.store, interval=sweep_s, holder=w.id) if sweep else None

    phase = {"now": "running"}

    def on_signal(name: str) -> None:
        if phase["now"] == "running":
            phase["now"] = "stopping"
            log.info("worker %s: %s received; stopping claims, %gs grace for %d in flight", w.id, name, grace, w.busy)
            return
        log.error("worker %s: %s during the grace period; stopping at once (the sweeper recovers unfinished tasks)", w.id, name)
        for h in logging.getLogger().handlers:
            h.flush()
        os._exit(EXIT_FORCED)

    with StopSignals(on_signal) as signals:
        w.start()
        if sweeper is not None:
            sweeper.start()
        log.info(
            "worker %s started: store=%s concurrency=%d queues=%s chunk_size=%d grace=%gs sweep=%s tasks=%s",
            w.id, getattr(app.store, "url", "?"), concurrency, ",".join(queue_list), chunk_size, grace,
            "on" if sweeper else "off", ",".join(sorted(app.registry)),
        )
        while phase["now"] == "running":
            signals.wait()
        if sweeper is not None:
            sweeper.stop()
        t0 = time.monotonic()
        clean = w.stop(grace)
        phase["now"] = "stopped"
        log.info(
            "worker %s stopped after %.1fs: %s", w.id, time.monotonic() - t0,
            "all in-flight tasks finished" if clean else "unfinished tasks handed back to the queue",
        )
    # The store is left open: the worker's daemon threads may still be in a
    # store call (Worker.stop does not join them); the process exit closes it.


# ---- sweep --------------------------------------------------------------------------------
@click.command()
@store_option
@click.option("--loop", is_flag=True, help="Keep sweeping every --interval until SIGTERM (one leader across the fleet).")
@click.option("--interval", default="30s", show_default=True, help="Time between passes with --loop.")
@click.option("--stale-pending-age", default="24h", show_default=True, help="Cancel PENDING tasks older than this ('off' to keep them).")
@click.option("--max-rows", type=click.IntRange(min=1), default=1000, show_default=True, help="At most this many tasks changed per pass.")
@log_level_option
@json_option
def sweep(store_url, loop, interval, stale_pending_age, max_rows, log_level, as_json):
    """Recover what crashed workers left: one pass, or --loop.

    A RUNNING task whose lease expired is retried (failed when it has no
    retry left); one running past twice its timeout is failed; a PENDING
    task due longer ago than --stale-pending-age is canceled. Every change
    is guarded, so sweepers racing each other change a task at most once.
    """
    from corral.maintenance import Sweeper

    stale = None if stale_pending_age.strip().lower() in ("off", "none", "never") else duration_arg(stale_pending_age, "--stale-pending-age")
    every = duration_arg(interval, "--interval")
    if every <= 0:
        raise CLIError("--interval must be > 0")
    store = open_given_store(store_url)
    url = store_url_of(store_url)
    if not loop:
        report = store.sweep(stale_pending_age=stale, max_rows=max_rows)
        if as_json:
            render.print_json(render.sweep_dict(report))
        else:
            click.echo(render.sweep_line(url, report))
        return
    _setup_logging(log_level)
    sweeper = Sweeper(store, interval=every, stale_pending_age=stale, max_rows=max_rows)
    with StopSignals() as signals:
        sweeper.start()
        log.info("sweeper %s started: store=%s interval=%gs stale_pending_age=%s", sweeper.holder,
                 url, every, "off" if stale is None else f"{stale:g}s")
        signals.wait()
        sweeper.stop()
        log.info("sweeper %s stopped after %d tick(s)", sweeper.holder, sweeper.ticks)

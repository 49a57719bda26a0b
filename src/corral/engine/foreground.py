"""Running a worker in the foreground until it is told to stop.

The one place that turns signals into a worker's life cycle, used by
``App.run`` and therefore by ``corral worker``:

- the first SIGTERM or SIGINT stops claiming and gives in-flight tasks
  ``grace`` seconds to finish; what does not finish is handed back;
- a second one during the grace period ends the process at once with
  :data:`EXIT_FORCED` (the sweeper recovers its tasks when their leases
  expire);
- a worker that stopped claiming because too many of its timed-out threads
  still run (``Worker.halted``) is stopped the same way as by a first signal,
  and the process exits with :data:`EXIT_ABANDONED`: only a process exit
  ends a thread, so its supervisor should restart it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from corral.engine.worker import Worker

log = logging.getLogger("corral.worker")

#: Exit code of a worker stopped at once by a second signal during its grace period.
EXIT_FORCED = 3
#: Exit code of a worker that stopped because too many timed-out threads still ran.
EXIT_ABANDONED = 4


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
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_w.setblocking(False)
        self._old = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._wake_r.close()
        self._wake_w.close()

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.on_signal is not None:
            self.on_signal(signal.Signals(signum).name)
        try:
            self._wake_w.send(b"\0")
        except OSError:  # the buffer is full: the waiter has bytes to read anyway
            pass

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a signal has been handled (at once if one already was),
        or ``timeout`` seconds; True if a signal came."""
        ready, _, _ = select.select([self._wake_r], [], [], timeout)
        if ready:
            self._wake_r.recv(4096)
        return bool(ready)


def run_until_signal(
    worker: Worker,
    *,
    grace: float,
    sweeper: Any = None,
    until: Callable[[], bool] | None = None,
    check_every: float = 0.2,
) -> bool:
    """Start ``worker`` (and ``sweeper``), run until a signal or ``until()``
    says so, then stop them. Returns True if nothing had to be handed back.

    Signal handlers are installed only on the main thread (Python allows no
    other); elsewhere only ``until`` ends the run."""
    state = {"phase": "running"}

    def on_signal(name: str) -> None:
        if state["phase"] == "running":
            state["phase"] = "stopping"
            log.info(
                "worker %s: %s received; stopping claims, %gs grace for %d in flight",
                worker.id,
                name,
                grace,
                worker.busy,
            )
            return
        log.error(
            "worker %s: %s during the grace period; stopping at once (the sweeper recovers unfinished tasks)",
            worker.id,
            name,
        )
        for h in logging.getLogger().handlers:
            h.flush()
        os._exit(EXIT_FORCED)

    on_main = threading.current_thread() is threading.main_thread()
    with StopSignals(on_signal) if on_main else contextlib.nullcontext() as signals:
        worker.start()
        if sweeper is not None:
            sweeper.start()
        log.info(
            "worker %s started: store=%s concurrency=%d prefetch=%s queues=%s chunk_size=%s grace=%gs"
            " sweep=%s tasks=%s periodic=%s",
            worker.id,
            getattr(worker.store, "url", "?"),
            worker.concurrency,
            "auto" if worker.prefetch_given is None else worker.prefetch_given,
            ",".join(worker.queues),
            "auto" if worker.chunk_size is None else worker.chunk_size,
            grace,
            f"every {worker.sweep_interval:g}s" if worker.sweep_interval else "off" if sweeper is None else "on",
            ",".join(sorted(worker.registry)),
            ",".join(s.name for s in worker.schedules) or "none",
        )
        while state["phase"] == "running" and worker.fatal is None:
            if worker.halted.is_set() or (until is not None and until()):
                break
            if signals is not None:
                signals.wait(check_every)
            else:
                time.sleep(check_every)
        state["phase"] = "stopping"  # a signal from here on is a second one
        if sweeper is not None:
            sweeper.stop()
        t0 = time.monotonic()
        clean = worker.stop(grace)
        state["phase"] = "stopped"
        log.info(
            "worker %s stopped after %.1fs: %s",
            worker.id,
            time.monotonic() - t0,
            "all in-flight tasks finished" if clean else "unfinished tasks handed back to the queue",
        )
        if worker.fatal is not None:
            # the store cannot be used, or a worker thread failed: `corral worker` exits 1 with this line
            raise worker.fatal
    if worker.halted.is_set():
        log.error(
            "worker %s: exiting with code %d so that its supervisor restarts it and its timed-out threads end",
            worker.id,
            EXIT_ABANDONED,
        )
        raise SystemExit(EXIT_ABANDONED)
    return clean

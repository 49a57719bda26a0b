"""Running a worker in the foreground until it is told to stop.

The one place that turns signals into a worker's life cycle, used by
``App.run`` and therefore by ``corral worker``:

- the first SIGTERM or SIGINT stops claiming and gives in-flight tasks
  ``grace`` seconds to finish; what does not finish is handed back;
- a second one during the grace period ends the process at once with
  :data:`EXIT_FORCED` (the sweeper recovers its tasks when their leases
  expire).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from corral.engine.worker import Worker

log = logging.getLogger("corral.worker")

#: Exit code of a worker stopped at once by a second signal during its grace period.
EXIT_FORCED = 3
_SIGNALS = (signal.SIGTERM, signal.SIGINT)


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
    # The handler only flips the phase: taking a lock inside a signal handler
    # can deadlock against the code it interrupted.
    state = {"phase": "running"}

    def on_signal(signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        if state["phase"] == "running":
            state["phase"] = "stopping"
            log.info("worker %s: %s received; stopping claims, %gs grace for %d in flight",
                     worker.id, name, grace, worker.busy)
            return
        log.error("worker %s: %s during the grace period; stopping at once "
                  "(the sweeper recovers unfinished tasks)", worker.id, name)
        for h in logging.getLogger().handlers:
            h.flush()
        os._exit(EXIT_FORCED)

    old: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        old = {s: signal.signal(s, on_signal) for s in _SIGNALS}
    try:
        worker.start()
        if sweeper is not None:
            sweeper.start()
        log.info(
            "worker %s started: store=%s concurrency=%d queues=%s chunk_size=%d grace=%gs sweep=%s tasks=%s",
            worker.id, getattr(worker.store, "url", "?"), worker.concurrency, ",".join(worker.queues),
            worker.chunk_size, grace, "on" if sweeper is not None else "off", ",".join(sorted(worker.registry)),
        )
        while state["phase"] == "running":
            if until is not None and until():
                break
            time.sleep(check_every)
        if sweeper is not None:
            sweeper.stop()
        t0 = time.monotonic()
        clean = worker.stop(grace)
        state["phase"] = "stopped"
        log.info(
            "worker %s stopped after %.1fs: %s", worker.id, time.monotonic() - t0,
            "all in-flight tasks finished" if clean else "unfinished tasks handed back to the queue",
        )
        return clean
    finally:
        for s, h in old.items():
            signal.signal(s, h)

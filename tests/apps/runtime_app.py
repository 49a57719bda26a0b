"""Task app for the worker-process tests of the runtime: a process task that
records its pid and never returns, and a thread task that hangs past its timeout.

Run as ``python -m corral worker tests.apps.runtime_app:app --store URL``.
"""

from __future__ import annotations

import os
import threading
import time

import corral

app = corral.App(os.environ.get("CORRAL_STORE"))


@app.task(isolation="process")
def hold_in_child(pidfile: str) -> None:
    """Write this child's pid, then run until killed (the workload, not a wait)."""
    with open(pidfile + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(pidfile + ".tmp", pidfile)
    while True:
        time.sleep(0.05)


@app.task(timeout=0.3)
def hang_in_thread() -> None:
    """Block far past the timeout: a thread the worker cannot stop."""
    threading.Event().wait(3600)

"""Worker app of the periodic fleet test: cron time comes from a file the test writes.

Run as a worker process: ``python tests/apps/periodic_app.py`` with
CORRAL_STORE, CLOCK_FILE (epoch seconds, moved by the test) and RUNS_LOG
(each run appends its task id) set. A run the kill cuts short is retried
when its lease runs out. Only the periodic loop reads the file
clock: the store keeps the real one, so leases and the sweeper behave as in
production while the test decides when each tick comes.
"""

from __future__ import annotations

import os
import time

import corral
from corral.stores import open_store

CLOCK_FILE = os.environ.get("CLOCK_FILE", "clock.txt")
RUNS_LOG = os.environ.get("RUNS_LOG", "runs.log")


class FileClock:
    """Wall time read from CLOCK_FILE (what the test wrote last); real monotonic time."""

    def time(self) -> float:
        with open(CLOCK_FILE) as f:
            return float(f.read().strip() or 0)

    def monotonic(self) -> float:
        return time.monotonic()


store = open_store(os.environ.get("CORRAL_STORE"))
app = corral.App(store, clock=FileClock())


@app.periodic("* * * * *", name="every_minute", retries=3)
def every_minute(ctx) -> int:
    fd = os.open(RUNS_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{ctx.task_id}\n".encode())
    finally:
        os.close(fd)
    return ctx.task_id


if __name__ == "__main__":
    print("worker ready", flush=True)
    app.run(
        2,
        grace=1.0,
        lease_seconds=2.0,
        heartbeat_interval=0.3,
        sweep_interval=0.5,
        periodic_interval=0.02,
        poll_interval=0.05,
    )

"""Task app for the crash test: every execution is recorded outside corral.

Run as a worker process: ``python tests/apps/crash_app.py`` with CORRAL_STORE
and CRASH_LOG set. Each execution records its start and end in the history
file CRASH_LOG (:class:`corral.testing.HistoryLog`), shared by every worker.
"""

from __future__ import annotations

import os
import threading
import time

import corral
from corral.testing import HistoryLog

app = corral.App(os.environ.get("CORRAL_STORE"))
history = HistoryLog(os.environ.get("CRASH_LOG", "crash.log"))


@app.task(retries=5, backoff=corral.Backoff(base=0.01, cap=0.1))
def step(ctx, group: str, seq: int, dur: float) -> int:
    history.start(ctx.task_id, ctx.group, lease=str(ctx.attempt))
    time.sleep(dur)
    history.end(ctx.task_id, lease=str(ctx.attempt))
    return seq


if __name__ == "__main__":
    app.worker(
        8,
        chunk_size=4,
        lease_seconds=1.0,
        heartbeat_interval=0.2,
        sweep_interval=0.25,
        poll_interval=0.1,
    ).start()
    threading.Event().wait()

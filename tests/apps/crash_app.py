"""Task app for the crash test: every execution is recorded outside corral.

Run as a worker process: ``python tests/apps/crash_app.py`` with CORRAL_STORE
and CRASH_LOG set. Each execution appends a start line and an end line
(``S|E pid group seq time``) to CRASH_LOG with O_APPEND, so lines from
several processes never interleave.
"""

from __future__ import annotations

import os
import threading
import time

import corral

app = corral.App(os.environ.get("CORRAL_STORE"))
LOG = os.environ.get("CRASH_LOG", "crash.log")


def _record(kind: str, group: str, seq: int) -> None:
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{kind} {os.getpid()} {group} {seq} {time.time():.6f}\n".encode())
    finally:
        os.close(fd)


@app.task(retries=5, backoff=corral.Backoff(base=0.01, cap=0.1))
def step(group: str, seq: int, dur: float) -> int:
    _record("S", group, seq)
    time.sleep(dur)
    _record("E", group, seq)
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

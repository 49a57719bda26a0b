"""Task app for the fault tests: every run is recorded in a shared history.

Run as a worker process: ``python tests/apps/history_app.py`` with
CORRAL_STORE and HISTORY_LOG set (WORKER_OPTIONS: JSON keyword arguments of
the worker). Each run of ``step``, ``slow``, ``push`` (under the keyed
limit ``merchant``) and ``call`` (under the limit ``live``) records its start and end
through :class:`corral.testing.HistoryLog`; logs go to stderr.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time

import corral
from corral.testing import HistoryLog

app = corral.App(os.environ.get("CORRAL_STORE"))
history = HistoryLog(os.environ.get("HISTORY_LOG", "history.jsonl"))


@app.task(retries=5, backoff=corral.Backoff(base=0.01, cap=0.1))
def step(ctx, group: str, seq: int, dur: float, fail_first: bool = False, first_dur: float | None = None) -> int:
    history.start(ctx.task_id, ctx.group, lease=str(ctx.attempt))
    try:
        time.sleep(first_dur if first_dur is not None and ctx.attempt == 1 else dur)
        if fail_first and ctx.attempt == 1:
            raise ConnectionError("first attempt fails")
    finally:
        history.end(ctx.task_id, lease=str(ctx.attempt))
    return seq


@app.task(retries=3)
def slow(ctx, first_run: float) -> int:
    """Runs ``first_run`` seconds on its first attempt, at once after."""
    history.start(ctx.task_id, ctx.group, lease=str(ctx.attempt))
    time.sleep(first_run if ctx.attempt == 1 else 0)
    history.end(ctx.task_id, lease=str(ctx.attempt))
    return os.getpid()


app.limit("merchant", concurrency=2, per_key=True)


@app.task(limits=["merchant"], limit_key="merchant")
def push(ctx, merchant: str, dur: float) -> int:
    """A call to a merchant's API: at most two at once per merchant."""
    history.start(ctx.task_id, None, lease=str(ctx.attempt))
    time.sleep(dur)
    history.end(ctx.task_id, lease=str(ctx.attempt))
    return os.getpid()


app.limit("live", concurrency=4)


@app.task(limits=["live"])
def call(ctx, dur: float) -> int:
    """A call under the plain limit ``live``, which tests change while it runs."""
    history.start(ctx.task_id, None, lease=str(ctx.attempt))
    time.sleep(dur)
    history.end(ctx.task_id, lease=str(ctx.attempt))
    return os.getpid()


@app.task
def otp(ctx, dur: float) -> int:
    """A code sent if it is still worth sending (submitted with expires=)."""
    history.start(ctx.task_id, None, lease=str(ctx.attempt))
    time.sleep(dur)
    history.end(ctx.task_id, lease=str(ctx.attempt))
    return os.getpid()


@app.task
def noop(ctx) -> int:
    history.start(ctx.task_id, ctx.group, lease=str(ctx.attempt))
    history.end(ctx.task_id, lease=str(ctx.attempt))
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    options = json.loads(os.environ.get("WORKER_OPTIONS", "{}"))
    options.setdefault("concurrency", 4)
    app.worker(**options).start()
    print("worker ready", flush=True)
    threading.Event().wait()

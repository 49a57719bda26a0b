"""How one task body runs: in the slot's thread, on an event loop, or in a child process.

Only the process executor can be stopped from outside: Python threads cannot
be killed safely, so a timed-out thread task is abandoned (the worker keeps
its task leased until the thread ends).

A child process dies with its worker: were it to outlive a killed worker, the
sweeper would re-queue its task once the lease expired and another worker
would run it while the orphan still ran. On Linux the kernel kills the child
when the worker goes (``PR_SET_PDEATHSIG``); everywhere, a thread in the
child ends it when its pipe to the worker breaks or it is re-parented.
"""

from __future__ import annotations

import asyncio
import ctypes
import multiprocessing
import os
import select
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from corral.core import texts
from corral.core.model import dumps, loads
from corral.core.retries import DEFAULT_PERMANENT, is_retryable
from corral.core.validation import DEFAULT_MAX_PAYLOAD_BYTES
from corral.engine.context import CheckpointView
from corral.errors import Canceled, ChildFailed, PermanentError, Retry


class _LoopThread:
    """One event loop per worker for ``async def`` tasks."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="corral-async", daemon=True)
        self._thread.start()

    def run(self, coro, on_future=None) -> Any:
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        if on_future is not None:
            on_future(fut)
        return fut.result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)


_loop: _LoopThread | None = None
_loop_lock = threading.Lock()


def run_async(coro, on_future=None) -> Any:
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = _LoopThread()
    return _loop.run(coro, on_future)


# ---- process isolation -------------------------------------------------------


class _ChildContext(CheckpointView):
    """The ``ctx`` a child process sees: calls travel to the parent over a pipe."""

    def __init__(
        self,
        conn,
        task_id,
        trace_id,
        attempt,
        checkpoints,
        span_id=None,
        upstream=(),
        max_payload_bytes=DEFAULT_MAX_PAYLOAD_BYTES,
    ):
        self._conn = conn
        self.max_payload_bytes = max_payload_bytes
        self._ups = upstream  # read by the worker before the fork
        self.task_id = task_id
        self.trace_id = trace_id
        self.attempt = attempt
        self._span_id = span_id
        self.canceled = False
        self.cancelled = False  # the earlier spelling
        self._checkpoint = checkpoints
        import logging

        self.log = logging.LoggerAdapter(
            logging.getLogger("corral.task"), {"trace_id": trace_id, "task_id": task_id, "attempt": attempt}
        )

    def check_canceled(self) -> None:  # the parent kills us on cancel
        return None

    def _upstream(self):
        return self._ups

    check_cancelled = check_canceled

    def progress(self, fraction: float, message: str | None = None) -> None:
        self._conn.send(("progress", float(fraction), texts.progress_message(message)))

    def checkpoint(self, stage: str, data: Any = None) -> None:
        text = self._checked_checkpoint(stage, data)
        self._conn.send(("checkpoint", stage, text))


#: Exit code of a child that ended itself because its worker was gone.
EXIT_ORPHANED = 70
_PR_SET_PDEATHSIG = 1
#: How often the child's watcher looks for a change of parent (its pipe wakes it at once).
_WATCH_EVERY = 0.5


def _die_with_parent(parent_pid: int, conn: Any) -> None:
    """Make this child end when the worker that forked it ends, however it ends."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # no usable libc: the watcher below still ends the child
            pass
    # The worker may have died before prctl took effect: the signal would never come.
    if os.getppid() != parent_pid:
        os._exit(EXIT_ORPHANED)
    threading.Thread(
        target=_watch_parent, args=(parent_pid, conn.fileno()), name="corral-parent-watch", daemon=True
    ).start()


def _watch_parent(parent_pid: int, fd: int) -> None:
    """End the child when the worker's end of its pipe closes (the pipe reports
    an error to its writer once no reader is left) or it is re-parented.
    Re-parenting is also checked because a sibling child may hold a copy of
    the worker's end, inherited at its fork."""
    poller = select.poll()
    poller.register(fd, 0)  # errors and hang-ups are always reported
    while True:
        events = poller.poll(_WATCH_EVERY * 1000)
        if any(ev & select.POLLNVAL for _, ev in events):
            return  # the child closed the pipe itself: it is finishing
        if events or os.getppid() != parent_pid:
            os._exit(EXIT_ORPHANED)


def _child_main(conn, parent_pid, fn, takes_ctx, args, kwargs, meta, rules) -> None:
    _die_with_parent(parent_pid, conn)
    os.setpgrp() if hasattr(os, "setpgrp") else None
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        if takes_ctx:
            ctx = _ChildContext(conn, *meta)
            value = fn(ctx, *args, **kwargs)
        else:
            value = fn(*args, **kwargs)
        if asyncio.iscoroutine(value):
            value = asyncio.run(value)
        conn.send(("ok", dumps(value)))
    except Retry as exc:
        conn.send(("retry", exc.after, str(exc)))
    except BaseException as exc:  # noqa: BLE001 - everything must reach the parent
        retryable = is_retryable(exc, *rules)
        only = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        conn.send(("error", type(exc).__name__, "".join(traceback.format_exception(exc)), retryable, only))
    finally:
        conn.close()


class ProcessRun:
    """One task body in a forked child that the worker can kill."""

    _ctx = multiprocessing.get_context("fork")

    def __init__(
        self,
        fn: Callable,
        takes_ctx: bool,
        args,
        kwargs,
        meta,
        on_message: Callable,
        *,
        retry_on: tuple[type[BaseException], ...] | None = None,
        permanent_on: tuple[type[BaseException], ...] = DEFAULT_PERMANENT,
    ):
        self._parent, child = self._ctx.Pipe(duplex=False)
        self._on_message = on_message
        self.killed_for: str | None = None
        rules = (retry_on, permanent_on)  # the child judges its error by the task's own rules
        # The kernel's death signal follows the thread that forks: the slot
        # thread, which waits here for the child to end.
        self.proc = self._ctx.Process(
            target=_child_main, args=(child, os.getpid(), fn, takes_ctx, args, kwargs, meta, rules), daemon=True
        )
        self.proc.start()
        child.close()

    def kill(self, why: str) -> None:
        """Kill the child and every process it started: the child leads its
        own process group (``setpgrp`` at its start), so a task's own
        subprocesses do not outlive its timeout or cancel."""
        self.killed_for = why
        pid = self.proc.pid
        if pid is not None and hasattr(os, "killpg"):
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:  # no such group yet (killed before its setpgrp) or already gone
                pass
        try:
            self.proc.kill()
        except (OSError, ValueError):  # already gone, or already closed
            pass

    def wait(self, deadline_s: float | None) -> Any:
        """Return the body's result; raise its exception, or Canceled/TimeoutError when killed."""
        import time

        end = None if deadline_s is None else time.monotonic() + deadline_s
        while True:
            remaining = None if end is None else end - time.monotonic()
            if remaining is not None and remaining <= 0 and self.killed_for is None:
                self.kill("timeout")
            if self.killed_for is not None:
                self.proc.join(5)
                if self.killed_for == "cancel":
                    raise Canceled("killed on cancel")
                raise TimeoutError("killed on timeout")
            wait = 0.05 if remaining is None else max(0.0, min(0.05, remaining))
            if self._parent.poll(wait):
                try:
                    msg = self._parent.recv()
                except EOFError:
                    self.proc.join(5)
                    if self.killed_for is not None:
                        continue
                    raise ChildFailed(
                        "ChildDied", f"child process exited with code {self.proc.exitcode}", True
                    ) from None
                kind = msg[0]
                if kind == "ok":
                    self.proc.join(5)
                    return loads(msg[1])
                if kind == "retry":
                    self.proc.join(5)
                    raise Retry(after=msg[1], reason=msg[2])
                if kind == "error":
                    self.proc.join(5)
                    if not msg[3]:
                        err = PermanentError(msg[2].strip().splitlines()[-1])
                        err.child_traceback = msg[2]  # type: ignore[attr-defined]  # kept by the outcome
                        raise err
                    raise ChildFailed(msg[1], msg[2], msg[3], error=msg[4])
                self._on_message(msg)
            elif not self.proc.is_alive() and not self._parent.poll(0):
                if self.killed_for is not None:
                    continue
                raise ChildFailed("ChildDied", f"child process exited with code {self.proc.exitcode}", True)

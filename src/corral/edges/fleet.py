"""Worker processes started as a user starts them: ``corral worker APP``.

The demo and the benchmarks that measure what a user gets run their tasks in
real ``corral worker`` processes; this starts them, waits until each has said
it started, reports one that died, and stops them with SIGTERM (their drain)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any


def lazy_app(build: Callable[[], Any]) -> Callable[[str], Any]:
    """A module ``__getattr__`` whose ``app`` is built on first access, so
    importing the module (``corral worker module:app``) opens no store until
    the worker asks for the app."""
    built: list[Any] = []

    def __getattr__(name: str) -> Any:
        if name != "app":
            raise AttributeError(name)
        if not built:
            built.append(build())
        return built[0]

    return __getattr__


class WorkerFleet:
    """``n`` ``corral worker APP_SPEC --store URL -c SLOTS`` processes (``slots``
    None: the command's default)."""

    def __init__(self, app_spec: str, url: str, n: int, slots: int | None, env: Mapping[str, str] | None = None):
        self.app_spec, self.url, self.n, self.slots = app_spec, url, n, slots
        self.env = dict(env or {})
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Any] = []
        #: the workers killed on purpose (:meth:`kill`): their exit is not a failure
        self.killed: set[int] = set()

    def __enter__(self) -> WorkerFleet:
        env = {**os.environ, **self.env}
        for _ in range(self.n):
            log = tempfile.TemporaryFile(mode="w+")
            self.logs.append(log)
            cmd = [sys.executable, "-m", "corral", "worker", self.app_spec, "--store", self.url]
            if self.slots is not None:
                cmd += ["-c", str(self.slots)]
            cmd += ["--grace", "10"]
            self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=log, env=env, stdin=subprocess.DEVNULL))
        return self

    def _text(self, k: int) -> str:
        log = self.logs[k]
        log.flush()
        log.seek(0)
        return log.read()

    def log_text(self, k: int) -> str:
        """What worker ``k`` (from 0) has logged so far."""
        return self._text(k)

    def kill(self, k: int) -> None:
        """SIGKILL worker ``k``: a crash, no drain (its leases expire, its leadership lapses)."""
        self.killed.add(k)
        self.procs[k].kill()
        self.procs[k].wait()

    def check(self) -> None:
        """Raise if a worker has exited (with the end of its log), unless killed on purpose."""
        for k, p in enumerate(self.procs):
            if k not in self.killed and p.poll() is not None:
                tail = " | ".join(self._text(k).strip().splitlines()[-3:])
                raise RuntimeError(f"worker process {k + 1} exited with status {p.returncode}: {tail}")

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until every worker has logged that it started."""
        end = time.monotonic() + timeout
        waiting = set(range(self.n))
        while waiting:
            self.check()
            waiting = {k for k in waiting if " started: " not in self._text(k)}
            if waiting and time.monotonic() > end:
                raise RuntimeError(f"{len(waiting)} worker process(es) did not start within {timeout:g}s")
            time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for log in self.logs:
            log.close()

"""Processes the tests start: workers and commands that run on.

Every test that starts a worker process (or a `corral` command that keeps
running) does it through :class:`Process`: the child sees this test run's
``sys.path``, the store URL it is given (and no ``CORRAL_STORE`` inherited
from the shell), writes its output to a log file the test can read, and is
killed when the test ends, whatever happened. :class:`AppWorker` is a worker
of ``tests/apps/history_app.py``, whose runs the fault tests check.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from helpers import wait_for

TESTS = Path(__file__).parent
APPS = TESTS / "apps"
APP = APPS / "history_app.py"
#: The corral command line, as a child process runs it.
CORRAL = (sys.executable, "-m", "corral")


def child_env(store: str | None = None, **extra: object) -> dict[str, str]:
    """The environment of a child process: this run's import path, ``store``
    as CORRAL_STORE (none inherited) and ``extra`` variables."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("CORRAL_STORE", None)
    if store is not None:
        env["CORRAL_STORE"] = store
    env.update({k: str(v) for k, v in extra.items()})
    return env


class Process:
    """A child process of a test, its output (stdout and stderr, unless
    ``stdout`` is given: then stderr alone) appended to ``log``."""

    def __init__(
        self,
        argv: Sequence[str | Path],
        log: Path,
        *,
        store: str | None = None,
        env: dict[str, object] | None = None,
        cwd: Path | None = None,
        stdout: int | None = None,
    ):
        self.log_path = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [str(a) for a in argv],
                env=child_env(store, **(env or {})),
                cwd=cwd,
                stdout=out if stdout is None else stdout,
                stderr=subprocess.STDOUT if stdout is None else out,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait_log(self, text: str, timeout: float = 30) -> None:
        """Wait until ``text`` is in the log; fail at once if the process ended first."""
        wait_for(lambda: text in self.log or not self.running(), timeout=timeout, message=f"{text!r} logged")
        assert text in self.log, self.log

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 20) -> int:
        """Wait for the end; its exit code (fails, showing the log, if it runs on)."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout}s: {self.proc.args}\n{self.log}") from None

    def stop(self, timeout: float = 20) -> int:
        """SIGTERM, then wait for the end; its exit code."""
        self.signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> None:
        """kill -9 (if still running), and wait for the end."""
        if self.running():
            self.proc.kill()
        self.proc.wait(10)

    def close(self) -> None:
        self.kill()


class AppWorker(Process):
    """One worker process of the history app (``tests/apps/history_app.py``):
    its runs recorded in ``history``, ``options`` the worker's keyword arguments.
    ``pid`` is the worker's name in the history (a string)."""

    def __init__(self, url: str, history: Path, log: Path, **options):
        super().__init__(
            [sys.executable, APP], log, store=url, env={"HISTORY_LOG": history, "WORKER_OPTIONS": json.dumps(options)}
        )

    @property
    def pid(self) -> str:  # type: ignore[override]
        return str(self.proc.pid)

    def wait_ready(self, timeout: float = 30) -> None:
        self.wait_log("worker ready", timeout)


class Processes:
    """The processes a test started (see the ``processes`` fixture)."""

    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.all: list[Process] = []

    def start(self, argv: Sequence[str | Path], name: str = "process", **kwargs) -> Process:
        p = Process(argv, self.tmp_path / f"{name}.log", **kwargs)
        self.all.append(p)
        return p

    def worker(self, url: str, history: Path, name: str = "worker", **options) -> AppWorker:
        w = AppWorker(url, history, self.tmp_path / f"{name}.log", **options)
        self.all.append(w)
        return w

    def close(self) -> None:
        for p in self.all:
            p.close()

"""The skeleton of a maintenance loop: one step every ``interval`` seconds on
a daemon thread, until stopped. A step that fails (a store outage) is logged
and tried again at the next turn: maintenance must outlive an outage."""

from __future__ import annotations

import logging
import threading
from typing import Self


class Loop:
    """Subclasses set ``interval`` and define :meth:`step`; ``thread_name``
    names the thread and ``what`` the step in the log."""

    thread_name = "corral-loop"
    what = "step"
    interval: float
    log: logging.Logger = logging.getLogger("corral")

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def step(self) -> object:
        raise NotImplementedError

    def run(self) -> None:
        """Step until :meth:`stop` (a failing step skips one turn)."""
        while not self._stop.is_set():
            try:
                self.step()
            except Exception as exc:  # noqa: BLE001 - an outage must not end the loop
                self.log.warning("%s failed, will try again: %s", self.what, exc)
            self._stop.wait(self.interval)

    def start(self) -> Self:
        """Run the loop in a daemon thread; returns at once."""
        if self._thread is None:
            self._thread = threading.Thread(target=self.run, name=self.thread_name, daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float | None = 5.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

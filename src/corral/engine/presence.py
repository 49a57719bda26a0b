"""A worker process's row in the store: who it is, what it serves and how busy
it is, written every few seconds and deleted when it stops cleanly.

``corral workers`` and the dashboard's Workers page read these rows with the
tasks each worker holds (:mod:`corral.core.workers`): a row gone silent, or a
held task whose lease ran out, is a dead worker's, shown until the sweeper has
taken its leases back and forgets it (:meth:`corral.stores.base.Store.forget_workers`).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Sequence
from importlib import metadata

from corral.core.model import WorkerInfo
from corral.errors import StoreError
from corral.stores.base import Store

log = logging.getLogger("corral.worker")


def corral_version() -> str:
    """The installed corral's version ("unknown" when run from a source tree without metadata)."""
    try:
        return metadata.version("corral")
    except metadata.PackageNotFoundError:
        return "unknown"


class Presence:
    """Writes ``store``'s row of one worker every ``every`` seconds (real
    time) on a daemon thread, with ``in_use()`` as its slots in use, and
    deletes it on :meth:`stop`."""

    def __init__(
        self,
        store: Store,
        worker_id: str,
        *,
        queues: Sequence[str],
        slots: int,
        in_use: Callable[[], int],
        every: float,
    ):
        self.store = store
        self.every = every
        self._in_use = in_use
        self._info = WorkerInfo(
            id=worker_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            queues=tuple(queues),
            slots=slots,
            in_use=0,
            version=corral_version(),
            beat_every=every,
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def report(self) -> bool:
        """Write the row once; False when the store could not take it (the next beat tries again)."""
        info = self._info
        try:
            self.store.report_worker(
                WorkerInfo(
                    info.id, info.host, info.pid, info.queues, info.slots, self._in_use(), info.version, info.beat_every
                )
            )
            return True
        except NotImplementedError:
            self._stop.set()  # a store that keeps no worker rows: nothing to report
            return False
        except StoreError as exc:
            log.debug("worker %s: its report failed: %s", info.id, exc)
            return False

    def start(self) -> Presence:
        self.report()
        self._thread = threading.Thread(target=self._run, name="corral-presence", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.report()

    def stop(self) -> None:
        """Stop reporting and delete the row: a clean stop is not a dead worker."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self.store.remove_worker(self._info.id)
        except (StoreError, NotImplementedError):
            pass  # the row goes silent instead; the sweeper forgets it


__all__ = ["Presence", "corral_version"]

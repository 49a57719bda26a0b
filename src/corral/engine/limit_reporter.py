"""A worker's reports of its adaptive limits (docs/adaptive-limits.md).

The slots tell the reporter when a task naming an adaptive limit starts and
how it ended (:meth:`LimitReporter.started`, :meth:`LimitReporter.ended`):
counts in memory, one :class:`~corral.core.adaptive.ReportAccumulator` per
limit, never a write per task. About once a second, just after each whole
second of the wall clock, a daemon thread sends what was counted to the
store in one write (:meth:`corral.stores.base.Store.report_limits`); the
sweeper's leader takes the reports and runs the controller
(:mod:`corral.maintenance.adaptive_keeper`). A worker with nothing counted
writes nothing. Which limits are adaptive is read from the store every few
seconds, so a limit declared adaptive while the worker runs is counted too.

What a task's end says to the controller (:func:`signal`): a success (with
its latency), a throttle (``Retry(after=)``, a 429 or 503: the partner
refused for load; the task runs again later and burns no attempt when it
raised ``Retry`` or a 429 with Retry-After), or an error load can cause
(timeouts, connection errors, other 5xx: what a breaker counts). A bad
input, a bug or a cancel says nothing about the partner's load.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from corral.core.adaptive import MAX_KEY_STATES, LimitReport, ReportAccumulator, busiest_reports
from corral.core.breaker import counts_as_failure
from corral.core.gates import KEY_SEP, keyed_name, split_key
from corral.core.model import Outcome
from corral.core.retries import http_status
from corral.core.states import State
from corral.errors import Retry, StoreError
from corral.stores.base import Store

log = logging.getLogger("corral.worker")

#: Seconds between two reports.
REPORT_EVERY = 1.0
#: Reports go this far past each whole second of the wall clock; the
#: leader decides later in the second (adaptive_keeper.DECIDE_AT), so each
#: of its intervals holds one report of each worker.
REPORT_AT = 0.0
#: How often the worker reads which limits are adaptive.
REFRESH_EVERY = 5.0

SUCCESS, THROTTLE, ERROR = "success", "throttle", "error"


def signal(outcome: Outcome | None, exc: BaseException | None) -> str | None:
    """What an attempt's end says about the partner's load (None: nothing)."""
    if outcome is None or outcome.status is State.CANCELED:
        return None
    if outcome.status is State.SUCCESS:
        return SUCCESS
    if outcome.snooze or isinstance(exc, Retry) or (exc is not None and http_status(exc) in (429, 503)):
        return THROTTLE
    if outcome.status is State.TIMEOUT or counts_as_failure(exc, permanent=True):
        return ERROR
    return None


class LimitReporter:
    """One worker's counts per adaptive limit, sent once a second."""

    def __init__(
        self,
        store: Store,
        worker_id: str,
        *,
        every: float = REPORT_EVERY,
        refresh_every: float = REFRESH_EVERY,
        now: Callable[[], float] = time.monotonic,
    ):
        self.store = store
        self.id = worker_id
        self.every = every
        self.refresh_every = refresh_every
        self._now = now
        self._lock = threading.Lock()
        self._accs: dict[str, ReportAccumulator] = {}
        self._in_flight: dict[str, int] = {}
        self._adaptive: frozenset[str] = frozenset()
        self._read_at: float | None = None
        #: when the last report was taken: a key's counts made after it start from it
        self._taken_at = now()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: reports written (one write each, whatever the tasks counted)
        self.writes = 0

    # ---- the slots' side: counts in memory ---------------------------------------
    def started(self, limits: Sequence[str]) -> tuple[str, ...]:
        """A task naming ``limits`` starts here: the adaptive ones it counts under (pass them to :meth:`ended`)."""
        if not self._adaptive:
            return ()
        adaptive = self._adaptive
        # a keyed limit's task names its key's gate (``limit + KEY_SEP + key``): counted per key
        mine = tuple(n for n in limits if n in adaptive or (KEY_SEP in n and split_key(n)[0] in adaptive))
        if mine:
            with self._lock:
                for name in mine:
                    n = self._in_flight[name] = self._in_flight.get(name, 0) + 1
                    self._acc(name).started(n)
        return mine

    def ended(
        self, limits: tuple[str, ...], outcome: Outcome | None, exc: BaseException | None, seconds: float
    ) -> None:
        """The task :meth:`started` counted under ``limits`` ended after ``seconds``."""
        if not limits:
            return
        what = signal(outcome, exc)
        with self._lock:
            for name in limits:
                self._in_flight[name] = max(0, self._in_flight.get(name, 0) - 1)
                acc = self._acc(name)
                if what == SUCCESS:
                    acc.succeeded(seconds * 1000.0)
                elif what == THROTTLE:
                    acc.throttled()
                elif what == ERROR:
                    acc.failed()

    def _acc(self, name: str) -> ReportAccumulator:
        acc = self._accs.get(name)
        if acc is None:
            # a key counted again after a report without it covers the interval since that report
            since = self._taken_at if KEY_SEP in name else self._now()
            acc = self._accs[name] = ReportAccumulator(since)
        return acc

    # ---- the reporter's side: one write a second --------------------------------
    def refresh(self) -> None:
        """Read which limits are adaptive (counting under the others stops)."""
        try:
            names = frozenset(self.store.adaptive_limits())
        except NotImplementedError:
            names = frozenset()
        with self._lock:
            self._adaptive = names
            for gone in [n for n in self._accs if split_key(n)[0] not in names]:
                del self._accs[gone]
        self._read_at = self._now()

    def flush(self) -> bool:
        """Send what was counted since the last report (one write; none if nothing was)."""
        now = self._now()
        with self._lock:
            reports = {name: acc.take(now) for name, acc in self._accs.items()}
            self._taken_at = now
            busy = {name: n for name, n in self._in_flight.items() if n}
            # a key's counts are kept only while it has calls in flight: the keys met stay few in memory
            for name in [n for n in self._accs if KEY_SEP in n and not busy.get(n)]:
                del self._accs[name]
                self._in_flight.pop(name, None)
        for name, n in busy.items():  # calls still in flight were in flight in this interval too
            if name in reports and reports[name].peak_in_flight < n:
                reports[name] = replace(reports[name], peak_in_flight=n)
        live = {
            n: r for n, r in reports.items() if r.calls or r.successes or r.throttles or r.errors or r.peak_in_flight
        }
        sent = {n: r.to_dict() for n, r in _busiest_keys(live).items()}
        if not sent:
            return False
        self.store.report_limits(self.id, json.dumps(sent, separators=(",", ":"), sort_keys=True))
        self.writes += 1
        return True

    def tick(self) -> None:
        if self._read_at is None or self._now() - self._read_at >= self.refresh_every:
            self.refresh()
        if self._adaptive:
            self.flush()

    def start(self) -> LimitReporter:
        try:
            self.refresh()
        except StoreError as exc:
            log.debug("worker %s: reading the adaptive limits failed: %s", self.id, exc)
        self._thread = threading.Thread(target=self._run, name="corral-limit-reports", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self._until_next()):
            try:
                self.tick()
            except StoreError as exc:  # counted again from now: the next report covers less, not more
                log.debug("worker %s: its limit report failed: %s", self.id, exc)
            except NotImplementedError:
                return

    def _until_next(self) -> float:
        """Seconds to the next report: just past the next whole second of the wall clock."""
        if self.every != REPORT_EVERY:
            return self.every
        wall = time.time()
        return (REPORT_AT - wall) % 1.0 or 1.0

    def stop(self) -> None:
        """Send what is left and stop."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            if self._adaptive:
                self.flush()
        except (StoreError, NotImplementedError):
            pass


def _busiest_keys(reports: dict[str, LimitReport], top: int = MAX_KEY_STATES) -> dict[str, LimitReport]:
    """``reports`` with each keyed limit's keys cut to its ``top`` busiest
    (:func:`corral.core.adaptive.busiest_reports`): a report stays bounded
    however many keys the worker met. Plain limits' reports are all kept."""
    out = {n: r for n, r in reports.items() if KEY_SEP not in n}
    per: dict[str, dict[str, LimitReport]] = {}
    for name, report in reports.items():
        limit, key = split_key(name)
        if key is not None:
            per.setdefault(limit, {})[key] = report
    for limit, keys in per.items():
        for key, report in busiest_reports(keys, top).items():
            out[keyed_name(limit, key)] = report
    return out


__all__ = ["LimitReporter", "signal", "REPORT_EVERY"]

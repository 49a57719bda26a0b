"""The dashboard's view of the store, refreshed once a second by one thread.

Every page and every live stream reads the same snapshot, so ten open
browser tabs cost the store what one does: the live counts (partial indexes),
the limits, the level, and the tasks finished since the last look (the
``finished_at`` index), which feed the hour of per-minute charts in
:class:`corral.core.series.Series`.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from corral.core.levels import Level
from corral.core.series import STEP, WINDOW, Series
from corral.stores.base import Store

log = logging.getLogger("corral.dashboard")

#: Finished tasks read per look; past it the next look goes on where this one stopped.
BATCH = 5000
#: Finished tasks read at start to fill the hour (the newest ones, when more finished).
BACKFILL = 20_000
#: Counts of finished tasks stop this many seconds before now: a task whose
#: transaction commits a moment after the look still falls after the count.
LAG = 1.0


def fmt_rate(x: float | None) -> str:
    return "–" if x is None else f"{x:.1%}"


def fmt_seconds(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.2f} s"


class Sampler:
    """Reads the store every ``interval`` seconds (on a daemon thread) and keeps the snapshot."""

    def __init__(self, store: Store, interval: float = 1.0):
        self.store = store
        self.interval = interval
        self.series = Series()
        self._lock = threading.Lock()
        self._tick_lock = threading.Lock()  # one look at a time: the thread, or a page before its first look
        self._snapshot: dict[str, Any] = {}
        self._since: float | None = None  # finished_at of the newest finished task seen
        self._seen_at_since: dict[int, str] = {}  # its ids and states (ties on finished_at are read again)
        self._counts = True  # False: the store counts no finished tasks (finished_counts), rows are read
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ticks = 0

    # ---- one look ---------------------------------------------------------------
    def _take_finished(self, rows: list) -> None:
        fresh = [r for r in rows if not (r.finished_at == self._since and r.id in self._seen_at_since)]
        self.series.finished((r.status, r.started_at, r.finished_at) for r in fresh)
        for r in rows:
            if self._since is None or r.finished_at > self._since:
                self._since, self._seen_at_since = r.finished_at, {r.id: r.status}
            elif r.finished_at == self._since:
                self._seen_at_since[r.id] = r.status

    def _read_finished(self, now: float) -> None:
        """The tasks finished since the last look, a bounded amount: as rows
        while their minute keeps durations (the first :data:`MAX_DURATIONS`),
        then counted in the store by state, no row read (a worker fleet
        finishing thousands a second costs this process what a quiet one does)."""
        store = self.store
        for _ in range(10):
            since = self._since
            assert since is not None
            minute_end = (since // STEP + 1) * STEP
            if self._counts and not self.series.wants_durations(since):
                cut = min(now - LAG, minute_end)
                if cut <= since:
                    return
                try:
                    counts = store.finished_counts(since, cut)
                except NotImplementedError:
                    self._counts = False
                    continue
                # the tasks at ``since`` taken as rows already are counted again: take them out
                counts += [(since, status, -1) for status in self._seen_at_since.values()]
                self.series.counted(counts)
                self._since, self._seen_at_since = cut, {}
                if cut < minute_end:
                    return  # up to a moment ago
                continue  # a new minute: its durations, as rows
            rows = store.recent_finished(since, BATCH)
            self._take_finished(rows)
            if len(rows) < BATCH:
                return

    def tick(self) -> dict[str, Any]:
        """Look once; returns the new snapshot."""
        with self._tick_lock:
            return self._tick()

    def _tick(self) -> dict[str, Any]:
        store = self.store
        now = store.now()
        if self._since is None:
            rows = store.recent_finished(now - WINDOW, BACKFILL, newest_first=True)
            rows.reverse()
            self._since = now - WINDOW
            self._take_finished(rows)
        else:
            self._read_finished(now)
        counts = store.active_counts()
        usage = store.limit_usage()
        specs = store.limits()
        limits = {name: (usage.get(name, 0), spec.concurrency) for name, spec in specs.items()}
        depth = counts.get("PENDING", 0) + counts.get("RETRYING", 0)
        running = counts.get("RUNNING", 0)
        self.series.sample(now, running, depth, limits)
        try:
            lv = store.fleet_level()
            level = {"name": Level(lv.level).name, "value": lv.level, "manual": lv.manual, "reason": lv.reason}
        except NotImplementedError:
            level = {"name": "NORMAL", "value": 0, "manual": False, "reason": ""}
        rate, p99 = self.series.success_rate(now), self.series.p99(now)
        alerts = self.series.alerts(now)
        snap = {
            "at": now,
            "running": running,
            "depth": depth,
            "waiting": counts.get("WAITING", 0),
            "retrying": counts.get("RETRYING", 0),
            "success_rate": rate,
            "p99": p99,
            "shown": {
                "running": str(running),
                "depth": str(depth),
                "waiting": str(counts.get("WAITING", 0)),
                "retrying": str(counts.get("RETRYING", 0)),
                "success_rate": fmt_rate(rate),
                "p99": fmt_seconds(p99),
                "level": f"L{level['value']} {level['name']}",
                "alerts_firing": str(sum(a.firing for a in alerts)),
            },
            "level": level,
            "alerts": [{"name": a.name, "firing": a.firing, "summary": a.summary} for a in alerts],
            "points": [
                {"at": p.at, "running": p.running, "depth": p.depth, "success_rate": p.success_rate, "p99": p.p99}
                for p in self.series.points(now)
            ],
        }
        with self._lock:
            self._snapshot = snap
            self.ticks += 1
        return snap

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            snap = self._snapshot
        return snap or self.tick()

    # ---- the thread ----------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="corral-dashboard-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.tick()
            except Exception:  # a store hiccup must not end the dashboard's view
                log.exception("dashboard: reading the store failed; trying again")
            self._stop.wait(max(0.05, self.interval - (time.monotonic() - started)))

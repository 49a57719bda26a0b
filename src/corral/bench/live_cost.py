"""``corral bench dashboard --live-cost``: what an open dashboard costs the
claim/complete path.

W1 (N queued no-op tasks run by P ``corral worker``-like processes) in turns,
without and with a dashboard process whose live stream (``/stream``, as the
Tasks page opens it: the snapshot every second, the new events, the changing
cells of a page of rows) has a client reading it. The turns alternate their
order each round (off/on, on/off, ...) on one fresh store, so a drift of the
machine falls on both sides; reported: each turn's tasks/s, the medians, and
with / without; and the CPU the dashboard process spent during its turns,
as a share of one core (a figure the machine's noise moves less).
"""

from __future__ import annotations

import statistics
import threading
import time
import urllib.request
from typing import Any

from corral.bench import common
from corral.bench.common import Recorder

#: the rows a Tasks page shows and its stream follows
PAGE = 50


def dashboard_process(url: str, out: Any, go: Any, done: Any, stop: Any) -> None:  # pragma: no cover - a child
    """Serve the dashboard of ``url`` until ``stop`` is set; puts its address
    on ``out``, then the CPU seconds it spent from ``go`` to ``done``."""
    from corral.edges.dashboard import serve_background
    from corral.stores import open_store

    store = open_store(url)
    dash = serve_background(store)
    out.put(dash.url)
    go.wait()
    cpu = time.process_time()
    done.wait()
    out.put(time.process_time() - cpu)
    stop.wait()
    dash.stop()
    store.close()


class StreamClient:
    """A browser's open Tasks page: reads the live stream on a thread, counting its events."""

    def __init__(self, base: str, rows: list[int]):
        self.url = f"{base}/stream?rows={','.join(map(str, rows))}"
        self.events: dict[str, int] = {}
        self.first = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="bench-stream-client", daemon=True)

    def __enter__(self) -> StreamClient:
        self._thread.start()
        if not self.first.wait(60):
            raise RuntimeError("the dashboard's stream sent no snapshot within 60 s")
        return self

    def _read(self) -> None:
        with urllib.request.urlopen(self.url, timeout=60) as resp:
            for raw in resp:
                if self._stop.is_set():
                    return
                line = raw.decode("utf-8", "replace")
                if line.startswith("event: "):
                    kind = line[7:].strip()
                    self.events[kind] = self.events.get(kind, 0) + 1
                    if kind == "snapshot":
                        self.first.set()

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()  # the reader ends at the next event (one a second at least)
        self._thread.join(5)


def run(kind: str, pg_url: str | None, tasks: int, processes: int, rounds: int, progress: Any = None) -> dict[str, Any]:
    from corral.bench import tasks as bench_tasks
    from corral.bench.throughput import _span, _submit, _Workers

    turns: list[dict[str, Any]] = []
    ctx = common.spawn_context()
    with common.temp_store_url(kind, pg_url) as url:
        app = bench_tasks.build_app(url, limit=None)
        opts = {"concurrency": 8, "poll_interval": 0.5, "lease_seconds": 60.0}
        try:
            for r in range(rounds):
                for live in (False, True) if r % 2 == 0 else (True, False):
                    rec = Recorder(tasks, 1 << 30, shared=True)
                    _submit(app, "bench.noop", 0, tasks)
                    rows = [t.id for t in app.store.list_tasks(_newest(PAGE))]
                    stop, go, done, out = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Queue()
                    dash = None
                    client: StreamClient | None = None
                    if live:
                        dash = ctx.Process(
                            target=dashboard_process, args=(url, out, go, done, stop), name="bench-dashboard"
                        )
                        dash.start()
                        client = StreamClient(out.get(timeout=60), rows).__enter__()
                    dash_cpu = None
                    try:
                        with _Workers(app, url, rec, processes, opts, layout="cli") as w:
                            go.set()
                            w.go_now()
                            if not rec.wait_done(tasks, timeout=1800):
                                raise RuntimeError(f"W1 turn timed out: {rec.done}/{tasks}")
                            done.set()
                        if dash is not None:
                            dash_cpu = out.get(timeout=30)
                    finally:
                        if client is not None:  # closed first: the dashboard then stops at once
                            client.__exit__(None, None, None)
                        if dash is not None:
                            done.set()
                            stop.set()
                            dash.join(30)
                            if dash.is_alive():
                                dash.kill()
                                dash.join()
                    first, last = _span(rec)
                    turn: dict[str, Any] = {"round": r + 1, "live": live, "rate": round(tasks / (last - first), 1)}
                    if client is not None:
                        turn["stream_events"] = dict(client.events)
                    if dash_cpu is not None:  # the dashboard's CPU over the turn, as a share of one core
                        turn["dashboard_cpu_s"] = round(dash_cpu, 3)
                        turn["dashboard_core_share"] = round(dash_cpu / (last - first), 4)
                    turns.append(turn)
                    if progress is not None:
                        progress(turn)
        finally:
            app.store.close()
    off = [t["rate"] for t in turns if not t["live"]]
    on = [t["rate"] for t in turns if t["live"]]
    med_off, med_on = statistics.median(off), statistics.median(on)
    shares = [t["dashboard_core_share"] for t in turns if "dashboard_core_share" in t]
    return {
        "store": kind,
        "tasks": tasks,
        "processes": processes,
        "rounds": rounds,
        "turns": turns,
        "median_off": med_off,
        "median_on": med_on,
        "ratio": round(med_on / med_off, 4),
        "cost_pct": round(100 * (1 - med_on / med_off), 2),
        "dashboard_core_share": round(statistics.median(shares), 4) if shares else None,
    }


def _newest(n: int):
    from corral.core.model import TaskFilter

    return TaskFilter(limit=n, newest_first=True)


__all__ = ["run"]

"""``corral bench dashboard --live-cost``: what an open dashboard costs the
claim/complete path.

W1 (N queued no-op tasks run by P ``corral worker``-like processes) in many
short turns, without and with an open dashboard: a dashboard process serving
the store (its sampler reads the store every second) and a client reading its
live stream (``/stream``, as the Tasks page opens it: the snapshot every
second, the new events, the changing cells of a page of rows). The turns come
in pairs, one of each, their order alternating (off/on, on/off, ...), so a
drift of the machine falls on both sides of a pair; each pair gives a ratio
(with / without), and the report gives the median ratio and its spread (the
quartiles, the extremes), a figure a loaded machine moves far less than the
rates themselves. Besides: the CPU seconds the dashboard process spent during
its turns, and the store calls a second it made (by method), counted in that
process; and the load average before and after.

One dashboard process serves the whole run: it serves in the turns with the
live stream only, and is idle (no server, no sampler) in the others.
"""

from __future__ import annotations

import http.client
import os
import statistics
import threading
import time
import urllib.request
from collections import Counter
from typing import Any

from corral.bench import common
from corral.bench.common import Recorder

#: the rows a Tasks page shows and its stream follows
PAGE = 50


class CountingStore:
    """A store whose public calls are counted (by method name): what the
    dashboard asks of the store, from every thread of its process."""

    def __init__(self, store: Any):
        self._store = store
        self._lock = threading.Lock()
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if name.startswith("_") or not callable(attr):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.calls[name] += 1
            return attr(*args, **kwargs)

        return counted

    def taken(self) -> Counter[str]:
        """The counts so far, and start again from zero."""
        with self._lock:
            calls, self.calls = self.calls, Counter()
        return calls


def dashboard_process(url: str, ctl: Any, out: Any) -> None:  # pragma: no cover - a child
    """Serve the dashboard of ``url`` between an ``on`` and an ``off`` on
    ``ctl`` (puts its address on ``out`` at each ``on``); ``mark`` starts the
    count of a turn, ``count`` puts the CPU seconds and store calls since the
    mark on ``out``; ``quit`` ends it."""
    from corral.edges.dashboard import serve_background
    from corral.stores import open_store

    store = CountingStore(open_store(url))
    dash = None
    cpu = 0.0
    while True:
        cmd = ctl.get()
        if cmd == "on":
            dash = serve_background(store)  # type: ignore[arg-type]
            out.put(dash.url)
        elif cmd == "mark":
            store.taken()
            cpu = time.process_time()
        elif cmd == "count":
            out.put({"cpu_s": time.process_time() - cpu, "calls": dict(store.taken())})
        elif cmd == "off":
            if dash is not None:
                dash.stop()
                dash = None
        else:
            break
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
        try:
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
        except (OSError, http.client.HTTPException):  # the server stopped first
            return

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()  # the reader ends at the next event (one a second at least), or when the server stops
        self._thread.join(5)


def _spread(values: list[float]) -> dict[str, float]:
    """Median, quartiles and extremes of ``values``."""
    vs = sorted(values)
    if len(vs) > 1:
        q1, _, q3 = statistics.quantiles(vs, n=4, method="inclusive")
    else:
        q1 = q3 = vs[0]
    return {
        "median": round(statistics.median(vs), 4),
        "q1": round(q1, 4),
        "q3": round(q3, 4),
        "min": round(vs[0], 4),
        "max": round(vs[-1], 4),
    }


def run(kind: str, pg_url: str | None, tasks: int, processes: int, pairs: int, progress: Any = None) -> dict[str, Any]:
    from corral.bench import tasks as bench_tasks
    from corral.bench.throughput import _span, _submit, _Workers

    turns: list[dict[str, Any]] = []
    ctx = common.spawn_context()
    load_before = os.getloadavg()
    with common.temp_store_url(kind, pg_url) as url:
        app = bench_tasks.build_app(url, limit=None)
        opts = {"concurrency": 8, "poll_interval": 0.5, "lease_seconds": 60.0}
        ctl, out = ctx.Queue(), ctx.Queue()
        dash = ctx.Process(target=dashboard_process, args=(url, ctl, out), name="bench-dashboard")
        dash.start()
        try:
            for p in range(pairs):
                for live in (False, True) if p % 2 == 0 else (True, False):
                    turns.append(
                        _turn(app, url, ctl, out, live, p + 1, tasks, processes, opts, _span, _submit, _Workers)
                    )
                    if progress is not None:
                        progress(turns[-1])
        finally:
            ctl.put("quit")
            dash.join(30)
            if dash.is_alive():
                dash.kill()
                dash.join()
            app.store.close()
    load_after = os.getloadavg()
    ratios = []
    for p in range(1, pairs + 1):
        off, on = (next(t["rate"] for t in turns if t["pair"] == p and t["live"] is side) for side in (False, True))
        ratios.append(on / off)
    lives = [t for t in turns if t["live"]]
    seconds = sum(t["seconds"] for t in lives)
    calls: Counter[str] = Counter()
    for t in lives:
        calls.update(t["store_calls"])
    spread = _spread(ratios)
    return {
        "store": kind,
        "tasks": tasks,
        "processes": processes,
        "pairs": pairs,
        "turns": turns,
        "median_off": statistics.median(t["rate"] for t in turns if not t["live"]),
        "median_on": statistics.median(t["rate"] for t in lives),
        "pair_ratios": [round(r, 4) for r in ratios],
        "ratio": spread,
        "cost_pct": round(100 * (1 - spread["median"]), 2),
        "dashboard_cpu_s": round(sum(t["dashboard_cpu_s"] for t in lives), 3),
        "dashboard_core_share": round(sum(t["dashboard_cpu_s"] for t in lives) / seconds, 4),
        "store_calls_per_s": round(sum(calls.values()) / seconds, 1),
        "store_calls": {k: round(v / seconds, 2) for k, v in calls.most_common()},
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in load_after],
    }


def _turn(app, url, ctl, out, live, pair, tasks, processes, opts, _span, _submit, _Workers) -> dict[str, Any]:
    """One W1 turn, with the dashboard serving a live stream or idle."""
    rec = Recorder(tasks, 1 << 30, shared=True)
    _submit(app, "bench.noop", 0, tasks)
    rows = [t.id for t in app.store.list_tasks(_newest(PAGE))]
    client: StreamClient | None = None
    report: dict[str, Any] | None = None
    if live:
        ctl.put("on")
        client = StreamClient(out.get(timeout=60), rows).__enter__()
    try:
        with _Workers(app, url, rec, processes, opts, layout="cli") as w:
            if live:
                ctl.put("mark")
            w.go_now()
            if not rec.wait_done(tasks, timeout=1800):
                raise RuntimeError(f"W1 turn timed out: {rec.done}/{tasks}")
            if live:
                ctl.put("count")  # the count ends here, before the workers stop
                report = out.get(timeout=60)
    finally:
        if client is not None:  # closed first: the dashboard then stops at once
            client.__exit__(None, None, None)
            ctl.put("off")
    first, last = _span(rec)
    turn: dict[str, Any] = {"pair": pair, "live": live, "seconds": round(last - first, 3)}
    turn["rate"] = round(tasks / (last - first), 1)
    if client is not None and report is not None:
        turn["stream_events"] = dict(client.events)
        turn["dashboard_cpu_s"] = round(report["cpu_s"], 3)
        turn["store_calls"] = report["calls"]
    return turn


def _newest(n: int):
    from corral.core.model import TaskFilter

    return TaskFilter(limit=n, newest_first=True)


__all__ = ["run", "CountingStore"]

"""Where a no-op task's time goes: CPU by part of the worker, and the database's.

``corral bench throughput --only process --profile`` installs a
:class:`WorkerProfile` in each worker process: the CPU its threads spent
between the go and the end of the run, read from ``/proc`` (Linux) and
grouped by the thread's part (the dispatcher claims and hands out work, the
completer writes outcomes, the slots run tasks, the rest keep the worker
alive), with the CPU spent inside the store's ``claim`` and ``complete``
calls measured apart (``time.thread_time``: the thread's own CPU, SQLite's
work included, a PostgreSQL round trip's wait not). On PostgreSQL,
:func:`backend_cpu` adds the server processes' CPU for the run's database.
Divided by the tasks run: microseconds of CPU a task, per part.

Sampling per thread (not a tracing profiler) keeps the measurement from
slowing what it measures: two ``thread_time`` reads a store call and one
``/proc`` read per thread at each end.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

#: the worker's threads, by name, and the part each is counted in
PARTS: tuple[tuple[str, str], ...] = (
    (r"corral-dispatcher", "dispatcher"),
    (r"corral-completer", "completer"),
    (r"corral-slot-\d+|corral-async|ThreadPoolExecutor.*", "slots"),
    (r"corral-(sweeper|periodic|adaptive|loop)", "maintenance"),
    (r"corral-(heartbeat|watchdog|presence|limit-reports|level.*|pause.*)", "keep-alive"),
    (r"corral-sqlite-checkpoint", "store.checkpoint"),
    (r"MainThread", "main"),
)

#: the store calls whose CPU is counted apart from their thread's
STORE_CALLS = (
    "claim",
    "complete",
    "complete_and_claim",
    "record_starts",
    "wait_for_work",
    "wait_offering",
    "heartbeat",
)

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def part_of(thread_name: str) -> str:
    """The part of the worker a thread of that name belongs to."""
    for pattern, part in PARTS:
        if re.fullmatch(pattern, thread_name):
            return part
    return "other"


def proc_cpu(path: str) -> float | None:
    """CPU seconds of one thread or one single-threaded process, ``path``
    its ``/proc/...`` directory (None: gone). ``schedstat`` is the kernel's
    exact run time; ``stat``'s ticks are sampled, and a thread that often
    wakes for the GIL is charged ticks another thread used."""
    try:
        with open(f"{path}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(f"{path}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime


def threads_cpu() -> dict[int, float]:
    """CPU seconds of each thread of this process, by native thread id."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        cpu = proc_cpu(f"/proc/self/task/{tid}")
        if cpu is not None:
            out[int(tid)] = cpu
    return out


def by_part(before: dict[int, float], after: dict[int, float], names: dict[int, str]) -> dict[str, float]:
    """CPU seconds spent between two readings, summed by part (a thread born
    since the first reading counts whole; one gone by the second is lost)."""
    out: dict[str, float] = {}
    for tid, cpu in after.items():
        spent = cpu - before.get(tid, 0.0)
        if spent > 0:
            part = part_of(names.get(tid, ""))
            out[part] = out.get(part, 0.0) + spent
    return out


def by_name(before: dict[int, float], after: dict[int, float], names: dict[int, str]) -> dict[str, float]:
    """As :func:`by_part`, by thread name (numbers dropped: the slots add up)."""
    out: dict[str, float] = {}
    for tid, cpu in after.items():
        spent = cpu - before.get(tid, 0.0)
        if spent > 0:
            name = re.sub(r"\d+", "N", names.get(tid, "(ended)"))
            out[name] = out.get(name, 0.0) + spent
    return out


class WorkerProfile:
    """A worker process's CPU by part, from :meth:`begin` to :meth:`end`."""

    def __init__(self, store: Any, calls: Iterable[str] = STORE_CALLS):
        #: CPU seconds inside each store call, and the calls, by "call@part"
        self.inside: dict[str, float] = {}
        self.count: dict[str, int] = {}
        self._lock = threading.Lock()
        self._before: dict[int, float] = {}
        self.result: dict[str, Any] | None = None
        for call in calls:
            setattr(store, call, self._timed(call, getattr(store, call)))

    def _timed(self, call: str, inner: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*a: Any, **kw: Any) -> Any:
            t0 = time.thread_time()
            try:
                return inner(*a, **kw)
            finally:
                spent = time.thread_time() - t0
                key = f"{call}@{part_of(threading.current_thread().name)}"
                with self._lock:
                    self.inside[key] = self.inside.get(key, 0.0) + spent
                    self.count[key] = self.count.get(key, 0) + 1

        return timed

    def begin(self) -> None:
        with self._lock:
            self.inside.clear()
            self.count.clear()
        self._t0 = time.monotonic()
        self._before = threads_cpu()

    def end(self) -> dict[str, Any]:
        """The reading (the first call's: later calls return it unchanged)."""
        if self.result is None:
            after = threads_cpu()
            names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
            with self._lock:
                self.result = {
                    "seconds": time.monotonic() - self._t0,
                    "threads": by_part(self._before, after, names),
                    "by_name": by_name(self._before, after, names),
                    "inside": dict(self.inside),
                    "calls": dict(self.count),
                }
        return self.result

    def end_when(self, event: Any, path: str) -> threading.Thread:
        """Read the profile when ``event`` is set and write it to ``path``."""

        def wait() -> None:
            event.wait()
            self.write(path)

        t = threading.Thread(target=wait, name="corral-bench-profile", daemon=True)
        t.start()
        return t

    def write(self, path: str) -> None:
        result = self.end()
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f)
        os.replace(tmp, path)


def backend_cpu(url: str) -> dict[int, float]:
    """CPU seconds of each PostgreSQL server process serving the database of
    ``url`` (this connection's own excepted), by pid: empty when the server's
    processes cannot be read from here (another host)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as con:
        pids = [
            pid
            for (pid,) in con.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        ]
    out = {}
    for pid in pids:
        cpu = proc_cpu(f"/proc/{pid}")
        if cpu is not None:
            out[pid] = cpu
    return out


def summarize(workers: list[dict[str, Any]], tasks: int, server: float | None) -> dict[str, Any]:
    """Microseconds of CPU a task, per part, over all worker processes: each
    store call apart from the rest of the thread that made it."""
    parts: dict[str, float] = {}
    calls: dict[str, int] = {}
    for w in workers:
        for part, s in w["threads"].items():
            parts[part] = parts.get(part, 0.0) + s
        for key, s in w["inside"].items():
            call, part = key.split("@")
            parts[part] = parts.get(part, 0.0) - s
            parts[f"store.{call}"] = parts.get(f"store.{call}", 0.0) + s
            calls[call] = calls.get(call, 0) + w["calls"][key]
    if server is not None:
        parts["database server"] = server
    us = 1e6 / max(tasks, 1)
    # /proc counts in clock ticks, thread_time exactly: a thread's rest can read a tick below 0
    parts = {k: max(0.0, v) for k, v in parts.items()}
    out = {k: round(v * us, 1) for k, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v > 0}
    claims = calls.get("claim", 0) + calls.get("complete_and_claim", 0)
    named: dict[str, float] = {}
    for w in workers:
        for name, s in w.get("by_name", {}).items():
            named[name] = named.get(name, 0.0) + s
    return {
        "us_per_task": out,
        "threads_us_per_task": {k: round(v * us, 1) for k, v in sorted(named.items(), key=lambda kv: -kv[1])},
        "total_us_per_task": round(sum(parts.values()) * us, 1),
        "tasks_per_claim": round(tasks / claims, 1) if claims else None,
        "calls": calls,
    }

"""What an operator sees of worker processes: each one's row with the tasks
it holds, and whether it is dead.

A worker writes its row every ``beat_every`` seconds (engine/presence.py). It
is *dead* when its row has been silent for :data:`DEAD_AFTER_BEATS` beats, or
when a task it holds has a lease that ran out (it stopped renewing). A dead
worker is shown with what it held until the sweeper has taken those leases
back and forgets its row. A worker named by held tasks but without a row (one
of a corral that kept none) is shown from its tasks alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from corral.core.model import TaskRecord, WorkerInfo

#: Beats a worker may miss before its silence makes it dead.
DEAD_AFTER_BEATS = 3


@dataclass(frozen=True, slots=True)
class HeldTask:
    id: int
    name: str
    #: RUNNING (its body started) or RESERVED (held, not started)
    status: str
    lease_expires_at: float | None


@dataclass(slots=True)
class WorkerView:
    id: str
    host: str
    pid: int | None
    queues: tuple[str, ...]
    slots: int | None
    in_use: int | None
    version: str
    started_at: float | None
    heartbeat_at: float | None
    held: list[HeldTask] = field(default_factory=list)
    #: why it is dead ("" while alive)
    dead: str = ""

    @property
    def alive(self) -> bool:
        return not self.dead

    def as_dict(self, now: float) -> dict[str, Any]:
        return {
            "id": self.id,
            "host": self.host,
            "pid": self.pid,
            "queues": list(self.queues),
            "slots": self.slots,
            "in_use": self.in_use,
            "version": self.version,
            "started_at": self.started_at,
            "heartbeat_at": self.heartbeat_at,
            "heartbeat_age": None if self.heartbeat_at is None else max(0.0, now - self.heartbeat_at),
            "alive": self.alive,
            "dead": self.dead or None,
            "held": [
                {"id": h.id, "name": h.name, "status": h.status, "lease_expires_at": h.lease_expires_at}
                for h in self.held
            ],
        }


def worker_silence(row: WorkerInfo, now: float) -> float | None:
    """Seconds a worker's row has been silent, once that is past
    :data:`DEAD_AFTER_BEATS` beats (its process is gone or stuck); None while it reports."""
    quiet = now - row.heartbeat_at
    return quiet if quiet > DEAD_AFTER_BEATS * row.beat_every else None


def _host_pid(worker_id: str) -> tuple[str, int | None]:
    """``host:pid:random`` (:func:`corral.core.model.new_holder_id`) split; a name of another shape is its own host."""
    parts = worker_id.rsplit(":", 2)
    if len(parts) == 3 and parts[1].isdigit():
        return parts[0], int(parts[1])
    return worker_id, None


def views(rows: Iterable[WorkerInfo], held: Iterable[TaskRecord], now: float) -> list[WorkerView]:
    """Each worker with what it holds: dead ones first, then by start."""
    out: dict[str, WorkerView] = {}
    beats: dict[str, float] = {}
    for r in rows:
        out[r.id] = WorkerView(
            r.id, r.host, r.pid, r.queues, r.slots, r.in_use, r.version, r.started_at, r.heartbeat_at
        )
        beats[r.id] = r.beat_every
    for t in held:
        if t.worker_id is None:
            continue
        v = out.get(t.worker_id)
        if v is None:
            host, pid = _host_pid(t.worker_id)
            v = out[t.worker_id] = WorkerView(t.worker_id, host, pid, (), None, None, "unknown", None, None)
        v.held.append(HeldTask(t.id, t.name, t.status.value, t.lease_expires_at))
    for v in out.values():
        v.held.sort(key=lambda h: h.id)
        if v.slots is not None:  # its held tasks that run: newer than the worker's last report
            v.in_use = sum(h.status == "RUNNING" for h in v.held)
        expired = [h.lease_expires_at for h in v.held if h.lease_expires_at is not None and h.lease_expires_at < now]
        if expired:
            v.dead = f"lease lost {now - min(expired):.0f}s ago"
        elif v.heartbeat_at is not None and now - v.heartbeat_at > DEAD_AFTER_BEATS * beats.get(v.id, 0.0):
            v.dead = f"silent for {now - v.heartbeat_at:.0f}s"

    return sorted(out.values(), key=lambda v: (v.alive, v.started_at or 0.0, v.id))


__all__ = ["DEAD_AFTER_BEATS", "HeldTask", "WorkerView", "views", "worker_silence"]

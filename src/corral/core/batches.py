"""Batches as the stores keep them: a per-batch limit is an ordinary named
limit, and an ``on_complete`` callback is a task template the store fills in
with the batch's summary, exactly once, when the batch reaches a final state.

Pure: no store, no thread. The stores call :func:`callback_task` inside the
transaction that marks the batch settled, so the callback exists if and only
if that mark does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from corral.core.model import NewTask, dumps, loads

#: A batch's concurrency is the named limit ``batch:<name>``, charged in the
#: claim like any other limit, so every worker of the store respects it.
LIMIT_PREFIX = "batch:"
#: Aggregate statuses after which a batch is settled (its callback runs).
FINAL_STATUSES = ("ALL_SUCCESS", "PARTIAL_SUCCESS", "FAILED")


def limit_name(batch: str) -> str:
    """The named limit that holds ``batch``'s concurrency."""
    return LIMIT_PREFIX + batch


def callback_key(batch: str) -> str:
    """The idempotency key of a batch's callback task: a second guard, beside
    the settled mark, that no batch ever gets two."""
    return f"{LIMIT_PREFIX}{batch}:on_complete"


@dataclass(frozen=True, slots=True)
class Callback:
    """What a batch's ``on_complete`` task is submitted with (its arguments
    are the batch summary, known only when the batch ends)."""

    name: str
    queue: str = "default"
    priority: int = 0
    max_retries: int = 0
    timeout: float | None = None
    limits: tuple[str, ...] = ()

    def to_json(self) -> str:
        return dumps(
            {
                "name": self.name,
                "queue": self.queue,
                "priority": self.priority,
                "max_retries": self.max_retries,
                "timeout": self.timeout,
                "limits": list(self.limits),
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Callback:
        d = loads(text)
        return cls(
            name=d["name"],
            queue=d.get("queue", "default"),
            priority=int(d.get("priority", 0)),
            max_retries=int(d.get("max_retries", 0)),
            timeout=d.get("timeout"),
            limits=tuple(d.get("limits") or ()),
        )


def callback_task(batch: str, template: str, summary: Mapping[str, Any]) -> NewTask:
    """The callback task of ``batch``: ``template`` (:meth:`Callback.to_json`)
    called with the batch summary as its one argument. Not itself in the
    batch (that batch would never end)."""
    cb = Callback.from_json(template)
    return NewTask(
        name=cb.name,
        args=dumps({"args": [dict(summary)], "kwargs": {}}),
        queue=cb.queue,
        priority=cb.priority,
        max_retries=cb.max_retries,
        timeout=cb.timeout,
        limits=cb.limits,
        key=callback_key(batch),
        trace_id=os.urandom(16).hex(),
    )


@dataclass(frozen=True, slots=True)
class Progress:
    """A batch's tasks in the four bins a progress bar shows."""

    done: int  # SUCCESS
    failed: int  # FAILED, TIMEOUT, CANCELED
    running: int  # RUNNING
    queued: int  # WAITING, PENDING, RETRYING, RESERVED (held by a worker, not started)

    @property
    def ended(self) -> int:
        return self.done + self.failed

    @property
    def total(self) -> int:
        return self.ended + self.running + self.queued

    def line(self) -> str:
        return f"done {self.done}, failed {self.failed}, running {self.running}, queued {self.queued}"


def progress(counts: Mapping[str, int]) -> Progress:
    """Per-state counts (``BatchSummary.counts``) as progress bins; a state
    no bin knows counts as failed, as a row of an unknown state reads."""
    done = counts.get("SUCCESS", 0)
    running = counts.get("RUNNING", 0)
    queued = sum(counts.get(s, 0) for s in ("WAITING", "PENDING", "RETRYING", "RESERVED"))
    failed = sum(counts.values()) - done - running - queued
    return Progress(done, failed, running, queued)

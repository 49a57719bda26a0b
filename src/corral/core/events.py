"""The event stream's vocabulary: which kinds exist and what a task's state
change is called.

The durable stores write task events with triggers in the transaction that
changed the task (so every path is covered: claims, completions, cancels,
sweeps, a dependency's end), and the SQL there spells the same mapping as
:data:`STATE_KINDS`; the memory store calls :func:`task_event_fields`.
"""

from __future__ import annotations

from typing import Any

from corral.core.model import TaskRecord

#: What a task's new state is called in the stream.
STATE_KINDS: dict[str, str] = {
    "WAITING": "waiting",
    "PENDING": "queued",
    "RETRYING": "retrying",
    "RUNNING": "started",
    "SUCCESS": "succeeded",
    "FAILED": "failed",
    "TIMEOUT": "timed_out",
    "CANCELED": "canceled",
}
#: A new task (its data says the state it starts in).
SUBMITTED = "submitted"
PROGRESS = "progress"
BREAKER = "breaker"
LEVEL = "level"
#: An adaptive limit's controller changed its effective values (data: the decision's explanation).
LIMIT_ADAPTED = "limit_adapted"
#: A keyed adaptive limit's controller changed a key's effective values (subject
#: :func:`limit_key_subject`; data: the decision's explanation with ``limit`` and ``key``).
#: A kind of its own: a thousand keys' changes must not crowd the limit's out of a read.
LIMIT_KEY_ADAPTED = "limit_key_adapted"
#: A queue, group or limit paused or resumed by hand (subject ``<kind>:<name>``).
PAUSE = "pause"
#: A limit's settings changed: declared, set while running, handed back (core.limits).
LIMIT = "limit"
#: Every kind a task's life writes.
TASK_KINDS = frozenset({SUBMITTED, PROGRESS, *STATE_KINDS.values()})
#: Kinds the stores write; other kinds (a worker's health, say) may be added by ``add_event``.
KNOWN_KINDS = frozenset({*TASK_KINDS, BREAKER, LEVEL, PAUSE, LIMIT, LIMIT_ADAPTED, LIMIT_KEY_ADAPTED})
#: Errors in event data are cut to this many characters (the task row keeps it whole).
ERROR_CHARS = 500


def task_subject(task_id: int) -> str:
    return f"task:{task_id}"


def limit_key_subject(limit: str, key: str) -> str:
    """The subject of a key's events under a keyed limit: ``limit:merchant_api:key:m-1001``."""
    return f"limit:{limit}:key:{key}"


def state_kind(status: str) -> str:
    return STATE_KINDS.get(status, status.lower())


def task_event_fields(t: TaskRecord, before: str | None) -> dict[str, Any]:
    """What a task event carries (the same keys the SQL triggers write)."""
    return {
        "id": t.id,
        "name": t.name,
        "queue": t.queue,
        "status": t.status.value,
        "from": before,
        "attempt": t.attempt,
        "group": t.group,
        "batch": t.batch,
        "trace_id": t.trace_id,
        "error": t.error[:ERROR_CHARS] if t.error else None,
    }


def check_kinds(kinds: Any) -> frozenset[str] | None:
    """``kinds`` as a set (None: every kind). A string is one kind."""
    if kinds is None:
        return None
    if isinstance(kinds, str):
        return frozenset({kinds})
    return frozenset(kinds)

"""``ctx``: what a running task may ask of corral.

A task that declares a first parameter named ``ctx`` receives one. Every call
is a cancel point: once the task's cancel flag is set, the next ``ctx`` call
raises :class:`~corral.errors.Canceled`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from corral.core import texts
from corral.core.model import dumps, loads
from corral.core.states import State
from corral.core.validation import DEFAULT_MAX_PAYLOAD_BYTES
from corral.engine.logs import running, task_fields
from corral.errors import Canceled, PermanentError, Retry

logger = logging.getLogger("corral.task")


class _TraceAdapter(logging.LoggerAdapter):  # type: ignore[type-arg,unused-ignore]
    """Adds the task's trace id, id, attempt and name to each record (as
    attributes: the formatters of :mod:`corral.engine.logs` print them)."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        assert self.extra is not None  # always built with the task's fields
        extra = dict(kwargs.get("extra") or {})
        for k, v in self.extra.items():
            extra.setdefault(k, v)
        kwargs["extra"] = extra
        return msg, kwargs


#: What ctx.upstream reads of each upstream task: id, ref, task name, result
#: (JSON text; None unless it succeeded).
Upstream = tuple[int, "str | None", str, "str | None"]


def upstream_results(ups: Sequence[Upstream], by: str) -> dict[Any, Any]:
    """The fan-in map of :meth:`CheckpointView.upstream`, keyed as ``by`` says."""
    if by not in ("id", "ref", "name"):
        raise ValueError(f"ctx.upstream(by=...) takes 'id', 'ref' or 'name', not {by!r}")
    out: dict[Any, Any] = {}
    for tid, ref, name, result in ups:
        key: Any = tid if by == "id" else name if by == "name" else (ref if ref is not None else tid)
        if key in out:
            raise ValueError(f"two upstream tasks are named {key!r}: use ctx.upstream() (by id) or refs")
        out[key] = loads(result)
    return out


class CheckpointView:
    """Reading checkpoints and upstream results, asking for a retry, trace
    headers: the same for every kind of ctx."""

    _checkpoint: dict
    task_id: int
    trace_id: str | None
    attempt: int
    #: the bound on the stored checkpoint object (``App(max_payload_bytes=...)``)
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    _checkpoint_sizes: dict[str, int] | None = None

    def _upstream(self) -> Sequence[Upstream]:
        raise NotImplementedError

    def check_canceled(self) -> None:
        """Raise Canceled once the task was asked to cancel (each ctx has its own way to know)."""

    def upstream(self, by: str = "id") -> dict[Any, Any]:
        """The results of the tasks this one depends on (fan-in), decoded from
        their stored JSON: ``{upstream task id: result}``. An upstream that
        did not succeed (a task declared ``on_upstream_failure="run"``) maps
        to None. ``by="ref"`` keys them by their local name in the graph they
        were submitted with (an upstream without one keeps its id);
        ``by="name"`` by task name (refused if two upstream tasks share one)."""
        return upstream_results(self._upstream(), by)

    @property
    def checkpoints(self) -> dict[str, Any]:
        """Every stage recorded by earlier attempts (and this one), in order."""
        return dict(self._checkpoint)

    @property
    def last_checkpoint(self) -> tuple[str, Any] | None:
        if not self._checkpoint:
            return None
        stage = next(reversed(self._checkpoint))
        return stage, self._checkpoint[stage]

    def done(self, stage: str) -> bool:
        return stage in self._checkpoint

    def _checked_checkpoint(self, stage: str, data: Any) -> str:
        """``data`` as the JSON text to store for ``stage``, recorded here;
        a checkpoint that would take the stored checkpoints over the bound
        raises :class:`~corral.errors.PermanentError` (a retry would too)."""
        self.check_canceled()
        text = dumps(data)
        if self._checkpoint_sizes is None:
            self._checkpoint_sizes = texts.checkpoint_sizes(self._checkpoint)
        problem, size = texts.checkpoint_problem(stage, text, self._checkpoint_sizes, self.max_payload_bytes)
        if problem is not None:
            raise PermanentError(problem)
        self._checkpoint.pop(stage, None)  # last stage last
        self._checkpoint[stage] = loads(text)
        self._checkpoint_sizes[stage] = size
        return text

    def retry(self, after: float | None = None, reason: str = "retry requested") -> None:
        """Stop this attempt and ask for another one ``after`` seconds from now."""
        raise Retry(after=after, reason=reason)

    def trace_headers(self) -> dict[str, str]:
        """Headers for an outgoing HTTP call, so the trace reaches the service
        called: W3C ``traceparent`` (the task's trace; this attempt's span as
        the parent) and ``X-Corral-Trace-Id`` (the trace id as submitted)."""
        from corral.core.tracing import headers

        return headers(self.trace_id, self.task_id, self.attempt, getattr(self, "_span_id", None))


class Context(CheckpointView):
    """Per-run handle: progress, checkpoints, cancel, retries, logging."""

    def __init__(self, store, record, token: str, attempt: int, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES):
        self._store = store
        self.max_payload_bytes = max_payload_bytes
        self._token = token
        self.task_id: int = record.id
        self.name: str = record.name
        self.trace_id: str | None = record.trace_id
        self.attempt: int = attempt
        self.group: str | None = record.group
        self.batch: str | None = record.batch
        self._checkpoint: dict = loads(record.checkpoint) if record.checkpoint else {}
        # a plain flag, set once from another thread: nothing waits on it, and
        # a context is made for every task, so it stays cheap
        self._cancel_requested: bool = bool(record.cancel_requested)
        self._log: logging.LoggerAdapter | None = None
        self._ups: Sequence[Upstream] | None = None
        self._span_id: str | None = None  # this attempt's OpenTelemetry span, when one was made

    @property
    def log(self) -> logging.LoggerAdapter:
        """A logger whose lines carry this task's trace id, id and attempt
        (``extra`` attributes ``trace_id``, ``task_id``, ``attempt``, ``task_name``)."""
        if self._log is None:
            self._log = _TraceAdapter(logger, task_fields(self))
        return self._log

    def _upstream(self) -> Sequence[Upstream]:
        self.check_canceled()
        if self._ups is None:  # read once: upstream tasks have ended and do not change
            self._ups = [
                (u.id, u.ref, u.name, u.result if u.status is State.SUCCESS else None)
                for u in self._store.upstream(self.task_id)
            ]
        return self._ups

    # ---- cancel -----------------------------------------------------------
    @property
    def canceled(self) -> bool:
        return self._cancel_requested

    def check_canceled(self) -> None:
        if self._cancel_requested:
            raise Canceled(f"task {self.task_id} was canceled")

    # the earlier spellings, kept working
    cancelled = canceled
    check_cancelled = check_canceled

    def _request_cancel(self) -> None:
        self._cancel_requested = True

    # ---- progress and checkpoints ------------------------------------------
    def progress(self, fraction: float, message: str | None = None) -> None:
        """Persist progress (0..1) and a short message, visible while it runs
        (a message longer than ``corral.core.texts.MAX_PROGRESS_MESSAGE_CHARS``
        is cut, with a marker saying how long it was)."""
        self.check_canceled()
        self._store.set_progress(self.task_id, self._token, float(fraction), texts.progress_message(message))

    def checkpoint(self, stage: str, data: Any = None) -> None:
        """Record that ``stage`` finished with ``data``; a re-run can skip it.
        All of a task's checkpoints together are bounded like its arguments
        (``max_payload_bytes``, as JSON): past it this raises PermanentError."""
        text = self._checked_checkpoint(stage, data)
        self._store.save_checkpoint(self.task_id, self._token, stage, text)


def current() -> Context | None:
    """The context of the task running in this thread, if any."""
    ctx = running()
    return ctx if isinstance(ctx, Context) else None

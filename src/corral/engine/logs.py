"""Log lines that say which task they are about.

Every line the engine writes about a task passes :func:`task_fields` as
``extra=``, and ``ctx.log`` does the same, so a record carries ``trace_id``,
``task_id``, ``attempt`` and ``task_name`` as attributes, not only as text.
:class:`TaskFilter` fills them in for any other line written while a task
runs in that thread (a task's own ``logging.getLogger(__name__)``), and the
two formatters print them: :class:`TextFormatter` at the end of the line,
:class:`JsonFormatter` as one JSON object per line. Both cut a message
longer than ``corral.core.texts.MAX_LOG_MESSAGE_CHARS``.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from typing import Any

from corral.core.texts import log_message

_running = threading.local()


def running() -> Any:
    """The task running in this thread (its ctx), if any."""
    return getattr(_running, "task", None)


def set_running(task: Any) -> None:
    """Say which task runs in this thread from now on (None: none): the
    worker's slot sets it around a task's body, so lines the body writes
    carry the task's fields and ``corral.engine.context.current`` finds it."""
    _running.task = task


def task_fields(rec: Any, attempt: int | None = None) -> dict[str, Any]:
    """``extra=`` for a line about the task ``rec`` (a TaskRecord or a Context)."""
    return {
        "trace_id": getattr(rec, "trace_id", None),
        "task_id": getattr(rec, "id", None) if not hasattr(rec, "task_id") else rec.task_id,
        "attempt": getattr(rec, "attempt", None) if attempt is None else attempt,
        "task_name": getattr(rec, "name", None),
    }


class TaskFilter(logging.Filter):
    """Give a record written inside a running task that task's fields.

    Put it on a handler: it never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "task_id", None) is None:
            ctx = running()
            if ctx is not None:
                for k, v in task_fields(ctx).items():
                    setattr(record, k, v)
        return True


class TextFormatter(logging.Formatter):
    """The usual text line, with ``[trace_id=... task=... attempt=...]`` at
    the end when the line is about a task."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        record.message = log_message(record.message)  # no line of megabytes, whatever was logged
        return super().formatMessage(record)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        task_id = getattr(record, "task_id", None)
        if task_id is None:
            return text
        tail = f" [trace_id={getattr(record, 'trace_id', None)} task={task_id}"
        attempt = getattr(record, "attempt", None)
        if attempt is not None:
            tail += f" attempt={attempt}"
        tail += "]"
        if "\n" in text:  # keep a traceback below the tagged line
            first, rest = text.split("\n", 1)
            return f"{first}{tail}\n{rest}"
        return text + tail


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (ISO 8601, UTC), level, logger,
    message, and trace_id, task_id, attempt, task (its name) when known;
    ``exc`` holds a traceback."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": log_message(record.getMessage()),
        }
        for key in ("trace_id", "task_id", "attempt"):
            value = getattr(record, key, None)
            if value is not None:
                out[key] = value
        task_name = getattr(record, "task_name", None)
        if task_name is not None:
            out["task"] = task_name
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def setup(level: str = "INFO", fmt: str = "text", stream: Any = None) -> logging.Handler:
    """Configure the root logger for a worker process: one handler on
    ``stream`` (stderr) with the task filter and the chosen format."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(TaskFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    return handler

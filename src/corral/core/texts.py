"""Free text a task produces, made safe for every store, log and page.

Error texts, tracebacks and progress messages come from a task's own code
(an exception's message, ``ctx.progress(message=...)``), so they may hold
anything: a NUL character (PostgreSQL refuses it in text and a batch of
outcomes fails with it), a lone surrogate (not valid UTF-8: no store can
encode it), or megabytes. Each is cleaned here before it reaches a store
or a log line: NUL and lone surrogates become U+FFFD, and a text over its
bound is cut, with a marker saying how long it was. The same on every store.

Checkpoint data is not free text: it is the task's own data, kept exactly
and bounded like arguments (``max_payload_bytes``), see
:func:`checkpoint_problem`.

The bounds are documented in docs/reliability.md ("Limits on sizes and values").
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Iterable, Mapping
from typing import Any

from corral.core.model import Outcome, dumps
from corral.core.states import State

#: Longest error text a task's attempt keeps, in characters (the exception's own lines).
MAX_ERROR_CHARS = 8_192
#: Longest traceback a failed attempt keeps, in characters: its first and last frames.
MAX_TRACEBACK_CHARS = 16_384
#: Longest progress message, in characters.
MAX_PROGRESS_MESSAGE_CHARS = 2_048
#: Longest message of one log line written by corral's log formatters, in characters.
MAX_LOG_MESSAGE_CHARS = 65_536

#: What stands for a character no store can hold (NUL, a lone surrogate).
REPLACEMENT = "\ufffd"
_UNSAFE = re.compile("[\x00\ud800-\udfff]")


def cut_marker(length: int) -> str:
    """What a cut text ends with (or holds, where its middle was cut)."""
    return f" [... cut: {length} characters in all]"


def safe(text: str, limit: int, *, keep_tail: bool = False) -> str:
    """``text`` with NUL and lone surrogates replaced, cut to at most
    ``limit`` characters (marker included) when longer. ``keep_tail`` keeps
    its start and its end and cuts the middle (a traceback: the exception
    is at the end)."""
    n = len(text)
    if n > limit:
        marker = cut_marker(n)
        room = max(0, limit - len(marker))
        if keep_tail and room > 1:
            head = room // 2
            tail = room - head - 1  # the line break after the marker takes one
            text = text[:head] + marker + "\n" + (text[n - tail :] if tail else "")
        else:
            text = text[:room] + marker
    if text.isascii():
        return text.replace("\x00", REPLACEMENT) if "\x00" in text else text
    return _UNSAFE.sub(REPLACEMENT, text)


def error_text(text: str | None) -> str | None:
    """An error text as every store keeps it."""
    return None if text is None else safe(text, MAX_ERROR_CHARS)


def traceback_text(text: str | None) -> str | None:
    """A traceback as every store keeps it: bounded, its first and last frames kept."""
    return None if text is None else safe(text, MAX_TRACEBACK_CHARS, keep_tail=True)


def progress_message(text: str | None) -> str | None:
    """A progress message as every store keeps it (and the event stream carries it)."""
    if text is None:
        return None
    return safe(str(text), MAX_PROGRESS_MESSAGE_CHARS)


def log_message(text: str) -> str:
    """A log line's message: one bounded line's worth, whatever a task logged."""
    return text if len(text) <= MAX_LOG_MESSAGE_CHARS else safe(text, MAX_LOG_MESSAGE_CHARS)


def safe_outcome(o: Outcome) -> Outcome:
    """Make an outcome's texts safe in place (and return it): cheap when they are."""
    if o.error is not None:
        o.error = error_text(o.error)
    if o.traceback is not None:
        o.traceback = traceback_text(o.traceback)
    return o


def safe_outcomes(outcomes: Iterable[Outcome]) -> list[Outcome]:
    """:func:`safe_outcome` for each; the list the stores then write."""
    return [safe_outcome(o) for o in outcomes]


def refused(o: Outcome, why: str) -> Outcome:
    """Turn, in place, an outcome a store refused (a value in it the
    database cannot hold) into the FAILED outcome written instead, with the
    reason: only its task id, lease token and version are kept, and its
    attempt count when it is one every store can hold. The rest of its
    batch is written as usual."""
    was = o.status.value if hasattr(o.status, "value") else str(o.status)
    o.status = State.FAILED
    o.error = error_text(f"the store refused this attempt's outcome ({was}): {why}")
    o.result = o.traceback = o.run_at = o.started_at = o.finished_at = o.pause_limits = None
    o.burn_attempt, o.snooze, o.breaker_failure = True, False, None
    if not (isinstance(o.attempt, int) and 0 <= o.attempt < 2**31):
        o.attempt = None
    return o


def traceback_of(exc: BaseException) -> str | None:
    """The traceback of a failed attempt, bounded. A process-isolated task's
    exception arrives as text (``ChildFailed.text``, or ``child_traceback``
    on an error raised in the parent for it): that text is its traceback,
    and a child that died without one (killed) has none."""
    carried = getattr(exc, "child_traceback", None)
    if carried is None and type(exc).__name__ == "ChildFailed":
        carried = getattr(exc, "text", None)
    if carried is not None:
        if not isinstance(carried, str) or "Traceback (most recent call last)" not in carried:
            return None
        text = carried
    else:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return safe(text.rstrip("\n"), MAX_TRACEBACK_CHARS, keep_tail=True)


def checkpoint_problem(stage: str, data_json: str, sizes: Mapping[str, int], max_bytes: int) -> tuple[str | None, int]:
    """Why a checkpoint cannot be stored, or None; and the bytes its stage
    takes in the stored checkpoint object.

    The store keeps every stage in one JSON object, so the bound is on that
    object, the stages already recorded (``sizes``: bytes per stage, as this
    function returned them) included: the same bound as arguments and results."""
    from corral.core.validation import payload_problem

    problem = payload_problem(data_json, max_bytes, f"the data of checkpoint {_quoted(stage)}")
    if problem is not None:
        return problem, 0
    key = dumps(stage)
    size = _utf8_len(key) + 1 + _utf8_len(data_json)
    others = [v for k, v in sizes.items() if k != stage]
    total = 2 + sum(others) + len(others) + size
    if total > max_bytes:
        return (
            f"checkpoint {_quoted(stage)}: the task's checkpoints would take {total} bytes as JSON, over the limit"
            f" of {max_bytes} bytes (App(max_payload_bytes=...) sets it)"
        ), size
    return None, size


def checkpoint_sizes(checkpoint: Mapping[str, Any]) -> dict[str, int]:
    """Bytes each recorded stage takes in the stored checkpoint object."""
    return {k: _utf8_len(dumps(k)) + 1 + _utf8_len(dumps(v)) for k, v in checkpoint.items()}


def _utf8_len(text: str) -> int:
    if text.isascii():
        return len(text)
    return len(text.encode("utf-8", "surrogatepass"))


def _quoted(stage: str) -> str:
    from corral.core.validation import shown

    return shown(stage)

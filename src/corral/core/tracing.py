"""W3C trace context from a task's trace id (pure functions).

A task's ``trace_id`` is any text the submitter chose (32 hex digits by
default). Outgoing calls need a W3C ``traceparent``
(``00-<32 hex trace id>-<16 hex span id>-<2 hex flags>``):

* a trace id that *is* a traceparent (the submitter's own span, captured at
  submit or passed as ``trace_id=``) keeps its trace id, and its span is the
  parent of the task's attempts;
* 32 hex digits (not all zero) are the W3C trace id as they are;
* any other text is hashed into one, the same every time, so every attempt
  and every call of a task shares one trace.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_HEX32 = re.compile(r"^[0-9a-f]{32}$")
#: The header that carries corral's own trace id, as the submitter gave it.
CORRAL_HEADER = "X-Corral-Trace-Id"


@dataclass(frozen=True, slots=True)
class Parent:
    """A remote parent span: what a traceparent names."""

    trace_id: str  # 32 hex
    span_id: str  # 16 hex
    sampled: bool


def parse_traceparent(text: str | None) -> Parent | None:
    """The parent a W3C traceparent names, or None when ``text`` is not one
    (version ff, or an all-zero trace or span id, is invalid by the spec)."""
    if not text:
        return None
    m = _TRACEPARENT.match(text.strip().lower())
    if m is None:
        return None
    version, trace, span, flags = m.groups()
    if version == "ff" or trace == "0" * 32 or span == "0" * 16:
        return None
    return Parent(trace, span, bool(int(flags, 16) & 1))


def format_traceparent(trace_id: str, span_id: str, sampled: bool = True) -> str:
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}"


def _digest(*parts: object) -> str:
    return hashlib.blake2b("\x1f".join(map(str, parts)).encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def w3c_trace_id(trace_id: str | None) -> str:
    """The 32-hex W3C trace id of a task's trace id (see the module doc)."""
    parent = parse_traceparent(trace_id)
    if parent is not None:
        return parent.trace_id
    text = (trace_id or "").strip().lower()
    if _HEX32.match(text) and text != "0" * 32:
        return text
    return _digest("corral-trace", trace_id)


def attempt_span_id(trace_id: str | None, task_id: int, attempt: int) -> str:
    """A 16-hex span id for one attempt of a task, the same on every call,
    so all outgoing calls of an attempt name it as their parent."""
    span = _digest("corral-span", trace_id, task_id, attempt)[:16]
    return span if span != "0" * 16 else "0000000000000001"


def submit_parent(trace_id: str | None) -> Parent:
    """The parent of a task's attempts: the submitter's span when the trace
    id is a traceparent, else a span standing for the submit (a stable id in
    the task's trace, so all attempts of the task share one trace)."""
    parent = parse_traceparent(trace_id)
    if parent is not None:
        return parent
    return Parent(w3c_trace_id(trace_id), _digest("corral-submit", trace_id)[:16] or "0000000000000001", True)


def headers(trace_id: str | None, task_id: int, attempt: int, span_id: str | None = None) -> dict[str, str]:
    """The headers for an outgoing call made by an attempt: ``traceparent``
    (this attempt's span, or ``span_id`` when a tracer made one) and
    ``X-Corral-Trace-Id`` (the task's trace id as submitted)."""
    parent = parse_traceparent(trace_id)
    sampled = True if parent is None else parent.sampled
    span = span_id or attempt_span_id(trace_id, task_id, attempt)
    out = {"traceparent": format_traceparent(w3c_trace_id(trace_id), span, sampled)}
    if trace_id:
        out[CORRAL_HEADER] = trace_id
    return out

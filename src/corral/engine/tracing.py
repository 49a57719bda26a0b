"""OpenTelemetry spans for task attempts, when ``opentelemetry-api`` is installed.

Each attempt is a span named after the task (attributes ``corral.task_id``,
``corral.attempt``, ``corral.queue``, ``corral.group``), current while the
task body runs in its thread, so the task's own instrumented calls nest under
it. Its parent is the submitter's span when the task's trace id is a W3C
traceparent (captured at submit from the submitter's current span), else a
span standing for the submit in the task's own trace: every attempt of a task
shares one trace id (see :mod:`corral.core.tracing`).

Without the package, :data:`ENABLED` is False and the worker never calls in
here: nothing is imported and nothing costs anything. With the API but no
tracer provider configured (no SDK set up), no span is made either.
"""

from __future__ import annotations

import os
from typing import Any

from corral.core import texts
from corral.core import tracing as w3c

try:  # an optional dependency (the ``otel`` extra)
    from opentelemetry import context as otel_context
    from opentelemetry import trace as otel_trace
except ImportError:  # pragma: no cover - exercised when the extra is absent
    otel_trace = None  # type: ignore[assignment,unused-ignore]
    otel_context = None  # type: ignore[assignment,unused-ignore]

ENABLED = otel_trace is not None
TRACER_NAME = "corral"


class AttemptSpan:
    """A started attempt span and the context token that made it current."""

    __slots__ = ("span", "token", "span_id")

    def __init__(self, span: Any, token: Any, span_id: str | None):
        self.span = span
        self.token = token
        self.span_id = span_id


_tracer: Any = None
#: No provider named by the environment (read once: the API would load one from it).
_NO_PROVIDER_FROM_ENV = "OTEL_PYTHON_TRACER_PROVIDER" not in os.environ


def _configured_tracer() -> Any:
    """The tracer of the configured provider, or None while no SDK is set
    up: the API alone would make spans nobody records, at a cost per task."""
    global _tracer
    if _tracer is None and otel_trace is not None:
        # the API's own check reads os.environ on every call (a few % of a
        # no-op task's Python time): its module global says "none set" first
        if getattr(otel_trace, "_TRACER_PROVIDER", False) is None and _NO_PROVIDER_FROM_ENV:
            return None
        provider = otel_trace.get_tracer_provider()
        if isinstance(provider, otel_trace.ProxyTracerProvider | otel_trace.NoOpTracerProvider):
            return None
        _tracer = provider.get_tracer(TRACER_NAME)  # a provider once set stays set
    return _tracer


def start_attempt(rec: Any, attempt: int) -> AttemptSpan | None:
    """Start the span of one attempt of ``rec`` and make it current in this
    thread (nothing while no tracer provider is configured)."""
    if otel_trace is None or otel_context is None:
        return None
    tracer = _configured_tracer()
    if tracer is None:
        return None
    from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

    parent = w3c.submit_parent(rec.trace_id)
    remote = SpanContext(
        trace_id=int(parent.trace_id, 16),
        span_id=int(parent.span_id, 16),
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED if parent.sampled else TraceFlags.DEFAULT),
    )
    attributes: dict[str, Any] = {
        "corral.task_id": rec.id,
        "corral.attempt": attempt,
        "corral.queue": rec.queue,
        "corral.task_name": rec.name,
    }
    if rec.group is not None:
        attributes["corral.group"] = rec.group
    if rec.batch is not None:
        attributes["corral.batch"] = rec.batch
    if rec.trace_id:
        attributes["corral.trace_id"] = rec.trace_id
    span = tracer.start_span(
        rec.name,
        context=otel_trace.set_span_in_context(NonRecordingSpan(remote)),
        kind=SpanKind.CONSUMER,
        attributes=attributes,
    )
    sc = span.get_span_context()
    span_id = f"{sc.span_id:016x}" if sc.is_valid else None
    token = otel_context.attach(otel_trace.set_span_in_context(span))
    return AttemptSpan(span, token, span_id)


def end_attempt(handle: AttemptSpan | None, status: str, error: str | None) -> None:
    """End the span with the attempt's outcome; an outcome other than
    SUCCESS marks it as an error. Called in the thread that started it."""
    if handle is None or otel_trace is None or otel_context is None:
        return
    from opentelemetry.trace import Status, StatusCode

    try:
        handle.span.set_attribute("corral.outcome", status)
        if status != "SUCCESS":
            lines = [ln for ln in (error or status).strip().splitlines() if ln.strip()]
            last = texts.error_text(lines[-1].strip()) if lines else status  # bounded like the stored error
            handle.span.set_status(Status(StatusCode.ERROR, last))
        handle.span.end()
    finally:
        otel_context.detach(handle.token)


def current_traceparent() -> str | None:
    """The traceparent of the caller's current span (None without one, or
    without OpenTelemetry): what a submit stores as the task's trace id."""
    if otel_trace is None:
        return None
    sc = otel_trace.get_current_span().get_span_context()
    if not sc.is_valid:
        return None
    return w3c.format_traceparent(f"{sc.trace_id:032x}", f"{sc.span_id:016x}", bool(sc.trace_flags & 1))

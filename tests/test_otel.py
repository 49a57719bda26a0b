"""OpenTelemetry: each attempt is a span named after the task, parented to the
submitter's span when it had one, with the task's id, attempt, queue and
group as attributes; ``ctx.trace_headers()`` names the attempt's span."""

from __future__ import annotations

import pytest

import corral
from corral.core import tracing as w3c

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module")
def exporter():
    """The process's tracer provider (set once: OpenTelemetry allows no second)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    return _EXPORTER


@pytest.fixture
def app(exporter):
    exporter.clear()
    a = corral.App("memory://")
    yield a
    a.close(timeout=10)


def test_each_attempt_is_a_span_under_the_submitters_span(app, exporter):
    @app.task(retries=1, queue="default")
    def sync_sku(ctx, sku):
        if ctx.attempt == 1:
            raise ConnectionError("partner unreachable")
        return ctx.trace_headers()

    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("http POST /sync") as request_span:
        h = sync_sku.submit("A1", group="merchant-7")
    submitter = request_span.get_span_context()
    stored = h.get().trace_id
    assert w3c.parse_traceparent(stored) == w3c.Parent(
        f"{submitter.trace_id:032x}", f"{submitter.span_id:016x}", True
    )  # the submitter's context, captured at submit
    app.start(workers=1)
    headers = h.result(timeout=10)
    spans = [s for s in exporter.get_finished_spans() if s.name == "sync_sku"]
    assert len(spans) == 2
    first, second = sorted(spans, key=lambda s: s.attributes["corral.attempt"])
    for span, attempt in ((first, 1), (second, 2)):
        assert span.context.trace_id == submitter.trace_id
        assert span.parent is not None and span.parent.span_id == submitter.span_id
        assert span.attributes["corral.task_id"] == h.id
        assert span.attributes["corral.attempt"] == attempt
        assert span.attributes["corral.queue"] == "default"
        assert span.attributes["corral.group"] == "merchant-7"
    assert not first.status.is_ok and "partner unreachable" in (first.status.description or "")
    assert second.attributes["corral.outcome"] == "SUCCESS"
    # the outgoing call names the attempt's own span as its parent
    sent = w3c.parse_traceparent(headers["traceparent"])
    assert sent is not None and sent.trace_id == f"{submitter.trace_id:032x}"
    assert sent.span_id == f"{second.context.span_id:016x}"


def test_without_a_submitter_span_attempts_share_the_tasks_trace(app, exporter):
    @app.task
    def plain():
        return trace.get_current_span().get_span_context().trace_id

    h = plain.submit(trace_id="sku_sync_0801_001")
    app.start(workers=1)
    inside = h.result(timeout=10)
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "plain"]
    assert f"{span.context.trace_id:032x}" == w3c.w3c_trace_id("sku_sync_0801_001")
    assert inside == span.context.trace_id  # the span is current while the task runs

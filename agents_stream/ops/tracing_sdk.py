"""OpenTelemetry's SDK behind ``tracing.py``: the tracer provider, its exporters and batch processors, span handles.

Imported only when OTEL_* turns tracing on (``tracing.start``); the only module besides the test receiver that
imports OpenTelemetry. The exporters and the batch processor read their own OTEL_* variables (endpoint, headers,
timeout, compression, OTEL_BSP_MAX_QUEUE_SIZE, OTEL_BSP_SCHEDULE_DELAY...), and the sampler OTEL_TRACES_SAMPLER.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Mapping
from urllib.parse import urlsplit

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
    SpanProcessor,
)
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from agents_stream.ops.tracing import attributes_of, format_traceparent, parse_traceparent

__all__ = ["Handle", "Traces", "destination"]

_KINDS = {
    "internal": SpanKind.INTERNAL, "client": SpanKind.CLIENT, "producer": SpanKind.PRODUCER,
    "consumer": SpanKind.CONSUMER, "server": SpanKind.SERVER,
}
_ROOT = Context()  # an empty context: a span started under it begins a new trace


class Handle:
    """One started span."""

    __slots__ = ("_span",)

    def __init__(self, span: trace.Span) -> None:
        self._span = span

    @property
    def traceparent(self) -> str:
        ctx = self._span.get_span_context()
        return format_traceparent(ctx.trace_id, ctx.span_id, int(ctx.trace_flags))

    def set(self, attributes: Mapping[str, Any]) -> None:
        self._span.set_attributes(attributes_of(attributes))

    def event(self, name: str, attributes: Mapping[str, Any] | None = None) -> None:
        self._span.add_event(name, attributes_of(attributes or {}))

    def fail(self, description: str) -> None:
        self._span.set_status(Status(StatusCode.ERROR, description[:500]))

    def end(self) -> None:
        self._span.end()

    @contextmanager
    def current(self) -> Iterator[None]:
        """This span as the current one, for code that makes spans of its own (a tool's, through the global
        tracer provider): they nest under it."""
        token = otel_context.attach(trace.set_span_in_context(self._span))
        try:
            yield
        finally:
            otel_context.detach(token)


class Traces:
    """A tracer provider and its processors; ``span`` starts spans under a traceparent."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("agents_stream")

    @classmethod
    def configured(cls, exporters: list[str], service: str, attributes: Mapping[str, str]) -> Traces:
        """From the OTEL_* variables: each exporter behind a BatchSpanProcessor (a bounded queue, exported from
        its own thread; a full queue drops spans, it never blocks). Also the process's global tracer provider,
        when none is set yet, so spans a tool makes itself join the task's trace."""
        resource = Resource.create(dict(attributes))
        if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
            resource = resource.merge(Resource({SERVICE_NAME: service}))  # OTEL_SERVICE_NAME, when set, wins
        provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        for name in exporters:
            provider.add_span_processor(BatchSpanProcessor(_exporter(name)))
        if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            trace.set_tracer_provider(provider)
        return cls(provider)

    @classmethod
    def to(cls, exporter: SpanExporter, service: str = "agents-stream-test") -> Traces:
        """Tests: every span handed to ``exporter`` as it ends (no batching, no thread)."""
        provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service}), shutdown_on_exit=False)
        processor: SpanProcessor = SimpleSpanProcessor(exporter)
        provider.add_span_processor(processor)
        return cls(provider)

    def span(self, name: str, parent: str | None, kind: str, attributes: Mapping[str, Any] | None) -> Handle:
        ids = parse_traceparent(parent)
        context = _ROOT
        if ids is not None:
            trace_id, span_id, flags = ids
            remote = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags))
            context = trace.set_span_in_context(NonRecordingSpan(remote), _ROOT)
        return Handle(self.tracer.start_span(
            name, context=context, kind=_KINDS.get(kind, SpanKind.INTERNAL),
            attributes=attributes_of(attributes) if attributes else None,
        ))

    def shutdown(self) -> None:
        self.provider.shutdown()


def _exporter(name: str) -> SpanExporter:
    if name == "console":
        return ConsoleSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def destination(exporters: list[str], environ: Mapping[str, str]) -> str:
    """Where the spans go, for the log line that says tracing is on (the endpoint, never its headers)."""
    where = []
    for name in exporters:
        if name == "otlp":
            url = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or (
                (environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "http://localhost:4318").rstrip("/") + "/v1/traces")
            parts = urlsplit(url)  # no user, password or query: they may hold credentials
            port = f":{parts.port}" if parts.port else ""
            where.append(f"OTLP/HTTP {parts.scheme}://{parts.hostname}{port}{parts.path}")
        else:
            where.append("the console")
    return " and ".join(where)

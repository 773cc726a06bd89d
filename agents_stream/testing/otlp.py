"""OTLPReceiver: a real aiohttp server taking OTLP/HTTP protobuf traces (``POST /v1/traces``), keeping each span.

What a collector (Jaeger's, Tempo's, the OpenTelemetry Collector's) receives, decoded from the protobuf
ExportTraceServiceRequest with opentelemetry-proto: for tests and demos of tracing (installed with the ``tracing``
extra). ``async with OTLPReceiver() as r``: point OTEL_EXPORTER_OTLP_ENDPOINT at ``r.url``; ``r.spans`` fills up.
"""

from __future__ import annotations

import asyncio
import gzip
import zlib
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

__all__ = ["OTLPReceiver", "ReceivedSpan"]

#: the largest request body it reads (the SDK's own default limit is 64 MiB; a test's batches are small)
MAX_BODY_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as exported: ids in hex, times in ns since the epoch, its resource's and its own attributes."""

    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    #: (name, time in ns, attributes) of each event
    events: list[tuple[str, int, dict[str, Any]]]
    #: 0 unset, 1 ok, 2 error
    status: int
    status_message: str
    resource: dict[str, Any] = field(default_factory=dict)

    @property
    def service(self) -> str:
        return str(self.resource.get("service.name", ""))

    @property
    def instance(self) -> str:
        """The worker that made it (its resource's service.instance.id), "" for a command's."""
        return str(self.resource.get("service.instance.id", ""))


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return _attributes(v.kvlist_value.values)
    return getattr(v, which) if which else None


def _attributes(pairs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    kv: KeyValue
    for kv in pairs:
        out[kv.key] = _value(kv.value)
    return out


class OTLPReceiver:
    """The server; ``spans`` in the order they arrived, ``requests`` how many exports it answered."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host, self.port = host, port
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        """The base URL (OTEL_EXPORTER_OTLP_ENDPOINT's form: the exporter adds /v1/traces)."""
        return f"http://{self.host}:{self.port}"

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.trace_id == trace_id]

    async def _traces(self, request: web.Request) -> web.Response:
        body = await request.read()
        encoding = request.headers.get("Content-Encoding", "").lower()
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        message = ExportTraceServiceRequest()
        try:
            message.ParseFromString(body)
        except Exception as exc:  # a malformed export is the exporter's bug: say so, as a collector does
            return web.Response(status=400, text=f"not an ExportTraceServiceRequest: {exc}")
        for resource_spans in message.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope in resource_spans.scope_spans:
                for s in scope.spans:
                    self.spans.append(ReceivedSpan(
                        trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                        parent_id=s.parent_span_id.hex() or None, name=s.name, kind=s.kind,
                        start_ns=s.start_time_unix_nano, end_ns=s.end_time_unix_nano,
                        attributes=_attributes(s.attributes),
                        events=[(e.name, e.time_unix_nano, _attributes(e.attributes)) for e in s.events],
                        status=s.status.code, status_message=s.status.message, resource=resource,
                    ))
        self.requests += 1
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    async def __aenter__(self) -> OTLPReceiver:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=1.0)
        await asyncio.wait_for(self._runner.setup(), 10)
        await asyncio.wait_for(web.TCPSite(self._runner, self.host, self.port).start(), 10)
        if not self.port:
            self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await asyncio.wait_for(runner.cleanup(), 10)

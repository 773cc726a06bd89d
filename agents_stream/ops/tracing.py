"""Traces of tasks (OpenTelemetry; off unless the standard OTEL_* variables ask for them): the spans the code
starts, and the W3C trace context a task carries in its Kafka headers and in its record.

While tracing is off nothing of OpenTelemetry is imported and every function here returns None at once: the code
that starts spans asks ``on()`` or holds a traceparent that is None, so a task makes no span object. The SDK's part
(provider, exporter, batch processor) is ``tracing_sdk.py``, imported by ``start`` only.

A traceparent is the W3C header's value, ``00-<trace id>-<span id>-<flags>``: the one form a parent travels in,
in a Kafka header, in a task's record and between the ledger and the executor (tracestate is not carried).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from typing import Any, ContextManager, Iterable, Mapping, Protocol

__all__ = [
    "TRACEPARENT", "Span", "attributes_of", "exporters_of", "format_traceparent", "header_traceparent",
    "headers_with", "on", "parse_traceparent", "span", "start", "stop", "use",
]

log = logging.getLogger(__name__)

#: the W3C header (and Kafka header) name
TRACEPARENT = "traceparent"

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
#: what this module can export to: OTEL_TRACES_EXPORTER's values
EXPORTERS = frozenset({"otlp", "console"})
#: the one OTLP protocol the installed exporter speaks
OTLP_PROTOCOL = "http/protobuf"
#: an event's or span's attribute value longer than this is cut (a reason, a control event's details)
MAX_VALUE_CHARS = 500


class Span(Protocol):
    """A started span (``tracing_sdk.Handle``): what the code does with one."""

    @property
    def traceparent(self) -> str: ...

    def set(self, attributes: Mapping[str, Any]) -> None: ...

    def event(self, name: str, attributes: Mapping[str, Any] | None = None) -> None: ...

    def fail(self, description: str) -> None: ...

    def end(self) -> None: ...

    def current(self) -> ContextManager[None]: ...


class _Traces(Protocol):
    def span(self, name: str, parent: str | None, kind: str, attributes: Mapping[str, Any] | None) -> Span: ...

    def shutdown(self) -> None: ...


#: where spans go while tracing is on (``tracing_sdk.Traces``); None: off
_traces: _Traces | None = None


def on() -> bool:
    """Whether this process makes spans."""
    return _traces is not None


def span(name: str, parent: str | None, *, kind: str = "internal", attributes: Mapping[str, Any] | None = None,
         ) -> Span | None:
    """A span started now under ``parent`` (a traceparent; None or unreadable: a new trace); None while off.
    ``kind``: internal, client, producer or consumer. Attributes that are None are left out."""
    traces = _traces
    if traces is None:
        return None
    return traces.span(name, parent, kind, attributes)


# -- W3C trace context ------------------------------------------------------------------------------------------


def parse_traceparent(value: str | None) -> tuple[int, int, int] | None:
    """(trace id, span id, flags) of a W3C traceparent, or None when it is not a valid one (an invalid header is
    ignored, as the W3C spec says: the task then starts a trace of its own)."""
    if not value or len(value) > 512:
        return None
    m = _TRACEPARENT.match(value.strip())
    if m is None:
        return None
    version, trace_id, span_id, flags, rest = m.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    if trace_id == "0" * 32 or span_id == "0" * 16:
        return None
    return int(trace_id, 16), int(span_id, 16), int(flags, 16)


def format_traceparent(trace_id: int, span_id: int, flags: int) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-{flags & 0xFF:02x}"


def header_traceparent(headers: Iterable[tuple[str, Any]] | None) -> str | None:
    """The valid traceparent among a Kafka record's headers (the last one wins), else None."""
    found = None
    for name, value in headers or ():
        if name != TRACEPARENT:
            continue
        try:
            text = value.decode("ascii") if isinstance(value, bytes | bytearray) else str(value)
        except UnicodeDecodeError:
            continue
        if parse_traceparent(text) is not None:
            found = text.strip()
    return found


def headers_with(headers: Iterable[tuple[str, bytes]] | None, traceparent: str | None) -> list[tuple[str, bytes]]:
    """``headers`` with ``traceparent`` as their one traceparent (unchanged when it is None)."""
    kept = list(headers or ())
    if traceparent is None:
        return kept
    return [h for h in kept if h[0] != TRACEPARENT] + [(TRACEPARENT, traceparent.encode("ascii"))]


def attributes_of(details: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Span or event attributes from a dict of details (a control event's): numbers, booleans and strings as they
    are, anything else as compact JSON; every string cut at MAX_VALUE_CHARS; None left out."""
    out: dict[str, Any] = {}
    for key, value in details.items():
        if value is None:
            continue
        if not isinstance(value, str | bool | int | float):
            value = json.dumps(value, separators=(",", ":"), default=str)
        if isinstance(value, str) and len(value) > MAX_VALUE_CHARS:
            value = value[:MAX_VALUE_CHARS] + "…"
        out[f"{prefix}{key}"] = value
    return out


# -- on and off ----------------------------------------------------------------------------------------------------


def _true(raw: str | None) -> bool:
    return (raw or "").strip().lower() in ("1", "true", "yes", "on")


def exporters_of(environ: Mapping[str, str]) -> tuple[list[str], str | None]:
    """(exporters, problem): what the OTEL_* variables ask spans to be exported to — empty: tracing stays off —
    and why that cannot be done (None when it can).

    On when OTEL_TRACES_EXPORTER names exporters (otlp, console), or when it is unset and an OTLP endpoint
    (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is. OTEL_SDK_DISABLED=true and
    OTEL_TRACES_EXPORTER=none keep it off. Unlike OpenTelemetry's auto-configuration, an unset
    OTEL_TRACES_EXPORTER does not mean otlp to localhost: a worker nobody configured exports nothing."""
    if _true(environ.get("OTEL_SDK_DISABLED")):
        return [], None
    named = [e.strip().lower() for e in (environ.get("OTEL_TRACES_EXPORTER") or "").split(",") if e.strip()]
    if not named:
        endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        named = ["otlp"] if (endpoint or "").strip() else []
    if "none" in named:
        return [], None
    unknown = [e for e in named if e not in EXPORTERS]
    if unknown:
        return [], (f"OTEL_TRACES_EXPORTER={','.join(named)}: {', '.join(unknown)} is not an exporter this worker "
                    f"has (it has {', '.join(sorted(EXPORTERS))})")
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    if "otlp" in named and protocol and protocol.strip() != OTLP_PROTOCOL:
        return [], (f"OTLP protocol {protocol.strip()!r}: this worker exports OTLP over {OTLP_PROTOCOL} only (set "
                    f"OTEL_EXPORTER_OTLP_PROTOCOL={OTLP_PROTOCOL} and the collector's HTTP port, usually 4318)")
    return named, None


def start(service: str, attributes: Mapping[str, str], environ: Mapping[str, str] | None = None) -> bool:
    """Turn tracing on when the OTEL_* variables ask for it: spans batched (the SDK's BatchSpanProcessor, its
    bounded queue) to the configured exporters. True when on. A configuration that cannot be honoured is logged as
    an error and leaves tracing off: traces are never a reason for a worker not to work."""
    global _traces
    env = os.environ if environ is None else environ
    exporters, problem = exporters_of(env)
    if problem is not None:
        log.error("Tracing stays off: %s", problem)
        return False
    if not exporters or _traces is not None:
        return _traces is not None
    try:
        from agents_stream.ops import tracing_sdk
    except ImportError as exc:
        log.error("Tracing stays off: OTEL_* asks for traces but OpenTelemetry is not installed (%s); install "
                  "agents-stream[tracing]", exc)
        return False
    try:
        _traces = tracing_sdk.Traces.configured(exporters, service, attributes)
    except Exception as exc:  # a bad OTEL_* value the SDK refuses (a batch size, a header)
        log.error("Tracing stays off: the OpenTelemetry SDK refused the OTEL_* configuration: %r", exc)
        return False
    log.info("Tracing on: spans of service %s exported to %s", service, tracing_sdk.destination(exporters, env))
    return True


def use(traces: _Traces | None) -> None:
    """Tests: spans go to ``traces`` (``tracing_sdk.Traces.to(exporter)``), or nowhere again (None)."""
    global _traces
    _traces = traces


def stop_in_background() -> threading.Thread:
    """``stop`` in a daemon thread, started: its caller waits for it as long as it likes (join, or poll
    ``is_alive``), and the process still exits when the exporter's own timeouts have not run out."""
    stopping = threading.Thread(target=stop, name="agents-stream-traces-flush", daemon=True)
    stopping.start()
    return stopping


def stop() -> None:
    """Tracing off: the spans still queued are exported (the SDK waits for its exporter, up to its timeout), then
    the exporter is closed. Blocking: the worker calls it in a thread, bounded by its own timeout."""
    global _traces
    traces, _traces = _traces, None
    if traces is not None:
        traces.shutdown()

"""The records of ``agent.circuits``: the JSON body a worker sends, and the breaker event each kind folds into."""

from __future__ import annotations

import json
import uuid
from typing import Any

from agents_stream.resilience import breaker

__all__ = ["breaker_event", "decode", "encode"]

#: the log's record format version
VERSION = 1


def encode(kind: str, provider: str | None, worker: str, at: float, **fields: Any) -> tuple[str, bytes, bytes]:
    """(event id, key, value) of one event; keyed by the circuit id, or by the worker for ``hello``."""
    event_id = uuid.uuid4().hex
    body = {"v": VERSION, "id": event_id, "kind": kind, "provider": provider, "worker": worker, "at": at, **fields}
    return event_id, (provider or worker).encode(), json.dumps(body).encode()


def decode(value: bytes | None) -> dict[str, Any]:
    """The body of one record; ValueError (or TypeError) for one that is not a JSON object."""
    ev = json.loads(value)  # type: ignore[arg-type]  # None raises TypeError: a record to skip
    if not isinstance(ev, dict):
        raise ValueError("not a JSON object")
    return ev


def breaker_event(kind: str, ev: dict[str, Any], at: float) -> breaker.Event | None:
    """The breaker's event for a log event of ``kind`` at ``at``; None for a kind the breaker does not know."""
    if kind == "transition":
        return breaker.Adopt(at=at, state=ev["to"], opened_at=ev.get("opened_at"), closed_at=ev.get("closed_at"))
    if kind == "failure":
        return breaker.Failure(at=at, probe_id=_opt_str(ev.get("probe_id")))
    if kind == "success":
        return breaker.Success(at=at, probe_id=_opt_str(ev.get("probe_id")))
    if kind == "probe":
        return breaker.ProbeRequest(at=at, probe_id=str(ev["probe_id"]))
    if kind == "probe_cancel":
        return breaker.ProbeCancel(at=at, probe_id=str(ev["probe_id"]))
    return None  # a newer worker's event kind


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)

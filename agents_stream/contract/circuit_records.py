"""The wire format of the circuits log (agent.circuits): one model per kind of record a worker appends, its
breakers' failures, successes, probes and transitions, a Retry-After, its presence (decoded through
contract/events.py's ``CIRCUITS`` family; turned into breaker events by resilience/breaker_events.py)."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal, Union

from pydantic import Field

from agents_stream.contract.envelope import InternalEvent
from agents_stream.contract.models import SCHEMA_VERSION

__all__ = [
    "CircuitFailure", "CircuitHello", "CircuitProbe", "CircuitProbeCancel", "CircuitRateLimited", "CircuitSuccess",
    "CircuitTransition", "CircuitsEvent",
]


class _CircuitBase(InternalEvent):
    """The circuits log's envelope (``v``, not ``schema_version``, since its first version)."""

    v: int = SCHEMA_VERSION
    id: str
    kind: str
    provider: str | None = None  # the circuit id; None for presence
    worker: str
    at: float  # the sender's clock; the fold prefers the broker's LogAppendTime


class CircuitHello(_CircuitBase):
    """A worker's presence: the endpoints it calls and its partitions' spend of the day. Every worker sends all
    three; None means absent, which the fold reads as no endpoints, app "" and no spend (as it always has)."""

    OMIT_IF_NONE: ClassVar[frozenset[str]] = frozenset({"providers", "app", "spend"})

    kind: Literal["hello"] = "hello"
    providers: list[str] | None = None
    app: str | None = None
    #: agent → UTC day → partition → USD
    spend: dict[str, dict[str, dict[str, float]]] | None = None


class CircuitTransition(_CircuitBase):
    """A breaker transition, recorded by the worker whose event at offset ``cause`` caused it (for joiners)."""

    kind: Literal["transition"] = "transition"
    to: Literal["closed", "open", "half_open"]
    opened_at: float | None = None
    closed_at: float | None = None
    cause: int


class CircuitFailure(_CircuitBase):
    """A call failed; ``probe_id`` is set when it was an admitted probe. ``successes``: the sender's calls that
    succeeded since its last report, the latest ``success_age`` seconds before this event (both None: none)."""

    OMIT_IF_NONE: ClassVar[frozenset[str]] = frozenset({"successes", "success_age"})

    kind: Literal["failure"] = "failure"
    probe_id: str | None = None
    successes: int | None = Field(default=None, ge=1)
    success_age: float | None = Field(default=None, ge=0, le=3600)


class CircuitSuccess(_CircuitBase):
    """A probe answered (``probe_id``), or, with ``count``, the sender's calls that succeeded since its last report
    (sent every few seconds, not one event per call), the latest ``age`` seconds before this event."""

    OMIT_IF_NONE: ClassVar[frozenset[str]] = frozenset({"count", "age"})

    kind: Literal["success"] = "success"
    probe_id: str | None = None
    count: int | None = Field(default=None, ge=1)
    age: float | None = Field(default=None, ge=0, le=3600)


class CircuitProbe(_CircuitBase):
    """A worker asks for a half-open probe place; it calls only if the fold admits ``probe_id``."""

    kind: Literal["probe"] = "probe"
    probe_id: str


class CircuitProbeCancel(_CircuitBase):
    """A probe place is given back (its verdict came too late, or the call was cancelled)."""

    kind: Literal["probe_cancel"] = "probe_cancel"
    probe_id: str


class CircuitRateLimited(_CircuitBase):
    """A 429: the provider takes no call before ``until`` (sender's clock). ``retry_after`` (seconds) is
    None when absent; when present the fold counts it from its own (broker) time instead of ``until``."""

    OMIT_IF_NONE: ClassVar[frozenset[str]] = frozenset({"retry_after"})

    kind: Literal["rate_limited"] = "rate_limited"
    until: float
    retry_after: float | None = None


CircuitsEvent = Annotated[
    Union[
        CircuitHello, CircuitTransition, CircuitFailure, CircuitSuccess, CircuitProbe, CircuitProbeCancel,
        CircuitRateLimited,
    ],
    Field(discriminator="kind"),
]

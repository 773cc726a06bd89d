"""The root of every internal event and the one error a reader of an internal topic meets (contract/events.py)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict

__all__ = ["EventDecodeError", "InternalEvent"]


class EventDecodeError(ValueError):
    """A record of an internal topic that is not an event of its family. It carries no work: log it, skip it.

    ``kind`` is the record's kind when it had one; ``unknown_kind`` is True when that kind is not of the
    family (a newer worker's, most likely) rather than a known kind with a broken body.
    """

    def __init__(self, family: str, reason: str, *, kind: str | None = None, unknown_kind: bool = False) -> None:
        super().__init__(f"{family} event: {reason}")
        self.family = family
        self.reason = reason
        self.kind = kind
        self.unknown_kind = unknown_kind


class InternalEvent(BaseModel):
    """The root of every internal event: frozen, strict (no coercion), unknown fields ignored (evolution)."""

    model_config = ConfigDict(frozen=True, extra="ignore", strict=True)

    #: fields left out of the encoding when None: a producer sends them only when they have a value
    OMIT_IF_NONE: ClassVar[frozenset[str]] = frozenset()

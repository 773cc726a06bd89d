"""What every table record shares: versioned JSON in and out (never pickled), unknown fields ignored."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, TypeVar

R = TypeVar("R", bound="JsonRecord")


class JsonRecord:
    """Mixin for the frozen dataclasses the tables store (TaskRecord, JobRecord)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_json(cls: type[R], data: dict[str, Any]) -> R:
        # a newer worker's fields are ignored, so workers can be upgraded one at a time
        known = cls.__dataclass_fields__  # type: ignore[attr-defined]
        return cls(**{k: v for k, v in data.items() if k in known})

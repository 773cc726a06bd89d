"""JSON as the contract reads it: no NaN or Infinity (not JSON; they poison sums), and a bounded nesting depth."""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["MAX_ANSWER_DEPTH", "MAX_DEPTH", "nesting_depth", "strict_json"]

#: the deepest nesting an internal record may have. pydantic reads JSON up to 200 levels and writes up to 255,
#: and a task's answer travels on, one or two levels deeper each time, inside a result, a fan-in event and the
#: next step's task (docs/decisions.md, "Internal topics cannot stall a partition")
MAX_DEPTH = 128
#: the deepest answer a provider may give: a few levels under MAX_DEPTH for the envelopes it travels in
MAX_ANSWER_DEPTH = 120


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"{text[:20]} does not fit a float")
    return number


def strict_json(raw: bytes | str) -> Any:
    """``json.loads`` without NaN, Infinity or floats that overflow to infinity (ValueError for them)."""
    return json.loads(raw, parse_constant=_refuse_constant, parse_float=_finite)


def nesting_depth(value: Any, limit: int) -> int:
    """How deep ``value`` nests (a scalar is 0, ``[]`` is 1), counted without recursion; stops past ``limit``."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            if deepest > limit:
                return deepest
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest

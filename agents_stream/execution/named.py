"""Objects the config names by ``"package.module:NAME"`` (a saga, an agent): imported, and checked for their type."""

from __future__ import annotations

import importlib
from typing import TypeVar

__all__ = ["load_named"]

T = TypeVar("T")


def load_named(path: str, kind: type[T], what: str) -> T:
    """The ``kind`` object at ``path``; ValueError saying what is wrong (``what``: "saga", "agent")."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{what} {path!r}: expected 'package.module:NAME'")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"{what} {path!r} cannot be loaded: {exc}") from None
    if not isinstance(obj, kind):
        raise ValueError(f"{what} {path!r} is not an agents_stream {kind.__name__}")
    return obj

"""Objects the config names by ``"package.module:NAME"`` (a saga, an agent): imported, and checked for their type."""

from __future__ import annotations

import importlib
from typing import TypeVar

__all__ = ["load_named", "load_object", "not_found"]

T = TypeVar("T")


def load_named(path: str, kind: type[T], what: str) -> T:
    """The ``kind`` object at ``path``; ValueError saying what is wrong (``what``: "saga", "agent")."""
    obj = load_object(path, what)
    if not isinstance(obj, kind):
        raise ValueError(f"{what} {path!r} is not an agents_stream {kind.__name__}")
    return obj


def load_object(path: str, what: str) -> object:
    """The object at ``path``, whatever its type; ValueError saying what is wrong."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{what} {path!r}: expected 'package.module:NAME'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(f"{exc.name}.")):
            raise ValueError(f"{what} {path!r} cannot be loaded: {not_found(exc.name)}") from None
        raise ValueError(f"{what} {path!r} cannot be loaded: importing {module_name} failed: {exc}") from None
    except ImportError as exc:
        raise ValueError(f"{what} {path!r} cannot be loaded: importing {module_name} failed: {exc}") from None
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise ValueError(f"{what} {path!r} cannot be loaded: module {module_name} has no {attr!r}") from None
    return obj


def not_found(module: str) -> str:
    """What to do about a module of the config that Python cannot find: where modules are looked up."""
    return (f"no module named {module!r} on Python's path (the directory the worker was started in, then "
            f"PYTHONPATH, then the installed packages): start the worker from the directory that holds "
            f"{module.split('.')[0]}.py (or its package), or set PYTHONPATH=<that directory> "
            "(docs/guide/agents.md, \"Where an agent's module lives\")")

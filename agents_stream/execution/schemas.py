"""JSON Schemas from tasks and config, made safe to use: nothing fetched, local $refs only, bounded size and time.

A task's ``output_schema`` is written by whoever can produce to a task topic. Left to
jsonschema's defaults, a remote ``$ref`` makes the worker fetch a URL of the sender's
choosing (urllib, no timeout, on the event loop) and a ``pattern`` runs on Python's
backtracking ``re``, where ``^(a+)+$`` against forty a's and a "!" never ends. Here:

- the validator's registry retrieves nothing, and a ``$ref`` (``$dynamicRef``,
  ``$recursiveRef``) that does not start with ``#`` is refused when the schema is compiled;
- a schema is at most ``MAX_SCHEMA_BYTES`` of compact JSON and ``MAX_SCHEMA_DEPTH`` levels deep;
- every pattern runs on the ``regex`` engine with a timeout, and every check has a time
  budget of CPU seconds (``checking``): past it the check stops with ``CheckAborted``.
"""

from __future__ import annotations

import contextvars
import time
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, Callable, Iterator

import jsonschema
import regex
from jsonschema.exceptions import ValidationError
from referencing import Registry, Resource
from referencing.exceptions import NoSuchResource, Unresolvable

__all__ = ["MAX_SCHEMA_BYTES", "MAX_SCHEMA_DEPTH", "CheckAborted", "checking", "refusal", "safe_validator"]

#: the largest schema accepted, as compact JSON (UTF-8 bytes)
MAX_SCHEMA_BYTES = 64 * 1024
#: the deepest nesting of objects and arrays accepted in a schema
MAX_SCHEMA_DEPTH = 64
_REF_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")
# jsonschema evaluates these with Python's re, out of reach of the keywords replaced below (_utils)
_UNSAFE_TOGETHER = ("unevaluatedProperties", "patternProperties")

#: when the running check must stop, in CPU time of its thread (time.thread_time()); None: no check runs here
_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("schema_check_deadline", default=None)


class CheckAborted(Exception):
    """An answer that could not be checked within the bounds: a pattern or a check that ran out of time, a
    ``$ref`` cycle, a ``$ref`` to nowhere. The schema's fault more than the answer's: not worth a format retry."""


def _refuse(uri: str) -> Resource[Any]:
    # The registry behind every validator: a $ref never makes a worker open a connection of the sender's choosing.
    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]  # an attrs class: mypy does not see its fields


_REGISTRY: Registry[Any] = Registry(retrieve=_refuse)  # type: ignore[call-arg]  # attrs fields, as above


def _short(path: str) -> str:
    return path if len(path) <= 80 else "…" + path[-79:]


def refusal(schema: Any, size: int) -> str | None:
    """Why ``schema`` (of ``size`` bytes as compact JSON) may not be used, or None. Walks without recursion."""
    if size > MAX_SCHEMA_BYTES:
        return f"{size} bytes of JSON > the limit of {MAX_SCHEMA_BYTES}"
    keywords: set[str] = set()
    stack: list[tuple[Any, int, str]] = [(schema, 1, "$")]
    while stack:
        node, depth, path = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            return f"nested deeper than {MAX_SCHEMA_DEPTH} levels at {_short(path)}"
        if isinstance(node, dict):
            keywords.update(k for k in node if isinstance(k, str))
            for key, value in node.items():
                if key in _REF_KEYWORDS and isinstance(value, str) and not value.startswith("#"):
                    return (f"{key} {value[:120]!r} at {_short(path)} is not local: only references inside the "
                            "schema (#...) are allowed, nothing is fetched")
                stack.append((value, depth + 1, f"{path}.{key}"))
        elif isinstance(node, list):
            stack.extend((value, depth + 1, f"{path}[{i}]") for i, value in enumerate(node))
    if all(k in keywords for k in _UNSAFE_TOGETHER):
        return "unevaluatedProperties with patternProperties is not supported (its patterns would run unbounded)"
    return None


@lru_cache(maxsize=512)
def _pattern(pattern: str) -> Any:
    try:
        return regex.compile(pattern)
    except (regex.error, RecursionError, OverflowError) as exc:
        raise ValueError(f"pattern {pattern[:80]!r} is not a regular expression: {exc}") from None


def _search(pattern: str, text: str) -> bool:
    deadline = _deadline.get()
    left = None if deadline is None else max(deadline - time.thread_time(), 0.001)
    try:
        return _pattern(pattern).search(text, timeout=left) is not None
    except TimeoutError:
        raise CheckAborted(f"pattern {pattern[:80]!r} ran out of time on a string of {len(text)} characters") from None


def _check_time() -> None:
    deadline = _deadline.get()
    if deadline is not None and time.thread_time() > deadline:
        raise CheckAborted("checking the answer ran out of time")


def _pattern_kw(validator: Any, patrn: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _search(patrn, instance):
        yield ValidationError(f"{instance!r:.80} does not match {patrn!r:.80}")


def _pattern_properties(validator: Any, patterns: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for patrn, subschema in patterns.items():
        for key, value in instance.items():
            if _search(patrn, key):
                yield from validator.descend(value, subschema, path=key, schema_path=patrn)


def _additional_properties(stock: Callable[..., Any]) -> Callable[..., Any]:
    """additionalProperties with the patternProperties keys matched here (jsonschema's own messages)."""

    def keyword(validator: Any, aP: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
        patterns = schema.get("patternProperties") if isinstance(schema, dict) else None
        if not patterns or not validator.is_type(instance, "object"):
            yield from stock(validator, aP, instance, schema)  # no pattern to run: the stock keyword is safe
            return
        properties = schema.get("properties", {})
        extras = [k for k in instance if k not in properties and not any(_search(p, k) for p in patterns)]
        if validator.is_type(aP, "object"):
            for extra in extras:
                yield from validator.descend(instance[extra], aP, path=extra)
        elif not aP and extras:
            verb = "does" if len(extras) == 1 else "do"
            joined = ", ".join(repr(each) for each in sorted(extras))
            regexes = ", ".join(repr(each) for each in sorted(patterns))
            yield ValidationError(f"{joined} {verb} not match any of the regexes: {regexes}")

    return keyword


def _timed(stock: Callable[..., Any]) -> Callable[..., Any]:
    def keyword(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
        _check_time()  # every keyword of every subschema asks: a schema cannot make one check run on
        yield from stock(validator, value, instance, schema)

    return keyword


def _safe_class(cls: Any) -> Any:
    keywords = {name: _timed(fn) for name, fn in cls.VALIDATORS.items()}
    keywords["pattern"] = _timed(_pattern_kw)
    keywords["patternProperties"] = _timed(_pattern_properties)
    if "additionalProperties" in cls.VALIDATORS:
        keywords["additionalProperties"] = _timed(_additional_properties(cls.VALIDATORS["additionalProperties"]))
    return jsonschema.validators.extend(cls, keywords)


@lru_cache(maxsize=16)
def _safe(cls: Any) -> Any:
    return _safe_class(cls)


def safe_validator(schema: dict[str, Any], cls: Any) -> Any:
    """A validator of ``cls``'s draft for a checked schema: nothing retrieved, patterns bounded, time bounded.
    Every pattern is compiled here, so a bad one is refused now (ValueError), not at check time."""
    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("pattern"), str):
                _pattern(node["pattern"])
            if isinstance(node.get("patternProperties"), dict):
                for patrn in node["patternProperties"]:
                    _pattern(patrn)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return _safe(cls)(schema, registry=_REGISTRY, format_checker=cls.FORMAT_CHECKER)


@contextmanager
def checking(budget_s: float) -> Iterator[None]:
    """Run one check, in this thread, under a budget of ``budget_s`` CPU seconds: patterns and keywords past it raise
    CheckAborted; a ``$ref`` cycle or a ``$ref`` to nowhere raises it too.

    CPU time, not the clock: regex's own timeout counts CPU time, and on a loaded machine a wall-clock budget would
    abort sound checks that were merely waiting for a core.
    """
    token = _deadline.set(time.thread_time() + budget_s)
    try:
        yield
    except RecursionError:
        raise CheckAborted("the check recursed too deeply (a $ref cycle, or an answer nested too deeply)") from None
    except Unresolvable as exc:
        raise CheckAborted(f"a $ref cannot be resolved inside the schema: {str(exc)[:120]}") from None
    finally:
        _deadline.reset(token)

"""What an answer must look like: output schemas, format retries, the simplified task, the cache key."""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import json
import re
from functools import lru_cache
from typing import Any, cast

import jsonschema
from jsonschema.exceptions import best_match
from pydantic import BaseModel, ValidationError

from agents_stream.config import AgentConfig
from agents_stream.contract.models import Confidence, TaskPayload
from agents_stream.execution.schemas import CheckAborted, checking, refusal, safe_validator

__all__ = [
    "CHECK_BUDGET_S",
    "CheckAborted",
    "FormatError",
    "OutputSpec",
    "corrective",
    "fingerprint",
    "load_model",
    "self_reported_confidence",
    "simplify",
    "with_format",
]

#: CPU seconds one check of an answer may use at most; past them: CheckAborted
CHECK_BUDGET_S = 1.0
#: how much of a rejection reason goes back to the model, and into FormatError messages
_ERROR_CHARS = 300
#: a whole answer wrapped in a Markdown code fence, as models like to send JSON
_FENCE = re.compile(r"\A\s*```(?:[A-Za-z0-9_+-]+(?=\s))?\s*(?P<body>.*?)\s*```\s*\Z", re.DOTALL)


class FormatError(Exception):
    """An answer that is not the declared JSON; the message says what is wrong, briefly."""


def _shorten(text: str, limit: int = _ERROR_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _strip_fence(text: str) -> str:
    match = _FENCE.match(text)
    return match.group("body") if match else text


def _reject_constant(name: str) -> Any:
    # json.loads accepts NaN and Infinity, which are not JSON and break every consumer downstream
    raise ValueError(f"{name} is not a JSON value")


def _parse_json(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise FormatError(f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except ValueError as exc:
        raise FormatError(f"not JSON: {exc}") from None
    except RecursionError:
        raise FormatError("not JSON: nested too deeply to decode") from None


def _json_path(parts: Any) -> str:
    path = "$"
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _at(path: str, message: str) -> str:
    # the root needs no "$: " prefix; everything deeper names where it went wrong
    return message if path == "$" else f"{path}: {message}"


_REQUIRED = re.compile(r"\A(?P<name>.*) is a required property\Z", re.DOTALL)


def _schema_message(error: jsonschema.ValidationError) -> str:
    message = error.message
    if error.validator == "required":
        match = _REQUIRED.match(message)
        if match:
            message = f"missing required property {match.group('name')}"
    return _shorten(_at(_json_path(error.absolute_path), message))


def _model_message(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False)
    parts = []
    for error in errors[:3]:
        loc = list(error["loc"])
        if error["type"] == "missing" and loc:
            parts.append(_at(_json_path(loc[:-1]), f"missing required property {str(loc[-1])!r}"))
        else:
            parts.append(_at(_json_path(loc), error["msg"]))
    more = f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""
    return _shorten("; ".join(parts) + more)


@lru_cache(maxsize=128)
def _compiled(key: str) -> jsonschema.protocols.Validator:
    """The validator of one schema (keyed by its sorted JSON); every task would otherwise recompile it."""
    schema = json.loads(key)
    why = refusal(schema, len(key.encode("utf-8")))
    if why is not None:
        raise ValueError(f"invalid output_schema: {why}")
    # honour a declared "$schema"; everything else is Draft 2020-12
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = _json_path(exc.absolute_path)
        raise ValueError(f"invalid output_schema at {where}: {_shorten(exc.message)}") from None
    except RecursionError:  # the depth bound above keeps this out of reach; a worker must not die of it anyway
        raise ValueError("invalid output_schema: nested too deeply to check") from None
    try:
        return safe_validator(schema, cls)
    except ValueError as exc:
        raise ValueError(f"invalid output_schema: {exc}") from None


def _schema_key(schema: dict[str, Any]) -> str:
    if not isinstance(schema, dict):
        raise ValueError(f"invalid output_schema: expected a JSON object, got {type(schema).__name__}")
    try:
        # allow_nan=False: NaN and Infinity are not JSON (a TOML schema can hold them)
        return json.dumps(schema, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"invalid output_schema: not JSON-serialisable: {exc}") from None
    except RecursionError:
        raise ValueError("invalid output_schema: nested too deeply") from None


@lru_cache(maxsize=64)
def load_model(path: str) -> type[BaseModel]:
    """The pydantic model named by ``"package.module:Model"``; ValueError when it cannot be had."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"output_model {path!r} must look like 'package.module:Model'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import-time failure is a configuration error
        raise ValueError(f"output_model {path!r}: cannot import {module_name!r}: {exc}") from None
    obj: Any = module
    for name in attr.split("."):
        try:
            obj = getattr(obj, name)
        except AttributeError:
            raise ValueError(f"output_model {path!r}: {module_name!r} has no attribute {attr!r}") from None
    if not (isinstance(obj, type) and issubclass(obj, BaseModel)):
        raise ValueError(f"output_model {path!r} is not a pydantic BaseModel subclass")
    return obj


class OutputSpec:
    """How one agent's (or one task's) answers are checked: a JSON Schema or a pydantic model.

    Build one with ``for_task``, ``from_schema`` or ``from_model``; an invalid
    schema or an unimportable model raises ValueError there, not at check time.
    """

    __slots__ = ("schema", "model", "_validator")

    def __init__(self, *, schema: dict[str, Any] | None = None, model: type[BaseModel] | None = None) -> None:
        if (schema is None) == (model is None):
            raise ValueError("an OutputSpec needs exactly one of schema or model")
        self.schema = schema
        self.model = model
        self._validator = _compiled(_schema_key(schema)) if schema is not None else None

    @property
    def validator(self) -> Any:
        """The compiled JSON-schema validator (shared by every spec of the same schema), or None for a model."""
        return self._validator

    @classmethod
    def from_schema(cls, schema: dict[str, Any]) -> OutputSpec:
        return cls(schema=schema)

    @classmethod
    def from_model(cls, model: str | type[BaseModel]) -> OutputSpec:
        return cls(model=load_model(model) if isinstance(model, str) else model)

    @classmethod
    def for_task(cls, agent: AgentConfig, task: TaskPayload) -> OutputSpec | None:
        """The task's own output_schema, else the agent's schema or model; None: any text is fine."""
        if task.output_schema is not None:
            return cls.from_schema(task.output_schema)
        if agent.output_schema is not None:
            return cls.from_schema(agent.output_schema)
        if agent.output_model is not None:
            return cls.from_model(agent.output_model)
        return None

    def check(self, text: str, *, budget_s: float = CHECK_BUDGET_S) -> Any:
        """The parsed answer (a JSON value) when it is valid; else FormatError saying why, or CheckAborted when
        the schema could not be applied within ``budget_s`` CPU seconds (a slow pattern, a $ref cycle)."""
        body = _strip_fence(text).strip()
        value = _parse_json(body)
        if self.model is not None:
            try:
                # model_validate_json, not model_validate: JSON-mode rules (e.g. ISO dates under strict)
                parsed = self.model.model_validate_json(body)
            except ValidationError as exc:
                raise FormatError(_model_message(exc)) from None
            return parsed.model_dump(mode="json")
        validator = self._validator
        if validator is None:  # unreachable: __init__ gives a spec without a model a schema
            raise TypeError("OutputSpec has neither a model nor a schema")
        with checking(budget_s):
            error = best_match(validator.iter_errors(value))
        if error is not None:
            raise FormatError(_schema_message(error))
        return value

    async def check_async(self, text: str, *, budget_s: float = CHECK_BUDGET_S) -> Any:
        """``check`` in a thread: the event loop (leases, heartbeats, other tasks) keeps running meanwhile.

        jsonschema is pure Python and the regex engine releases the GIL while it matches, so the loop gets its
        turns; the budget bounds how long the thread can run, so an abandoned check (cancelled) ends too.
        """
        return await asyncio.to_thread(self.check, text, budget_s=budget_s)

    def describe(self) -> str:
        """The schema as compact JSON text, for prompts."""
        schema = self.schema if self.schema is not None else self.model.model_json_schema()  # type: ignore[union-attr]
        return json.dumps(schema, ensure_ascii=False, separators=(",", ":"))

    def __repr__(self) -> str:
        what = f"model={self.model.__qualname__}" if self.model is not None else f"schema={self.describe()[:60]}"
        return f"OutputSpec({what})"


def with_format(instruction: str, spec: OutputSpec | None) -> str:
    """The first attempt's instruction: with a spec, one more line asking for only matching JSON."""
    if spec is None:
        return instruction
    return f"{instruction}\n\nAnswer with only JSON matching this JSON Schema: {spec.describe()}"


def corrective(prompt_instruction: str, error: str, spec: OutputSpec) -> str:
    """The instruction of a format retry: the original, why the last answer was rejected, what to send."""
    return (
        f"{prompt_instruction}\n\n"
        f"Your previous answer was rejected: {_shorten(error)}\n"
        f"Answer again with only JSON (no prose, no code fence) matching this JSON Schema: {spec.describe()}"
    )


_CONFIDENCES = frozenset({"high", "medium", "low"})


def self_reported_confidence(output: Any) -> Confidence | None:
    """``"high"``, ``"medium"`` or ``"low"`` when a JSON object answer says so in ``confidence``."""
    if not isinstance(output, dict):
        return None
    value = output.get("confidence")
    if isinstance(value, str) and value.strip().lower() in _CONFIDENCES:
        return cast(Confidence, value.strip().lower())
    return None


SIMPLIFY_PREFIX = "Give a brief, best-effort answer that covers only the essentials."
_MAX_STRING = 500
_MAX_ITEMS = 20
# deeper than this is replaced by "…": the light tier does not need it, and recursion stays bounded
_MAX_DEPTH = 32


def _trim(value: Any, depth: int = 0) -> Any:
    if depth > _MAX_DEPTH:
        return "…"
    if isinstance(value, str):
        return value if len(value) <= _MAX_STRING else value[:_MAX_STRING] + "…"
    if isinstance(value, (list, tuple)):
        return [_trim(v, depth + 1) for v in value[:_MAX_ITEMS]]
    if isinstance(value, dict):
        return {k: _trim(v, depth + 1) for k, v in value.items()}
    return value


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def simplify(
    instruction: str, context: dict[str, Any], *, max_context_chars: int = 2000,
) -> tuple[str, dict[str, Any]]:
    """The lightweight tier's task: a brief-answer instruction and a bounded, deterministic context.

    Strings over 500 chars are cut with "…" and lists to 20 items, at every depth.
    If the compact JSON (sorted keys) is still over ``max_context_chars``, top-level
    keys are kept in sorted order while they fit; the rest are dropped.
    """
    trimmed = _trim(context)
    if len(_dumps(trimmed)) > max_context_chars:
        kept: dict[str, Any] = {}
        size = 2  # "{}"
        for key in sorted(trimmed, key=str):
            # compact JSON of one entry is "key":value, plus a comma when it is not the first
            entry = len(_dumps(key if isinstance(key, str) else str(key))) + 1 + len(_dumps(trimmed[key]))
            extra = entry + (1 if kept else 0)
            if size + extra > max_context_chars:
                break
            kept[key] = trimmed[key]
            size += extra
        trimmed = kept
    return f"{SIMPLIFY_PREFIX}\n\n{instruction}", trimmed


def fingerprint(
    agent: str, instruction: str, context: dict[str, Any], output_schema: dict[str, Any] | None = None,
) -> str:
    """The key of the last-good-answer cache: the same agent, instruction, context (and the task's own
    output schema, when it has one), whatever the key order."""
    parts: list[Any] = [agent, instruction, context]
    if output_schema is not None:  # an answer to another shape is not an answer to this one
        parts.append(output_schema)
    blob = json.dumps(parts, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()

"""A job's plan: its schema, its steps, and the check that it can run (ids, dependencies, agents, no cycles)."""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import jsonschema
from jsonschema.exceptions import best_match

__all__ = ["MAX_STEPS", "PLANNER_STEP", "PLAN_SCHEMA", "PlanError", "Step", "validate_plan"]

MAX_STEPS = 100
#: the step id of the planner's task: a plan may not use it, or its task id would collide with the planner's
PLANNER_STEP = "plan"

_ID = r"^[A-Za-z0-9_.-]{1,64}$"
# jsonschema's "pattern" is re.search, whose "$" also matches before a trailing newline:
# a step id feeds a task id, where a control character makes the task a poison message.
_ID_EXACT = re.compile(r"[A-Za-z0-9_.-]{1,64}")
# a plan an LLM returns as text often comes wrapped in a Markdown code fence
_FENCE = re.compile(r"\A\s*```(?:[A-Za-z0-9_+-]+(?=\s))?\s*(?P<body>.*?)\s*```\s*\Z", re.DOTALL)

#: The shape of a plan. Also the planner agent's output_schema, so it stays plain: no $schema, no $ref,
#: and unknown fields are allowed (and ignored) so a plan may carry more than this version reads.
PLAN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["tasks"],
    "properties": {
        "tasks": {
            "type": "array",
            "minItems": 1,
            "maxItems": MAX_STEPS,
            "items": {
                "type": "object",
                "required": ["id", "agent", "instruction"],
                "properties": {
                    "id": {"type": "string", "pattern": _ID, "description": "unique within the plan"},
                    "agent": {"type": "string", "minLength": 1, "description": "the agent that does the task"},
                    "instruction": {"type": "string", "description": "what the agent must do"},
                    "depends_on": {
                        "type": "array",
                        "items": {"type": "string"},
                        "description": "ids of the tasks whose outputs this task needs",
                    },
                    "context_data": {"type": "object", "description": "extra data for the agent"},
                },
            },
        },
    },
}
_VALIDATOR = jsonschema.Draft202012Validator(PLAN_SCHEMA)


class PlanError(ValueError):
    """A plan that cannot run; the message names the problem."""


@dataclass(frozen=True)
class Step:
    """One task of a validated plan."""

    id: str
    agent: str
    instruction: str
    depends_on: tuple[str, ...] = ()
    context_data: dict[str, Any] = field(default_factory=dict)


def validate_plan(plan: Any, agents: Collection[str]) -> tuple[Step, ...]:
    """The steps of ``plan`` in plan order, or PlanError naming what makes it unrunnable.

    ``plan`` may be the JSON text of a plan, as a planner model might answer.
    """
    if isinstance(plan, str | bytes):
        plan = _parse(plan)
    error = best_match(_VALIDATOR.iter_errors(plan))
    if error is not None:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        raise PlanError(f"the plan does not match its schema at ${where}: {_schema_message(error)}")
    steps = tuple(
        Step(
            id=task["id"],
            agent=task["agent"],
            instruction=task["instruction"],
            # a repeated dependency is harmless: keep the first of each
            depends_on=tuple(dict.fromkeys(task.get("depends_on", ()))),
            context_data=dict(task.get("context_data", {})),
        )
        for task in plan["tasks"]
    )
    ids = [s.id for s in steps]
    for s in steps:
        if not _ID_EXACT.fullmatch(s.id):
            raise PlanError(f"task id {s.id!r} must be 1 to 64 letters, digits, '_', '.' or '-'")
        if s.id == PLANNER_STEP:
            raise PlanError(f"task id {PLANNER_STEP!r} is reserved for the planner's task")
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise PlanError(f"task ids must be unique; repeated: {', '.join(duplicates)}")
    known = set(ids)
    for s in steps:
        if s.id in s.depends_on:
            raise PlanError(f"task {s.id!r} depends on itself")
        missing = [d for d in s.depends_on if d not in known]
        if missing:
            raise PlanError(f"task {s.id!r} depends on {', '.join(map(repr, missing))}, not a task of the plan")
        if s.agent not in agents:
            raise PlanError(
                f"task {s.id!r} names agent {s.agent!r}, which is not known; known agents: {', '.join(sorted(agents))}"
            )
    cycle = _find_cycle({s.id: s.depends_on for s in steps}, ids)
    if cycle:
        raise PlanError(f"the plan has a cycle (each runs before the next): {' -> '.join([*cycle, cycle[0]])}")
    return steps


def _parse(text: str | bytes) -> Any:
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PlanError(f"the plan is not JSON: {exc}") from None
    match = _FENCE.match(text)
    body = match.group("body") if match else text
    try:
        return json.loads(body, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise PlanError(f"the plan is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except (ValueError, RecursionError) as exc:
        raise PlanError(f"the plan is not JSON: {exc or 'nested too deeply'}") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


_JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number"}


def _schema_message(error: jsonschema.ValidationError) -> str:
    # jsonschema's own messages quote the whole offending value: a 101-task plan would drown the reason
    # Errors out of a validator always carry these (jsonschema's Unset is for errors built by hand).
    kind: Any = error.validator
    limit: Any = error.validator_value
    value: Any = error.instance
    if kind == "maxItems":
        return f"{len(value)} items, at most {limit} allowed"
    if kind == "minItems":
        return f"{len(value)} items, at least {limit} required"
    if kind == "type":
        return f"expected {limit}, got {_JSON_TYPES.get(type(value), 'null')}"
    if kind == "required":
        missing = [name for name in limit if name not in value]
        return f"missing required property {', '.join(map(repr, missing))}"
    return _shorten(error.message)


def _shorten(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _find_cycle(deps: dict[str, tuple[str, ...]], order: list[str]) -> list[str]:
    """The members of one cycle in dependency order (empty when there is none)."""
    state: dict[str, int] = {}  # absent: unseen, 1: on the current path, 2: done
    for root in order:
        if root in state:
            continue
        # iterative depth-first search: a path is at most MAX_STEPS long, but recursion need not be trusted
        path: list[str] = [root]
        branches = [iter(deps[root])]
        state[root] = 1
        while path:
            nxt = next(branches[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                branches.pop()
            elif state.get(nxt) == 1:
                # path runs root → … → nxt → … → path[-1], and path[-1] depends on nxt
                cycle = path[path.index(nxt) :]
                # read along the arrows "x -> y" meaning "x must run before y"
                return list(reversed(cycle))
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                branches.append(iter(deps[nxt]))
    return []

"""One tool call of an agent loop: its arguments checked, its breaker asked, its retries, the entry the model reads.

Every call goes through the tool's breaker in the shared circuits (``tool:<module>.<function>``, one per tool for
all workers, like a provider's): an open breaker answers the model at once that the tool is unavailable, without a
call. A call that answers (a result, a ToolError, a FatalToolError) counts as a success for the breaker; a timeout,
a lost connection, a TransientError or an unexpected exception as a failure.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

from agents_stream.contract.errors import CircuitOpen, TransientError
from agents_stream.contract.events import CALL_ID_PATTERN
from agents_stream.contract.models import TaskPayload
from agents_stream.execution.agent_definitions import Agent
from agents_stream.execution.tools import FatalToolError, Tool, ToolContext, ToolError, deadline, result_text
from agents_stream.ops import tracing
from agents_stream.resilience.backoff import backoff
from agents_stream.resilience.circuit import Permit
from agents_stream.tables import journal

__all__ = ["Admission", "ToolCaller", "ToolCalling"]

log = logging.getLogger(__name__)

#: how a tool failure that is worth retrying looks (the tool's own TransientError, a timeout, a lost connection)
_TRANSIENT = (TransientError, TimeoutError, ConnectionError, aiohttp.ClientConnectionError)


class Admission(Protocol):
    """What a tool call asks before it runs and reports after (``resilience.circuits.Circuits`` is one)."""

    async def acquire(self, provider: str) -> Permit: ...

    def release(self, permit: Permit, result: str, *, retry_after: float | None = None) -> None: ...


@dataclass(frozen=True)
class ToolCalling:
    """How a run calls its tools: admitted by ``circuits`` (None: no breaker asked), a failure worth retrying retried
    after a backoff between ``backoff_base_s`` and ``backoff_cap_s`` (jitter from ``rng``; None: a fresh one), each
    call a span under ``trace`` (None: not traced) and given ``fencing_token``, the run's dispatch number."""

    circuits: Admission | None = None
    backoff_base_s: float = 0.2
    backoff_cap_s: float = 5.0
    rng: random.Random | None = None
    trace: str | None = None
    fencing_token: int = 0


class ToolCaller:
    """Runs the tool calls of one task's loop."""

    def __init__(self, agent: Agent, task: TaskPayload, calling: ToolCalling = ToolCalling()) -> None:
        self.agent = agent
        self.task = task
        self.fencing_token = calling.fencing_token  # the run's dispatch number, given to each tool (ToolContext)
        #: the traceparent each call's span hangs under (ops/tracing.py); None: not traced
        self.trace = calling.trace
        self._circuits = calling.circuits
        self._backoff = (calling.backoff_base_s, calling.backoff_cap_s)
        self._rng = calling.rng or random.Random()

    def delegation_problem(self, tool: Tool, call: dict[str, Any]) -> str | None:
        """Why a call of an agent tool cannot become a sub-task (the model is told), or None when it can."""
        try:
            tool.validate(call["arguments"])
        except ToolError as exc:
            return str(exc)
        parent = self.task.parent
        lineage = [*(parent.lineage if parent else []), self.task.agent_name]
        if tool.delegate in lineage:
            return f"{tool.name} is not called: agent {tool.delegate} is already in the chain {' → '.join(lineage)}"
        if len(lineage) >= self.agent.max_depth:
            return f"{tool.name} is not called: the chain {' → '.join(lineage)} is at max_depth {self.agent.max_depth}"
        if not re.match(CALL_ID_PATTERN, call["id"]) or len(f"{self.task.task_id}/{call['id']}") > 256:
            return f"{tool.name} is not called: its call id {call['id'][:40]!r} cannot name a sub-task"
        return None

    async def call(
        self, turn: int, call: dict[str, Any], decision: dict[str, Any] | None = None,
        subresult: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """One tool call to its journal entry: the result, or the error the model is told of (``decision``: a
        human's on this call, a rejected call does not run; ``subresult``: the delegated sub-task's result).
        Traced, it is a span (``execute_tool <name>``); an agent tool's is its sub-task's (``invoke_agent``)."""
        tool = self.agent.by_name.get(call["name"])
        span = None
        if self.trace is not None and (tool is None or tool.delegate is None):
            span = tracing.span(f"execute_tool {call['name'][:64]}", self.trace, attributes={
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": call["name"],
                "gen_ai.tool.call.id": call["id"], "gen_ai.tool.type": "function", "agents_stream.turn": turn,
                "agents_stream.task_id": self.task.task_id,
            })
        if span is None:
            return await self._call(turn, call, decision, subresult, None)
        try:
            entry = await self._call(turn, call, decision, subresult, span)
        except BaseException as exc:
            span.fail(f"{type(exc).__name__}: the call did not end")
            span.end()
            raise
        span.set({"agents_stream.attempts": entry["attempts"], "agents_stream.tool.fatal": entry["fatal"]})
        if entry["error"]:
            span.fail(entry["content"])
        span.end()
        return entry

    async def _call(
        self, turn: int, call: dict[str, Any], decision: dict[str, Any] | None, subresult: dict[str, Any] | None,
        span: tracing.Span | None,
    ) -> dict[str, Any]:
        entry = {"kind": "tool", "turn": turn, "id": call["id"], "name": call["name"], "error": True,
                 "fatal": False, "attempts": 0}
        tool = self.agent.by_name.get(call["name"])
        if tool is None:
            known = ", ".join(self.agent.by_name) or "none"
            return {**entry, "content": f"there is no tool {call['name']!r}; the tools are: {known}"}
        if call.get("error"):
            return {**entry, "content": f"invalid arguments for {tool.name}: {call['error']}"}
        try:
            arguments = tool.validate(call["arguments"])
        except ToolError as exc:
            return {**entry, "content": str(exc)}
        if tool.delegate is not None:
            return self._delegated(tool, call, entry, subresult)
        if decision is not None and decision["decision"] != "approve":
            said = f": {decision['comment']}" if decision.get("comment") else ""
            return {**entry, "fatal": tool.on_reject == "fail", "content": f"rejected by {decision['by']}{said}"}
        key = journal.call_key(self.task.task_id, turn, call["id"])
        if span is not None:
            span.set({"agents_stream.idempotency_key": key})
        attempt = 1
        while True:
            ctx = ToolContext(
                task=self.task, turn=turn, call_id=call["id"], key=key, attempt=attempt,
                deadline=deadline(tool.timeout_s),
                log=logging.LoggerAdapter(log, {"task_id": self.task.task_id, "tool": tool.name}),
                fencing_token=self.fencing_token,
            )
            done = await self._attempt(tool, ctx, arguments, entry, span)
            if done is not None:
                return done
            base, cap = self._backoff
            await asyncio.sleep(backoff(attempt, base=base, cap=cap, rng=self._rng))
            attempt += 1

    def _delegated(
        self, tool: Tool, call: dict[str, Any], entry: dict[str, Any], subresult: dict[str, Any] | None,
    ) -> dict[str, Any]:
        """An agent tool's entry: its sub-task's output, or why it failed or was never started."""
        if subresult is None:
            return {**entry, "content": self.delegation_problem(tool, call) or f"{tool.name} was not delegated"}
        result = subresult["result"]
        if result.get("status") == "failed":
            return {**entry, "attempts": 1, "content": f"agent {tool.delegate} failed: {result.get('error')}"}
        return {**entry, "attempts": 1, "error": False, "content": result_text(result.get("output"))}

    async def _attempt(
        self, tool: Tool, ctx: ToolContext, arguments: Any, entry: dict[str, Any], span: tracing.Span | None,
    ) -> dict | None:
        """One attempt through the tool's breaker: its entry, or None when it is worth another attempt."""
        attempt = ctx.attempt
        permit = None
        if self._circuits is not None:
            try:
                permit = await self._circuits.acquire(tool.circuit)
            except CircuitOpen as exc:
                return {**entry, "attempts": attempt - 1,
                        "content": f"{tool.name} is unavailable now (its breaker is open: {exc}); it was not called"}
        verdict = "failure"
        try:
            if span is None:
                value = await tool.invoke(ctx, arguments)
            else:
                with span.current():  # spans the tool makes itself nest under its call's
                    value = await tool.invoke(ctx, arguments)
            verdict = "success"
            return {**entry, "attempts": attempt, "error": False, "content": result_text(value)}
        except ToolError as exc:
            verdict = "success"  # the tool answered: the call, not the tool, is at fault
            return {**entry, "attempts": attempt, "content": str(exc)}
        except FatalToolError as exc:
            verdict = "success"
            return {**entry, "attempts": attempt, "fatal": True, "content": str(exc)}
        except asyncio.CancelledError:
            verdict = "neutral"
            raise
        except _TRANSIENT as exc:
            why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            if attempt <= tool.retries:
                if span is not None:
                    span.event("retry", {"attempt": attempt, "error": why})
                return None
            log.warning("Task %s: tool %s failed %d times (%s); the model is told", self.task.task_id, tool.name,
                        attempt, why)
            return {**entry, "attempts": attempt,
                    "content": f"{tool.name} is unavailable (failed {attempt} times, last: {why})"}
        except Exception as exc:  # the tool's own bug or refusal: the model hears of it, the loop goes on
            log.warning("Task %s: tool %s raised %r; the model is told", self.task.task_id, tool.name, exc)
            return {**entry, "attempts": attempt, "content": f"{tool.name} failed: {type(exc).__name__}: {exc}"}
        finally:
            if permit is not None and self._circuits is not None:
                self._circuits.release(permit, verdict)

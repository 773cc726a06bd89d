"""The agent loop's journal read and written: a model turn as a journal entry, and the journal read back as the
conversation the model is shown and as the transcript a result carries. Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

from agents_stream.contract.models import TaskPayload
from agents_stream.execution.agent_definitions import Agent
from agents_stream.execution.history import earlier_turns, shown
from agents_stream.execution.outputs import OutputSpec
from agents_stream.execution.run import TurnAnswer
from agents_stream.execution.tools import error_detail, result_text
from agents_stream.providers.conversation import (
    AssistantTurn,
    Conversation,
    Message,
    ToolCall,
    ToolResult,
    UserText,
)
from agents_stream.tables import journal

__all__ = ["conversation", "transcript", "turn_entry"]


def turn_entry(turn: int, answer: TurnAnswer, version: str) -> dict[str, Any]:
    """A model's turn as the journal keeps it: its text, its calls (each with an id of its own), where it came from
    and what it cost, and the agent code version that asked it."""
    calls, seen = [], set()
    for i, c in enumerate(answer.turn.calls):
        call_id = c.id or f"call_{turn}_{i}"
        while call_id in seen:  # a model that gives two calls one id: each must be journaled on its own
            call_id += "_"
        seen.add(call_id)
        made: dict[str, Any] = {"id": call_id, "name": c.name, "arguments": c.arguments}
        if c.error:
            made["error"] = c.error
        if c.signature:
            made["signature"] = c.signature
        calls.append(made)
    usage = answer.turn.usage
    return {
        "kind": "turn", "turn": turn, "text": answer.turn.text, "calls": calls, "source": answer.source,
        "confidence": answer.confidence, "provider_calls": answer.provider_calls,
        "usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens, "cost": answer.cost},
        "version": version,
    }


def conversation(
    task: TaskPayload, agent: Agent, system: str, entries: list[Any], spec: OutputSpec | None = None,
) -> Conversation:
    """The conversation the journal stands for: the task, then each turn, its calls' results (in the model's
    order, however they finished) and any correction, as the next turn's request sends it."""
    state = journal.replay(entries)
    instruction = f"[task_id={task.task_id}]\n{task.instruction}"
    if task.context_data:
        instruction += "\n\nContext (JSON):\n" + result_text(task.context_data)
    if spec is not None:
        instruction += f"\n\nThe final answer: only JSON matching this JSON Schema: {spec.describe()}"
    messages: list[Message] = [*earlier_turns(task, shown(task, entries)), UserText(instruction)]
    messages += [UserText(text) for text in state.messages.get(-1, [])]  # messages that came before any turn
    for t in state.turns:
        n = t["turn"]
        calls = tuple(
            ToolCall(c["id"], c["name"], c["arguments"], c.get("error"), c.get("signature")) for c in t["calls"]
        )
        messages.append(AssistantTurn(t["text"], calls))
        for c in t["calls"]:
            r = state.results.get((n, c["id"]))
            if r is not None:
                messages.append(ToolResult(c["id"], c["name"], r["content"], r["error"]))
        messages += [UserText(note) for note in state.notes.get(n, [])]
        messages += [UserText(text) for text in state.messages.get(n, [])]  # a conversation's new messages
    return Conversation(system, tuple(messages), tuple(t.spec for t in agent.tools))


def transcript(entries: list[Any]) -> dict[str, Any]:
    """What a result says of the loop: its turns and tool calls, with the usage and cost of every model call."""
    state = journal.replay(entries)
    turns = [
        {"turn": t["turn"], "source": t["source"], "provider_calls": t["provider_calls"], "usage": t["usage"],
         "tool_calls": [c["name"] for c in t["calls"]], "version": t.get("version")}
        for t in state.turns
    ]
    calls = [
        {"turn": r["turn"], "id": r["id"], "name": r["name"], "error": r["error"], "attempts": r["attempts"],
         **({"detail": error_detail(r["content"])} if r["error"] else {})}
        for r in sorted(state.results.values(), key=lambda r: (r["turn"], r["id"]))
    ]
    return {"turns": turns, "tool_calls": calls}

"""The agent of B2's agent figure: three model turns, two tool calls (instant tools: the figure is the loop's cost)."""

from __future__ import annotations

from agents_stream.execution.agent_definitions import Agent
from agents_stream.execution.tools import ToolContext, tool


@tool
async def fetch(ctx: ToolContext) -> dict:
    """Fetch the record the task is about."""
    return {"record": ctx.task.task_id}


@tool
async def store(ctx: ToolContext) -> str:
    """Store the answer."""
    return f"stored under {ctx.key}"


BENCH = Agent("bench", "Fetch the record, store the answer, then say done.", tools=[fetch, store], max_turns=4)

"""An agent whose tool returns a large output: a day's log, ``kb`` kilobytes of it (deterministic text).

For tests and benchmarks of long conversations (tests/integration/test_conversation_scale.py): each round's tool
output lands in that round's journal, never in the conversation's own records. Configure it with
``agent = "agents_stream.testing.log_agent:LOGS"``.
"""

from __future__ import annotations

from agents_stream import Agent, ToolContext, tool

#: the most one call returns: the round's journal entry must stay one Kafka record
MAX_KB = 500


@tool
async def read_log(ctx: ToolContext, kb: int) -> str:
    """Read the last ``kb`` kilobytes of today's service log."""
    size = max(0, min(kb, MAX_KB)) * 1024
    line = f"{ctx.key} ok request served in 12 ms\n"
    return (line * (size // len(line) + 1))[:size]


LOGS = Agent(
    "logs", instructions="You answer questions about the service from its log. Read the log, then answer briefly.",
    tools=[read_log], max_turns=4, tool_result_max_bytes=(MAX_KB + 1) * 1024,
)

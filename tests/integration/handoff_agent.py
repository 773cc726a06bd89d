"""A desk agent with the built-in ``handoff`` tool, for tests/integration/test_handoff.py (loaded by workers)."""

from agents_stream import handoff
from agents_stream.execution.agent_definitions import Agent

DESK = Agent(
    "desk",
    instructions="You answer customers. When a customer asks for a person, call handoff with the reason.",
    tools=[handoff],
    max_turns=4,
)

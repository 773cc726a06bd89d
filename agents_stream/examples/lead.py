"""A lead agent that delegates: it asks the configured ``analyzer`` and ``summarizer`` agents (agents as tools).

Each call becomes a sub-task ``<task_id>/<call_id>`` on that agent's topic, run by any worker of any app id that
runs it; the lead waits without a slot and goes on when both results are back. Configure an agent with
``agent = "agents_stream.examples.lead:LEAD"`` next to ``analyzer`` and ``summarizer`` (the default config's).
"""

from __future__ import annotations

from agents_stream import Agent, agent_tool

LEAD = Agent(
    "lead",
    instructions=(
        "You lead a small team. Ask the analyzer for the facts and the summarizer for a summary of the context, "
        "then answer with a short report built from both."
    ),
    tools=[
        agent_tool("analyzer", "Ask the analyst agent: it answers an instruction about the context it is given."),
        agent_tool("summarizer", "Ask the summarizer agent: it summarises the context it is given."),
    ],
    max_turns=6,
)

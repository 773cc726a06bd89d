"""Agents that act, written in Python: instructions, tools and limits (the API users write agents with).

    SUPPORT = Agent(
        "support",
        instructions="You resolve customer issues. Look the order up before you act.",
        tools=[lookup_order, create_label, refund, notify_customer],
        max_turns=8,
    )

An agent whose config names a definition (``agent = "package.module:SUPPORT"``)
runs every task as a tool-calling loop: the model decides which tool to call
next, each model turn and each tool result is journaled in the task's ledger
record before the next action (``tables/journal.py``), and the loop resumes from
the journal after a crash, a rebalance or a hold. Providers, the ladder,
breakers, budgets and approvals still come from the config. ``mcp=["desk"]``
adds the tools of an MCP server (execution/mcp_tools.py), listed at start.

A journal outlives the code that wrote it: every model turn journals the
agent's ``code_version`` (``version=`` as the author labels it, and a
fingerprint of what the model is shown: instructions, tools, output model), and
a journal whose next call the new code cannot run fails the task instead of
doing something else (the upgrade contract, docs/upgrades.md). A renamed tool
keeps old journals going with ``renamed={"old_name": "new_name"}``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from agents_stream.config import McpServerConfig
from agents_stream.execution.named import load_named
from agents_stream.execution.tools import Tool
from agents_stream.tables.journal import Limits

__all__ = ["Agent", "load_agent"]


@dataclass(frozen=True)
class Agent:
    name: str
    instructions: str
    tools: tuple[Tool, ...] | list[Tool] = ()
    #: the final answer must validate as this model (its JSON is the task's output); None: the text is
    output_model: type[BaseModel] | None = None
    max_turns: int = 10
    max_tool_calls: int = 25
    #: failed tool calls (errors, invalid arguments) told to the model before the task fails
    max_tool_errors: int = 5
    #: corrections of a final answer that did not match ``output_model``
    format_retries: int = 2
    #: the largest tool result kept in the journal (bytes of its text)
    tool_result_max_bytes: int = 65_536
    #: a larger one: "fail" ends the task (journal_too_large), "truncate" keeps its start with a marker
    on_large_result: Literal["fail", "truncate"] = "fail"
    #: tokens (input and output, summed over the turns) and USD a task may use before it fails (budget_exceeded)
    max_tokens: int | None = None
    max_cost_usd: float | None = None
    #: the longest chain of agents calling agents (this one included) a task of this agent may start
    max_depth: int = 3
    #: MCP servers whose tools the model may call too: names of the config's ``[mcp.<name>]`` tables, or servers
    #: defined here (``McpServerConfig(name=..., url=...)`` or ``command=[...]``); their tools are listed at start
    mcp: tuple[str | McpServerConfig, ...] | list[str | McpServerConfig] = ()
    #: the author's label of this code (e.g. "2"); journaled with the fingerprint, shown in transcripts
    version: str | None = None
    #: tools renamed since a journal was written, old name → new name: an old journal's call runs the new tool
    #: under its first key; a model calling the old name runs it too (it is offered only the new one)
    renamed: tuple[tuple[str, str], ...] | dict[str, str] = ()
    #: the tools by name, renamed ones under their old names too
    by_name: dict[str, Tool] = field(init=False, repr=False, compare=False)
    #: a hash of what the model is shown and may call (the instructions, each tool's name, description and
    #: schema and the agent it delegates to, the renames, the output model); not the limits
    fingerprint: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        tools = tuple(self.tools)
        object.__setattr__(self, "tools", tools)
        object.__setattr__(self, "mcp", tuple(self.mcp))
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise ValueError(f"agent {self.name!r}: two tools share a name in {names}")
        if min(self.max_turns, self.max_tool_calls, self.tool_result_max_bytes) < 1:
            raise ValueError(f"agent {self.name!r}: max_turns, max_tool_calls and tool_result_max_bytes must be >= 1")
        renamed = tuple(sorted(dict(self.renamed).items()))
        object.__setattr__(self, "renamed", renamed)
        by_name = {t.name: t for t in tools}
        for old, new in renamed:
            if old in by_name or new not in by_name:
                raise ValueError(f"agent {self.name!r}: renamed {old!r} → {new!r} needs {new!r} among its tools "
                                 f"and {old!r} not: the tools are {names}")
        object.__setattr__(self, "by_name", {**by_name, **{old: by_name[new] for old, new in renamed}})
        object.__setattr__(self, "fingerprint", _fingerprint(self))

    @property
    def code_version(self) -> str:
        """What each journaled turn records: ``<version>+<fingerprint>``, or the fingerprint without a label."""
        return f"{self.version}+{self.fingerprint}" if self.version else self.fingerprint

    @property
    def limits(self) -> Limits:
        return Limits(self.max_turns, self.max_tool_calls, self.max_tool_errors, self.format_retries,
                      self.max_tokens, self.max_cost_usd)


def _fingerprint(agent: Agent) -> str:
    """12 hex digits of a SHA-256 over what a journal's continuation depends on, in a canonical JSON."""
    shown: dict[str, Any] = {
        "instructions": agent.instructions,
        "tools": sorted(
            ({"name": t.spec.name, "description": t.spec.description, "parameters": t.spec.parameters,
              "delegate": t.delegate} for t in agent.tools),
            key=lambda t: t["name"]),
        "renamed": agent.renamed,
        "output": agent.output_model.model_json_schema() if agent.output_model else None,
    }
    canonical = json.dumps(shown, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def load_agent(path: str) -> Agent:
    """``package.module:NAME`` → the Agent; ValueError saying what is wrong."""
    return load_named(path, Agent, "agent")

"""MCP tools without a server: names, input schemas made safe, arguments, the key in _meta, results, retries, the
config, the plans and their breakers, and when an agent holds because its server was never listed."""

from __future__ import annotations

import logging
import random
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from agents_stream.config import AppConfig, McpServerConfig, load_config
from agents_stream.contract.models import TaskPayload
from agents_stream.execution.agent_definitions import Agent
from agents_stream.execution.mcp_servers import McpConnection, McpServers, ensure_sdk
from agents_stream.execution.mcp_tools import (
    ATTEMPT_META,
    KEY_META,
    MAX_TOOLS,
    McpTool,
    exposed_name,
    from_listing,
    result_text,
)
from agents_stream.execution.plan import AgentPlan, mcp_servers, with_tool_circuits
from agents_stream.execution.tool_calls import ToolCaller, ToolCalling
from agents_stream.execution.tools import ToolContext, ToolError, tool
from agents_stream.providers.local import LocalProvider

DESK = McpServerConfig(name="desk", url="http://127.0.0.1:1/mcp", timeout_s=3, retries=2)
TICKET = {
    "name": "create_ticket", "title": "Create ticket", "description": "Open a ticket.",
    "inputSchema": {"type": "object", "title": "create_ticketArguments",
                    "properties": {"title": {"type": "string"}, "priority": {"type": "integer", "minimum": 1}},
                    "required": ["title"]},
}
TASK = TaskPayload(task_id="t-1", agent_name="desk", instruction="open a ticket")


@dataclass
class Server:
    """An McpCall: answers from a list (a dict is the result, an exception is raised), records every call."""

    answers: list[Any] = field(default_factory=list)
    calls: list[tuple[str, dict[str, Any], dict[str, Any], float]] = field(default_factory=list)

    async def call(self, tool: str, arguments: dict[str, Any], meta: dict[str, Any], timeout_s: float) -> Any:
        self.calls.append((tool, arguments, meta, timeout_s))
        answer = self.answers.pop(0) if self.answers else {"content": [{"type": "text", "text": "ok"}]}
        if isinstance(answer, BaseException):
            raise answer
        return answer


@dataclass
class Breakers:
    """An Admission that admits everything and records each call's verdict."""

    verdicts: list[tuple[str, str]] = field(default_factory=list)

    async def acquire(self, provider: str) -> Any:
        return provider

    def release(self, permit: Any, result: str, *, retry_after: float | None = None) -> None:
        self.verdicts.append((permit, result))


def ticket_tool(server: Server | None = None, config: McpServerConfig = DESK) -> McpTool:
    tools, problems = from_listing(config, [TICKET], server or Server())
    assert problems == []
    return tools[0]


def ctx(attempt: int = 1) -> ToolContext:
    return ToolContext(task=TASK, turn=0, call_id="c1", key="t-1:0:c1", attempt=attempt, deadline=0.0,
                       log=logging.LoggerAdapter(logging.getLogger("test"), {}))


def test_a_listed_tool_keeps_the_servers_schema_and_its_breaker_is_the_servers():
    """The model is offered the server's input schema (its pydantic title dropped); every tool of a server shares
    the breaker mcp:<server>, its timeout and retries are the server's."""
    made = ticket_tool()
    assert made.spec.name == "create_ticket" and made.spec.description == "Open a ticket."
    assert made.spec.parameters == {k: v for k, v in TICKET["inputSchema"].items() if k != "title"}
    assert made.circuit == "mcp:desk" and made.timeout_s == 3 and made.retries == 2 and made.remote == "create_ticket"


def test_names_are_prefixed_and_made_fit_for_every_provider():
    """Providers take [A-Za-z0-9_-]{1,64}: other characters become _, long names are cut; the prefix comes first."""
    assert exposed_name("s_", "lookup") == "s_lookup"
    assert exposed_name("", "files.read/v2") == "files_read_v2"
    assert exposed_name("", "x" * 100) == "x" * 64
    tools, _ = from_listing(DESK.model_copy(update={"prefix": "desk."}), [TICKET], None)
    assert tools[0].name == "desk_create_ticket" and tools[0].remote == "create_ticket"


@pytest.mark.parametrize("schema, why", [
    ({"type": "object", "properties": {"a": {"$ref": "https://example.com/s.json"}}}, "is not local"),
    ({"type": "array"}, "the arguments of a call are an object"),
    ("not a schema", "not a JSON object"),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "("}}}, "is not a 'regex'"),
    ({"type": "object", "properties": {"a": {"type": "strnig"}}}, "inputSchema"),
])
def test_a_tool_whose_schema_would_be_unsafe_is_left_out_and_said_why(schema, why):
    """A remote $ref (never fetched), a non-object, a bad pattern or an invalid schema: the tool is not offered, the
    others are, and the reason names the tool."""
    tools, problems = from_listing(DESK, [{"name": "bad", "inputSchema": schema}, TICKET], None)
    assert [t.name for t in tools] == ["create_ticket"]
    assert len(problems) == 1 and problems[0].startswith("bad: its inputSchema is refused") and why in problems[0]


def test_an_allow_list_offers_only_the_tools_it_names_and_reports_the_missing_ones():
    """tools = [...] keeps the server's other tools away from the model; a name the server does not list is said."""
    config = DESK.model_copy(update={"tools": ["create_ticket", "delete_everything"]})
    tools, problems = from_listing(config, [TICKET, {**TICKET, "name": "drop_tables"}], None)
    assert [t.name for t in tools] == ["create_ticket"]
    assert problems == ["delete_everything: named in tools = [...] but not listed by the server"]


def test_one_server_offers_at_most_max_tools():
    listed = [{**TICKET, "name": f"t{i}"} for i in range(MAX_TOOLS + 3)]
    tools, problems = from_listing(DESK, listed, None)
    assert len(tools) == MAX_TOOLS and len(problems) == 3 and "past the 128 tools" in problems[0]


def test_arguments_are_checked_against_the_servers_schema_before_any_call():
    """A wrong type or a missing property goes back to the model as a ToolError naming it; nothing is called."""
    made = ticket_tool()
    assert made.validate({"title": "x", "priority": 2}) == {"title": "x", "priority": 2}
    with pytest.raises(ToolError, match=r"invalid arguments for create_ticket: .*priority.*"):
        made.validate({"title": "x", "priority": "high"})
    with pytest.raises(ToolError, match="missing required property 'title'"):
        made.validate({})
    with pytest.raises(ToolError, match="an object is expected"):
        made.validate(["x"])  # type: ignore[arg-type]


async def test_a_call_carries_its_key_and_attempt_in_meta_and_reads_the_servers_text():
    """The idempotency key and the attempt go in _meta; the server's text blocks are what the model reads."""
    server = Server([{"content": [{"type": "text", "text": "T-1"}, {"type": "text", "text": "opened"}]}])
    made = ticket_tool(server)
    assert await made.invoke(ctx(attempt=2), {"title": "x"}) == "T-1\nopened"
    assert server.calls == [("create_ticket", {"title": "x"}, {KEY_META: "t-1:0:c1", ATTEMPT_META: 2}, 3)]


async def test_an_is_error_result_is_a_tool_error_the_model_hears():
    made = ticket_tool(Server([{"isError": True, "content": [{"type": "text", "text": "no such customer"}]}]))
    with pytest.raises(ToolError, match="no such customer"):
        await made.invoke(ctx(), {"title": "x"})


def test_results_read_as_text_structured_content_and_named_blocks():
    """Text blocks in order; structuredContent as JSON when there is no text; an image is named, not sent on."""
    assert result_text({"content": [], "structuredContent": {"b": 1, "a": 2}}) == '{"a": 2, "b": 1}'
    assert result_text({"content": [{"type": "image", "data": "AAAA", "mimeType": "image/png"}]}) == (
        "[image content (image/png) not shown]")
    assert result_text({"content": [{"type": "resource", "resource": {"uri": "f://a", "text": "body"}},
                                    {"type": "resource_link", "uri": "f://b", "name": "b"}]}) == "body\n[resource f://b]"
    assert result_text("garbage") == ""


async def test_a_transient_failure_is_retried_with_the_same_key_and_counts_against_the_servers_breaker():
    """A lost connection and a timeout are retried (retries = 2) with the same key; the third attempt answers. Each
    failed attempt is a failure of the breaker mcp:desk, the answer a success."""
    server = Server([ConnectionError("lost"), TimeoutError("slow"), {"content": [{"type": "text", "text": "T-9"}]}])
    agent = Agent("desk", instructions="", tools=[ticket_tool(server)])
    breakers = Breakers()
    caller = ToolCaller(agent, TASK, ToolCalling(circuits=breakers, backoff_base_s=0.001, backoff_cap_s=0.001,
                                                 rng=random.Random(0)))
    entry = await caller.call(0, {"id": "c1", "name": "create_ticket", "arguments": {"title": "x"}})
    assert entry["content"] == "T-9" and entry["error"] is False and entry["attempts"] == 3
    assert [c[2] for c in server.calls] == [{KEY_META: "t-1:0:c1", ATTEMPT_META: n} for n in (1, 2, 3)]
    assert breakers.verdicts == [("mcp:desk", "failure"), ("mcp:desk", "failure"), ("mcp:desk", "success")]


async def test_an_answered_error_is_not_retried():
    """isError (and a server's protocol error) is an answer: one attempt, the model is told, not retried."""
    server = Server([{"isError": True, "content": [{"type": "text", "text": "refused"}]}])
    agent = Agent("desk", instructions="", tools=[ticket_tool(server)])
    caller = ToolCaller(agent, TASK, ToolCalling(circuits=Breakers(), backoff_base_s=0.001, backoff_cap_s=0.001,
                                                 rng=random.Random(0)))
    entry = await caller.call(0, {"id": "c1", "name": "create_ticket", "arguments": {"title": "x"}})
    assert entry["error"] is True and entry["content"] == "refused" and len(server.calls) == 1


# -- the config and the plans -------------------------------------------------------------------------------------

def app_config(**agent: Any) -> AppConfig:
    return AppConfig.model_validate({
        "providers": {"p": {"kind": "local"}},
        "mcp": {"desk": {"url": "http://127.0.0.1:9/mcp"}, "files": {"command": ["files-server", "--ro"]}},
        "agents": {"a": {"providers": ["p"], **agent}},
    })


@pytest.mark.parametrize("server, why", [
    ({}, "give url (streamable HTTP) or command (stdio)"),
    ({"url": "http://x/mcp", "command": ["x"]}, "one of them"),
    ({"url": "ftp://x/mcp"}, "must start with http"),
    ({"command": []}, "not empty"),
    ({"command": ["x"], "headers_env": {"Authorization": "T"}}, "headers_env is for a url server"),
    ({"url": "http://x/mcp", "env_from": ["T"]}, "are for a command server"),
    ({"url": "http://x/mcp", "timeout_s": float("inf")}, "timeout_s"),
    ({"url": "http://x/mcp", "breaker": {"failure_threshold": 0}}, "bad breaker settings"),
])
def test_a_bad_mcp_server_is_refused_at_start_with_its_name(server, why):
    with pytest.raises(ValidationError, match=re.escape(why)):
        AppConfig.model_validate({"providers": {"p": {"kind": "local"}}, "mcp": {"desk": server},
                                  "agents": {"a": {"providers": ["p"]}}})


def test_an_agent_naming_an_unknown_server_or_a_saga_with_one_is_refused():
    with pytest.raises(ValidationError, match=r"unknown MCP servers \['nope'\]"):
        app_config(mcp=["nope"])
    with pytest.raises(ValidationError, match="give saga or mcp"):
        app_config(mcp=["desk"], saga="x.y:Z")


def build(config: AppConfig, agent: str = "a") -> AgentPlan:
    return AgentPlan.build(config, agent, lambda name: LocalProvider(config.provider(name)))


def test_a_config_only_agent_of_mcp_servers_is_a_tool_loop_of_their_tools():
    """mcp = [...] without agent = ...: a loop with no tools of its own, the servers' added at start."""
    plan = build(app_config(mcp=["desk", "files"], system="You run a desk."))
    assert plan.agent is not None and plan.agent.tools == () and plan.agent.name == "a"
    assert [s.name for s in plan.mcp] == ["desk", "files"] and plan.mcp[1].command == ["files-server", "--ro"]


@tool
def local_note(text: str) -> str:
    """Keep a note."""
    return text


INLINE = McpServerConfig(name="inline", command=["inline-server"])
WITH_MCP = Agent("with_mcp", instructions="", tools=[local_note], mcp=["desk", INLINE])
OTHER_DESK = Agent("other", instructions="", mcp=[McpServerConfig(name="desk", url="http://elsewhere/mcp")])


def test_a_python_agent_names_config_servers_and_defines_its_own():
    plan = build(app_config(agent="tests.unit.execution.test_mcp_tools:WITH_MCP"))
    assert [s.name for s in plan.mcp] == ["desk", "inline"] and plan.mcp[1] is INLINE


def test_two_different_servers_under_one_name_are_refused():
    with pytest.raises(ValueError, match="two different MCP servers are named 'desk'"):
        build(app_config(agent="tests.unit.execution.test_mcp_tools:OTHER_DESK", mcp=["desk"]))
    config = app_config(mcp=["desk"])
    plans = {"a": build(config), "b": build(config)}
    plans["b"].mcp = (OTHER_DESK.mcp[0],)  # type: ignore[assignment]
    with pytest.raises(ValueError, match="different MCP server 'desk'"):
        mcp_servers(plans)


def test_each_server_gets_one_breaker_in_the_shared_circuits_with_a_probe_timeout_past_its_attempts():
    config = app_config(mcp=["desk", "files"])
    plans = {"a": build(config), "b": build(config)}
    extended, names = with_tool_circuits(config, plans)
    assert names == ["mcp:desk", "mcp:files"]
    desk = extended.providers["mcp:desk"]
    assert desk.timeout_s == 30 and extended.breaker_for("mcp:desk").probe_timeout_s == max(60.0, 30 * 3 + 10)


# -- holding until listed -----------------------------------------------------------------------------------------

def servers_for(config: AppConfig, *agents: str) -> tuple[McpServers, dict[str, AgentPlan]]:
    plans = {a: build(config, a) for a in agents}
    events: list[tuple[str, str]] = []
    made = McpServers(mcp_servers(plans), plans, send_control=lambda e, s, a, d: events.append((e, s)),
                      on_change=lambda: None)
    return made, plans


def test_an_agent_holds_until_every_server_of_it_was_listed_then_runs_with_their_tools():
    """Never listed: agent_for says why (the agent holds); once listed, the agent's tools and the servers' are one
    set; a listing kept while the server is down still counts."""
    mcp, plans = servers_for(app_config(agent="tests.unit.execution.test_mcp_tools:WITH_MCP"), "a")
    plan = plans["a"]
    why = mcp.agent_for(plan)
    assert isinstance(why, str) and "MCP server desk were never listed" in why and mcp.holds(plan)
    desk, inline = mcp.connections["desk"], mcp.connections["inline"]
    desk.tools, desk.generation = from_listing(desk.config, [TICKET], desk)[0], 1
    assert "MCP server inline" in str(mcp.agent_for(plan))
    inline.tools, inline.generation = from_listing(inline.config, [{**TICKET, "name": "grep"}], inline)[0], 1
    made = mcp.agent_for(plan)
    assert isinstance(made, Agent) and [t.name for t in made.tools] == ["local_note", "create_ticket", "grep"]
    assert not mcp.holds(plan) and mcp.agent_for(plan) is made, "the same listing gives the same agent"


def test_two_servers_offering_one_tool_name_hold_the_agent_and_say_to_set_a_prefix():
    mcp, plans = servers_for(app_config(mcp=["desk", "files"]), "a")
    for connection in mcp.connections.values():
        connection.tools, connection.generation = from_listing(connection.config, [TICKET], connection)[0], 1
    why = mcp.agent_for(plans["a"])
    assert isinstance(why, str) and "two tools share a name" in why and "prefix" in why


def test_the_example_config_of_the_readme_builds():
    """docs/examples/mcp-desk.toml: an agent of two servers, one over HTTP and one stdio with a prefix and a list."""
    config = load_config(Path(__file__).resolve().parents[3] / "docs" / "examples" / "mcp-desk.toml")
    plan = build(config, "desk")
    assert [(s.name, s.url is not None, s.prefix, s.tools) for s in plan.mcp] == [
        ("desk", True, "", None), ("crm", False, "crm_", ["lookup_customer"])]


def test_a_server_is_named_in_logs_without_its_credentials():
    """Logs and control events name a URL without userinfo, query or fragment, and a command by its program only."""
    secret = McpServerConfig(name="s", url="https://bot:pw@mcp.example.com:8443/v1/mcp?token=abc#frag")
    assert McpConnection(secret, on_change=lambda c, e: None, rng=random.Random()).describe() == (
        "https://mcp.example.com:8443/v1/mcp")
    command = McpServerConfig(name="s", command=["/opt/files-server", "--token", "abc"])
    assert McpConnection(command, on_change=lambda c, e: None, rng=random.Random()).describe() == (
        "stdio command /opt/files-server")


def test_a_worker_without_the_sdk_refuses_agents_of_mcp_servers_saying_what_to_install(monkeypatch):
    """The SDK is an extra: a worker whose agents name a server and that lacks it stops at start with the fix."""
    monkeypatch.setitem(sys.modules, "mcp", None)
    with pytest.raises(ValueError, match=re.escape("pip install 'agents-stream[mcp]'")):
        ensure_sdk(["desk"])

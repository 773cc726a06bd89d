"""Tools of MCP servers as the agent loop's tools: names, input schemas made safe, arguments checked, results as text.

A tool an MCP server lists becomes an ``McpTool``: the model sees it under the server's ``prefix`` and its own
name, with the server's ``inputSchema`` as its JSON Schema (refused when ``execution/schemas.py`` would refuse it:
a remote ``$ref``, too large, too deep, a bad pattern), and the model's arguments are checked against that schema
before any call. A call carries its idempotency key in the request's ``_meta``:

    {"agents-stream/idempotency-key": "<task_id>:<turn>:<call_id>", "agents-stream/attempt": 1}

the same key on every attempt and on every worker that runs the call again after a crash. Everything here works on
the JSON the server sent (``execution/mcp_servers.py`` speaks the protocol), so it is tested without a server.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel

from agents_stream.config import McpServerConfig
from agents_stream.execution.outputs import FormatError, OutputSpec
from agents_stream.execution.schemas import CheckAborted
from agents_stream.execution.tools import Tool, ToolContext, ToolError
from agents_stream.providers.conversation import ToolSpec

__all__ = [
    "ATTEMPT_META", "KEY_META", "MAX_TOOLS", "McpCall", "McpTool", "circuit_name", "exposed_name", "from_listing",
    "result_text",
]

#: the ``_meta`` keys of a call: its idempotency key, and which attempt this is (1, 2, ...)
KEY_META = "agents-stream/idempotency-key"
ATTEMPT_META = "agents-stream/attempt"
#: the most tools taken from one server (providers take at most 128 tools in one request)
MAX_TOOLS = 128
#: the longest description the model is given of one tool (characters)
MAX_DESCRIPTION = 1024
#: CPU seconds the check of one call's arguments may take (the check runs on the event loop)
ARGUMENTS_CHECK_S = 0.25
_NAME = re.compile(r"[^A-Za-z0-9_-]")


class McpCall(Protocol):
    """One call on a server's connection: the ``CallToolResult`` as the JSON the server sent (``content``,
    ``structuredContent``, ``isError``). Raises ConnectionError or TimeoutError (transient), or another exception
    (the server failed the call)."""

    async def call(self, tool: str, arguments: dict[str, Any], meta: dict[str, Any], timeout_s: float) -> Any: ...


def circuit_name(server: str) -> str:
    """The breaker of every tool of one MCP server, shared by all workers."""
    return f"mcp:{server}"


def exposed_name(prefix: str, remote: str) -> str:
    """A tool's name as the model sees it: the prefix and the server's name, in the characters and length every
    provider accepts (``[A-Za-z0-9_-]{1,64}``)."""
    return _NAME.sub("_", f"{prefix}{remote}")[:64] or "_"


async def _not_a_function(**_: Any) -> Any:
    raise RuntimeError("an MCP tool runs on its server, never as a function here")


@dataclass(frozen=True)
class McpTool(Tool):
    """A tool of an MCP server: validated against its input schema, called on the server's connection."""

    server: str = ""
    #: the tool's own name on its server
    remote: str = ""
    schema: dict[str, Any] = field(default_factory=dict)
    checker: OutputSpec | None = field(default=None, compare=False, repr=False)
    connection: McpCall | None = field(default=None, compare=False, repr=False)

    @property
    def circuit(self) -> str:
        return circuit_name(self.server)

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.schema)

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The model's arguments checked against the server's schema; ToolError says what is wrong."""
        if not isinstance(arguments, dict):
            raise ToolError(f"invalid arguments for {self.name}: an object is expected")
        if self.checker is not None:
            try:
                self.checker.check(json.dumps(arguments), budget_s=ARGUMENTS_CHECK_S)
            except FormatError as exc:
                raise ToolError(f"invalid arguments for {self.name}: {exc}") from None
            except CheckAborted as exc:
                raise ToolError(f"the arguments of {self.name} could not be checked: {exc}") from None
        return arguments

    async def invoke(self, ctx: ToolContext, arguments: Any) -> Any:
        """One attempt on the server: its answer as text; ToolError when the server says the call failed."""
        if self.connection is None:
            raise ConnectionError(f"MCP server {self.server} has no connection")
        meta = {KEY_META: ctx.key, ATTEMPT_META: ctx.attempt}
        result = await self.connection.call(self.remote, arguments, meta, self.timeout_s)
        text = result_text(result)
        if result.get("isError"):
            raise ToolError(text or f"{self.name} failed (the server gave no reason)")
        return text


def from_listing(
    server: McpServerConfig, listed: list[Any], connection: McpCall | None,
) -> tuple[list[McpTool], list[str]]:
    """The server's listed tools (``tools/list`` JSON) as McpTools, and why each tool left out was left out."""
    wanted = None if server.tools is None else set(server.tools)
    tools: list[McpTool] = []
    problems: list[str] = []
    refused: set[str] = set()
    for entry in listed:
        remote = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(remote, str) or not remote:
            problems.append("a tool without a name")
            continue
        if wanted is not None and remote not in wanted:
            continue
        if len(tools) == MAX_TOOLS:
            refused.add(remote)
            problems.append(f"{remote}: past the {MAX_TOOLS} tools one server may offer")
            continue
        schema = entry.get("inputSchema")
        why = _schema_problem(schema)
        checker = None
        if why is None:
            try:
                checker = OutputSpec.from_schema(schema)
            except ValueError as exc:
                why = str(exc).removeprefix("invalid output_schema").lstrip(": ") or "it cannot be compiled"
        if why is not None:
            refused.add(remote)
            problems.append(f"{remote}: its inputSchema is refused ({why})")
            continue
        description = entry.get("description") or entry.get("title") or remote
        tools.append(McpTool(
            name=exposed_name(server.prefix, remote), description=str(description)[:MAX_DESCRIPTION],
            fn=_not_a_function, arguments=BaseModel,  # checked against the server's schema instead
            takes_context=False, timeout_s=server.timeout_s,
            retries=server.retries, max_concurrency=server.max_concurrency, server=server.name, remote=remote,
            schema=_for_model(schema), checker=checker, connection=connection,
        ))
    if wanted is not None:
        missing = sorted(wanted - {t.remote for t in tools} - refused)
        problems += [f"{name}: named in tools = [...] but not listed by the server" for name in missing]
    return tools, problems


def result_text(result: Any) -> str:
    """A ``CallToolResult`` as the text the model reads: its text blocks in order, other blocks named (an image's
    bytes are not sent on), or its ``structuredContent`` as JSON when it has no text."""
    if not isinstance(result, dict):
        return ""
    parts: list[str] = []
    for block in result.get("content") or []:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            parts.append(str(block.get("text", "")))
        elif kind == "resource":
            resource = block.get("resource") or {}
            parts.append(str(resource.get("text")) if "text" in resource else f"[resource {resource.get('uri')}]")
        elif kind == "resource_link":
            parts.append(f"[resource {block.get('uri')}]")
        else:
            parts.append(f"[{kind} content ({block.get('mimeType', 'unknown type')}) not shown]")
    if not any(parts) and result.get("structuredContent") is not None:
        return json.dumps(result["structuredContent"], ensure_ascii=False, sort_keys=True)
    return "\n".join(parts)


def _schema_problem(schema: Any) -> str | None:
    if not isinstance(schema, dict):
        return "not a JSON object"
    if schema.get("type", "object") != "object":
        return f"type {schema.get('type')!r}: the arguments of a call are an object"
    return None


def _for_model(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema as the model is given it: an object schema, without the title pydantic-made servers add."""
    shown = {k: v for k, v in schema.items() if k not in ("title", "$schema")}
    shown.setdefault("type", "object")
    shown.setdefault("properties", {})
    return shown

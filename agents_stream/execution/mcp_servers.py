"""Connections to MCP servers: one per server per worker, opened at start, its tools listed, reopened when lost.

Each connection has one owner task (the SDK's client is entered and left in the same task): it connects (a stdio
command started as a child of the worker, or a streamable-HTTP URL), lists the tools, then waits until the
connection is lost or the worker stops, and connects again with backoff. Calls come from the agent loops' tasks.

A server that cannot be reached when the worker starts does not stop the worker: the agents that name it hold
their tasks (intake paused, nothing failed, nothing lost; the task.held and mcp.unavailable control events and a
warning say which server, and what it answered) until its tools are listed, then resume by themselves. Once listed,
a server's tools stay offered while it is down: a call fails as transient (retried with the same key, counted by the
server's breaker), and the model is told the tool is unavailable.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import random
import sys
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any, Callable

from agents_stream.config import McpServerConfig
from agents_stream.execution.agent_definitions import Agent
from agents_stream.execution.mcp_tools import McpTool, from_listing
from agents_stream.execution.tools import ToolError
from agents_stream.resilience.backoff import backoff

if TYPE_CHECKING:
    from agents_stream.execution.plan import AgentPlan

__all__ = ["McpConnection", "McpServers", "ensure_sdk"]

log = logging.getLogger(__name__)

SendControl = Callable[[str, str, str | None, dict[str, Any]], None]
#: the most pages of tools/list read from one server
MAX_PAGES = 20
#: how long a call cut by a lost connection is given to end once cancelled
_CANCEL_S = 1.0


def ensure_sdk(servers: list[str]) -> None:
    """ValueError when agents name MCP servers and the SDK is not installed (``agents-stream[mcp]``)."""
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise ValueError(f"agents name MCP servers {servers}, but the mcp package is not installed: "
                         "pip install 'agents-stream[mcp]'") from None


class McpConnection:
    """One MCP server as this worker sees it: its listed tools, whether it is connected, its calls."""

    def __init__(self, config: McpServerConfig, *, on_change: Callable[[McpConnection, str | None], None],
                 rng: random.Random) -> None:
        self.config = config
        self.name = config.name
        #: the tools of the last listing (kept while the server is down); None: never listed since the worker started
        self.tools: list[McpTool] | None = None
        #: bumped on every listing
        self.generation = 0
        #: why the server is not connected now (None: connected, or not tried yet)
        self.error: str | None = None
        self._on_change = on_change
        self._rng = rng
        self._client: Any = None
        self._lost: asyncio.Event | None = None

    @property
    def connected(self) -> bool:
        return self._client is not None

    def describe(self) -> str:
        """Where the server is, without credentials: the URL without userinfo or query, or the command's program."""
        if self.config.url is not None:
            head = self.config.url.split("?", 1)[0].split("#", 1)[0]
            scheme, _, rest = head.partition("://")
            host, slash, path = rest.partition("/")
            return f"{scheme}://{host.rpartition('@')[2]}{slash}{path}"
        return f"stdio command {self.config.command[0] if self.config.command else '?'}"

    def why(self, exc: BaseException) -> str:
        """A failure in one line, without the server's credentials: the SDK's HTTP errors quote the whole URL
        (userinfo and query included); it is told as ``describe`` tells it. The text reaches logs, control events,
        the journal and the model."""
        text = _why(exc)
        if self.config.url is not None and self.config.url in text:
            text = text.replace(self.config.url, self.describe())
        return text

    async def run(self) -> None:
        """Until cancelled: connect, list, keep the connection while it lasts, connect again with backoff."""
        failures = 0
        while True:
            listed = self.generation
            try:
                await self._session()  # returns only by an exception: the connection failed or was lost
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure of connecting or of the session: try again, never crash
                failures = 1 if self.generation != listed else failures + 1  # it was up: the backoff starts over
                why, was = self.why(exc), self.error
                self.error = why
                delay = backoff(failures, base=0.5, cap=self.config.reconnect_max_s, rng=self._rng)
                level = logging.WARNING if why != was or failures % 20 == 0 else logging.DEBUG
                log.log(level, "MCP server %s (%s) cannot be used: %s; connecting again in %.1fs (attempt %d). "
                        "Check [mcp.%s] and that the server runs; agents whose tools were never listed hold their "
                        "tasks meanwhile", self.name, self.describe(), why, delay, failures, self.name)
                if was is None:  # it was up (or never tried): one mcp.unavailable per outage
                    self._on_change(self, why)
                await asyncio.sleep(delay)

    async def _session(self) -> None:
        from mcp import Client

        async with AsyncExitStack() as stack:
            async with asyncio.timeout(self.config.connect_timeout_s):
                client = await stack.enter_async_context(Client(
                    await self._target(stack), read_timeout_seconds=self.config.timeout_s,
                ))
                listed = await self._list(client)
            tools, problems = from_listing(self.config, listed, self)
            for problem in problems:
                log.warning("MCP server %s: tool %s; it is not offered to the model", self.name, problem)
            self.tools, self.generation, self.error = tools, self.generation + 1, None
            self._lost = asyncio.Event()
            self._client = client
            log.info("MCP server %s (%s) connected: %d tools (%s)", self.name, self.describe(), len(tools),
                     ", ".join(t.name for t in tools) or "none")
            self._on_change(self, None)
            try:
                # until a call or a ping finds the connection lost; a transport that fails cancels this wait (the
                # SDK's task group is this task's), and leaving the client raises what failed
                while not self._lost.is_set():
                    try:
                        await asyncio.wait_for(self._lost.wait(), self.config.ping_interval_s)
                    except TimeoutError:
                        await self._ping(client)
                raise ConnectionError("the connection was lost")
            finally:
                self._client = None
                self._lost.set()  # calls still waiting on this connection end now

    async def _ping(self, client: Any) -> None:
        """Is the server still there? ``ping`` is gone from the 2026 protocol, so the first page of ``tools/list``
        (every version has it) is asked: any answer, an error too, is alive; a closed connection or no answer within
        ``connect_timeout_s`` is not."""
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED

        try:
            await asyncio.wait_for(client.list_tools(cache_mode="refresh"), self.config.connect_timeout_s)
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                raise ConnectionError(f"the connection was closed ({exc.message})") from None

    async def _target(self, stack: AsyncExitStack) -> Any:
        from mcp import StdioServerParameters

        if self.config.command is not None:
            env = dict(self.config.env)
            env.update({name: os.environ[name] for name in self.config.env_from if name in os.environ})
            # Through the relay (execution/mcp_relay.py): one message of the server is read to max_message_bytes.
            relay = ["-m", "agents_stream.execution.mcp_relay", str(self.config.max_message_bytes), "--",
                     *self.config.command]
            return StdioServerParameters(command=sys.executable, args=relay, env=env, cwd=self.config.cwd)
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        from agents_stream.execution.mcp_bounds import bounded_transport  # imports httpx2: the mcp extra's

        logging.getLogger("httpx2").setLevel(logging.WARNING)  # one INFO line per request (keepalives too) otherwise

        headers = {header: os.environ.get(var, "") for header, var in self.config.headers_env.items()}
        missing = [var for var in self.config.headers_env.values() if not os.environ.get(var)]
        if missing:
            raise ValueError(f"the environment variables {missing} of headers_env are not set")
        limit = self.config.max_message_bytes
        http = await stack.enter_async_context(httpx2.AsyncClient(
            headers=headers, timeout=httpx2.Timeout(30.0, connect=self.config.connect_timeout_s, read=300.0),
            transport=bounded_transport(httpx2.AsyncHTTPTransport(), limit),
        ))
        return streamable_http_client(self.config.url or "", http_client=http, max_sse_event_size=limit)

    async def _list(self, client: Any) -> list[Any]:
        listed: list[Any] = []
        cursor = None
        for _ in range(MAX_PAGES):
            page = await client.list_tools(cursor=cursor, cache_mode="refresh")
            listed += [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in page.tools]
            cursor = page.next_cursor
            if cursor is None:
                return listed
        log.warning("MCP server %s: tools/list still had pages after %d; the tools of the first %d are offered",
                    self.name, MAX_PAGES, MAX_PAGES)
        return listed

    async def call(self, tool: str, arguments: dict[str, Any], meta: dict[str, Any], timeout_s: float) -> Any:
        """One ``tools/call``: the result as JSON; ConnectionError or TimeoutError when it may work on a retry."""
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED, INVALID_PARAMS, METHOD_NOT_FOUND, REQUEST_TIMEOUT

        client, lost = self._client, self._lost
        if client is None or lost is None:
            raise ConnectionError(f"MCP server {self.name} is not connected ({self.error or 'connecting'})")
        request = asyncio.ensure_future(client.call_tool(tool, arguments, read_timeout_seconds=timeout_s, meta=meta))
        watch = asyncio.ensure_future(lost.wait())
        try:
            # The SDK's read timeout bounds the call; this bound is ours, in case it does not.
            done, _ = await asyncio.wait({request, watch}, timeout=timeout_s + _CANCEL_S,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not request.done():
                request.cancel()
                await asyncio.wait({request}, timeout=_CANCEL_S)
        if not done:
            raise TimeoutError(f"MCP server {self.name}: no answer within {timeout_s:g}s")
        if request.cancelled() or not request.done():
            raise ConnectionError(f"MCP server {self.name}: the connection was lost during the call")
        try:
            result = request.result()
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                lost.set()
                raise ConnectionError(f"MCP server {self.name}: {exc.message}") from None
            if exc.code == REQUEST_TIMEOUT:
                raise TimeoutError(f"MCP server {self.name}: {exc.message}") from None
            if exc.code in (INVALID_PARAMS, METHOD_NOT_FOUND):
                raise ToolError(f"{tool}: {exc.message}") from None
            raise McpServerError(f"MCP server {self.name} answered error {exc.code}: {exc.message}") from None
        except TimeoutError:
            raise  # slow, not gone: retried on the same connection
        except Exception as exc:
            if not _broken_transport(exc):  # e.g. a result that is not what the protocol says: an answer, not a loss
                raise McpServerError(f"MCP server {self.name}: the call failed: {self.why(exc)}") from None
            lost.set()
            raise ConnectionError(f"MCP server {self.name}: {self.why(exc)}") from None
        return result.model_dump(mode="json", by_alias=True, exclude_none=True)


class McpServerError(Exception):
    """The server answered the call with a protocol error (not the tool's own isError): the model is told, the
    server's breaker counts a failure, the call is not retried."""


class McpServers:
    """This worker's MCP connections, and each agent's tools with its servers' tools added."""

    def __init__(
        self, servers: dict[str, McpServerConfig], plans: dict[str, AgentPlan], *, send_control: SendControl,
        on_change: Callable[[], None], rng: random.Random | None = None,
    ) -> None:
        rng = rng or random.Random()
        self.plans = plans
        self.connections = {name: McpConnection(s, on_change=self._changed, rng=rng) for name, s in servers.items()}
        self._send_control = send_control
        self._on_change = on_change
        self._agents: dict[str, tuple[tuple[int, ...], Agent | str]] = {}

    async def run(self) -> None:
        """Every connection's owner, until cancelled (each closes its connection: a stdio server is stopped)."""
        async with asyncio.TaskGroup() as group:
            for connection in self.connections.values():
                group.create_task(connection.run())

    def agent_for(self, plan: AgentPlan) -> Agent | str:
        """The plan's agent with its MCP servers' tools added, or why it cannot run now (a server never listed, a
        name two tools share)."""
        assert plan.agent is not None
        servers = [self.connections[s.name] for s in plan.mcp]
        waiting = [c for c in servers if c.tools is None]
        if waiting:
            return "; ".join(f"the tools of MCP server {c.name} were never listed ({c.error or 'connecting'})"
                             for c in waiting)
        key = tuple(c.generation for c in servers)
        cached = self._agents.get(plan.config.name)
        if cached is not None and cached[0] == key:
            return cached[1]
        extra = [t for c in servers for t in c.tools or ()]
        made: Agent | str
        try:
            made = dataclasses.replace(plan.agent, tools=(*plan.agent.tools, *extra))
        except ValueError as exc:
            made = f"{exc}: give the MCP servers a prefix (prefix = \"...\" in [mcp.<name>])"
            log.warning("Agent %s cannot run: %s", plan.config.name, made)
        self._agents[plan.config.name] = (key, made)
        return made

    def holds(self, plan: AgentPlan) -> bool:
        """Whether the plan's agent takes no task now (one of its servers was never listed)."""
        return bool(plan.mcp) and isinstance(self.agent_for(plan), str)

    def _changed(self, connection: McpConnection, error: str | None) -> None:
        agents = sorted(a for a, plan in self.plans.items() if any(s.name == connection.name for s in plan.mcp))
        if error is None:
            tools = [t.name for t in connection.tools or ()]
            self._send_control("mcp.connected", connection.name, None,
                               {"server": connection.describe(), "tools": tools, "agents": agents})
        else:
            self._send_control("mcp.unavailable", connection.name, None,
                               {"server": connection.describe(), "error": error, "agents": agents,
                                "holding": connection.tools is None})
        self._on_change()


def _broken_transport(exc: BaseException) -> bool:
    """Whether a call's exception says the connection broke (a socket, a stream, an HTTP exchange), not the call."""
    import anyio
    import httpx2

    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    broken = (OSError, httpx2.TransportError, anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream)
    if isinstance(exc, httpx2.HTTPStatusError):
        return exc.response.status_code >= 500 or exc.response.status_code == 429
    return isinstance(exc, broken)


def _why(exc: BaseException) -> str:
    """A failure in one line: an exception group (the SDK's task groups) by its first leaf."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__

"""MCP tool servers on the real broker: an agent whose tools come from MCP servers built with the SDK (a
streamable-HTTP server process and a stdio server the worker starts), each call recorded with its idempotency key;
a server down at start; a SIGKILL after the calls were journaled."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agents_stream.config import McpServerConfig
from agents_stream.contract import topics
from agents_stream.execution.mcp_servers import McpConnection
from agents_stream.testing.fakellm import call, hang, ok, tool_calls
from agents_stream.testing.mcpserver import read_calls

from .harness import ROOT, encode, eventually, free_port, produce, read_topic, results_for, task, unique


class HttpMcpServer:
    """``python -m agents_stream.testing.mcpserver --http PORT``: a real MCP server process, stopped by its pid."""

    def __init__(self, record: Path, log: Path) -> None:
        self.record = record
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self._log_path = log
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        with self._log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "agents_stream.testing.mcpserver", "--record", str(self.record),
                 "--http", str(self.port)], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
            )
        await eventually(self._listening, timeout=20, interval=0.2, what=f"the MCP server on port {self.port}")

    def _listening(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"the MCP server exited with {self.proc.returncode}: {self._log_path.read_text()}")
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def http_mcp(tmp_path: Path) -> Iterator[HttpMcpServer]:
    server = HttpMcpServer(tmp_path / "http-calls.jsonl", tmp_path / "http-mcp.log")
    yield server
    server.stop()


def config(fake_url: str, agent: str, servers: dict[str, str]) -> str:
    """A provider on the fake LLM, the MCP servers (TOML bodies by name) and one agent made of their tools only."""
    lines = ["[providers.fake]", 'kind = "openai"', f'base_url = "{fake_url}/v1"', 'model = "fake-model"',
             "timeout_s = 10", ""]
    for name, body in servers.items():
        lines += [f"[mcp.{name}]", body, "reconnect_max_s = 1", "timeout_s = 5", ""]
    listed = ", ".join(f'"{n}"' for n in servers)
    lines += [f"[agents.{agent}]", 'providers = ["fake"]', 'system = "You run a ticket desk."', f"mcp = [{listed}]"]
    return "\n".join(lines) + "\n"


def stdio_server(record: Path) -> str:
    command = [sys.executable, "-m", "agents_stream.testing.mcpserver", "--record", str(record), "--name", "desk2"]
    return (f"command = {json.dumps(command)}\ncwd = {json.dumps(str(ROOT))}\nprefix = \"s_\"\n"
            'env_from = ["DESK_STDIO_SECRET"]')


async def control_events(kind: str, server: str, agent: str, timeout: float) -> list[dict[str, Any]]:
    """The control events of one kind about an MCP server and this test's agent (agent.control is shared)."""

    def mine(m: Any) -> bool:
        event = json.loads(m.value)
        return m.key == server.encode() and event.get("event") == kind and agent in event["details"].get("agents", ())

    return [json.loads(m.value) for m in await read_topic(topics.CONTROL, timeout=timeout, until=bool, keep=mine)]


def asked(fake: Any, task_id: str) -> list[int]:
    """The turns a task's model requests asked for (the number of the model's own turns each carried)."""
    return [sum(1 for m in r.body.get("messages", []) if m.get("role") == "assistant")
            for r in fake.requests if r.task_id == task_id]


async def test_an_agent_of_mcp_tools_holds_until_its_server_is_listed_then_calls_both_with_their_keys(
    cluster_factory, fake_llm, http_mcp, tmp_path,
):
    """The HTTP server is down when the worker starts: the worker is ready, the agent's task waits (mcp.unavailable,
    no model call) and nothing fails. Once the server is up its tools are listed; the model is offered both servers'
    tools with their own input schemas, calls one of each, every call carries <task_id>:<turn>:<call_id> in _meta,
    and the model reads both results. The HTTP server gets its header from the environment (never logged), the
    stdio server only the variables named in env_from."""
    agent = unique("desk")
    stdio_record = tmp_path / "stdio-calls.jsonl"
    # breakers live in the shared circuits log: each test's servers get names of their own
    on_http, on_stdio = unique("desk_http"), unique("desk_stdio")
    http_server = f'url = "{http_mcp.url}"\nheaders_env = {{ Authorization = "DESK_HTTP_AUTH" }}'
    servers = {on_http: http_server, on_stdio: stdio_server(stdio_record)}
    toml = config(fake_llm.url, agent, servers)
    c = cluster_factory([agent], None, toml=toml, DESK_HTTP_AUTH="Bearer desk-s3cret", DESK_STDIO_SECRET="x")
    await c.started()
    t = task(agent, instruction="Open a ticket for customer c-7.")
    await produce(topics.task_topic(agent), [encode(t)])
    down = await control_events("mcp.unavailable", on_http, agent, timeout=30)
    assert down[0]["details"]["holding"] is True and "ConnectError" in down[0]["details"]["error"], down
    assert f"MCP server {on_http} (http://127.0.0.1:{http_mcp.port}/mcp) cannot be used" in c.workers[0].tail(200)
    assert not [r for r in fake_llm.requests if r.task_id == t["task_id"]], "no model call before the tools are known"

    fake_llm.enqueue(
        tool_calls(call("create_ticket", {"title": "Refund c-7", "priority": 2}, id="c1"),
                   call("s_lookup_customer", {"customer_id": "c-7"}, id="c2")),
        ok("Ticket T-1 opened for Ada."),
    )
    await http_mcp.start()
    result = json.loads((await results_for({t["task_id"]}, timeout=60))[t["task_id"]][0].value)
    assert result["status"] == "succeeded" and result["output"] == "Ticket T-1 opened for Ada.", result

    first, last = [r for r in fake_llm.requests if r.task_id == t["task_id"]]
    offered = {f["function"]["name"]: f["function"] for f in (x for x in first.body["tools"])}
    assert set(offered) == {"create_ticket", "lookup_customer", "sleep", "refuse", "report", "s_create_ticket",
                            "s_lookup_customer", "s_sleep", "s_refuse", "s_report"}
    schema = offered["create_ticket"]["parameters"]
    assert schema["properties"]["priority"]["type"] == "integer" and schema["properties"]["priority"]["default"] == 1
    ticket = [x for x in read_calls(http_mcp.record) if x["tool"] == "create_ticket"]
    customer = [x for x in read_calls(stdio_record) if x["tool"] == "lookup_customer"]
    assert [(x["key"], x["attempt"], x["arguments"]) for x in ticket] == [
        (f"{t['task_id']}:0:c1", 1, {"title": "Refund c-7", "priority": 2})]
    assert [x["key"] for x in customer] == [f"{t['task_id']}:0:c2"]
    assert ticket[0]["authorization"] == "Bearer desk-s3cret", "headers_env: the header, its value from the env"
    assert customer[0]["environment"] == ["DESK_STDIO_SECRET"], "a stdio server gets env_from, not the worker's env"
    assert "desk-s3cret" not in c.workers[0].tail(100_000), "a header's value never reaches the log"
    body = json.dumps(last.body)
    assert "T-1" in body and "Ada" in body, "the model's next turn reads both results"
    assert [x["name"] for x in result["transcript"]["tool_calls"]] == ["create_ticket", "s_lookup_customer"]


    async def counted() -> bool:  # a call's verdict reaches the view through the circuits log: wait for it
        breakers = (await c.workers[0].get("/circuits"))["providers"]
        seen = [(breakers[b]["state"], breakers[b]["calls_in_window"]) for b in (f"mcp:{on_http}", f"mcp:{on_stdio}")]
        return seen == [("closed", 1), ("closed", 1)]

    await eventually(counted, timeout=10, what="one breaker per server in the shared circuits, each counting its call")


async def test_a_worker_killed_after_mcp_calls_were_journaled_calls_none_of_them_again(
    cluster_factory, fake_llm, http_mcp,
):
    """Three tasks each call create_ticket (a side effect) and are killed (SIGKILL) while their next model turn is
    in flight, the calls journaled; the restarted worker asks only that turn again: the server saw one call per
    task, each with its key, none again, and every task has exactly one result."""
    await http_mcp.start()
    agent = unique("desk")
    toml = config(fake_llm.url, agent, {unique("desk_http"): f'url = "{http_mcp.url}"'})
    c = cluster_factory([agent], None, toml=toml)
    await c.started("a")
    fake_llm.set_mode(tool_turns=["create_ticket"])  # turn 0 of every task: create_ticket (its defaults)
    fake_llm.enqueue(hang(60), hang(60), hang(60))  # turn 1 of every task: in flight at the kill
    tasks = [task(agent, instruction=f"Open ticket {i}.") for i in range(3)]
    ids = [t["task_id"] for t in tasks]
    await produce(topics.task_topic(agent), [encode(t) for t in tasks])
    await eventually(lambda: all(1 in asked(fake_llm, i) for i in ids), timeout=40, what="turn 1 of each task asked")
    c.workers[0].kill()
    before = read_calls(http_mcp.record)
    assert sorted(x["key"].split(":")[0] for x in before) == sorted(ids), before

    await c.started("a")
    results = await results_for(set(ids), timeout=60)
    assert {i: len(results[i]) for i in ids} == {i: 1 for i in ids}, "exactly one result per task"
    for i in ids:
        assert json.loads(results[i][0].value)["status"] == "succeeded"
        assert asked(fake_llm, i) == [0, 1, 1], "only the turn in flight at the kill is asked again"
    after = read_calls(http_mcp.record)
    assert after == before, "no journaled call ran again"
    assert all(x["attempt"] == 1 and not x["replay"] and x["key"].split(":")[1] == "0" for x in after)
    print(f"\nmcp: {len(after)} calls for {len(ids)} tasks across a SIGKILL; keys {[x['key'] for x in after]}")


def children_running(pattern: str) -> list[int]:
    """This process's children whose command line contains ``pattern``."""
    out = subprocess.run(["pgrep", "-P", str(os.getpid())], capture_output=True, text=True).stdout.split()
    found = []
    for pid in map(int, out):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except FileNotFoundError:
            continue
        if pattern in cmdline:
            found.append(pid)
    return found


async def test_a_connection_tells_retryable_failures_from_answers_and_comes_back_by_itself(http_mcp, tmp_path):
    """The SDK's behaviour the retries rely on, against real server processes (no worker): a call past its timeout is
    a TimeoutError, a call cut by the server's death a ConnectionError at once (not at its timeout), a call while the
    server is down is a ConnectionError, an isError result comes back as data; the connection comes back by itself,
    listing again, for an HTTP server restarted and for a stdio server whose process was killed (seen by the ping,
    with no call)."""
    changes: list[str | None] = []
    await http_mcp.start()
    server = McpServerConfig(name="desk", url=http_mcp.url, reconnect_max_s=0.5, ping_interval_s=0.2)
    http = McpConnection(server, on_change=lambda c, error: changes.append(error), rng=random.Random(0))
    stdio_record = tmp_path / "stdio-calls.jsonl"
    command = [sys.executable, "-m", "agents_stream.testing.mcpserver", "--record", str(stdio_record), "--name", "sd"]
    stdio = McpConnection(McpServerConfig(name="sd", command=command, cwd=str(ROOT), reconnect_max_s=0.5,
                                          ping_interval_s=0.5),
                          on_change=lambda c, error: None, rng=random.Random(0))
    owners = [asyncio.ensure_future(http.run()), asyncio.ensure_future(stdio.run())]
    try:
        await eventually(lambda: http.connected and stdio.connected, timeout=20, interval=0.1, what="both listed")
        refused = await http.call("refuse", {"reason": "closed on Sundays"}, {}, 5)
        assert refused["isError"] is True and "closed on Sundays" in json.dumps(refused)
        with pytest.raises(TimeoutError):
            await http.call("sleep", {"seconds": 5}, {}, 0.5)
        assert http.generation == 1, "the pings (every 0.2 s) of a live server never made it connect again"

        slow = asyncio.ensure_future(http.call("sleep", {"seconds": 8}, {}, 10))
        await eventually(lambda: {"seconds": 8} in [x["arguments"] for x in read_calls(http_mcp.record)],
                         timeout=5, interval=0.1, what="the slow call at the server")
        started = time.monotonic()
        http_mcp.stop()
        with pytest.raises(ConnectionError):
            await slow
        assert time.monotonic() - started < 3, "a call cut by a lost connection fails at once, not at its timeout"
        await eventually(lambda: not http.connected, timeout=5, interval=0.1, what="the connection seen lost")
        with pytest.raises(ConnectionError, match="not connected"):
            await http.call("lookup_customer", {"customer_id": "c"}, {}, 5)
        await http_mcp.start()
        await eventually(lambda: http.connected and http.generation == 2, timeout=15, interval=0.1,
                         what="the HTTP server listed again")
        assert (await http.call("lookup_customer", {"customer_id": "c"}, {}, 5))["isError"] is False
        assert changes[0] is None and changes[1] is not None and changes[-1] is None, changes

        (pid,) = children_running("--name sd")
        os.kill(pid, signal.SIGKILL)
        await eventually(lambda: stdio.connected and stdio.generation == 2, timeout=15, interval=0.1,
                         what="a new stdio server listed")
        answer = await stdio.call("lookup_customer", {"customer_id": "c"}, {}, 5)
        assert answer["structuredContent"]["name"] == "Ada" and children_running("--name sd") != [pid]
    finally:
        for owner in owners:
            owner.cancel()
        await asyncio.gather(*owners, return_exceptions=True)
    assert children_running("--name sd") == [], "a stopped connection stops its stdio server"

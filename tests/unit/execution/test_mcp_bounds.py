"""An MCP server's answer is read to at most ``max_message_bytes``, counted as it arrives, never decoded whole first.

Against the real test server (agents_stream/testing/mcpserver.py over streamable HTTP, a process of its own): its
``report`` tool answers as many bytes as asked; past the limit the call fails as the server's error, with the limit
named, and a call within the limit is read whole.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents_stream.config import McpServerConfig
from agents_stream.execution.mcp_servers import McpConnection, McpServerError

ROOT = Path(__file__).resolve().parents[3]
LIMIT = 64 * 1024


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server_url(tmp_path: Path):
    port = _free_port()
    args = [sys.executable, "-m", "agents_stream.testing.mcpserver", "--record", str(tmp_path / "calls.jsonl"),
            "--http", str(port)]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert proc.poll() is None and time.monotonic() < deadline, "the MCP server did not start"
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.kill()
        proc.wait(timeout=10)


async def test_an_answer_past_max_message_bytes_is_not_read_and_fails_the_call(server_url: str) -> None:
    config = McpServerConfig(name="desk", url=server_url, max_message_bytes=LIMIT, timeout_s=10)
    connection = McpConnection(config, on_change=lambda c, e: None, rng=random.Random(0))
    owner = asyncio.ensure_future(connection.run())
    try:
        async with asyncio.timeout(20):
            while not connection.connected:
                await asyncio.sleep(0.05)
        small = await connection.call("report", {"size": LIMIT // 4}, {}, 10)
        assert small["content"][0]["text"] == "x" * (LIMIT // 4), "an answer within the limit is read whole"
        with pytest.raises(McpServerError, match=r"larger than max_message_bytes \(65536 bytes\)"):
            await connection.call("report", {"size": 50 * LIMIT}, {}, 10)  # the server's error: not retried
        again = await connection.call("report", {"size": 16}, {}, 10)
        assert again["content"][0]["text"] == "x" * 16, "the connection stays up for the next call"
    finally:
        owner.cancel()
        await asyncio.gather(owner, return_exceptions=True)


# -- stdio: the relay (execution/mcp_relay.py) -------------------------------------------------------------------

def test_the_relay_passes_lines_whole_and_answers_an_oversized_one_with_its_error() -> None:
    from agents_stream.execution.mcp_relay import Lines

    lines = Lines(limit=100)
    small = b'{"jsonrpc": "2.0", "id": 7, "result": {"ok": true}}'
    big = b'{"jsonrpc": "2.0", "id": "call-9", "result": {"text": "' + b"x" * 5000 + b'"}}'
    out = lines.feed(small[:20]) + lines.feed(small[20:] + b"\n" + big[:3000]) + lines.feed(big[3000:] + b"\n")
    assert out[0] == small + b"\n", "a line within the limit, split across reads, passes whole"
    error = json.loads(out[1])
    assert error["id"] == "call-9" and "larger than max_message_bytes (100 bytes)" in error["error"]["message"]
    notification = b'{"jsonrpc": "2.0", "method": "notifications/x", "params": {"p": "' + b"y" * 500 + b'"}}\n'
    assert lines.feed(notification) == [], "a notification past the limit is dropped"
    assert lines.feed(small + b"\n") == [small + b"\n"], "the next line after an oversized one passes"


async def test_a_stdio_answer_past_max_message_bytes_is_not_read_and_fails_the_call(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "agents_stream.testing.mcpserver", "--record", str(tmp_path / "calls.jsonl")]
    config = McpServerConfig(name="desk", command=command, cwd=str(ROOT), max_message_bytes=LIMIT, timeout_s=10)
    connection = McpConnection(config, on_change=lambda c, e: None, rng=random.Random(0))
    owner = asyncio.ensure_future(connection.run())
    try:
        async with asyncio.timeout(30):
            while not connection.connected:
                await asyncio.sleep(0.05)
        small = await connection.call("report", {"size": LIMIT // 4}, {}, 10)
        assert small["content"][0]["text"] == "x" * (LIMIT // 4), "an answer within the limit is read whole"
        with pytest.raises(McpServerError, match=r"larger than max_message_bytes \(65536 bytes\)"):
            await connection.call("report", {"size": 50 * LIMIT}, {}, 10)
        again = await connection.call("report", {"size": 16}, {}, 10)
        assert again["content"][0]["text"] == "x" * 16, "the connection stays up for the next call"
    finally:
        owner.cancel()
        await asyncio.gather(owner, return_exceptions=True)

"""An MCP server's answer is read to at most ``max_message_bytes``, counted as it arrives, never decoded whole first.

Against the real test server (agents_stream/testing/mcpserver.py over streamable HTTP, a process of its own): its
``report`` tool answers as many bytes as asked; past the limit the call fails as the server's error, with the limit
named, and a call within the limit is read whole.
"""

from __future__ import annotations

import asyncio
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents_stream.config import McpServerConfig
from agents_stream.execution.mcp_servers import McpConnection, McpServerError

ROOT = Path(__file__).resolve().parents[2]
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

"""A stdio MCP server's messages bounded as they are read: ``python -m agents_stream.execution.mcp_relay <max bytes>
-- <command> [args...]`` runs the server as its child and passes its stdin and stdout through, line by line (one
line is one JSON-RPC message on MCP's stdio transport), so the SDK never holds more than ``max_message_bytes`` of
one message.

A line past the limit is not read on: its bytes are dropped as they arrive, and the request it answers gets a
JSON-RPC error naming the limit instead (its id is found in the line's first bytes, where servers write it), which
fails that call as the server's error; a notification past the limit is dropped. The worker starts every stdio
server through this relay (execution/mcp_servers.py); HTTP servers are bounded by execution/mcp_bounds.py.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sys

__all__ = ["Lines", "main"]

#: how much of a line is kept to find the id of an oversized message
HEAD_BYTES = 4096
_ID = re.compile(rb'"id"\s*:\s*("(?:[^"\\]|\\.){0,200}"|-?\d{1,20})')


class Lines:
    """Splits a byte stream into lines of at most ``limit`` bytes; a longer line comes out as its error (or not
    at all)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.line = bytearray()
        self.head = b""
        self.over = False

    def feed(self, chunk: bytes) -> list[bytes]:
        """The complete lines ``chunk`` ends (each with its newline), oversized ones replaced."""
        out: list[bytes] = []
        start = 0
        while True:
            newline = chunk.find(b"\n", start)
            piece = chunk[start:] if newline < 0 else chunk[start:newline]
            self._add(piece)
            if newline < 0:
                return out
            finished = self._finish()
            if finished is not None:
                out.append(finished)
            start = newline + 1

    def _add(self, piece: bytes) -> None:
        if self.over:
            return
        if len(self.line) + len(piece) > self.limit:
            self.over = True
            self.head = bytes(self.line[:HEAD_BYTES]) + piece[:HEAD_BYTES]
            self.line = bytearray()
            return
        self.line += piece

    def _finish(self) -> bytes | None:
        if not self.over:
            line, self.line = bytes(self.line) + b"\n", bytearray()
            return line
        self.over = False
        found = _ID.search(self.head)
        self.head = b""
        if found is None:
            return None  # a notification (or an id we cannot find): dropped
        error = {"code": -32603, "message": (f"the server's message is larger than max_message_bytes "
                                             f"({self.limit} bytes); not read on")}
        reply = {"jsonrpc": "2.0", "id": json.loads(found.group(1)), "error": error}
        return json.dumps(reply).encode() + b"\n"


async def _pump_in(reader: asyncio.StreamReader, child: asyncio.subprocess.Process) -> None:
    """Our stdin to the child's, until it ends (then the child's stdin is closed)."""
    assert child.stdin is not None
    while chunk := await reader.read(65536):
        child.stdin.write(chunk)
        await child.stdin.drain()
    child.stdin.close()


async def _pump_out(child: asyncio.subprocess.Process, lines: Lines) -> None:
    """The child's stdout to ours, bounded line by line."""
    assert child.stdout is not None
    out = sys.stdout.buffer
    while chunk := await child.stdout.read(65536):
        for line in lines.feed(chunk):
            out.write(line)
        out.flush()


async def main(limit: int, command: list[str]) -> int:
    loop = asyncio.get_running_loop()
    child = await asyncio.create_subprocess_exec(
        *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=None,
    )
    for sig in (signal.SIGTERM, signal.SIGINT):  # stopping the relay stops its server
        loop.add_signal_handler(sig, child.terminate)
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    feeding = asyncio.ensure_future(_pump_in(reader, child))
    try:
        await _pump_out(child, Lines(limit))
    finally:
        feeding.cancel()
    return await child.wait()


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) < 3 or args[1] != "--" or not args[0].isdigit():
        sys.exit("usage: python -m agents_stream.execution.mcp_relay <max bytes> -- <command> [args...]")
    sys.exit(asyncio.run(main(int(args[0]), args[2:])))

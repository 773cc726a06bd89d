"""A real MCP tool server built with the official SDK, for tests and demos: it records every call with its key.

    python -m agents_stream.testing.mcpserver --record calls.jsonl                      # stdio
    python -m agents_stream.testing.mcpserver --record calls.jsonl --http 8091           # streamable HTTP at /mcp

Its tools (a small ticket desk): ``create_ticket`` (a side effect, idempotent by the call's key),
``lookup_customer``, ``sleep`` (answers after ``seconds``, recorded as it starts), ``refuse`` (an ``isError``
result), ``report`` (``size`` bytes of text: an oversized result). Every call appends one JSON line to ``--record``:
the tool, its arguments, the idempotency key from ``_meta`` (``agents-stream/idempotency-key``), the attempt,
``replay``: whether that key was seen before (then the stored answer is sent again, no second ticket), the request's
Authorization header and which DESK_*, KAFKA* and AGENTS_STREAM_* variables the server's environment has. The file
is read back at start, so a server started again (a stdio server lives and dies with its worker) still knows every
key.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError

__all__ = ["KEY_META", "build", "main", "read_calls"]

#: the ``_meta`` key agents-stream sends each call's idempotency key in (execution/mcp_tools.py says the same)
KEY_META = "agents-stream/idempotency-key"
ATTEMPT_META = "agents-stream/attempt"


def read_calls(path: Path) -> list[dict[str, Any]]:
    """The calls recorded in ``path`` so far (none when it does not exist yet)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def build(record: Path, name: str = "desk") -> MCPServer:
    """The server, its calls appended to ``record``."""
    server = MCPServer(name, log_level="WARNING")
    answers: dict[str, Any] = {c["key"]: c["answer"] for c in read_calls(record) if c.get("key")}

    def note(ctx: Context, tool: str, arguments: dict[str, Any], answer: Any) -> Any:
        meta = ctx.request_context.meta or {}
        sent = meta.get(KEY_META)
        key = None if sent is None else str(sent)
        replay = False
        if key is not None:
            replay = key in answers
            answer = answers.setdefault(key, answer)
        http = ctx.request_context.request  # the HTTP request over streamable HTTP; None over stdio
        line = {"tool": tool, "arguments": arguments, "key": key, "attempt": meta.get(ATTEMPT_META),
                "replay": replay, "answer": answer, "pid": os.getpid(), "at": time.time(),
                # what reached the server besides the call: a header sent from headers_env, variables from env_from
                "authorization": getattr(http, "headers", {}).get("authorization"),
                "environment": sorted(k for k in os.environ if k.startswith(("DESK_", "AGENTS_STREAM_", "KAFKA")))}
        with record.open("a") as f:
            f.write(json.dumps(line) + "\n")
        return answer

    @server.tool()
    def create_ticket(ctx: Context, title: str = "untitled", priority: int = 1) -> dict[str, Any]:
        """Open a support ticket (a side effect: one ticket per idempotency key)."""
        number = len([a for a in answers.values() if isinstance(a, dict) and "ticket" in a]) + 1
        return note(ctx, "create_ticket", {"title": title, "priority": priority},
                    {"ticket": f"T-{number}", "title": title, "priority": priority})

    @server.tool()
    def lookup_customer(customer_id: str, ctx: Context) -> dict[str, Any]:
        """Look a customer up: their name and plan."""
        return note(ctx, "lookup_customer", {"customer_id": customer_id},
                    {"customer_id": customer_id, "name": "Ada", "plan": "gold"})

    @server.tool()
    async def sleep(seconds: float, ctx: Context) -> str:
        """Answer after ``seconds`` (recorded when it starts)."""
        answer = note(ctx, "sleep", {"seconds": seconds}, f"slept {seconds:g}s")
        await asyncio.sleep(seconds)
        return answer

    @server.tool()
    def refuse(reason: str, ctx: Context) -> str:
        """Always fails, saying why (an isError result)."""
        note(ctx, "refuse", {"reason": reason}, None)
        raise ToolError(f"refused: {reason}")

    @server.tool()
    def report(size: int, ctx: Context) -> str:
        """A report of ``size`` bytes (at most 64 MiB)."""
        note(ctx, "report", {"size": size}, None)
        return "x" * max(0, min(size, 64 * 1024 * 1024))

    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", type=Path, required=True, help="append every call to this JSONL file")
    parser.add_argument("--http", type=int, default=None, metavar="PORT",
                        help="serve streamable HTTP at http://127.0.0.1:PORT/mcp (default: stdio)")
    parser.add_argument("--name", default="desk")
    args = parser.parse_args(argv)
    server = build(args.record, args.name)
    if args.http is None:
        server.run("stdio")
        return
    print(f"MCP server {args.name} at http://127.0.0.1:{args.http}/mcp", file=sys.stderr, flush=True)
    server.run("streamable-http", host="127.0.0.1", port=args.http)


if __name__ == "__main__":
    main()

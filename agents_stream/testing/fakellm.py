"""A fake LLM server for tests, demos and benchmarks: real HTTP, Gemini/OpenAI/Anthropic shapes, scripted.

    async with FakeLLM([ok("hi"), status(429, retry_after=1)]) as fake:
        ...  # point a provider at fake.url
        assert len(fake.requests) == 2

Scripted replies are consumed in order, then ``default``; with ``default=None``
an exhausted script answers 500 "fake LLM script ran out" and logs an ERROR.
Runtime modes (outage, latency, error_rate, rate_limit) are set with
``set_mode`` in-process or ``POST /_admin/mode`` from another process.

The public entry: the script lives in testing/script.py, the three APIs' bodies
in testing/wire.py, the server in testing/server.py; import them from here.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from typing import Any

from agents_stream.testing.script import (
    SCRIPT_RAN_OUT,
    Mode,
    Reply,
    call,
    hang,
    malformed,
    ok,
    refusal,
    status,
    tool_calls,
)
from agents_stream.testing.server import FakeLLM, RecordedRequest

__all__ = [
    "SCRIPT_RAN_OUT",
    "FakeLLM",
    "Mode",
    "RecordedRequest",
    "Reply",
    "call",
    "hang",
    "main",
    "malformed",
    "ok",
    "refusal",
    "serve_forever",
    "status",
    "tool_calls",
]


async def serve_forever(host: str = "127.0.0.1", port: int = 8089, **mode: Any) -> None:
    """Run a FakeLLM until SIGINT/SIGTERM; ``mode`` takes ``seed`` and the ``set_mode`` fields."""
    seed = mode.pop("seed", 0)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with FakeLLM(host=host, port=port, seed=seed) as fake:
        await fake.set_mode(**mode)
        # the line other processes wait for (and read the port from when --port 0)
        print(f"fake LLM listening on {fake.url}", flush=True)
        await stop.wait()  # the process's whole life: no timeout by design


def main(argv: list[str] | None = None) -> int:
    """``agents-stream fake-llm`` / ``python -m agents_stream.testing.fakellm``."""
    parser = argparse.ArgumentParser(prog="fake-llm", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8089, help="0 picks a free port (printed)")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds added to every answer")
    parser.add_argument("--error-rate", type=float, default=0.0, help="share of requests answered 500")
    parser.add_argument("--seed", type=int, default=0, help="seed of the error-rate RNG")
    parser.add_argument("--tool-turns", default="", help="comma-separated tool names: a request offering tools "
                        "that carries n model turns calls the n-th (every task an agent loop)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(
            serve_forever(args.host, args.port, latency=args.latency, error_rate=args.error_rate, seed=args.seed,
                          tool_turns=[t for t in args.tool_turns.split(",") if t])
        )
    except ValueError as exc:
        parser.error(str(exc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

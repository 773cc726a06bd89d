"""A fake LLM server for tests, demos and benchmarks: real HTTP, Gemini/OpenAI/Anthropic shapes, scripted.

    async with FakeLLM([ok("hi"), status(429, retry_after=1)]) as fake:
        ...  # point a provider at fake.url
        assert len(fake.requests) == 2

Scripted replies are consumed in order, then ``default``; with ``default=None``
an exhausted script answers 500 "fake LLM script ran out" and logs an ERROR;
with ``exhausted="fail"`` (the ``fake-llm`` command's default) a request that
finds a given script used up answers 400 "fake LLM script ran out" (the task
fails saying so) while a server never given a script still echoes.
Runtime modes (outage, latency, error_rate, rate_limit) are set with
``set_mode`` in-process or ``POST /_admin/mode`` from another process.

The public entry: the script lives in testing/script.py, the three APIs' bodies
in testing/wire.py, the server in testing/server.py (its admin endpoints in
testing/fakellm_admin.py, what it records of a request in testing/recorded.py);
import them from here.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from typing import Any

from agents_stream.testing.script import (
    EXHAUSTED,
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


EPILOG = """\
Scripting it from another process (docs/guide/fake-llm.md):
  POST /_admin/script  {"replies": [{"text": "hi"}, {"calls": [{"name": "t", "arguments": {}}]}, ...],
                        "replace": false}
      appends the replies to the script ("replace": true drops the ones left first); each request takes the
      next one. Reply fields: kind (ok|status|malformed|refusal), text (null: echo the prompt), calls, code,
      retry_after, body, latency, input_tokens, output_tokens, chunk_delay, cut_after.
  POST /_admin/reset   forget the script, the requests and the modes
  POST /_admin/mode    {"outage": true|false|"refuse", "latency": s, "error_rate": 0..1, "rate_limit": s|null,
                        "outage_for": s, "tool_turns": [...], "seed": n}
  GET  /_admin/stats   in flight, requests, script_remaining, scripted, script_misses
  GET  /_admin/requests  every request received
Never given a script, every request gets its prompt echoed; once a given script is used up, see --exhausted.
"""


async def serve_forever(
    host: str = "127.0.0.1", port: int = 8089, *, exhausted: str = "fail", **mode: Any,
) -> None:
    """Run a FakeLLM until SIGINT/SIGTERM; ``mode`` takes ``seed`` and the ``set_mode`` fields."""
    seed = mode.pop("seed", 0)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with FakeLLM(host=host, port=port, seed=seed, exhausted=exhausted) as fake:
        await fake.set_mode(**mode)
        # the line other processes wait for (and read the port from when --port 0)
        print(f"fake LLM listening on {fake.url}", flush=True)
        await stop.wait()  # the process's whole life: no timeout by design


def main(argv: list[str] | None = None) -> int:
    """``agents-stream fake-llm`` / ``python -m agents_stream.testing.fakellm``."""
    parser = argparse.ArgumentParser(prog="fake-llm", description=__doc__.splitlines()[0], epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8089, help="0 picks a free port (printed)")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds added to every answer")
    parser.add_argument("--error-rate", type=float, default=0.0, help="share of requests answered 500")
    parser.add_argument("--seed", type=int, default=0, help="seed of the error-rate RNG")
    parser.add_argument("--tool-turns", default="", help="comma-separated tool names: a request offering tools "
                        "that carries n model turns calls the n-th (every task an agent loop)")
    parser.add_argument("--exhausted", choices=EXHAUSTED, default="fail",
                        help="once a script given to /_admin/script is used up, a request gets: fail (a 400 "
                             "'fake LLM script ran out', the task fails saying so; the default) or echo (its prompt "
                             "echoed, as before any script)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(
            serve_forever(args.host, args.port, latency=args.latency, error_rate=args.error_rate, seed=args.seed,
                          tool_turns=[t for t in args.tool_turns.split(",") if t], exhausted=args.exhausted)
        )
    except ValueError as exc:
        parser.error(str(exc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

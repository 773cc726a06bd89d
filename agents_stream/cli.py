"""The ``agents-stream`` command: worker, publish, fake-llm, settings."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import uuid
from typing import IO, Iterator

from agents_stream import topics
from agents_stream.settings import Settings


def _bootstrap(broker: str) -> str:
    """``kafka://host:9092,kafka://h2:9092`` → ``host:9092,h2:9092`` for aiokafka."""
    return ",".join(part.strip().split("://", 1)[-1] for part in broker.split(",") if part.strip())


def _cmd_worker(args: argparse.Namespace) -> int:
    argv = [sys.executable, "-m", "faust", "-A", "agents_stream.app", "worker", "-l", args.loglevel]
    # exec: the worker *is* this process, so SIGTERM from Docker/Kubernetes reaches Faust.
    os.execv(sys.executable, argv)
    return 0  # pragma: no cover


def _lines(source: IO[str]) -> Iterator[tuple[int, str]]:
    for number, line in enumerate(source, 1):
        if line.strip():
            yield number, line.strip()


async def _publish(args: argparse.Namespace, settings: Settings) -> int:
    from aiokafka import AIOKafkaProducer

    source = sys.stdin if args.file in (None, "-") else open(args.file, encoding="utf-8")
    topic = topics.task_topic(args.agent)
    producer = AIOKafkaProducer(bootstrap_servers=_bootstrap(settings.broker), acks="all", linger_ms=5, compression_type="gzip")
    await asyncio.wait_for(producer.start(), timeout=30)
    sent = bad = 0
    try:
        futures = []
        for number, line in _lines(source):
            try:
                task = json.loads(line)
                if not isinstance(task, dict):
                    raise ValueError("not a JSON object")
            except ValueError as exc:
                print(f"line {number}: skipped, not a JSON object ({exc})", file=sys.stderr)
                bad += 1
                continue
            task.setdefault("task_id", str(uuid.uuid4()))
            task.setdefault("agent_name", args.agent)
            key = str(task["task_id"]).encode("utf-8")
            futures.append(await producer.send(topic, json.dumps(task).encode("utf-8"), key=key))
            sent += 1
            if not args.quiet:
                print(task["task_id"])
        await asyncio.wait_for(asyncio.gather(*futures), timeout=60)
    finally:
        await asyncio.wait_for(producer.stop(), timeout=30)
        if source is not sys.stdin:
            source.close()
    print(f"published {sent} task(s) to {topic}" + (f"; {bad} line(s) skipped" if bad else ""), file=sys.stderr)
    return 1 if bad else 0


def _cmd_publish(args: argparse.Namespace) -> int:
    return asyncio.run(_publish(args, Settings.from_env()))


def _cmd_fake_llm(args: argparse.Namespace) -> int:
    from agents_stream import fakellm

    return fakellm.main(args.rest) or 0


def _cmd_settings(args: argparse.Namespace) -> int:
    current = Settings.from_env()
    for name, env, default, doc in Settings.describe():
        print(f"{env}={getattr(current, name)!s:<28} # {doc} (default {default!r})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agents-stream", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    worker = sub.add_parser("worker", help="run a worker (same as: faust -A agents_stream.app worker)")
    worker.add_argument("-l", "--loglevel", default=os.environ.get("AGENTS_STREAM_LOG_LEVEL", "info"))
    worker.set_defaults(func=_cmd_worker)

    publish = sub.add_parser("publish", help="publish tasks (JSON lines) to agent.tasks.<agent>")
    publish.add_argument("--agent", required=True, help="sub-agent name; its topic is agent.tasks.<agent>")
    publish.add_argument("file", nargs="?", default="-", help="JSON-lines file, or - for stdin")
    publish.add_argument("-q", "--quiet", action="store_true", help="do not print task ids")
    publish.set_defaults(func=_cmd_publish)

    fake = sub.add_parser("fake-llm", help="run the fake LLM server (Gemini, OpenAI and Anthropic APIs)", add_help=False)
    fake.add_argument("rest", nargs=argparse.REMAINDER)
    fake.set_defaults(func=_cmd_fake_llm)

    settings = sub.add_parser("settings", help="print every setting, its environment name and value")
    settings.set_defaults(func=_cmd_settings)

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["fake-llm"]:
        # its own options (--port, --latency, ...) belong to fakellm.main
        from agents_stream import fakellm

        return fakellm.main(argv[1:]) or 0
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

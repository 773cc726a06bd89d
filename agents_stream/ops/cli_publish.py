"""``agents-stream publish``: tasks from JSON lines onto agent.tasks.<agent>, paced, with a progress bar."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from functools import partial
from typing import IO, Any, Iterator

from agents_stream.contract import topics
from agents_stream.kafka import security as kafka_security
from agents_stream.ops import tracing
from agents_stream.ops.cli_common import AddParser, flush_traces
from agents_stream.settings import Settings, bootstrap_servers

__all__ = ["register"]


def register(add_parser: AddParser) -> None:
    publish = add_parser("publish", help="publish tasks (JSON lines) to agent.tasks.<agent>")
    publish.add_argument("--agent", required=True, help="sub-agent name; its topic is agent.tasks.<agent>")
    publish.add_argument("file", nargs="?", default="-", help="JSON-lines file, or - for stdin")
    publish.add_argument("-q", "--quiet", action="store_true", help="do not print task ids")
    publish.add_argument("--rate", type=float, metavar="N",
                         help="send at most N tasks per second (default: as fast as the broker takes them)")
    publish.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                         help="a progress bar on stderr (default: when stderr is a terminal)")
    publish.add_argument("--json", action="store_true", help="print one JSON summary instead of the task ids")
    publish.set_defaults(func=_cmd_publish)


def _lines(source: IO[str]) -> Iterator[tuple[int, str]]:
    for number, line in enumerate(source, 1):
        if line.strip():
            yield number, line.strip()


async def _publish(args: argparse.Namespace, settings: Settings) -> int:
    from aiokafka import AIOKafkaProducer

    source = sys.stdin if args.file in (None, "-") else open(args.file, encoding="utf-8")
    topic = topics.task_topic(args.agent)
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap_servers(settings.broker), acks="all", linger_ms=5, compression_type="gzip",
        **kafka_security.client_kwargs(settings),
    )
    sent = bad = 0
    started = time.monotonic()
    progress = _Progress(args.progress if args.progress is not None else sys.stderr.isatty(), _count_lines(args.file))
    # Each task the root of its trace (or under $TRACEPARENT, a caller's), its traceparent in the record's headers.
    traced = tracing.start("agents-stream-publish", {})
    parent = os.environ.get("TRACEPARENT") if traced else None
    try:
        await asyncio.wait_for(producer.start(), timeout=30)  # a refused login fails here: still close the producer
        futures = []
        for number, line in _lines(source):
            if args.rate:  # pace the sends: task n leaves no earlier than n / rate seconds after the start
                ahead = started + sent / args.rate - time.monotonic()
                if ahead > 0:
                    await asyncio.sleep(ahead)
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
            span = tracing.span(f"publish {topic}", parent, kind="producer", attributes={
                "messaging.system": "kafka", "messaging.operation.type": "send", "messaging.destination.name": topic,
                "agents_stream.task_id": str(task["task_id"]), "agents_stream.agent": args.agent,
            }) if traced else None
            headers = tracing.headers_with(None, span.traceparent) if span is not None else None
            future = await producer.send(topic, json.dumps(task).encode("utf-8"), key=key, headers=headers)
            if span is not None:
                future.add_done_callback(partial(_sent, span))
            futures.append(future)
            sent += 1
            progress.update(sent, started)
            if not args.quiet and not args.json:
                print(task["task_id"])
        await asyncio.wait_for(asyncio.gather(*futures), timeout=60)
    finally:
        progress.done()
        await asyncio.wait_for(producer.stop(), timeout=30)
        if source is not sys.stdin:
            source.close()
        flush_traces()
    seconds = time.monotonic() - started
    if args.json:
        print(json.dumps({"topic": topic, "published": sent, "skipped": bad, "seconds": round(seconds, 3)}))
    skipped = f"; {bad} line(s) skipped" if bad else ""
    print(f"published {sent} task(s) to {topic} in {seconds:.1f}s{skipped}", file=sys.stderr)
    return 1 if bad else 0


def _sent(span: tracing.Span, future: asyncio.Future[Any]) -> None:
    """A publish span ends when the broker answered; a refused send marks it failed."""
    if future.cancelled() or future.exception() is not None:
        span.fail("not sent: " + ("cancelled" if future.cancelled() else repr(future.exception())))
    span.end()


def _count_lines(path: str | None) -> int | None:
    """The number of tasks in a file, for the progress bar (None for stdin: the bar then shows a count)."""
    if path in (None, "-"):
        return None
    with open(path, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


class _Progress:
    """A one-line progress bar on stderr, redrawn at most 10 times a second."""

    def __init__(self, enabled: bool, total: int | None) -> None:
        self.enabled, self.total, self._drawn = enabled, total, 0.0

    def update(self, sent: int, started: float, force: bool = False) -> None:
        self._last = (sent, started)
        now = time.monotonic()
        if not self.enabled or (now - self._drawn < 0.1 and not force):
            return
        self._drawn = now
        rate = sent / max(now - started, 1e-6)
        if self.total:
            filled = int(30 * sent / self.total)
            bar = f"[{'#' * filled}{'.' * (30 - filled)}] {sent}/{self.total}"
        else:
            bar = f"{sent} sent"
        print(f"\r{bar}  {rate:,.0f} tasks/s ", end="", file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.enabled and self._drawn:
            self.update(*self._last, force=True)
            print(file=sys.stderr)


def _cmd_publish(args: argparse.Namespace) -> int:
    return asyncio.run(_publish(args, Settings.from_env()))

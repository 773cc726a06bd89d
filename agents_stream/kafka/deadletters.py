"""Reading dead-letter topics: the records of ``agent.tasks.<agent>.dlq`` and the look for one message's dead letter."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping

from agents_stream.contract import topics
from agents_stream.contract.topics import HISTORY_HEADER
from agents_stream.kafka import security as kafka_security
from agents_stream.settings import Settings, bootstrap_servers

__all__ = [
    "DeadLetter", "FindDeadLetter", "dead_letter_finder", "find_dead_letter", "history_of", "partitions_of",
    "read_dead_letters",
]

#: how far before an earlier owner began a dead letter its record is looked for (clocks of workers and broker)
DEAD_LETTER_CLOCK_SLACK_S = 600.0

#: (dlq topic, source (topic, partition, offset), sent no earlier than) → the dead letter found, or None
FindDeadLetter = Callable[[str, tuple[str, int, int], float], Awaitable["DeadLetter | None"]]


@dataclass(frozen=True)
class DeadLetter:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, str]

    @property
    def ref(self) -> str:
        """``<dlq topic>:<partition>:<offset>``: how the commands name one record."""
        return f"{self.topic}:{self.partition}:{self.offset}"

    @property
    def agent(self) -> str:
        return self.topic.removeprefix(topics.TASK_PREFIX).removesuffix(".dlq")

    @property
    def task_id(self) -> str | None:
        return self.key.decode("utf-8", "replace") if self.key is not None else None

    def as_dict(self) -> dict[str, Any]:
        text = self.value.decode("utf-8", "replace") if self.value is not None else None
        try:
            body: Any = json.loads(text) if text is not None else None
        except ValueError:
            body = text
        return {
            "ref": self.ref, "agent": self.agent, "task_id": self.task_id, "headers": self.headers,
            "history": history_of(self), "value": body,
        }


def history_of(dl: DeadLetter) -> list[dict[str, str]]:
    """The failures before this one (from a requeue's history header), oldest first."""
    try:
        earlier = json.loads(dl.headers.get(HISTORY_HEADER, "[]"))
    except ValueError:
        earlier = []
    return earlier if isinstance(earlier, list) else []


async def partitions_of(broker: str, names: list[str], timeout: float, security: Mapping[str, Any] | None) -> list[Any]:
    """The partitions of those of ``names`` that exist on the broker."""
    from aiokafka import TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers(broker), **(security or {}))
    await asyncio.wait_for(admin.start(), timeout)
    try:
        existing = set(await asyncio.wait_for(admin.list_topics(), timeout))
        present = [n for n in names if n in existing]
        described = await asyncio.wait_for(admin.describe_topics(present), timeout) if present else []
    finally:
        await asyncio.wait_for(admin.close(), timeout)
    return [TopicPartition(d["topic"], p["partition"]) for d in described for p in d["partitions"]]


async def _read(
    broker: str, names: list[str], timeout: float, security: Mapping[str, Any] | None, since_ms: int | None = None,
) -> list[DeadLetter]:
    """The records of these topics up to their end when the read started: from the beginning, or from the first
    record written at or after ``since_ms`` (ms since the epoch)."""
    from aiokafka import AIOKafkaConsumer

    parts = await partitions_of(broker, names, timeout, security)
    if not parts:
        return []
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap_servers(broker), group_id=None, enable_auto_commit=False, **(security or {}),
    )
    await asyncio.wait_for(consumer.start(), timeout)
    out: list[DeadLetter] = []
    try:
        consumer.assign(parts)
        await asyncio.wait_for(consumer.seek_to_beginning(*parts), timeout)
        ends = await asyncio.wait_for(consumer.end_offsets(parts), timeout)
        remaining = {tp for tp in parts if ends[tp] > 0}
        if since_ms is not None:
            starts = await asyncio.wait_for(consumer.offsets_for_times(dict.fromkeys(remaining, since_ms)), timeout)
            for tp, found in starts.items():
                if found is None or found.offset >= ends[tp]:  # nothing written since then
                    remaining.discard(tp)
                else:
                    consumer.seek(tp, found.offset)
        deadline = asyncio.get_running_loop().time() + timeout
        while remaining:
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"reading the dead-letter topics took longer than {timeout:.0f}s")
            batch = await consumer.getmany(*remaining, timeout_ms=500)
            for tp, records in batch.items():
                for r in records:
                    if r.offset < ends[tp]:
                        headers = {k: v.decode("utf-8", "replace") for k, v in (r.headers or ())}
                        out.append(DeadLetter(tp.topic, tp.partition, r.offset, r.key, r.value, headers))
            for tp in list(remaining):
                if await asyncio.wait_for(consumer.position(tp), timeout) >= ends[tp]:
                    remaining.discard(tp)
    finally:
        await asyncio.wait_for(consumer.stop(), timeout)
    return out


async def read_dead_letters(
    broker: str, names: list[str], timeout: float = 60.0, *, security: Mapping[str, Any] | None = None,
) -> list[DeadLetter]:
    """Every record of these topics, from the beginning up to their end when the read started."""
    out = await _read(broker, names, timeout, security)
    return sorted(out, key=lambda d: (d.topic, d.headers.get("failed_at", ""), d.partition, d.offset))


async def find_dead_letter(
    broker: str, topic: str, source: tuple[str, int, int], since: float, timeout: float = 30.0,
    *, security: Mapping[str, Any] | None = None,
) -> DeadLetter | None:
    """The record of ``topic`` written at or after ``since`` (seconds since the epoch) for the message at
    ``source`` (topic, partition, offset), as its ``original_*`` headers name it; None when there is none."""
    want = {"original_topic": source[0], "original_partition": str(source[1]), "original_offset": str(source[2])}
    for dl in await _read(broker, [topic], timeout, security, since_ms=max(0, int(since * 1000))):
        if all(dl.headers.get(name) == value for name, value in want.items()):
            return dl
    return None


def dead_letter_finder(settings: Settings, timeout: float = 30.0) -> FindDeadLetter:
    """The outbox's look on the dead-letter topic, on the broker of ``settings``, with slack for clock skew."""

    async def find(dlq: str, source: tuple[str, int, int], since: float) -> DeadLetter | None:
        return await find_dead_letter(
            settings.broker, dlq, source, since - DEAD_LETTER_CLOCK_SLACK_S, timeout=timeout,
            security=kafka_security.client_kwargs(settings),
        )

    return find

"""Dead-letter tooling: list, show and requeue the records of ``agent.tasks.<agent>.dlq``.

A requeue sends the original bytes back to the original topic under the same
key, with a fresh ``agents_stream.requeue_id`` (the ledger then starts the task
again with its attempt counter reset, even though it had finished) and the
dead-letter headers of every earlier failure in ``agents_stream.history``, so
a task that fails again reaches the dead-letter topic with its whole story.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Mapping

from agents_stream.contract import topics
from agents_stream.contract.topics import HISTORY_HEADER, REQUEUE_HEADER
from agents_stream.settings import bootstrap_servers

__all__ = ["DeadLetter", "find_dead_letter", "history_of", "matches", "parse_ref", "read_dead_letters", "requeue", "requeue_headers_for", "summary"]

#: the contract's dead-letter headers (DESIGN.md), kept in the history of a requeued task
STANDARD_HEADERS = ("error_reason", "error_layer", "original_topic", "original_partition", "original_offset", "failed_at", "attempts")


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


def summary(dl: DeadLetter) -> dict[str, Any]:
    """One line of a listing: where the record is, whose task, and why it failed."""
    h = dl.headers
    attempts = h.get("attempts")
    return {
        "ref": dl.ref, "topic": dl.topic, "partition": dl.partition, "offset": dl.offset,
        "task_id": dl.task_id, "agent": dl.agent, "error_layer": h.get("error_layer"), "reason": h.get("error_reason"),
        "attempts": int(attempts) if attempts and attempts.isdigit() else None, "failed_at": h.get("failed_at"),
        "requeues": len(history_of(dl)),
    }


def parse_ref(ref: str) -> tuple[str, int, int]:
    """``agent.tasks.x.dlq:0:12`` → (topic, partition, offset); ValueError with the expected form."""
    try:
        topic, partition, offset = ref.rsplit(":", 2)
        if not topic.endswith(".dlq"):
            raise ValueError
        return topic, int(partition), int(offset)
    except ValueError:
        raise ValueError(f"{ref!r} is not a dead-letter reference like agent.tasks.<agent>.dlq:<partition>:<offset>") from None


def _when(text: str) -> datetime:
    when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def matches(
    dl: DeadLetter,
    *,
    agent: str | None = None,
    layer: str | None = None,
    reason: str | None = None,
    since: str | None = None,
    until: str | None = None,
) -> bool:
    """The filters of ``dlq list`` / ``dlq requeue``: exact agent and layer, reason substring, failed_at range."""
    if agent is not None and dl.agent != agent:
        return False
    if layer is not None and dl.headers.get("error_layer") != layer:
        return False
    if reason is not None and reason.lower() not in dl.headers.get("error_reason", "").lower():
        return False
    if since is not None or until is not None:
        failed = dl.headers.get("failed_at")
        if not failed:
            return False
        at = _when(failed)
        if since is not None and at < _when(since):
            return False
        if until is not None and at > _when(until):
            return False
    return True


def history_of(dl: DeadLetter) -> list[dict[str, str]]:
    """The failures before this one (from a requeue's history header), oldest first."""
    try:
        earlier = json.loads(dl.headers.get(HISTORY_HEADER, "[]"))
    except ValueError:
        earlier = []
    return earlier if isinstance(earlier, list) else []


def requeue_headers_for(dl: DeadLetter, requeue_id: str) -> list[tuple[str, bytes]]:
    """Headers of the requeued message: its requeue id and the history including this failure."""
    this = {name: dl.headers[name] for name in STANDARD_HEADERS if name in dl.headers}
    this["dead_letter"] = dl.ref
    history = [*history_of(dl), this]
    return [
        (REQUEUE_HEADER, requeue_id.encode()),
        (HISTORY_HEADER, json.dumps(history, separators=(",", ":")).encode("utf-8")),
    ]


async def dlq_topics(broker: str, agent: str | None, timeout: float = 30.0, *, security: Mapping[str, Any] | None = None) -> list[str]:
    """The dead-letter topics to read: one agent's, or every ``agent.tasks.*.dlq`` on the broker.

    ``security`` here and below: the broker credentials, ``kafka_security.client_kwargs(settings)``.
    """
    if agent is not None:
        return [topics.dlq_topic(agent)]
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers(broker), **(security or {}))
    await asyncio.wait_for(admin.start(), timeout)
    try:
        names = await asyncio.wait_for(admin.list_topics(), timeout)
    finally:
        await asyncio.wait_for(admin.close(), timeout)
    return sorted(n for n in names if n.startswith(topics.TASK_PREFIX) and n.endswith(".dlq"))


async def _partitions(broker: str, names: list[str], timeout: float, security: Mapping[str, Any] | None) -> list[Any]:
    """The partitions of those of ``names`` that exist on the broker."""
    from aiokafka import TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers(broker), **(security or {}))
    await asyncio.wait_for(admin.start(), timeout)
    try:
        existing = set(await asyncio.wait_for(admin.list_topics(), timeout))
        described = await asyncio.wait_for(admin.describe_topics([n for n in names if n in existing]), timeout) if existing & set(names) else []
    finally:
        await asyncio.wait_for(admin.close(), timeout)
    return [TopicPartition(d["topic"], p["partition"]) for d in described for p in d["partitions"]]


async def _read(
    broker: str, names: list[str], timeout: float, security: Mapping[str, Any] | None, since_ms: int | None = None,
) -> list[DeadLetter]:
    """The records of these topics up to their end when the read started: from the beginning, or from the first
    record written at or after ``since_ms`` (ms since the epoch)."""
    from aiokafka import AIOKafkaConsumer

    parts = await _partitions(broker, names, timeout, security)
    if not parts:
        return []
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap_servers(broker), group_id=None, enable_auto_commit=False, **(security or {}))
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


async def requeue(
    broker: str, records: list[DeadLetter], timeout: float = 60.0, *, security: Mapping[str, Any] | None = None,
) -> list[tuple[DeadLetter, str]]:
    """Send each record's original bytes back to its original topic; returns (record, requeue id)."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap_servers(broker), acks="all", **(security or {}))
    await asyncio.wait_for(producer.start(), timeout)
    done = []
    try:
        futures = []
        for dl in records:
            target = dl.headers.get("original_topic") or topics.task_topic(dl.agent)
            requeue_id = uuid.uuid4().hex
            futures.append(await producer.send(target, dl.value, key=dl.key, headers=requeue_headers_for(dl, requeue_id)))
            done.append((dl, requeue_id))
        await asyncio.wait_for(asyncio.gather(*futures), timeout)
    finally:
        await asyncio.wait_for(producer.stop(), timeout)
    return done

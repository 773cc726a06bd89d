"""Dead-letter tooling: list, show and requeue the records of ``agent.tasks.<agent>.dlq``."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import datetime, timezone
from typing import Any, Mapping

from agents_stream.contract import topics
from agents_stream.contract.topics import HISTORY_HEADER, REQUEUE_HEADER
from agents_stream.kafka.deadletters import DeadLetter, history_of, read_dead_letters
from agents_stream.ops import tracing
from agents_stream.settings import bootstrap_servers

# The reader (DeadLetter, read_dead_letters) lives in agents_stream.kafka.deadletters; listed here for the commands.
__all__ = [
    "DeadLetter", "dlq_topics", "history_of", "matches", "parse_ref", "read_dead_letters", "requeue",
    "requeue_headers_for", "requeue_target", "summary",
]

#: the contract's dead-letter headers (docs/contract.md), kept in the history of a requeued task
STANDARD_HEADERS = (
    "error_reason", "error_layer", "original_topic", "original_partition", "original_offset", "failed_at", "attempts",
)


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
        if not (topic.startswith(topics.TASK_PREFIX) and topic.endswith(".dlq")):
            raise ValueError
        return topic, int(partition), int(offset)
    except ValueError:
        raise ValueError(
            f"{ref!r} is not a dead-letter reference like agent.tasks.<agent>.dlq:<partition>:<offset>"
        ) from None


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



def requeue_headers_for(dl: DeadLetter, requeue_id: str) -> list[tuple[str, bytes]]:
    """Headers of the requeued message: its requeue id and the history including this failure."""
    this = {name: dl.headers[name] for name in STANDARD_HEADERS if name in dl.headers}
    this["dead_letter"] = dl.ref
    history = [*history_of(dl), this]
    headers = [
        (REQUEUE_HEADER, requeue_id.encode()),
        (HISTORY_HEADER, json.dumps(history, separators=(",", ":")).encode("utf-8")),
    ]
    # the task's trace (a dead letter carries it): the requeued run is traced in it, its failures before it
    return tracing.headers_with(headers, tracing.header_traceparent(dl.headers.items()))


async def dlq_topics(
    broker: str, agent: str | None, timeout: float = 30.0, *, security: Mapping[str, Any] | None = None,
) -> list[str]:
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



def requeue_target(dl: DeadLetter) -> str:
    """Where a dead letter goes back to: only ever its agent's own task topic, named by the dead-letter topic it
    was read from. Its ``original_topic`` header is as its writer set it: a record planted on a dead-letter topic
    must not reach agent.approvals or another agent's tasks."""
    agent = topics.agent_of(dl.topic.removesuffix(".dlq")) if dl.topic.endswith(".dlq") else None
    if not agent:
        raise ValueError(f"{dl.ref} is not on an agent's dead-letter topic (agent.tasks.<agent>.dlq): not requeued")
    return topics.task_topic(agent)


async def requeue(
    broker: str, records: list[DeadLetter], timeout: float = 60.0, *, security: Mapping[str, Any] | None = None,
) -> list[tuple[DeadLetter, str]]:
    """Send each record's original bytes back to its agent's task topic; returns (record, requeue id).

    Under the same key, with a fresh ``agents_stream.requeue_id`` (the ledger starts the task again with its
    attempt counter reset, even though it had finished) and every earlier failure's dead-letter headers in
    ``agents_stream.history``, so a task that fails again reaches the dead-letter topic with its whole story.
    """
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap_servers(broker), acks="all", **(security or {}))
    await asyncio.wait_for(producer.start(), timeout)
    done = []
    try:
        futures = []
        for dl in records:
            target = requeue_target(dl)
            requeue_id = uuid.uuid4().hex
            headers = requeue_headers_for(dl, requeue_id)
            futures.append(await producer.send(target, dl.value, key=dl.key, headers=headers))
            done.append((dl, requeue_id))
        await asyncio.wait_for(asyncio.gather(*futures), timeout)
    finally:
        await asyncio.wait_for(producer.stop(), timeout)
    return done

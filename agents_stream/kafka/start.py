"""Where a new app id starts a task topic another app id already read: as the operator chose, never silently.

A group without a commit reads a topic from its earliest offset (nothing published before the first worker is
lost), and the task table is per app id: a new app id on a topic another one has read would call the model again
for every task still in the retention. So before the consumer joins, for each task topic the group never committed
on while another group committed past the topic's start, the worker needs AGENTS_STREAM_START_FROM — earliest,
latest or group:<app id> — commits that start for its group (asked once: the commit is the answer), or refuses to
start and says how to choose. docs/decisions.md, "A new app id does not silently re-run history".
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Literal

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import OffsetAndMetadata

from agents_stream.contract import topics as contract_topics
from agents_stream.kafka import security as kafka_security
from agents_stream.kafka.admin import retried
from agents_stream.settings import Settings, bootstrap_servers

__all__ = ["Start", "StartFrom", "decide", "parse_start_from", "refusal", "commit_starts", "commit_task_topic_starts"]

log = logging.getLogger(__name__)

_TIMEOUT_S = 30.0
#: offsets of other groups asked at once (a shared broker may have many groups)
_CONCURRENCY = 8


@dataclass(frozen=True)
class StartFrom:
    """AGENTS_STREAM_START_FROM: ``ask`` (unset: refuse and say how), ``earliest``, ``latest`` or ``group``."""

    how: Literal["ask", "earliest", "latest", "group"]
    group: str | None = None


def parse_start_from(value: str) -> StartFrom:
    """The setting's value; ValueError saying the accepted forms for anything else."""
    value = value.strip()
    if not value:
        return StartFrom("ask")
    if value in ("earliest", "latest"):
        return StartFrom(value)  # type: ignore[arg-type]
    if value.startswith("group:") and value[len("group:"):].strip():
        return StartFrom("group", value[len("group:"):].strip())
    raise ValueError(f"AGENTS_STREAM_START_FROM={value!r}: expected earliest, latest or group:<app id>")


@dataclass(frozen=True)
class Start:
    """What the worker does about one topic: nothing (``commit`` None: the group's commits, or the earliest
    offset), commit these offsets for its group first, or refuse (``refused``, with ``readers``)."""

    topic: str
    commit: dict[int, int] | None = None
    refused: bool = False
    #: the other groups that read the topic past its start, with the offsets they committed
    readers: dict[str, dict[int, int]] = field(default_factory=dict)


def decide(
    topic: str, own: dict[int, int], others: dict[str, dict[int, int]], begin: dict[int, int], end: dict[int, int],
    choice: StartFrom,
) -> Start:
    """Where ``topic`` starts for a group with commits ``own`` when ``others`` committed theirs (pure)."""
    if own:
        return Start(topic)  # read before: the group's own commits say where
    readers = {
        g: offs for g, offs in sorted(others.items()) if any(o > begin.get(p, 0) for p, o in offs.items())
    }
    if not readers:
        return Start(topic)  # nobody read it: from the start, so nothing published before the first worker is lost
    if choice.how == "earliest":
        return Start(topic, commit=dict(begin), readers=readers)
    if choice.how == "latest":
        return Start(topic, commit=dict(end), readers=readers)
    if choice.how == "group" and choice.group in readers:
        theirs = readers[choice.group]
        return Start(topic, commit={p: max(theirs.get(p, b), b) for p, b in begin.items()}, readers=readers)
    return Start(topic, refused=True, readers=readers)


def refusal(app_id: str, starts: list[Start], choice: StartFrom) -> str:
    """What the operator reads when the worker will not start: which topics, who read them, how to choose."""
    readers = sorted({g for s in starts for g in s.readers})
    topics = ", ".join(f"{s.topic} (read by {', '.join(s.readers)})" for s in starts)
    unknown = (
        f"AGENTS_STREAM_START_FROM=group:{choice.group} names an app id that has not read them. "
        if choice.how == "group" else ""
    )
    return (
        f"App id {app_id} has never read {topics}. Reading from the start would call the model again for every "
        f"task still in their retention. {unknown}Choose where app id {app_id} starts, then start the worker again: "
        "AGENTS_STREAM_START_FROM=earliest (every task in the topic, again), =latest (only tasks published from "
        f"now on) or ={' or ='.join(f'group:{g}' for g in readers)} (where that app id has got to). The choice is "
        f"committed for app id {app_id} and not asked again."
    )


async def commit_task_topic_starts(settings: Settings, group: str, inputs: list[str]) -> list[Start]:
    """``commit_starts`` for the task topics among ``inputs``, with the settings' broker and choice."""
    try:
        choice = parse_start_from(settings.start_from)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    tasks = [t for t in inputs if contract_topics.agent_of(t) is not None]
    bootstrap = bootstrap_servers(settings.broker)
    return await commit_starts(bootstrap, kafka_security.client_kwargs(settings), group, tasks, choice)


async def commit_starts(
    bootstrap: str, client_kwargs: dict[str, Any], group: str, topics: list[str], choice: StartFrom,
) -> list[Start]:
    """Decide each of ``topics`` for ``group`` and commit the chosen starts; SystemExit (with ``refusal``'s
    message) when a topic needs a choice the setting does not make. Before the group's consumer joins."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **client_kwargs)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                                **client_kwargs)
    await asyncio.wait_for(admin.start(), _TIMEOUT_S)
    try:
        await asyncio.wait_for(consumer.start(), _TIMEOUT_S)
        own = await retried(f"the commits of group {group}", lambda: _committed(admin, group, topics))
        fresh = [t for t in topics if not own.get(t)]
        begin, end = await retried("the task topics' offsets", lambda: _bounds(admin, consumer, fresh))
        # Only a topic holding records can have a history to re-run: the other groups are asked about those.
        held = [t for t in fresh if any(o > begin.get(tp, 0) for tp, o in end.items() if tp.topic == t)]
        others = await _others(admin, group, held) if held else {}
        starts = [
            decide(t, own.get(t, {}), others.get(t, {}), _of(begin, t), _of(end, t), choice) for t in topics
        ]
        refused = [s for s in starts if s.refused]
        if refused:
            message = refusal(group, refused, choice)
            log.critical(message)
            raise SystemExit(message)
        chosen = [s for s in starts if s.commit is not None]
        if chosen:
            await retried(f"committing the starts of group {group}", lambda: _commit(consumer, group, chosen))
    finally:
        await admin.close()
        await consumer.stop()
    return starts


async def _bounds(
    admin: AIOKafkaAdminClient, consumer: AIOKafkaConsumer, topics: list[str],
) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
    """The first and next offsets of every partition of ``topics``."""
    if not topics:
        return {}, {}
    described = await admin.describe_topics(topics)
    parts = [TopicPartition(t["topic"], p["partition"]) for t in described for p in t.get("partitions") or ()]
    begin = await consumer.beginning_offsets(parts)
    end = await consumer.end_offsets(parts)
    return begin, end


def _of(offsets: dict[TopicPartition, int], topic: str) -> dict[int, int]:
    return {tp.partition: o for tp, o in offsets.items() if tp.topic == topic}


async def _committed(admin: AIOKafkaAdminClient, group: str, topics: list[str]) -> dict[str, dict[int, int]]:
    offsets = await admin.list_consumer_group_offsets(group)
    out: dict[str, dict[int, int]] = {}
    for tp, meta in offsets.items():
        if tp.topic in topics and meta.offset >= 0:
            out.setdefault(tp.topic, {})[tp.partition] = meta.offset
    return out


async def _others(admin: AIOKafkaAdminClient, group: str, topics: list[str]) -> dict[str, dict[str, dict[int, int]]]:
    """topic → other group → its commits on the topic."""
    listed = await retried("the consumer groups", admin.list_consumer_groups)
    groups = sorted({g[0] for g in listed if g[0] != group})
    gate = asyncio.Semaphore(_CONCURRENCY)

    async def one(g: str) -> tuple[str, dict[str, dict[int, int]]]:
        async with gate:
            try:
                return g, await retried(f"the commits of group {g}", lambda: _committed(admin, g, topics))
            except Exception as exc:  # a group we may not describe (ACLs) cannot be one we follow
                log.info("Offsets of consumer group %s not readable (%r); not counted as a reader", g, exc)
                return g, {}

    out: dict[str, dict[str, dict[int, int]]] = {}
    for g, by_topic in await asyncio.gather(*(one(g) for g in groups)):
        for topic, offs in by_topic.items():
            out.setdefault(topic, {})[g] = offs
    return out


async def _commit(consumer: AIOKafkaConsumer, group: str, starts: list[Start]) -> None:
    offsets = {
        TopicPartition(s.topic, p): OffsetAndMetadata(o, "") for s in starts for p, o in (s.commit or {}).items()
    }
    consumer.assign(list(offsets))
    await consumer.commit(offsets)
    for s in starts:
        log.warning(
            "App id %s starts %s where AGENTS_STREAM_START_FROM said (other readers: %s): committed %s",
            group, s.topic, ", ".join(s.readers), dict(sorted((s.commit or {}).items())),
        )

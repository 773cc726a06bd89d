"""The worker's topics: those it reads and those it declares, made before its consumer joins the group."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import faust
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaConnectionError, KafkaError, TopicAlreadyExistsError

from agents_stream.config import AppConfig
from agents_stream.contract import topics
from agents_stream.kafka import security as kafka_security
from agents_stream.resilience.backoff import backoff
from agents_stream.settings import Settings, bootstrap_servers

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class TopicSpec:
    """A topic with its own partition count and configs (not co-partitioned with the input topics)."""

    name: str
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)


#: The circuits log: one partition (every worker folds the whole log in one order, agents_stream.resilience.
#: circuits), stamped by the broker (LogAppendTime: the fold uses one clock for all workers), kept a day.
CIRCUITS_RETENTION = timedelta(days=1)
CIRCUITS_CONFIG = {"message.timestamp.type": "LogAppendTime"}
CIRCUITS_SPEC = TopicSpec(
    topics.CIRCUITS, 1, {**CIRCUITS_CONFIG, "retention.ms": str(int(CIRCUITS_RETENTION.total_seconds() * 1000))},
)


def leader_spec(app_id: str) -> TopicSpec:
    """The topic Faust's assignor elects its group leader with (Faust's ``LeaderAssignor`` names it so: one
    partition, default configs). Made with the others before the group is joined: Faust would make it moments
    before the consumer subscribes, and a broker slow to list it logged "not found in cluster metadata"."""
    return TopicSpec(f"{app_id}-__assignor-__leader", 1)


@dataclass(frozen=True)
class Replication:
    """How every topic the app creates is replicated: ``factor`` copies, and a write with acks=all counts once
    ``min_insync`` of them have it (docs/cluster.md)."""

    factor: int
    min_insync: int

    def topic_configs(self) -> dict[str, str]:
        return {"min.insync.replicas": str(self.min_insync)}


def replication_for(settings: Settings, brokers: int) -> Replication:
    """AGENTS_STREAM_REPLICATION_FACTOR and AGENTS_STREAM_MIN_INSYNC_REPLICAS, their 0 (auto) resolved against
    ``brokers``, the brokers the cluster's metadata lists: min(3, brokers) replicas, and 2 in sync with three or
    more (one broker may fail and writes go on, and an acknowledged write is on two brokers), else 1."""
    factor = settings.replication_factor or max(1, min(3, brokers))
    min_insync = settings.min_insync_replicas or (2 if factor >= 3 else 1)
    if factor < 1 or min_insync < 1 or min_insync > factor:
        raise SystemExit(
            f"AGENTS_STREAM_REPLICATION_FACTOR={factor} and AGENTS_STREAM_MIN_INSYNC_REPLICAS={min_insync}: "
            "both must be at least 1 and min.insync.replicas at most the replication factor (0 chooses both)"
        )
    if factor > 1 and min_insync == factor:
        log.warning(
            "min.insync.replicas=%d equals the replication factor: one broker down stops every write "
            "(NotEnoughReplicas). Set AGENTS_STREAM_MIN_INSYNC_REPLICAS=%d to survive one broker.",
            min_insync, factor - 1,
        )
    return Replication(factor, min_insync)


def input_topics(settings: Settings, agents: list[str]) -> list[str]:
    """The topics the ledger agent reads: its agents' tasks, its own outcomes and answers, the shared ones."""
    inputs = [
        *(topics.task_topic(a) for a in agents),
        topics.outcomes_topic(settings.app_id), topics.answers_topic(settings.app_id), topics.APPROVALS,
    ]
    if settings.jobs_enabled():  # the orchestrator shares the ledger's loop (agents_stream.orchestrator)
        inputs += [topics.JOBS, topics.JOB_EVENTS]
    return inputs


def output_topics(app: faust.App, settings: Settings, config: AppConfig, agents: list[str]) -> list[Any]:
    """Output topics nobody in this app consumes: declared at start (auto-creation is off)."""
    n = settings.partitions
    dead_letters = [
        *(topics.dlq_topic(a) for a in agents), topics.dlq_of(topics.APPROVALS), topics.dlq_of(topics.JOBS),
    ]
    return [
        app.topic(topics.RESULTS, partitions=n, internal=True),
        # conversations' replies and progress (contract/conversation_messages.py, tables/conversation_events.py)
        app.topic(topics.REPLIES, partitions=n, internal=True),
        app.topic(topics.CONVERSATION_EVENTS, partitions=n, internal=True),
        app.topic(topics.CONTROL, partitions=n, internal=True),
        *(
            app.topic(name, partitions=n, internal=True, retention=timedelta(days=settings.dlq_retention_days))
            for name in dead_letters
        ),
        # Ledgers of every app id send their job tasks' results here; the orchestrator sends tasks to any agent.
        app.topic(topics.JOB_EVENTS, partitions=n, internal=True),
        app.topic(topics.JOB_RESULTS, partitions=n, internal=True),
        # Any worker's web view accepts a job cancel, even with the orchestrator elsewhere.
        *([] if settings.jobs_enabled() else [app.topic(topics.JOBS, partitions=n, internal=True)]),
        *(
            app.topic(topics.task_topic(a), partitions=n, internal=True)
            for a in config.agents if settings.jobs_enabled() and a not in agents
        ),
        # Also made before the consumer starts (CIRCUITS_SPEC in ensure_topics): declared here with the same configs.
        app.topic(
            topics.CIRCUITS, partitions=CIRCUITS_SPEC.partitions, internal=True, retention=CIRCUITS_RETENTION,
            config=dict(CIRCUITS_CONFIG),
        ),
    ]


async def ensure_topics(
    settings: Settings,
    names: list[str],
    timeout: float = 60.0,
    compacted: list[str] | None = None,
    others: list[TopicSpec] | None = None,
    group: str | None = None,
    present: set[str] | None = None,
) -> Replication:
    """Create the input topics, the tables' changelogs (``compacted``) and ``others`` that are missing, and wait
    until the broker describes every one of them (and, with ``group``, names that group's coordinator). Returns
    the replication they were made with (``replication_for`` the brokers up now), for the topics Faust declares.

    Before the consumer joins its group, so no assignment leaves a topic out (docs/decisions.md, "Topics made
    before the group is joined").

    Every input topic must also have AGENTS_STREAM_PARTITIONS partitions (the
    tables are co-partitioned with them). One created earlier with another
    count would crash the worker at its first event; stop now and say why.

    ``present`` (when given) gets the name of every topic the broker has now: the cluster's list, read anyway, and
    the ones made here. Faust does not declare those again (``IdempotentProducer.create_topic``).
    """
    admin = await _connected_admin(settings)
    compacted = compacted or []
    others = others or []
    try:
        brokers = len((await asyncio.wait_for(admin.describe_cluster(), timeout=30.0)).get("brokers") or ())
        replication = replication_for(settings, brokers)
        existing = set(await asyncio.wait_for(admin.list_topics(), timeout=30.0))
        specs = [TopicSpec(name, settings.partitions) for name in names]
        specs += [TopicSpec(name, settings.partitions, {"cleanup.policy": "compact"}) for name in compacted]
        specs += others
        await _create_missing(admin, [t for t in specs if t.name not in existing], replication, brokers)
        described = await _described(admin, [t.name for t in specs], timeout)
        if present is not None:
            present.update(existing, described)
        problems = size_problems(settings, await _message_limits(admin, names + compacted))
        if group is not None:
            await _coordinator(admin, group, timeout)
    finally:
        await admin.close()
    _warn_under_replicated(described, replication)
    counts = {t: len(parts) for t, parts in described.items()}
    if problems:
        message = "Record size limits disagree: " + "; ".join(problems)
        log.critical(message)
        raise SystemExit(message)
    wrong = {t: n for t, n in counts.items() if n != settings.partitions and t in names}
    if wrong:
        message = (
            f"Input topics exist with a partition count other than AGENTS_STREAM_PARTITIONS={settings.partitions}: "
            f"{wrong}. Tables are co-partitioned with their input topics, so every worker sharing these topics "
            "must use the count they were created with: set AGENTS_STREAM_PARTITIONS to match, or (on a "
            "development broker) delete the topics"
        )
        log.critical(message)
        raise SystemExit(message)
    return replication


async def _create_missing(
    admin: AIOKafkaAdminClient, missing: list[TopicSpec], replication: Replication, brokers: int,
) -> None:
    if not missing:
        return
    if replication.factor > brokers:
        message = (
            f"Cannot create topics {sorted(t.name for t in missing)} with {replication.factor} replicas: the cluster "
            f"lists {brokers} broker(s) up. Start the missing brokers, or lower AGENTS_STREAM_REPLICATION_FACTOR"
        )
        log.critical(message)
        raise SystemExit(message)
    new = [
        NewTopic(t.name, t.partitions, replication.factor, topic_configs={**replication.topic_configs(), **t.configs})
        for t in missing
    ]
    try:
        await asyncio.wait_for(admin.create_topics(new), timeout=30.0)
    except TopicAlreadyExistsError:
        pass  # another worker starting at the same time made them
    log.info(
        "Created topics %s (%d replicas, min.insync.replicas=%d)",
        ", ".join(sorted(t.name for t in missing)), replication.factor, replication.min_insync,
    )


def _warn_under_replicated(described: dict[str, list[dict[str, Any]]], replication: Replication) -> None:
    """Topics made earlier with fewer replicas keep them (the app never reassigns partitions): say so once."""
    fewer = sorted(
        t for t, parts in described.items() if min(len(p.get("replicas") or ()) for p in parts) < replication.factor
    )
    if fewer:
        log.warning(
            "Topics %s have fewer than %d replicas (made earlier, or by hand): a broker lost takes their partitions "
            "with it. Add replicas with scripts/kafka-tool reassign-partitions (docs/cluster.md).",
            ", ".join(fewer), replication.factor,
        )


def size_problems(settings: Settings, limits: dict[str, int]) -> list[str]:
    """What stops a task's record from always fitting: the payload limit must leave room for an answer within
    the record limit (also the producer's max_request_size), and every topic must take a record that big
    (``limits``: each topic's max.message.bytes). Each problem says what to set."""
    problems = []
    record, payload = settings.record_max_bytes, settings.payload_max_bytes
    if payload + settings.answer_max_bytes > record:
        problems.append(
            f"AGENTS_STREAM_PAYLOAD_MAX_BYTES ({payload}) + AGENTS_STREAM_ANSWER_MAX_BYTES "
            f"({settings.answer_max_bytes}) > AGENTS_STREAM_RECORD_MAX_BYTES ({record}): a task and its answer must "
            "fit in one record; lower the first two or raise the last"
        )
    small = {name: limit for name, limit in sorted(limits.items()) if limit < record}
    if small:
        shown = ", ".join(f"{name}={limit}" for name, limit in list(small.items())[:5])
        problems.append(
            f"{len(small)} topic(s) take smaller records than AGENTS_STREAM_RECORD_MAX_BYTES ({record}), the "
            f"producer's max_request_size: max.message.bytes {shown}. Lower AGENTS_STREAM_RECORD_MAX_BYTES, or set "
            f"max.message.bytes >= {record} on them (scripts/kafka-tool configs --bootstrap-server <broker> "
            f"--alter --entity-type topics --entity-name <topic> --add-config max.message.bytes={record})"
        )
    return problems


async def _message_limits(admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, int]:
    """max.message.bytes of each topic (its own, or the broker's default it inherits); {} when not allowed to ask."""
    try:
        return await _topic_config(admin, names, "max.message.bytes")
    except (KafkaError, asyncio.TimeoutError) as exc:
        log.warning("Could not read the topics' max.message.bytes (%r); record sizes are not checked at start", exc)
        return {}


async def longest_retention_s(settings: Settings, names: list[str]) -> float | None:
    """The longest ``retention.ms`` of these topics, in seconds; None when one keeps its records forever (-1) or
    the broker does not say (then nothing may expire: a record could outlive its task's message)."""
    if not names:
        return None
    admin = await _connected_admin(settings)
    try:
        found = await _topic_config(admin, names, "retention.ms")
    except (KafkaError, asyncio.TimeoutError) as exc:
        log.warning("Could not read the task topics' retention.ms (%r): finished task records do not expire", exc)
        return None
    finally:
        await admin.close()
    if set(found) != set(names) or any(ms < 0 for ms in found.values()):
        return None
    return max(found.values()) / 1000.0


async def _topic_config(admin: AIOKafkaAdminClient, names: list[str], key: str) -> dict[str, int]:
    """The integer value of config ``key`` of each topic the broker describes (its own or the default it
    inherits); a topic it reports an error for, or whose value is not an integer, is left out."""
    resources = [ConfigResource(ConfigResourceType.TOPIC, name, {key: None}) for name in names]
    responses = await asyncio.wait_for(admin.describe_configs(resources), timeout=30.0)
    found: dict[str, int] = {}
    for response in responses:
        for error_code, _, _, name, entries in response.resources:
            value = str({entry[0]: entry[1] for entry in entries}.get(key, ""))
            if error_code == 0 and value.lstrip("-").isdigit():
                found[name] = int(value)
    return found


async def _connected_admin(settings: Settings) -> AIOKafkaAdminClient:
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap_servers(settings.broker), **kafka_security.client_kwargs(settings),
    )
    try:
        await asyncio.wait_for(admin.start(), timeout=30.0)
    except (KafkaConnectionError, asyncio.TimeoutError):
        # The worker's first connection: a refused login, a failed TLS handshake or no broker ends the
        # worker here, with the reason (aiokafka's own error only says "Unable to bootstrap").
        await admin.close()
        reason = await kafka_security.diagnose(settings, bootstrap_servers(settings.broker))
        message = f"Cannot connect to the Kafka broker at {settings.broker}: {reason}"
        log.critical(message)
        raise SystemExit(message) from None
    log.info("Connected to Kafka at %s (%s)", settings.broker, kafka_security.parse(settings).describe())
    return admin


async def _described(
    admin: AIOKafkaAdminClient, names: list[str], timeout: float,
) -> dict[str, list[dict[str, Any]]]:
    """The partitions of ``names`` once the broker describes them all; SystemExit after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        described: list[dict[str, Any]] = await asyncio.wait_for(admin.describe_topics(names), timeout=30.0)
        parts = {t["topic"]: list(t.get("partitions") or ()) for t in described}
        if all(parts.get(n) for n in names):
            return parts
        if time.monotonic() > deadline:
            late = [n for n in names if not parts.get(n)]
            raise SystemExit(f"Topics not visible on the broker after {timeout:.0f}s: {late}")
        await asyncio.sleep(0.2)


async def _coordinator(admin: AIOKafkaAdminClient, group: str, timeout: float) -> None:
    """Wait until the broker names ``group``'s coordinator. On a fresh broker the first ask creates the offsets
    topic and is refused for a moment, which the consumer would log at ERROR; asked here, it is expected."""
    try:
        await retried(f"the coordinator of group {group}", lambda: admin.find_coordinator(group), timeout=timeout)
    except (KafkaError, asyncio.TimeoutError) as exc:  # no ACL to describe the group, or none yet: the consumer
        log.info("No coordinator for group %s (%r); the consumer keeps asking", group, exc)  # asks by itself


async def retried(what: str, call: Callable[[], Awaitable[T]], *, timeout: float = 30.0) -> T:
    """``call()``, asked again while the cluster answers with a retriable error, for at most ``timeout``.

    A fresh cluster names no group coordinator until it has made its offsets topic, and may name one and refuse
    the next request a moment later (seen on the three-broker cluster: the worker died at start with
    GroupCoordinatorNotAvailableError). A refusal that is not retriable (an ACL) is raised at once.
    """
    deadline = time.monotonic() + timeout
    attempt = 0
    while True:
        try:
            return await asyncio.wait_for(call(), max(0.1, deadline - time.monotonic()))
        except KafkaError as exc:
            attempt += 1
            delay = backoff(attempt, base=0.2, cap=2.0)
            if not exc.retriable or time.monotonic() + delay > deadline:
                raise
            log.info("Reading %s: the cluster answered %r (retriable); asking again in %.1fs", what, exc, delay)
        await asyncio.sleep(delay)

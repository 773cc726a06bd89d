"""A three-broker cluster, leaders SIGKILLed under load (docs/cluster.md).

The test starts its own KRaft cluster (scripts/cluster.sh: three nodes, 256 MB heaps, its own ports and data
dir; the shared broker on 9092 is not used), two workers, and a steady stream of tasks. It SIGKILLs the broker
that leads the busiest task partition, checks that tasks published while it is down are accepted and answered
while it is still down, restarts it, waits until every partition is fully in sync, then does the same to a
second broker. At the end every accepted task has exactly one distinct result, and both workers ran throughout.

With the app's topics on one replica (today's main), the partitions the killed broker led have no leader until
it returns: the tasks sent to them are not accepted, and those already there are not answered, while it is down.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from agents_stream.contract import topics

from .harness import ROOT, encode, eventually, task

#: three brokers of its own: a core of CPU while they start
pytestmark = pytest.mark.exclusive


CLUSTER_SH = ROOT / "scripts" / "cluster.sh"
AGENT = "analyst"
PARTITIONS = 6  # two leaders per broker per topic
RATE = 6.0  # tasks per second, for the whole run (three JVMs and two workers share two busy cores)
OUTAGE_TASKS = 45  # tasks sent while a broker is down, each answered before it is restarted
PHASE_TIMEOUT = 90.0


def _free_block(n: int) -> int:
    """A first port of ``n`` consecutive free ports (cluster.sh gives node N the first port + N - 1)."""
    import socket

    for _ in range(50):
        base = random.randint(20000, 60000)
        try:
            socks = []
            for port in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no block of free ports found")


@dataclass
class KafkaCluster:
    """The nodes of scripts/cluster.sh with this test's ports and data dir; every PID it saw is stopped at the end."""

    data_dir: Path
    port: int = field(default_factory=lambda: _free_block(3))
    controller_port: int = field(default_factory=lambda: _free_block(3))
    seen: set[int] = field(default_factory=set)

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ, "CLUSTER_DATA_DIR": str(self.data_dir), "CLUSTER_PORT": str(self.port),
            "CLUSTER_CONTROLLER_PORT": str(self.controller_port), "CLUSTER_HEAP_OPTS": "-Xms128m -Xmx512m",
            "CLUSTER_START_TIMEOUT": "150",
        }

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{self.port + i}" for i in range(3))

    def run(self, command: str, timeout: float = 200.0) -> str:
        done = subprocess.run(
            ["bash", str(CLUSTER_SH), command], env=self.env, capture_output=True, text=True, timeout=timeout,
        )
        if command != "status":
            assert done.returncode == 0, f"cluster.sh {command} failed ({done.returncode}):\n{done.stderr}"
        return done.stdout

    def start(self) -> None:
        try:
            self.run("start")
        finally:  # a node started before a failed start is stopped too
            self.seen |= set(self.pids().values())

    def pids(self) -> dict[int, int]:
        return {int(n): int(p) for n, p in (line.split() for line in self.run("pids").splitlines())}

    def kill(self, node: int) -> None:
        pid = self.pids()[node]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)

    def close(self) -> None:
        """SIGKILL every node this test started, by PID (its data dir is thrown away: no clean shutdown needed)."""
        for pid in self.seen:
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def kafka_cluster(tmp_path: Path):
    cluster = KafkaCluster(tmp_path / "kafka-cluster")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


class Load:
    """Publishes tasks at RATE (acks=all, idempotent) and reads agent.results, both in the background."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.sent: list[str] = []  # task ids in the order they were sent
        self.accepted: dict[str, float] = {}  # task id -> when the cluster acknowledged it
        self.refused: dict[str, str] = {}  # task id -> why the send failed
        self.results: dict[str, list[bytes]] = {}
        self.sent_at: dict[str, float] = {}  # task id -> when it was handed to the producer
        self.answered_at: dict[str, float] = {}  # task id -> when its first result was read
        self.stopping = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Load:
        self.tasks = [asyncio.create_task(self._publish()), asyncio.create_task(self._read())]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.stopping.set()
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    def failed(self) -> None:
        for t in self.tasks:
            if t.done() and not t.cancelled() and t.exception() is not None:
                raise AssertionError(f"the test's load failed: {t.exception()!r}")

    async def _publish(self) -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, acks="all", enable_idempotence=True, request_timeout_ms=30000,
            # a leader cut off (not dead) times requests out without closing the connection: without a metadata
            # refresh the producer would send its retries to that leader for the default 5 minutes
            metadata_max_age_ms=5000,
        )
        await asyncio.wait_for(producer.start(), 60)
        started = time.monotonic()
        try:
            while not self.stopping.is_set():
                ahead = started + len(self.sent) / RATE - time.monotonic()
                if ahead > 0:
                    await asyncio.sleep(ahead)
                t = task(AGENT, n=len(self.sent))
                key, value = encode(t)
                fut = await producer.send(topics.task_topic(AGENT), value=value, key=key)
                self.sent.append(t["task_id"])
                self.sent_at[t["task_id"]] = time.monotonic()
                fut.add_done_callback(lambda f, tid=t["task_id"]: self._acked(tid, f))
        finally:
            await asyncio.wait_for(producer.stop(), 60)

    def _acked(self, task_id: str, fut: asyncio.Future[Any]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            self.refused[task_id] = "cancelled" if fut.cancelled() else repr(fut.exception())
        else:
            self.accepted[task_id] = time.monotonic()

    async def _read(self) -> None:
        consumer = AIOKafkaConsumer(
            topics.RESULTS, bootstrap_servers=self.bootstrap, auto_offset_reset="earliest",
            enable_auto_commit=False, group_id=None, metadata_max_age_ms=2000,
        )
        await asyncio.wait_for(consumer.start(), 60)
        try:
            while True:
                for msgs in (await consumer.getmany(timeout_ms=500)).values():
                    for m in msgs:
                        if m.key is not None:
                            self.results.setdefault(m.key.decode(), []).append(m.value)
                            self.answered_at.setdefault(m.key.decode(), time.monotonic())
        finally:
            await consumer.stop()

    def unanswered(self, ids: list[str]) -> list[str]:
        return [i for i in ids if i not in self.results]

    def timeline(self, ids: list[str], since: float) -> list[str]:
        """Per task, seconds after ``since``: sent, acknowledged, first answered (None: not yet), with its partition
        (a failure report: which of the producer, the workers or the results' reader held a task)."""
        def at(when: float | None) -> float | None:
            return None if when is None else round(when - since, 1)

        return [f"{i[:8]} p{_partition_of(i, PARTITIONS)} sent {at(self.sent_at.get(i))} acked "
                f"{at(self.accepted.get(i))} answered {at(self.answered_at.get(i))}" for i in ids]


async def _describe(bootstrap: str, names: list[str] | None = None) -> list[dict[str, Any]]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await asyncio.wait_for(admin.start(), 30)
    try:
        names = names if names is not None else await asyncio.wait_for(admin.list_topics(), 30)
        return await asyncio.wait_for(admin.describe_topics(names), 30)
    finally:
        await admin.close()


async def _busiest_leader(load: Load, bootstrap: str, exclude: set[int]) -> int:
    """The broker leading the task partition that has seen the most tasks (not one in ``exclude``)."""
    (described,) = await _describe(bootstrap, [topics.task_topic(AGENT)])
    leaders = {p["partition"]: p["leader"] for p in described["partitions"]}
    counts = {p: 0 for p in leaders}
    for task_id in load.sent:
        counts[_partition_of(task_id, len(leaders))] += 1
    ranked = sorted(leaders, key=lambda p: -counts[p])
    return next(leaders[p] for p in ranked if leaders[p] not in exclude and leaders[p] >= 0)


def _partition_of(task_id: str, partitions: int) -> int:
    from aiokafka.partitioner import murmur2

    return (murmur2(task_id.encode()) & 0x7FFFFFFF) % partitions


async def _fully_in_sync(bootstrap: str) -> bool:
    return all(
        p["leader"] >= 0 and sorted(p["isr"]) == sorted(p["replicas"])
        for t in await _describe(bootstrap) for p in t["partitions"]
    )


def _producer_ids(cluster: KafkaCluster, topic: str, partition: int) -> list[str]:
    """Producer ids the partition's leader tracks (idempotent or transactional writers only)."""
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "kafka-tool"), "transactions", "--bootstrap-server", cluster.bootstrap,
         "describe-producers", "--topic", topic, "--partition", str(partition)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()[1:] if line.strip()]
    return [row[0] for row in rows if row and row[0].isdigit() and int(row[0]) >= 0]


async def _outage(load: Load, cluster: KafkaCluster, node: int, workers: list[Any]) -> dict[str, Any]:
    """Kill ``node``; OUTAGE_TASKS tasks sent after it must be accepted and answered before it comes back."""
    cluster.kill(node)
    killed_at, first = time.monotonic(), len(load.sent)
    await eventually(lambda: len(load.sent) >= first + OUTAGE_TASKS, timeout=PHASE_TIMEOUT, what="the outage's tasks")
    during = load.sent[first:first + OUTAGE_TASKS]

    def answered() -> bool:
        load.failed()
        for w in workers:
            assert w.proc.poll() is None, f"worker {w.name} exited during the outage of broker {node}:\n{w.tail()}"
        return not load.unanswered(during)

    try:
        await eventually(answered, timeout=PHASE_TIMEOUT, what=f"answers while broker {node} is down")
    except AssertionError:
        refused = [i for i in during if i in load.refused]
        pending = [i for i in during if i not in load.accepted and i not in load.refused]
        raise AssertionError(
            f"broker {node} down: {len(load.unanswered(during))} of {len(during)} tasks sent during the outage "
            f"unanswered after {PHASE_TIMEOUT:.0f}s ({len(refused)} refused by the cluster, {len(pending)} never "
            f"acknowledged), e.g. {load.refused.get(refused[0]) if refused else ''}"
        ) from None
    assert cluster.pids().get(node) is None, f"broker {node} came back by itself"
    return {"node": node, "answered_in_s": round(time.monotonic() - killed_at, 1)}


async def test_three_brokers_lose_no_task_when_leaders_die(kafka_cluster: KafkaCluster, cluster_factory) -> None:
    started = time.monotonic()
    bootstrap = kafka_cluster.bootstrap
    app = cluster_factory([AGENT], None)
    broker = ",".join(f"kafka://{b}" for b in bootstrap.split(","))
    settings = {"KAFKA_BROKER": broker, "AGENTS_STREAM_PARTITIONS": str(PARTITIONS)}
    workers = [app.worker(f"w{i}", **settings).start() for i in range(2)]
    await asyncio.gather(*(w.wait_ready(timeout=150) for w in workers))
    # Every topic the app made is on the three brokers with min.insync.replicas=2 (the app's default here).
    (tasks_topic,) = await _describe(bootstrap, [topics.task_topic(AGENT)])
    assert {len(p["replicas"]) for p in tasks_topic["partitions"]} == {3}, tasks_topic

    async with Load(bootstrap) as load:
        await eventually(lambda: len(load.results) >= 30, timeout=PHASE_TIMEOUT, what="the first answers")
        first = await _busiest_leader(load, bootstrap, exclude=set())
        phases = [await _outage(load, kafka_cluster, first, workers)]
        kafka_cluster.start()
        await eventually(lambda: _fully_in_sync(bootstrap), timeout=PHASE_TIMEOUT, what="all replicas in sync")
        second = await _busiest_leader(load, bootstrap, exclude={first})
        phases.append(await _outage(load, kafka_cluster, second, workers))
        kafka_cluster.start()
        load.stopping.set()
        await eventually(
            lambda: len(load.accepted) + len(load.refused) >= len(load.sent), timeout=60, what="every send settled",
        )
        sent = list(load.sent)
        try:
            await eventually(lambda: not load.unanswered(sent), timeout=PHASE_TIMEOUT, what="every task's result")
        except AssertionError:
            missing = load.unanswered(sent)
            raise AssertionError(
                f"{len(missing)} of {len(sent)} tasks unanswered {PHASE_TIMEOUT:.0f}s after the last restart "
                f"(outages {phases}), e.g. {missing[:3]}"
            ) from None
        results = dict(load.results)

    lost = [i for i in sent if i not in results]
    conflicting = [i for i in sent if len(set(results.get(i, []))) > 1]
    figures = {
        "tasks": len(sent), "kills": len(phases), "refused": len(load.refused), "lost": len(lost),
        "conflicting": len(conflicting), "resent": sum(len(results[i]) - len(set(results[i])) for i in sent),
        "outages": phases, "time_s": round(time.monotonic() - started, 1),
    }
    print(f"\ncluster test figures: {figures}")
    # The workers' producer is idempotent: the brokers keep a producer id and sequence for what it wrote.
    assert _producer_ids(kafka_cluster, topics.RESULTS, 0), "no idempotent producer wrote agent.results"
    assert not load.refused, f"tasks the cluster refused: {list(load.refused.items())[:3]}; {figures}"
    assert not lost and not conflicting, figures
    assert all(w.proc.poll() is None for w in workers), [w.tail() for w in workers]

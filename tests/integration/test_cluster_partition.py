"""The three-broker cluster with a real network partition that isolates the leader of task
partitions (docs/cluster.md).

Node 1 of scripts/cluster.sh runs in its own network namespace (tests/integration/netpart.py; CLUSTER_NODE_1_PREFIX):
it reaches the other nodes, and they and every client reach it, only through the namespace's veth pair. Two workers
answer a steady stream of tasks. The namespace's link goes down: node 1, leader of a third of the task partitions,
is alive but cut off — the controller fences it after broker.session.timeout.ms and moves its partitions' leadership
to the in-sync replicas. Tasks sent during the cut must be accepted and answered during the cut; then the link comes
back, node 1 catches up into the ISR, and every task has exactly one distinct result, none lost or refused.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agents_stream.contract import topics

from .harness import eventually
from .netpart import Netns
from .test_cluster import AGENT, PARTITIONS, PHASE_TIMEOUT, KafkaCluster, Load, _describe, _fully_in_sync

#: three brokers of its own: a core of CPU while they start
pytestmark = [pytest.mark.exclusive, pytest.mark.long]  # in make chaos: docs/cluster.md

ISOLATED = 1
OUTAGE_TASKS = 45


@dataclass
class PartitionedCluster(KafkaCluster):
    """scripts/cluster.sh's nodes with node 1 in the test's network namespace."""

    net: Netns | None = field(default=None)

    @property
    def env(self) -> dict[str, str]:
        env = super().env
        if self.net is not None:
            env[f"CLUSTER_NODE_{ISOLATED}_PREFIX"] = " ".join(self.net.exec_prefix())
        return env


async def _leaders_from_the_others(cluster: PartitionedCluster) -> dict[int, int] | None:
    """The task partitions' leaders, asked of the two other nodes (a request routed to the cut-off node hangs or
    fails: None, asked again)."""
    others = ",".join(f"127.0.0.1:{cluster.port + i}" for i in range(3) if i != ISOLATED - 1)
    try:
        (described,) = await _describe(others, [topics.task_topic(AGENT)])
    except (Exception, asyncio.TimeoutError):  # noqa: BLE001 - any failure of this one ask: the next tries again
        return None
    return {p["partition"]: p["leader"] for p in described["partitions"]}


@pytest.fixture
def partitioned_cluster(tmp_path: Path):
    cluster = PartitionedCluster(tmp_path / "kafka-cluster")
    others = [i for i in range(3) if i != ISOLATED - 1]
    # node 1 reaches the other nodes' client and controller ports; they and the clients reach its own
    expose = [cluster.port + i for i in others] + [cluster.controller_port + i for i in others]
    publish = [cluster.port + ISOLATED - 1, cluster.controller_port + ISOLATED - 1]
    with Netns(expose=expose, publish=publish) as net:
        cluster.net = net
        try:
            cluster.start()
            yield cluster
        finally:
            cluster.close()  # the nodes first: node 1 is the namespace's last process


async def test_a_partition_that_isolates_a_leader_loses_no_task(partitioned_cluster: PartitionedCluster,
                                                                 cluster_factory) -> None:
    cluster, net = partitioned_cluster, partitioned_cluster.net
    assert net is not None
    bootstrap = cluster.bootstrap
    app = cluster_factory([AGENT], None)
    broker = ",".join(f"kafka://{b}" for b in bootstrap.split(","))
    settings = {"KAFKA_BROKER": broker, "AGENTS_STREAM_PARTITIONS": str(PARTITIONS)}
    workers = [app.worker(f"w{i}", **settings).start() for i in range(2)]
    await asyncio.gather(*(w.wait_ready(timeout=150) for w in workers))
    (described,) = await _describe(bootstrap, [topics.task_topic(AGENT)])
    led = [p["partition"] for p in described["partitions"] if p["leader"] == ISOLATED]
    assert led, f"node {ISOLATED} leads no task partition: {described}"

    async with Load(bootstrap) as load:
        await eventually(lambda: len(load.results) >= 30, timeout=PHASE_TIMEOUT, what="the first answers")
        net.cut()
        cut_at, first = time.monotonic(), len(load.sent)
        await eventually(lambda: len(load.sent) >= first + OUTAGE_TASKS, timeout=PHASE_TIMEOUT,
                         what="the cut's tasks")
        during = load.sent[first:first + OUTAGE_TASKS]

        def answered_during_the_cut() -> bool:
            load.failed()
            for w in workers:
                assert w.proc is not None and w.proc.poll() is None, f"worker {w.name} exited:\n{w.tail()}"
            return not load.unanswered(during)

        try:
            await eventually(answered_during_the_cut, timeout=PHASE_TIMEOUT,
                             what=f"answers while node {ISOLATED} is cut off")
        except AssertionError:
            unanswered = load.unanswered(during)
            raise AssertionError(
                f"node {ISOLATED} cut off: {len(unanswered)} of {len(during)} tasks sent during the cut unanswered "
                f"after {PHASE_TIMEOUT:.0f}s ({sum(i in load.refused for i in during)} refused by the cluster, "
                f"{sum(i not in load.accepted and i not in load.refused for i in during)} not yet acknowledged; "
                f"{len(load.results)} tasks answered in all); the task partitions node {ISOLATED} led: {led}; "
                f"per task: {load.timeline(during, cut_at)}"
            ) from None
        answered_in_s = round(time.monotonic() - cut_at, 1)
        leaders = await eventually(lambda: _leaders_from_the_others(cluster), timeout=60,
                                   what="the task partitions' leaders, from the nodes that are not cut off")
        net.heal()
        await eventually(lambda: _fully_in_sync(bootstrap), timeout=PHASE_TIMEOUT, what="all replicas in sync again")
        load.stopping.set()
        await eventually(lambda: len(load.accepted) + len(load.refused) >= len(load.sent), timeout=60,
                         what="every send settled")
        sent = list(load.sent)
        try:
            await eventually(lambda: not load.unanswered(sent), timeout=PHASE_TIMEOUT, what="every task's result")
        except AssertionError:
            unanswered = load.unanswered(sent)
            raise AssertionError(
                f"{len(unanswered)} of {len(sent)} tasks unanswered {PHASE_TIMEOUT:.0f}s after the heal; per task "
                f"(seconds after the cut): {load.timeline(unanswered, cut_at)}"
            ) from None
        results = dict(load.results)

    lost = [i for i in sent if i not in results]
    conflicting = [i for i in sent if len(set(results.get(i, []))) > 1]
    figures = {"tasks": len(sent), "refused": len(load.refused), "lost": len(lost), "conflicting": len(conflicting),
               "answered_during_cut_in_s": answered_in_s, "led_by_isolated": led,
               "leaders_during_cut": leaders}
    print(f"\ncluster partition figures: {figures}")
    assert all(leaders[p] != ISOLATED for p in led), f"node {ISOLATED} still leads during the cut: {figures}"
    assert not load.refused, f"tasks the cluster refused: {list(load.refused.items())[:3]}; {figures}"
    assert not lost and not conflicting, (figures, {i: sorted(set(results[i])) for i in conflicting[:2]})

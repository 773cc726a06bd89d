"""Faust's own command line on one host: data dirs per app id, ``faust --datadir``, and a start without ERROR lines."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from agents_stream.contract import topics

from .harness import BOOTSTRAP, Cluster, Worker, encode, produce, results_for, task, unique


async def _one_task(agent: str) -> None:
    t = task(agent)
    await produce(topics.task_topic(agent), [encode(t)])
    results = await results_for({t["task_id"]}, timeout=60)
    assert [json.loads(m.value)["status"] for m in results[t["task_id"]]] == ["succeeded"]


async def describe(topic: str) -> tuple[int, str, str]:
    """(partitions, message.timestamp.type, retention.ms) of ``topic``."""
    admin = AIOKafkaAdminClient(bootstrap_servers=BOOTSTRAP)
    await asyncio.wait_for(admin.start(), 30)
    try:
        meta = await asyncio.wait_for(admin.describe_topics([topic]), 30)
        configs = await asyncio.wait_for(admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)]), 30)
    finally:
        await admin.close()
    entries = {e[0]: e[1] for e in configs[0].resources[0][4]}
    return len(meta[0]["partitions"]), entries["message.timestamp.type"], entries["retention.ms"]


def _first(lines: list[str], *needles: str) -> int:
    found = [i for i, line in enumerate(lines) if all(n in line for n in needles)]
    assert found, f"no log line with {needles}"
    return found[0]


def _stores(datadir: Path) -> list[Path]:
    """The RocksDB stores Faust opened under ``datadir`` (one per table and partition)."""
    return sorted(p for p in datadir.rglob("*.db") if p.is_dir())


def _on_host(c: Cluster, host: Path, **overrides: str) -> Worker:
    """A worker started like ``faust -A agents_stream.app worker`` in ``host``, with no data dir set."""
    worker = c.worker(AGENTS_STREAM_DATA_DIR="", **overrides)  # empty: unset (Settings.from_env)
    worker.cwd = host
    return worker


async def test_two_app_ids_on_one_host_keep_their_tables_apart(cluster_factory, tmp_path: Path):
    """Default data dirs are namespaced by app id: a second app id on the host does not open the first one's
    RocksDB stores (which crashed it with Faust's ConsistencyError), and both process tasks side by side."""
    host = tmp_path / "host"
    host.mkdir()
    a, b = unique("analyzer"), unique("analyzer")
    first, second = cluster_factory([a], None), cluster_factory([b], None)
    w1 = _on_host(first, host).start()
    await w1.wait_ready()
    await _one_task(a)
    w2 = _on_host(second, host).start()
    await w2.wait_ready()
    await _one_task(b)
    await _one_task(a)
    assert w1.proc is not None and w1.proc.poll() is None, w1.tail()
    assert w2.proc is not None and w2.proc.poll() is None, w2.tail()
    for c in (first, second):
        assert _stores(host / ".data" / "worker" / c.app_id), f"no stores under .data/worker/{c.app_id}"


async def test_faust_datadir_option_is_the_one_used(cluster_factory, tmp_path: Path):
    """``faust -A agents_stream.app --datadir X worker`` keeps the tables in X, over AGENTS_STREAM_DATA_DIR."""
    agent = unique("analyzer")
    c = cluster_factory([agent], None)
    given, ours = tmp_path / "given", tmp_path / "ours"
    worker = c.worker(AGENTS_STREAM_DATA_DIR=str(ours))
    worker.faust_options = ["--datadir", str(given)]
    worker.start()
    await worker.wait_ready()
    await _one_task(agent)
    assert _stores(given), f"no stores under the --datadir {given}:\n{worker.tail()}"
    assert not ours.exists(), "AGENTS_STREAM_DATA_DIR was used although --datadir was given"


async def test_a_first_start_logs_no_error(cluster_factory, tmp_path: Path):
    """A worker whose topics all are new (its app id, agent and, through a test-only name, the circuits log,
    which is shared on a real cluster) starts, works and stops without an ERROR line in its log: the
    circuits log is made before anything reads it ("Topic agent.circuits not found in cluster metadata")."""
    agent = unique("analyzer")
    c = cluster_factory([agent], None)
    worker = c.worker()
    circuits = unique("it.circuits")
    worker.preamble = f"import agents_stream.contract.topics as t; t.CIRCUITS = {circuits!r}"
    worker.start()
    await worker.wait_ready()
    await _one_task(agent)
    code, _ = worker.terminate()
    assert code == 0, worker.tail()
    lines = worker.log_path.read_text(errors="replace").splitlines()
    assert any(circuits in line for line in lines), "the worker did not use the test's circuits topic"
    errors = [line for line in lines if "[ERROR]" in line or "[CRITICAL]" in line]
    assert not errors, "\n".join(errors[:20])
    # On a warm broker the race rarely shows: check the order too. The log made before the group is joined.
    created = _first(lines, "Created topics", circuits)
    joined, folded = _first(lines, "Joined group"), _first(lines, "Circuits: folded")
    assert created < joined < folded, "the circuits log is made before the consumer joins and before it is read"
    described = await describe(circuits)
    assert described == (1, "LogAppendTime", "86400000"), "made with the configs Faust would have declared"


async def test_a_restart_declares_none_of_the_topics_the_broker_has(cluster_factory):
    """Faust declares each of the app's topics as it starts (a CreateTopics request and a metadata refresh of the
    whole cluster each); a worker skips the ones the broker already has. Restarted, it declares none, and still
    reads its tasks and writes its results."""
    agent = unique("analyzer")
    c = cluster_factory([agent], None)
    worker = await c.started()
    await _one_task(agent)
    first = worker.log_path.read_text(errors="replace").splitlines()
    declared = [line for line in first if "Creating topic" in line]
    made_first = (f"'{topics.task_topic(agent)}'", "-changelog'", "-__assignor-__leader'")
    assert not any(name in line for line in declared for name in made_first), (
        "the topics made before the group is joined were declared again:\n" + "\n".join(declared))
    assert worker.terminate()[0] == 0, worker.tail()

    worker.start()
    await worker.wait_ready()
    await _one_task(agent)
    again = worker.log_path.read_text(errors="replace").splitlines()[len(first):]
    assert [line for line in again if "Creating topic" in line] == [], "a topic the broker has was declared again"
    assert worker.terminate()[0] == 0, worker.tail()

"""docs/security.md's topic ACLs, applied on a broker of this test's own with the authorizer on (KAFKA_ACLS=1).

The broker is started by scripts/broker.sh on free ports with its own data dir (never the shared broker on
9092, whose configuration stays as it is) and stopped by its PID file at the end. scripts/acls.sh adds the
documented ACLs; then the worker runs as its user on the SASL listener, a producer's user may write tasks but
not the circuits log or approval decisions, and a user without ACLs may write nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError, TopicAuthorizationFailedError

from .harness import ROOT, free_port, task, unique

WORKER_USER, WORKER_PASSWORD = "agents", "agents-local-secret"  # scripts/broker.sh's local-only test user
PRODUCER_USER, PRODUCER_PASSWORD = "producer", "producer-local-secret"
STRANGER_USER, STRANGER_PASSWORD = "stranger", "stranger-local-secret"


@dataclass(frozen=True)
class AclBroker:
    plaintext: int
    sasl: int
    env: dict[str, str]

    def tool(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(ROOT / "scripts" / "kafka-tool"), *args], env=self.env, cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout, check=False)

    def add_user(self, user: str, password: str) -> None:
        """docs/security.md "Users": a SCRAM-SHA-512 login, added as the admin (PLAINTEXT, a super user here)."""
        done = self.tool("configs", "--bootstrap-server", f"127.0.0.1:{self.plaintext}", "--alter",
                         "--entity-type", "users", "--entity-name", user,
                         "--add-config", f"SCRAM-SHA-512=[password={password}]")
        assert done.returncode == 0, done.stderr


def broker_sh(env: dict[str, str], command: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "scripts" / "broker.sh"), command], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AclBroker]:
    """A broker of this module's own with ACLs on: started here, stopped here (its PID file), data dir in tmp."""
    ports = [free_port() for _ in range(4)]
    env = {
        **os.environ, "KAFKA_ACLS": "1", "KAFKA_PORT": str(ports[0]), "KAFKA_CONTROLLER_PORT": str(ports[1]),
        "KAFKA_SASL_PORT": str(ports[2]), "KAFKA_SASL_SSL_PORT": str(ports[3]),
        "KAFKA_DATA_DIR": str(tmp_path_factory.mktemp("kafka-acls")), "KAFKA_HEAP_OPTS": "-Xms128m -Xmx384m",
        "KAFKA_START_TIMEOUT": "240",
    }
    started = broker_sh(env, "start", timeout=420)
    try:
        assert started.returncode == 0, started.stderr
        yield AclBroker(ports[0], ports[2], env)
    finally:
        stopped = broker_sh(env, "stop", timeout=120)
        assert stopped.returncode == 0, stopped.stderr


def client_env(broker: AclBroker, user: str, password: str) -> dict[str, str]:
    """A worker's or the CLI's settings for logging in as ``user`` on the broker's SASL_PLAINTEXT listener."""
    return {
        "KAFKA_BROKER": f"kafka://127.0.0.1:{broker.sasl}", "AGENTS_STREAM_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "AGENTS_STREAM_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "AGENTS_STREAM_KAFKA_SASL_USERNAME": user,
        "AGENTS_STREAM_KAFKA_SASL_PASSWORD": password,
    }


def sasl(user: str, password: str) -> dict[str, str]:
    return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_plain_username": user, "sasl_plain_password": password}


async def send_as(broker: AclBroker, user: str, password: str, topic: str, value: bytes) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=f"127.0.0.1:{broker.sasl}", acks="all",
                                request_timeout_ms=15000, **sasl(user, password))
    await asyncio.wait_for(producer.start(), 60)
    try:
        await asyncio.wait_for(producer.send_and_wait(topic, value, key=b"k"), 60)
    finally:
        await producer.stop()


async def result_of(broker: AclBroker, task_id: str, timeout: float) -> dict:
    """The task's record on agent.results, read on the PLAINTEXT listener (the admin's, a super user here)."""
    consumer = AIOKafkaConsumer("agent.results", bootstrap_servers=f"127.0.0.1:{broker.plaintext}",
                                auto_offset_reset="earliest", enable_auto_commit=False, group_id=None)
    await asyncio.wait_for(consumer.start(), 60)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            for msgs in (await consumer.getmany(timeout_ms=500)).values():
                for m in msgs:
                    if m.key == task_id.encode():
                        return json.loads(m.value)
        raise AssertionError(f"no result for {task_id} on agent.results within {timeout}s")
    finally:
        await consumer.stop()


async def test_documented_acls_let_the_worker_run_and_keep_producers_to_their_topics(acl_broker, cluster_factory):
    """With scripts/acls.sh's ACLs: the worker (User:agents) answers a task the producer's user published through
    `agents-stream publish`; that user may not write agent.circuits or agent.approvals; a user without ACLs may not
    write tasks."""
    agent = unique("acl")
    c = cluster_factory([agent], None)
    applied = subprocess.run(
        ["bash", str(ROOT / "scripts" / "acls.sh")], cwd=ROOT, capture_output=True, text=True, timeout=900,
        env={**acl_broker.env, "ACL_BOOTSTRAP": f"127.0.0.1:{acl_broker.plaintext}", "APP_ID": c.app_id,
             "AGENTS": agent, "WORKER": WORKER_USER, "PRODUCER": PRODUCER_USER}, check=False,
    )
    assert applied.returncode == 0, applied.stderr
    acl_broker.add_user(PRODUCER_USER, PRODUCER_PASSWORD)
    acl_broker.add_user(STRANGER_USER, STRANGER_PASSWORD)

    worker = await c.started(**client_env(acl_broker, WORKER_USER, WORKER_PASSWORD))
    t = task(agent)
    published = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "agents_stream.ops.cli", "publish", "--agent", agent],
        input=json.dumps(t) + "\n", capture_output=True, text=True, timeout=120, cwd=ROOT, check=False,
        env={**os.environ, **client_env(acl_broker, PRODUCER_USER, PRODUCER_PASSWORD)},
    )
    assert published.returncode == 0, published.stderr
    assert (await result_of(acl_broker, t["task_id"], timeout=120))["status"] == "succeeded", worker.tail()

    for topic in ("agent.circuits", "agent.approvals"):
        with pytest.raises(TopicAuthorizationFailedError):
            await send_as(acl_broker, PRODUCER_USER, PRODUCER_PASSWORD, topic, b'{"forged": true}')
    with pytest.raises(KafkaError):
        await send_as(acl_broker, STRANGER_USER, STRANGER_PASSWORD, f"agent.tasks.{agent}", json.dumps(t).encode())

    log = worker.log_path.read_text(errors="replace")
    assert "AuthorizationFailed" not in log and "Authorization failed" not in log, worker.tail(80)


def test_security_md_lists_the_commands_acls_sh_runs() -> None:
    """docs/security.md shows exactly what scripts/acls.sh runs with its defaults (`--print`)."""
    printed = subprocess.run(["bash", str(ROOT / "scripts" / "acls.sh"), "--print"], cwd=ROOT, capture_output=True,
                             text=True, timeout=60, check=True, env={**os.environ, "KAFKA_PORT": "9092"}).stdout
    doc = (ROOT / "docs" / "security.md").read_text()
    missing = [line for line in printed.splitlines() if line not in doc]
    assert printed.strip() and not missing, f"docs/security.md lacks: {missing}"


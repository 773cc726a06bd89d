"""Real-broker test harness: worker processes, Kafka reads and writes, committed offsets."""

from __future__ import annotations

import asyncio
import ctypes
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import aiohttp
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

ROOT = Path(__file__).resolve().parents[2]
BOOTSTRAP = os.environ.get("KAFKA_BOOTSTRAP", "127.0.0.1:9092")
PARTITIONS = 8  # the default: topics shared by every app id (agent.jobs, agent.approvals, ...) keep one count
#: every test worker's read token (reads of task data need one); a test may set its own, or "" for none
READ_TOKEN = "harness-read-token"


#: ports handed out for servers a test starts later (a worker's web views): below Linux's ephemeral range (32768 and
#: up), from which the kernel picks every outgoing connection's local port. A port taken with ``bind(0)`` came from
#: that range, and a client's connection (to the broker, say) could be given it before the worker bound it: CI once
#: saw a worker fail to start with "address already in use". Each pytest-xdist process gets its own slice of it.
PORTS_FROM, PORTS_SLICE, PORT_SLICES = 20_000, 3_000, 4
_ports: Iterator[int] | None = None


def _port_slice() -> Iterator[int]:
    """This process's ports, round its slice, from a point its pid picks (a bench and a test run rarely meet)."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else PORT_SLICES - 1
    start = PORTS_FROM + (index % PORT_SLICES) * PORTS_SLICE
    first = os.getpid() % PORTS_SLICE
    return (start + (first + i) % PORTS_SLICE for i in itertools.count())


def free_port() -> int:
    """A local port free now, outside the ephemeral range, not handed out before by this process."""
    global _ports
    if _ports is None:
        _ports = _port_slice()
    for candidate in itertools.islice(_ports, PORTS_SLICE):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", candidate))
            except OSError:
                continue
        return candidate
    raise RuntimeError(f"every port of this process's slice of {PORTS_FROM}.. is taken: stop what holds them")


def dies_with_this_process() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the child killed when this process dies: a pytest stopped by a signal, which runs
    no fixture's teardown, leaves no worker or forwarder behind to go on using CPU and the broker. Linux's
    parent-death signal follows the thread that started the child, so only a child of the main thread gets it."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    libc = ctypes.CDLL(None, use_errno=True)

    def set_parent_death_signal() -> None:
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG

    return set_parent_death_signal


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def write_config(
    path: Path, agents: list[str], fake_url: str | None, *, timeout_s: float = 10.0, extra: str = "",
) -> Path:
    lines = [extra] if extra else []
    if fake_url:
        lines += [
            "[providers.fake]", 'kind = "openai"', f'base_url = "{fake_url}/v1"', 'model = "fake-model"',
            f"timeout_s = {timeout_s}", "",
        ]
    lines += ["[providers.local]", 'kind = "local"', ""]
    for agent in agents:
        lines += [f"[agents.{agent}]", f'providers = ["{"fake" if fake_url else "local"}"]', ""]
    path.write_text("\n".join(lines))
    return path


@dataclass
class Worker:
    """One worker process (``python -m faust -A agents_stream.app worker``)."""

    name: str
    env: dict[str, str]
    log_path: Path
    web_port: int
    proc: subprocess.Popen | None = None
    _log: Any = None
    #: options of ``faust`` itself, before the subcommand (``--datadir X``)
    faust_options: list[str] = field(default_factory=list)
    cwd: Path = ROOT
    #: Python run in the worker process before Faust's command line (a test's own topic names)
    preamble: str | None = None
    #: what the command runs under: ``Netns.exec_prefix()`` runs the worker in a test's network namespace
    prefix: list[str] = field(default_factory=list)

    def command(self) -> list[str]:
        # IT_WORKER_LOG_LEVEL=debug: every worker's log at debug, for a post-mortem (the Kafka client's requests)
        level = os.environ.get("IT_WORKER_LOG_LEVEL", "info")
        cli = ["-A", "agents_stream.app", *self.faust_options, "worker", "-l", level]
        if self.preamble is None:
            return [sys.executable, "-m", "faust", *cli]
        # runpy as ``-m`` does: Faust's argv[0] is its own __main__, as the app expects.
        run = f"{self.preamble}\nimport runpy\nrunpy.run_module('faust', run_name='__main__', alter_sys=True)"
        return [sys.executable, "-c", run, *cli]

    def start(self) -> Worker:
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [*self.prefix, *self.command()], cwd=self.cwd, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
            preexec_fn=dies_with_this_process(),
        )
        return self

    async def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if self.proc and self.proc.poll() is not None:
                    raise AssertionError(f"worker {self.name} exited with {self.proc.returncode}:\n{self.tail()}")
                try:
                    url, ask = f"http://127.0.0.1:{self.web_port}/readyz", aiohttp.ClientTimeout(total=2)
                    async with session.get(url, timeout=ask) as r:
                        if r.status == 200:
                            return
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    pass
                await asyncio.sleep(0.3)
        raise AssertionError(f"worker {self.name} not ready after {timeout}s:\n{self.tail()}")

    async def readyz(self) -> dict[str, Any]:
        async with aiohttp.ClientSession() as session:
            url, timeout = f"http://127.0.0.1:{self.web_port}/readyz", aiohttp.ClientTimeout(total=5)
            async with session.get(url, timeout=timeout) as r:
                return await r.json()

    def read_headers(self) -> dict[str, str]:
        """The credential of a read: this worker's read token, else its write token."""
        token = self.env.get("AGENTS_STREAM_READ_TOKEN") or self.env.get("AGENTS_STREAM_API_TOKEN")
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def get(self, path: str) -> Any:
        async with aiohttp.ClientSession() as session:
            url, timeout = f"http://127.0.0.1:{self.web_port}{path}", aiohttp.ClientTimeout(total=5)
            async with session.get(url, timeout=timeout, headers=self.read_headers()) as r:
                return await r.json() if r.content_type == "application/json" else await r.text()

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def terminate(self, timeout: float = 60.0) -> tuple[int, float]:
        """SIGTERM; returns (exit code, seconds to exit)."""
        assert self.proc is not None
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"worker {self.name} ignored SIGTERM for {timeout}s:\n{self.tail()}") from None
        return code, time.monotonic() - started

    def tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return "(no log)"

    def close(self) -> None:
        self.kill()
        if self._log:
            self._log.close()


@dataclass
class Cluster:
    """A test's own app id (consumer group), agents (topics), config and workers."""

    tmp: Path
    agents: list[str]
    fake_url: str | None
    app_id: str = field(default_factory=lambda: unique("it"))
    settings: dict[str, str] = field(default_factory=dict)
    workers: list[Worker] = field(default_factory=list)
    toml: str | None = None  # a whole config file instead of the generated one
    extra: str = ""  # TOML put before the generated config (e.g. a [breaker] table)
    #: where the workers' RocksDB data dirs go (default: ``tmp``); the tests give a tmpfs directory (data_root)
    data_root: Path | None = None

    def __post_init__(self) -> None:
        if self.toml is not None:
            self.config = self.tmp / f"{self.app_id}.toml"
            self.config.write_text(self.toml)
        else:
            self.config = write_config(self.tmp / f"{self.app_id}.toml", self.agents, self.fake_url, extra=self.extra)

    def worker(self, name: str | None = None, **overrides: str) -> Worker:
        name = name or f"w{len(self.workers)}"
        port = int(overrides.get("WEB_PORT") or free_port())  # a restart may keep its predecessor's address
        env = {
            **os.environ,
            "KAFKA_BROKER": f"kafka://{BOOTSTRAP}",
            "AGENTS_STREAM_APP_ID": self.app_id,
            "AGENTS_STREAM_CONFIG": str(self.config),
            "AGENTS_STREAM_DATA_DIR": str((self.data_root or self.tmp) / f"data-{name}"),
            "AGENTS_STREAM_PARTITIONS": str(PARTITIONS),
            "WEB_PORT": str(port),
            "AGENTS_STREAM_LEASE_TTL_S": "6",
            "AGENTS_STREAM_SESSION_TIMEOUT_S": "6",
            "AGENTS_STREAM_BACKOFF_BASE_S": "0.2",
            "AGENTS_STREAM_BACKOFF_CAP_S": "1.0",
            "AGENTS_STREAM_PROBE_INTERVAL_S": "1.0",
            "AGENTS_STREAM_SHUTDOWN_GRACE_S": "8",
            "PYTHONUNBUFFERED": "1",
            # Each test is its own app id, which would read agent.jobs from the start and re-run (fail) every
            # earlier test's jobs: only the job tests run the orchestrator.
            "AGENTS_STREAM_JOBS": "0",
            "AGENTS_STREAM_READ_TOKEN": READ_TOKEN,
            **self.settings,
            **overrides,
        }
        worker = Worker(name, env, self.tmp / f"{self.app_id}-{name}.log", port)
        self.workers.append(worker)
        return worker

    async def started(self, name: str | None = None, **overrides: str) -> Worker:
        """A worker process, started and answering /readyz."""
        worker = self.worker(name, **overrides).start()
        await worker.wait_ready()
        return worker

    def close(self) -> None:
        for w in self.workers:
            w.close()


@contextmanager
def data_root(fallback: Path) -> Iterator[Path]:
    """A directory for workers' RocksDB data on tmpfs (/dev/shm), removed afterwards; ``fallback`` without one.

    Opening a RocksDB database costs about 57 ms on this machine's disk and 3.5 ms on tmpfs (its files are
    fsynced when made), and a worker opens 32 (4 tables x 8 partitions) when it starts: on tmpfs the suite's
    hundreds of worker starts take minutes less. The databases are the same; only the disk under them differs.
    """
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield fallback
        return
    path = Path(tempfile.mkdtemp(prefix="agents-stream-test-", dir=shm))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# -- Kafka I/O -------------------------------------------------------------------------


async def create_topics(names: list[str], partitions: int = PARTITIONS, configs: dict[str, str] | None = None) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=BOOTSTRAP)
    await asyncio.wait_for(admin.start(), 30)
    try:
        existing = set(await admin.list_topics())
        new = [NewTopic(n, partitions, 1, topic_configs=configs or {}) for n in names if n not in existing]
        if new:
            await asyncio.wait_for(admin.create_topics(new), 30)
    finally:
        await admin.close()


async def produce(
    topic: str, records: list[tuple[bytes | None, bytes | None]], *, partition: int | None = None,
    headers: list[tuple[str, bytes]] | None = None,
) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=BOOTSTRAP, acks="all")
    await asyncio.wait_for(producer.start(), 30)
    try:
        futs = [await producer.send(topic, value=v, key=k, partition=partition, headers=headers) for k, v in records]
        await asyncio.wait_for(asyncio.gather(*futs), 30)
    finally:
        await producer.stop()


def task(agent: str, task_id: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "task_id": task_id or str(uuid.uuid4()), "agent_name": agent, "instruction": f"analyse {extra.pop('n', 0)}",
        "context_data": {}, **extra,
    }


def encode(t: dict[str, Any]) -> tuple[bytes, bytes]:
    return t["task_id"].encode(), json.dumps(t).encode()


async def read_topic(
    topic: str,
    *,
    until: Callable[[list[Any]], bool],
    timeout: float,
    keep: Callable[[Any], bool] = lambda m: True,
    bootstrap: str = BOOTSTRAP,
) -> list[Any]:
    """All records of ``topic`` from the beginning that ``keep`` accepts, once ``until`` holds."""
    # A consumer subscribed before its topic exists would not see it for minutes (metadata age).
    await eventually(lambda: topic_exists(topic, bootstrap), timeout=min(timeout, 30), what=f"topic {topic}")
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False, group_id=None,
    )
    await asyncio.wait_for(consumer.start(), 30)
    seen: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for msgs in batch.values():
                seen.extend(m for m in msgs if keep(m))
            if until(seen):
                # read a little longer to catch duplicates that would follow
                batch = await consumer.getmany(timeout_ms=1500)
                for msgs in batch.values():
                    seen.extend(m for m in msgs if keep(m))
                return seen
        return seen
    finally:
        await consumer.stop()


async def results_for(ids: set[str], timeout: float, bootstrap: str = BOOTSTRAP) -> dict[str, list[Any]]:
    """agent.results records keyed by task_id, for these ids; waits until each has one."""
    msgs = await read_topic(
        "agent.results",
        until=lambda seen: {m.key.decode() for m in seen} >= ids,
        timeout=timeout,
        keep=lambda m: m.key is not None and m.key.decode() in ids,
        bootstrap=bootstrap,
    )
    out: dict[str, list[Any]] = {}
    for m in msgs:
        out.setdefault(m.key.decode(), []).append(m)
    return out


async def committed(group: str, topic: str) -> dict[int, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=BOOTSTRAP)
    await asyncio.wait_for(admin.start(), 30)
    try:
        offsets = await asyncio.wait_for(admin.list_consumer_group_offsets(group), 30)
    finally:
        await admin.close()
    return {tp.partition: meta.offset for tp, meta in offsets.items() if tp.topic == topic}


async def uncommitted(group: str, topic: str) -> int:
    """Messages of ``topic`` the group has not committed; a partition with no commit at all counts from 0
    (kafka-consumer-groups prints "-" there, e.g. when intake paused before the first fetch)."""
    ends, done = await end_offsets(topic), await committed(group, topic)
    return sum(end - max(done.get(p, 0), 0) for p, end in ends.items())


async def all_committed(group: str, topic: str, *, timeout: float = 30.0, what: str = "lag 0") -> None:
    """Wait until ``group`` has committed every message of ``topic``. A worker commits its watermark every commit
    interval (1 s), not with each result: a commit read right after a result can be the one before it."""

    async def none_left() -> bool:
        return await uncommitted(group, topic) == 0

    await eventually(none_left, timeout=timeout, what=what)


async def topic_exists(topic: str, bootstrap: str = BOOTSTRAP) -> bool:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await asyncio.wait_for(admin.start(), 30)
    try:
        return topic in await asyncio.wait_for(admin.list_topics(), 30)
    finally:
        await admin.close()


async def end_offsets(topic: str) -> dict[int, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=BOOTSTRAP)
    await asyncio.wait_for(admin.start(), 30)
    try:
        described = await asyncio.wait_for(admin.describe_topics([topic]), 30)
    finally:
        await admin.close()
    parts = [TopicPartition(topic, p["partition"]) for p in described[0]["partitions"]]
    consumer = AIOKafkaConsumer(bootstrap_servers=BOOTSTRAP)
    await asyncio.wait_for(consumer.start(), 30)
    try:
        ends = await asyncio.wait_for(consumer.end_offsets(parts), 30)
        return {tp.partition: off for tp, off in ends.items()}
    finally:
        await consumer.stop()


async def eventually(
    check: Callable[[], Any], *, timeout: float, interval: float = 0.5, what: str = "condition",
) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")

"""What every benchmark shares: the broker address, payloads, a paced/bulk publisher, a result watcher, processes.

The broker is ``KAFKA_BOOTSTRAP`` (host:port, what tests/integration/harness.py reads), else the one in
``KAFKA_BROKER``, else 127.0.0.1:9092. bench/run.py sets ``KAFKA_BOOTSTRAP`` before importing anything else.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # noqa: E402

from agents_stream.contract.topics import partition_for  # noqa: E402
from tests.integration import harness  # noqa: E402
from tests.integration.harness import BOOTSTRAP, create_topics, unique  # noqa: E402, F401

PARTITIONS = harness.PARTITIONS  # 8, the product's default AGENTS_STREAM_PARTITIONS; every bench topic uses it

#: The harness tunes timeouts down for fast tests; the benchmarks measure the product as shipped.
PRODUCT_DEFAULTS = {
    "AGENTS_STREAM_LEASE_TTL_S": "30",
    "AGENTS_STREAM_SESSION_TIMEOUT_S": "10",
    "AGENTS_STREAM_BACKOFF_BASE_S": "0.5",
    "AGENTS_STREAM_BACKOFF_CAP_S": "30",
    "AGENTS_STREAM_PROBE_INTERVAL_S": "5",
    "AGENTS_STREAM_SHUTDOWN_GRACE_S": "10",
    "AGENTS_STREAM_PARTITIONS": str(PARTITIONS),
}


def task_body(agent: str, task_id: str, i: int) -> bytes:
    """The one payload every benchmark and baseline moves (about 150 bytes)."""
    return json.dumps({
        "task_id": task_id, "agent_name": agent, "instruction": f"count the words of sentence {i}",
        "context_data": {"n": i},
    }).encode()


def subdir(tmp: Path, name: str) -> Path:
    """A fresh directory for one cluster: a worker's data dir is ``<dir>/data-<worker>`` (harness), and two
    apps sharing one would open each other's RocksDB stores (Faust's paths do not include the app id)."""
    path = tmp / unique(name)
    path.mkdir()
    return path


def task_ids(prefix: str, n: int) -> list[str]:
    run = unique(prefix)
    return [f"{run}-{i}" for i in range(n)]


def partition_of(task_id: str) -> int:
    return partition_for(task_id.encode(), PARTITIONS)


def lease_owner(value: bytes | None) -> str | None:
    """The worker a task-table changelog record names as the lease's owner (None for a tombstone or another
    kind of entry)."""
    if not value:
        return None
    try:
        record = json.loads(value)
    except ValueError:
        return None
    owner = record.get("owner") if isinstance(record, dict) else None
    return owner if isinstance(owner, str) and owner.count(":") >= 2 else None


# -- results ---------------------------------------------------------------------------


@dataclass
class Watch:
    """Every record that lands on ``topic`` after start(): first arrival (monotonic) per key."""

    topic: str
    seen: dict[str, float] = field(default_factory=dict)
    values: dict[str, bytes] = field(default_factory=dict)
    keep_values: bool = False
    _consumer: Any = None
    _task: Any = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self) -> Watch:
        await harness.eventually(lambda: harness.topic_exists(self.topic), timeout=60, what=f"topic {self.topic}")
        self._consumer = AIOKafkaConsumer(bootstrap_servers=BOOTSTRAP, enable_auto_commit=False, group_id=None,
                                          fetch_max_wait_ms=50)
        await asyncio.wait_for(self._consumer.start(), 30)
        tps = [TopicPartition(self.topic, p) for p in await harness.end_offsets(self.topic)]
        self._consumer.assign(tps)
        await asyncio.wait_for(self._consumer.seek_to_end(*tps), 30)
        for tp in tps:  # resolve now: records sent after start() must be seen
            await asyncio.wait_for(self._consumer.position(tp), 30)
        self._task = asyncio.ensure_future(self._run())
        return self

    async def _run(self) -> None:
        while True:
            batch = await self._consumer.getmany(timeout_ms=100)
            now = time.monotonic()
            for msgs in batch.values():
                for m in msgs:
                    if m.key is None:
                        continue
                    key = m.key.decode("utf-8", "replace")
                    if key not in self.seen:
                        self.seen[key] = now
                        if self.keep_values:
                            self.values[key] = m.value
            if batch:
                self._changed.set()

    async def wait_all(self, ids: list[str] | set[str], timeout: float) -> bool:
        """True once every id arrived; False when ``timeout`` ran out first."""
        want = set(ids)
        deadline = time.monotonic() + timeout
        while not want.issubset(self.seen.keys()):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._changed.clear()
            with suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(left, 1.0))
        return True

    def missing(self, ids: list[str]) -> int:
        return sum(1 for i in ids if i not in self.seen)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._consumer is not None:
            await self._consumer.stop()


async def producer(linger_ms: int = 5, **settings: Any) -> AIOKafkaProducer:
    p = AIOKafkaProducer(bootstrap_servers=BOOTSTRAP, acks="all", linger_ms=linger_ms, max_batch_size=256 * 1024,
                         **settings)
    await asyncio.wait_for(p.start(), 30)
    return p


async def produce_round_trip_s(n: int = 300) -> float:
    """The median time one record takes to be sent and confirmed by a bare aiokafka producer configured as the
    worker's (acks=all, idempotent, no linger), one after another, on a topic of its own: the baseline of a
    durable step."""
    topic = unique("bench-round-trip")
    await create_topics([topic], 1)
    p = await producer(linger_ms=0, enable_idempotence=True)
    try:
        await asyncio.wait_for(p.send_and_wait(topic, b"warm-up"), 30)
        took = []
        for i in range(n):
            started = time.perf_counter()
            await asyncio.wait_for(p.send_and_wait(topic, b"x" * 200, key=str(i).encode()), 30)
            took.append(time.perf_counter() - started)
        return sorted(took)[n // 2]
    finally:
        await p.stop()


async def publish_all(topic: str, agent: str, ids: list[str], sent_at: dict[str, float] | None = None) -> float:
    """Publish every id as fast as the client goes; returns the monotonic time the first send started."""
    p = await producer()
    try:
        started = time.monotonic()
        futs = []
        for i, task_id in enumerate(ids):
            if sent_at is not None:
                sent_at[task_id] = time.monotonic()
            futs.append(await p.send(topic, task_body(agent, task_id, i), key=task_id.encode()))
        await asyncio.wait_for(asyncio.gather(*futs), 120)
        return started
    finally:
        await p.stop()


async def publish_each(
    topic: str, agent: str, ids: list[str], answered: Callable[[str], Awaitable[None]],
) -> dict[str, float]:
    """Publish ``ids`` one at a time, the next once ``answered`` returned for the last; returns when each was
    sent. One producer for all, its metadata read before the first, no linger: a task's latency is the worker's,
    not the driver's start or its batching."""
    p = await producer(linger_ms=0)
    sent_at: dict[str, float] = {}
    try:
        await asyncio.wait_for(p.partitions_for(topic), 30)
        for i, task_id in enumerate(ids):
            sent_at[task_id] = time.monotonic()
            await asyncio.wait_for(await p.send(topic, task_body(agent, task_id, i), key=task_id.encode()), 30)
            await answered(task_id)
        return sent_at
    finally:
        await p.stop()


async def publish_paced(topic: str, agent: str, ids: list[str], rate: float, sent_at: dict[str, float]) -> None:
    """Publish ``ids`` at ``rate`` per second (ticks of 10 ms; no linger, so a send is not held back)."""
    p = await producer(linger_ms=0)
    try:
        tick = 0.01
        start = time.monotonic()
        futs = []
        i = 0
        while i < len(ids):
            due = min(len(ids), int((time.monotonic() - start) * rate) + 1)
            while i < due:
                task_id = ids[i]
                sent_at[task_id] = time.monotonic()
                futs.append(await p.send(topic, task_body(agent, task_id, i), key=task_id.encode()))
                i += 1
            await asyncio.sleep(tick)
        await asyncio.wait_for(asyncio.gather(*futs), 60)
    finally:
        await p.stop()


async def flow_ready(in_topic: str, out: Watch, agent: str, timeout: float = 120.0) -> None:
    """Send warm-up records (one per partition) until all came out: the consumer has its partitions."""
    ids: list[str] = []
    run = unique("warmup")
    k = 0
    while len({partition_of(i) for i in ids}) < PARTITIONS:
        ids.append(f"{run}-{k}")
        k += 1
    await publish_all(in_topic, agent, ids)
    if not await out.wait_all(ids, timeout):
        raise RuntimeError(
            f"warm-up records did not come out of the flow {in_topic} → {out.topic} within {timeout:.0f}s"
        )


@dataclass
class Flow:
    """One agents-stream worker with its task topic warmed up, and a Watch on ``agent.results``."""

    agent: str
    topic: str
    worker: Any
    out: Watch


@asynccontextmanager
async def one_worker(
    tmp: Path, prefix: str, llm_url: str | None = None, toml: Callable[[str], str] | None = None, **settings: str,
) -> AsyncIterator[Flow]:
    """Start one worker (product defaults, plus ``settings``; ``toml(agent)`` its whole config, else the harness's)
    for a new agent, wait until every partition flows, yield; print the worker's log tail if the body fails; stop
    the worker and the watch."""
    agent = unique(prefix)
    cluster = harness.Cluster(subdir(tmp, "cluster"), [agent], llm_url, settings={**PRODUCT_DEFAULTS, **settings},
                              toml=toml(agent) if toml else None)
    worker = track(cluster.worker().start())
    out = Watch("agent.results")
    try:
        await worker.wait_ready(timeout=120)
        topic = f"agent.tasks.{agent}"
        await out.start()
        await flow_ready(topic, out, agent)
        yield Flow(agent, topic, worker, out)
    except Exception:
        print(worker.tail(), file=sys.stderr)
        raise
    finally:
        await out.stop()
        worker.close()


# -- processes ---------------------------------------------------------------------------

_PROCS: list[subprocess.Popen] = []


def spawn(args: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
    """A child process we own: stopped by PID in stop()/stop_all(), never by name."""
    log = open(log_path, "ab")
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    _PROCS.append(proc)
    return proc


def stop(proc: subprocess.Popen | None, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def stop_all() -> None:
    for proc in _PROCS:
        with suppress(Exception):
            stop(proc, signal.SIGKILL)


def track(worker: Any) -> Any:
    """Register a harness Worker's process for stop_all()."""
    if worker.proc is not None:
        _PROCS.append(worker.proc)
    return worker


def base_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", "KAFKA_BROKER": f"kafka://{BOOTSTRAP}", **extra}


def tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except FileNotFoundError:
        return "(no log)"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads) so far, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of ``pid`` in bytes, from /proc/<pid>/status."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            out[name] = int(rest.split()[0]) * 1024
    return out


# -- the machine -------------------------------------------------------------------------


def machine() -> dict[str, str]:
    cpuinfo = Path("/proc/cpuinfo").read_text()
    models = re.findall(r"^model name\s*:\s*(.+)$", cpuinfo, re.M)
    meminfo = Path("/proc/meminfo").read_text()
    mem_kb = int(re.search(r"^MemTotal:\s*(\d+)", meminfo, re.M).group(1))  # type: ignore[union-attr]
    pom = (ROOT / "kafka" / "pom.xml").read_text()
    kafka = re.search(r"<kafka.version>([^<]+)</kafka.version>", pom)
    from importlib.metadata import version

    return {
        "CPU": f"{os.cpu_count()} × {models[0] if models else platform.processor() or 'unknown'}",
        "RAM": f"{mem_kb / 1024 / 1024:.1f} GiB",
        "OS": f"{platform.system()} {platform.release()}",
        "Python": platform.python_version(),
        "Kafka": f"{kafka.group(1) if kafka else '?'} (single node, KRaft, local; broker {BOOTSTRAP})",
        "libraries": f"faust-streaming {version('faust-streaming')}, aiokafka {version('aiokafka')}, "
                     f"rocksdict {version('rocksdict')}, aiohttp {version('aiohttp')}",
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1)))))
    return ordered[k]

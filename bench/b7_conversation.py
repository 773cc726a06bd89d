"""B7: conversations. One worker; the agent (`agents_stream.testing.log_agent`) answers each message after one
tool call (two model calls a message).

(a) A long conversation: 1,000 messages sent one after another, each tool call returning 100 KB (100 MB of tool
output in all), the model instant. At messages 1, 100 and 1,000 (the median of 10 around each): the latency of a
message (sent on the task topic → its reply on agent.replies), the bytes the broker's logs grew by while it was
answered (every topic: changelogs, outcomes, replies, events), and the worker's RSS. Flat means the conversation's
length costs nothing per message.
(b) Throughput, model 200 ms: N conversations of one message each, all sent at once, against the same agent's
work sent as N tasks in the same run (the baseline): messages/s and tasks/s, and the CPU per message and task.
(c) Overhead, model 200 ms: 50 messages of one conversation one after another, then 50 tasks: each one's latency
less its model time (two calls of 200 ms), p50 and p99, a message beside a task.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from agents_stream.testing.fakellm import FakeLLM, call, ok, tool_calls
from agents_stream.testing.script import Reply
from bench import common
from bench.common import BOOTSTRAP
from bench.report import Row
from tests.integration import harness

ROOT = Path(__file__).resolve().parents[1]
#: the local broker's log dirs (scripts/broker.sh, KAFKA_DATA_DIR); absent: bytes not measured
LOG_DIRS = Path(os.environ.get("KAFKA_DATA_DIR") or ROOT / ".data" / "kafka") / "data"
TOOL_KB = 100
LATENCY_S = 0.2
POINTS = (1, 100, 1000)
OVERHEAD_N = 50  # messages, then tasks, one at a time with the model at 200 ms


def _answer(record: Any, turns: int) -> Reply:
    messages = (record.body or {}).get("messages") or []
    if messages and messages[-1].get("role") == "tool":
        return ok("served fine")
    return tool_calls(call("read_log", {"kb": TOOL_KB}))


def _toml(url: str) -> Any:
    def toml(agent: str) -> str:
        return (f'[providers.fake]\nkind = "openai"\nbase_url = "{url}/v1"\nmodel = "fake-model"\ntimeout_s = 10\n\n'
                f'[agents.{agent}]\nproviders = ["fake"]\nagent = "agents_stream.testing.log_agent:LOGS"\n')
    return toml


def _log_bytes() -> dict[str, int] | None:
    """Bytes of each partition directory's log segments under the local broker's log dirs (None: not local)."""
    if not LOG_DIRS.is_dir():
        return None
    sizes: dict[str, int] = {}
    for d in os.scandir(LOG_DIRS):
        try:  # a topic deleted meanwhile (an earlier benchmark's cleanup) vanishes mid-listing
            with os.scandir(d.path) as files:
                logs = [f for f in files if f.name.endswith(".log")]
        except (FileNotFoundError, NotADirectoryError):
            continue
        sizes[d.name] = sum(_size(f) for f in logs)
    return sizes


def _size(f: os.DirEntry[str]) -> int:
    try:
        return f.stat().st_size
    except FileNotFoundError:  # a segment deleted since the listing (retention)
        return 0


def _grew(before: dict[str, int], after: dict[str, int]) -> int:
    """What the logs grew by: a directory gone since (a deleted topic) counts nothing, a new one all its bytes."""
    return sum(size - before.get(name, 0) for name, size in after.items())


class Replies:
    """agent.replies from now on: when each message id got its reply (monotonic)."""

    def __init__(self) -> None:
        self.seen: dict[str, float] = {}
        self.changed = asyncio.Event()

    async def __aenter__(self) -> Replies:
        await harness.eventually(lambda: harness.topic_exists("agent.replies"), timeout=60, what="agent.replies")
        self.consumer = AIOKafkaConsumer(bootstrap_servers=BOOTSTRAP, group_id=None, enable_auto_commit=False,
                                         fetch_max_wait_ms=20)
        await asyncio.wait_for(self.consumer.start(), 30)
        tps = [TopicPartition("agent.replies", p) for p in await harness.end_offsets("agent.replies")]
        self.consumer.assign(tps)
        await asyncio.wait_for(self.consumer.seek_to_end(*tps), 30)
        for tp in tps:
            await asyncio.wait_for(self.consumer.position(tp), 30)
        self.task = asyncio.ensure_future(self._run())
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await asyncio.wait_for(self.consumer.stop(), 30)

    async def _run(self) -> None:
        while True:
            batch = await self.consumer.getmany(timeout_ms=50)
            now = time.monotonic()
            for msgs in batch.values():
                for m in msgs:
                    for mid in json.loads(m.value).get("message_ids", []):
                        self.seen.setdefault(mid, now)
            if batch:
                self.changed.set()

    async def wait(self, ids: list[str], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not all(i in self.seen for i in ids):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), min(left, 1.0))
            except asyncio.TimeoutError:
                pass
        return True


def _message(agent: str, cid: str, mid: str, text: str) -> tuple[bytes, bytes]:
    body = {"conversation_id": cid, "message_id": mid, "agent_name": agent, "text": text}
    return cid.encode(), json.dumps(body).encode()


async def _long(flow: Any, producer: AIOKafkaProducer, replies: Replies, n: int) -> dict[str, Any]:
    cid = f"b7-{uuid.uuid4().hex[:8]}"
    latency: dict[int, float] = {}
    grew: dict[int, int] = {}
    rss: dict[int, int] = {}
    # the log dirs are scanned only around the points: a scan of a long-lived dev broker (thousands of partition
    # directories) takes longer than a message, and twice per message made the run outlast its time limit
    measured = {i for p in POINTS for i in range(max(1, p - 5), min(n, p + 5) + 1)}
    for i in range(1, n + 1):
        before = _log_bytes() if i in measured else None
        key, value = _message(flow.agent, cid, f"m{i}", f"how was the service at hour {i}?")
        started = time.monotonic()
        await (await producer.send(flow.topic, value=value, key=key))
        if not await replies.wait([f"m{i}"], timeout=60):
            raise RuntimeError(f"message {i} of the long conversation unanswered in 60 s:\n{flow.worker.tail()}")
        latency[i] = replies.seen[f"m{i}"] - started
        after = _log_bytes() if i in measured else None
        if before is not None and after is not None:
            grew[i] = _grew(before, after)
        if i in POINTS or i % 100 == 0:
            rss[i] = common.proc_status(flow.worker.proc.pid).get("VmRSS", 0)
    out: dict[str, Any] = {"n": n, "tool_kb": TOOL_KB, "points": {}}
    for p in POINTS:
        if p > n:
            continue
        around = [i for i in range(max(1, p - 5), min(n, p + 5) + 1)]
        out["points"][p] = {
            "latency_ms": statistics.median(latency[i] for i in around) * 1000,
            "log_bytes": statistics.median(grew[i] for i in around) if grew else None,
            "rss_mb": rss.get(p, 0) / 2**20,
        }
    out["latency_p50_ms"] = statistics.median(latency.values()) * 1000
    out["latency_p99_ms"] = sorted(latency.values())[int(0.99 * (len(latency) - 1))] * 1000
    out["messages_per_s"] = n / sum(latency.values())
    return out


async def _burst(flow: Any, producer: AIOKafkaProducer, replies: Replies, n: int) -> dict[str, Any]:
    """N one-message conversations at once, then the same work as N tasks (the baseline)."""
    pid = flow.worker.proc.pid
    mids = [f"b7burst-{uuid.uuid4().hex[:10]}" for _ in range(n)]
    cpu0 = common.cpu_seconds(pid)
    started = time.monotonic()
    for mid in mids:
        key, value = _message(flow.agent, mid, mid, "how was the service?")
        await producer.send(flow.topic, value=value, key=key)
    await producer.flush()
    done = await replies.wait(mids, timeout=60 + n / 5)
    took = max(replies.seen[m] for m in mids if m in replies.seen) - started
    conv = {"n": n, "complete": done, "seconds": took, "rate": n / took,
            "cpu_ms": (common.cpu_seconds(pid) - cpu0) * 1000 / n}
    ids = [f"b7task-{uuid.uuid4().hex[:10]}" for _ in range(n)]
    cpu0 = common.cpu_seconds(pid)
    started = await common.publish_all(flow.topic, flow.agent, ids)
    done = await flow.out.wait_all(ids, timeout=60 + n / 5)
    took = max(flow.out.seen[i] for i in ids if i in flow.out.seen) - started
    tasks = {"n": n, "complete": done, "seconds": took, "rate": n / took,
             "cpu_ms": (common.cpu_seconds(pid) - cpu0) * 1000 / n}
    return {"conversations": conv, "tasks": tasks}


async def _overhead(flow: Any, producer: AIOKafkaProducer, replies: Replies, n: int) -> dict[str, Any]:
    """One at a time, model 200 ms: a message's latency less its model time (two calls), in one conversation, and
    the same agent's work sent as tasks (the baseline): what a message costs over its model, beside a task."""
    model_s = 2 * LATENCY_S
    cid = f"b7o-{uuid.uuid4().hex[:8]}"
    conv: list[float] = []
    for i in range(n):
        key, value = _message(flow.agent, cid, f"{cid}-m{i}", "how was the service?")
        started = time.monotonic()
        await (await producer.send(flow.topic, value=value, key=key))
        if not await replies.wait([f"{cid}-m{i}"], timeout=60):
            raise RuntimeError(f"message {i} of the overhead series unanswered in 60 s:\n{flow.worker.tail()}")
        conv.append(replies.seen[f"{cid}-m{i}"] - started - model_s)
    tasks: list[float] = []
    for i in range(n):
        task_id = f"b7o-task-{uuid.uuid4().hex[:10]}"
        started = time.monotonic()
        await (await producer.send(flow.topic, value=common.task_body(flow.agent, task_id, i), key=task_id.encode()))
        if not await flow.out.wait_all([task_id], timeout=60):
            raise RuntimeError(f"task {i} of the overhead series unanswered in 60 s:\n{flow.worker.tail()}")
        tasks.append(flow.out.seen[task_id] - started - model_s)

    def pct(xs: list[float], q: float) -> float:
        return sorted(xs)[int(q * (len(xs) - 1))] * 1000

    return {"n": n, "model_ms": model_s * 1000,
            "message_p50_ms": pct(conv, 0.5), "message_p99_ms": pct(conv, 0.99),
            "task_p50_ms": pct(tasks, 0.5), "task_p99_ms": pct(tasks, 0.99)}


async def run(tmp: Path, n_long: int, n_burst: int) -> tuple[list[Row], dict[str, Any]]:
    async with FakeLLM(responder=_answer) as fake:
        async with common.one_worker(tmp, "b7", fake.url, toml=_toml(fake.url)) as flow:
            producer = AIOKafkaProducer(bootstrap_servers=BOOTSTRAP, acks="all", linger_ms=5)
            await asyncio.wait_for(producer.start(), 30)
            try:
                async with Replies() as replies:
                    long = await _long(flow, producer, replies, n_long)
                    await fake.set_mode(latency=LATENCY_S)
                    burst = await _burst(flow, producer, replies, n_burst)
                    overhead = await _overhead(flow, producer, replies, OVERHEAD_N)
            finally:
                await asyncio.wait_for(producer.stop(), 30)
    points = long["points"]
    rows = [Row("B7", f"a conversation of {n_long:,} messages, {TOOL_KB} KB of tool output each, model instant",
                f"{long['messages_per_s']:.1f} messages/s, p50 {long['latency_p50_ms']:.0f} ms, "
                f"p99 {long['latency_p99_ms']:.0f} ms")]
    for p, f in points.items():
        grew = f"{f['log_bytes'] / 1024:.0f} KiB" if f["log_bytes"] is not None else "not measured (remote broker)"
        rows.append(Row("B7", f"  at message {p:,}: latency / broker logs grew / worker RSS",
                        f"{f['latency_ms']:.0f} ms / {grew} / {f['rss_mb']:.0f} MiB"))
    first, last = points[min(points)], points[max(points)]
    flat = last["latency_ms"] <= 1.5 * first["latency_ms"] and (
        last["log_bytes"] is None or last["log_bytes"] <= 1.2 * first["log_bytes"])
    rows.append(Row("B7", f"  message {max(points):,} against message {min(points)}",
                    f"latency x{last['latency_ms'] / first['latency_ms']:.2f}"
                    + (f", bytes x{last['log_bytes'] / first['log_bytes']:.2f}" if last["log_bytes"] else ""),
                    "flat: latency ≤ x1.5, bytes ≤ x1.2", flat))
    conv, tasks = burst["conversations"], burst["tasks"]
    rows.append(Row("B7", f"{n_burst:,} one-message conversations at once vs {n_burst:,} tasks, model 200 ms x2",
                    f"{conv['rate']:.0f} messages/s vs {tasks['rate']:.0f} tasks/s "
                    f"(x{conv['rate'] / tasks['rate']:.2f}); CPU {conv['cpu_ms']:.1f} vs {tasks['cpu_ms']:.1f} ms",
                    "≥ 0.8x the tasks' rate", conv["rate"] >= 0.8 * tasks["rate"]))
    rows.append(Row("B7", f"overhead over the model time ({overhead['model_ms']:.0f} ms), {OVERHEAD_N} one at a time: "
                          "a message p50 / p99 vs a task",
                    f"{overhead['message_p50_ms']:.0f} / {overhead['message_p99_ms']:.0f} ms vs "
                    f"{overhead['task_p50_ms']:.0f} / {overhead['task_p99_ms']:.0f} ms"))
    return rows, {"long": long, "burst": burst, "overhead": overhead}


if __name__ == "__main__":  # a run of its own: python -m bench.b7_conversation [N_LONG] [N_BURST]
    import sys
    import tempfile

    from bench.report import table

    async def main() -> None:
        with tempfile.TemporaryDirectory(prefix="agents-stream-bench-") as d:
            rows, raw = await run(Path(d), int(sys.argv[1]) if len(sys.argv) > 1 else 1000,
                                  int(sys.argv[2]) if len(sys.argv) > 2 else 1000)
            print("\n".join(table(rows)))
            print(json.dumps(raw, indent=1, default=str))

    asyncio.run(main())

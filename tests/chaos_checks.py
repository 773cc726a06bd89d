"""What a chaos run (tests/chaos.py) saw on the output topics, its report and its checks: the verdict half of the
run, apart from the faults that make it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from agents_stream.contract import topics
from agents_stream.testing.fakellm import FakeLLM

from .integration.harness import BOOTSTRAP, end_offsets, eventually, topic_exists

if TYPE_CHECKING:
    from .chaos import ChaosPlan

log = logging.getLogger("chaos")

#: poison kinds, each with the error_reason prefix its dead-letter record must carry
POISON_REASONS = {
    "not_json": "not_json",
    "invalid_utf8": "invalid_utf8",
    "null_value": "null_value",
    "missing_fields": "schema_violation",
    "wrong_types": "schema_violation",
    "not_an_object": "schema_violation",
    "wrong_agent": "agent_mismatch",
}



@dataclass
class ChaosReport:
    plan: ChaosPlan
    app_id: str = ""
    logs: str = ""
    valid: int = 0
    poison: int = 0
    result_records: int = 0
    distinct: int = 0  # valid tasks with a result
    resent: int = 0  # result records repeating an earlier one byte for byte
    dlq_records: int = 0
    calls_total: int = 0
    calls_mean: float = 0.0
    calls_max: int = 0
    max_attempts: int = 0  # highest dispatch count in a result
    kills: int = 0
    pauses: int = 0
    broker_restarts: int = 0
    breaker_opened: int = 0
    held: int = 0  # tasks held at least once (task.held)
    redispatched: int = 0  # tasks whose lease lapsed and that ran again
    calls_after_result: int = 0  # provider calls that began > 1 s after their task's result: should be 0
    #: of those, how many were on a task that had been held / re-dispatched (a lease that lapsed) / neither,
    #: and a few examples (task, seconds after its result, its control events): where to look in the logs
    late_by_path: Counter = field(default_factory=Counter)
    late_examples: list[str] = field(default_factory=list)
    faults: list[tuple[float, str]] = field(default_factory=list)  # (wall time, what): the run's fault timeline
    lag: int | None = None
    publish_s: float = 0.0
    drain_s: float = 0.0  # last publish acknowledged → last result or dead letter written
    total_s: float = 0.0  # worker start → checks done
    problems: list[str] = field(default_factory=list)
    evidence: str = ""

    def table(self) -> str:
        p = self.plan
        rows = [
            ("tasks published", f"{p.tasks} ({self.valid} valid + {self.poison} poison) at {p.rate:g}/s"),
            ("workers",
             f"{p.workers}, one SIGKILLed every {p.kill_every:g}s and restarted" if p.kill_every else str(p.workers)),
            ("provider",
             f"error rate {p.error_rate:.0%}, latency {p.latency:g}s, one {p.outage_s:g}s outage at "
             f"t={p.outage_at:g}s"),
            ("results (records)", self.result_records),
            ("distinct results", f"{self.distinct} / {self.valid}"),
            ("duplicates (same bytes re-sent)", self.resent),
            ("DLQ records", f"{self.dlq_records} / {self.poison} poison"),
            ("provider calls per task", f"mean {self.calls_mean:.2f}, max {self.calls_max} ({self.calls_total} calls)"),
            ("calls after the task's result", self._late()),
            ("max dispatches of a task", self.max_attempts),
            ("kills", self.kills),
            ("pauses past the session timeout (SIGSTOP, then SIGCONT)", self.pauses),
            ("broker restarts", self.broker_restarts),
            ("breaker openings", self.breaker_opened),
            ("tasks held / re-dispatched", f"{self.held} / {self.redispatched}"),
            ("consumer lag at the end", "?" if self.lag is None else self.lag),
            ("publishing took", f"{self.publish_s:.1f}s"),
            ("time to drain (last publish → last result)", f"{self.drain_s:.1f}s"),
            ("total time", f"{self.total_s:.1f}s"),
            ("verdict", "PASSED" if not self.problems else f"FAILED ({len(self.problems)} problems)"),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

    def _late(self) -> str:
        if not self.calls_after_result:
            return "0"
        paths = ", ".join(f"{n} {path}" for path, n in sorted(self.late_by_path.items()))
        return f"{self.calls_after_result} ({paths}); e.g.\n    " + "\n    ".join(self.late_examples)

    def describe(self) -> str:
        """The problems and the evidence to look at (worker logs, the consumer group)."""
        lines = [f"app id {self.app_id}; worker logs: {self.logs}", *(f"- {p}" for p in self.problems)]
        if self.evidence:
            lines.append(self.evidence)
        return "\n".join(lines)


# -- what the run saw on the output topics ----------------------------------------------


@dataclass
class Seen:
    results: dict[str, list[Any]] = field(default_factory=lambda: defaultdict(list))
    dlq: dict[str, list[Any]] = field(default_factory=lambda: defaultdict(list))
    control: list[dict[str, Any]] = field(default_factory=list)


async def read_outputs(seen: Seen, agent: str, ours: set[str], positioned: asyncio.Event, stop: asyncio.Event) -> None:
    """Follow agent.results, agent.control (from their ends at the start) and the agent's DLQ (from its start);
    ``positioned`` is set once those start offsets are taken."""
    dlq = topics.dlq_topic(agent)
    await eventually(lambda: topic_exists(dlq), timeout=60, what=f"topic {dlq}")
    starts: dict[TopicPartition, int] = {}
    for topic in (topics.RESULTS, topics.CONTROL):
        for p, end in (await end_offsets(topic)).items():
            starts[TopicPartition(topic, p)] = end
    for p in await end_offsets(dlq):
        starts[TopicPartition(dlq, p)] = 0
    consumer = AIOKafkaConsumer(bootstrap_servers=BOOTSTRAP, enable_auto_commit=False, group_id=None)
    await asyncio.wait_for(consumer.start(), 30)
    try:
        consumer.assign(list(starts))
        for tp, offset in starts.items():
            consumer.seek(tp, offset)
        positioned.set()
        while not stop.is_set():
            try:
                batch = await consumer.getmany(timeout_ms=500)
            except KafkaError as exc:  # the broker restart: the consumer reconnects by itself
                log.info("output reader: %r; reading on", exc)
                await asyncio.sleep(1)
                continue
            for tp, msgs in batch.items():
                for m in msgs:
                    key = m.key.decode("utf-8", "replace") if m.key is not None else ""
                    if tp.topic == topics.RESULTS:
                        if key in ours:
                            seen.results[key].append(m)
                    elif tp.topic == dlq:
                        seen.dlq[key].append(m)
                    else:
                        with contextlib.suppress(ValueError, TypeError):
                            event = json.loads(m.value)
                            if event.get("subject") in ours or event.get("event", "").startswith("breaker."):
                                seen.control.append(event)
    finally:
        await asyncio.wait_for(consumer.stop(), 30)


# -- the checks ----------------------------------------------------------------------------


def _last_fault(faults: list[tuple[float, str]], ts: float) -> str:
    before = [(t, what) for t, what in faults if t <= ts]
    if not before:
        return "no fault before it"
    t, what = before[-1]
    return f"{ts - t:.1f}s after {what}"


def _differences(bodies: list[dict[str, Any]]) -> str:
    """The fields in which a task's distinct results differ, result by result."""
    fields = sorted(f for f in set().union(*bodies) if len({json.dumps(b.get(f)) for b in bodies}) > 1)
    return " | ".join(", ".join(f"{f}={str(b.get(f))[:80]}" for f in fields) for b in bodies)


def check(report: ChaosReport, seen: Seen, valid: set[str], poison: dict[str, str], fake: FakeLLM) -> None:
    """Fill ``report``'s figures from what the run saw, and its ``problems`` with every promise broken."""
    problems = report.problems
    report.result_records = sum(len(v) for v in seen.results.values())
    report.distinct = len(valid & seen.results.keys())
    report.resent = 0
    conflicting, not_ok = [], Counter()
    for key, msgs in seen.results.items():
        values = [m.value for m in msgs]
        report.resent += len(values) - len(set(values))
        if len(set(values)) > 1:
            conflicting.append(key)
        body = json.loads(values[0])
        report.max_attempts = max(report.max_attempts, int(body.get("attempts", 1)))
        if key in valid and body.get("status") != "succeeded":
            not_ok[body.get("status")] += 1
    if conflicting:
        problems.append(f"{len(conflicting)} tasks with more than one distinct result, e.g. {conflicting[:3]}")
        for key in conflicting[:3]:  # what differs, so the report says which path answered twice
            problems.append(f"  {key}: {_differences([json.loads(v) for v in {m.value for m in seen.results[key]}])}")
    if not_ok:
        problems.append(f"valid tasks whose result is not succeeded: {dict(not_ok)}")
    with_result = set(poison) & seen.results.keys()
    if with_result:
        problems.append(f"{len(with_result)} poison pills have a result, e.g. {sorted(with_result)[:3]}")

    report.dlq_records = sum(len(v) for v in seen.dlq.values())
    dead_valid = valid & seen.dlq.keys()
    if dead_valid:
        reasons = Counter(
            dict(m.headers).get("error_reason", b"?").decode()[:60] for k in dead_valid for m in seen.dlq[k]
        )
        problems.append(f"{len(dead_valid)} valid tasks were dead-lettered: {dict(reasons)}")
    bad = []
    for key, kind in poison.items():
        records = seen.dlq.get(key, [])
        if len(records) != 1:
            bad.append(f"{key} ({kind}): {len(records)} DLQ records")
            continue
        headers = {k: v.decode() for k, v in records[0].headers}
        if (headers.get("error_layer") != "schema"
                or not headers.get("error_reason", "").startswith(POISON_REASONS[kind])):
            bad.append(
                f"{key} ({kind}): layer {headers.get('error_layer')}, reason {headers.get('error_reason', '')[:60]!r}"
            )
    if bad:
        problems.append(f"{len(bad)} poison pills without exactly one schema dead letter: {bad[:5]}")

    calls = Counter(r.task_id for r in fake.requests if r.task_id in valid)
    report.calls_total = sum(calls.values())
    report.calls_mean = report.calls_total / max(1, len(valid))
    report.calls_max = max(calls.values(), default=0)
    poison_calls = sum(1 for r in fake.requests if r.task_id in poison)
    if poison_calls:
        problems.append(f"{poison_calls} provider calls for poison pills")
    first_result = {k: min(m.timestamp for m in msgs) / 1000 for k, msgs in seen.results.items()}
    late = [r for r in fake.requests if r.task_id in first_result and r.ts > first_result[r.task_id] + 1.0]
    report.calls_after_result = len(late)
    events: dict[str, list[str]] = defaultdict(list)
    for e in seen.control:
        events[e.get("subject", "")].append(str(e.get("event")))
    for r in late:
        kinds = set(events[r.task_id])
        path = ("re-dispatched" if "task.redispatched" in kinds
                else "held" if "task.held" in kinds else "neither held nor re-dispatched")
        report.late_by_path[path] += 1
        if len(report.late_examples) < 8:
            report.late_examples.append(
                f"{r.task_id}: {r.ts - first_result[r.task_id]:.1f}s after its result (answered {r.status}); "
                f"control events {events[r.task_id]}; {_last_fault(report.faults, r.ts)}"
            )

    report.breaker_opened = sum(
        1 for e in seen.control if e.get("event") == "breaker.open" and e.get("subject") == "fake"
    )
    report.held = len({e["subject"] for e in seen.control if e.get("event") == "task.held"})
    report.redispatched = len({e["subject"] for e in seen.control if e.get("event") == "task.redispatched"})

"""Traces (ops/tracing.py): the W3C context in Kafka headers and in the task's record, when tracing is on, and the
spans the ledger and the executor make, with their parents. Spans go to OpenTelemetry's in-memory exporter; the
ledger runs on recorded, at-once-confirmed sends, the executor on a fake LLM server."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from agents_stream.tables import leases
from agents_stream.tables.definitions import Tables
from agents_stream.tables.leases import TaskRecord
from faust.types import TP
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from agents_stream.config import ApprovalLevel, ApprovalPolicy
from agents_stream.contract import topics
from agents_stream.contract.events import CallsDelegated, LeaseExpired, TaskFailed, TaskSucceeded, encode
from agents_stream.contract.models import TaskPayload, Usage
from agents_stream.execution.agent_definitions import Agent
from agents_stream.execution.tool_calls import ToolCaller, ToolCalling
from agents_stream.execution.tools import ToolContext, tool
from agents_stream.ops import tracing
from agents_stream.ops.tracing_sdk import Traces
from agents_stream.orchestrator import Orchestrator
from agents_stream.settings import Settings
from agents_stream.testing.fakellm import FakeLLM, ok, status
from tests.unit.fake_worker import worker
from tests.unit.ledger_fakes import LedgerWorld, Table

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
SETTINGS = Settings(partitions=1, lease_ttl_s=5.0)
OUTCOMES = topics.outcomes_topic(SETTINGS.app_id)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on for the test, every span handed to an in-memory exporter as it ends; off again after."""
    exporter = InMemorySpanExporter()
    tracing.use(Traces.to(exporter))
    try:
        yield exporter
    finally:
        tracing.use(None)


def by_name(exporter: InMemorySpanExporter) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for s in exporter.get_finished_spans():
        out.setdefault(s.name, []).append(s)
    return out


def traceparent_of(span: ReadableSpan) -> str:
    ctx = span.get_span_context()
    assert ctx is not None
    return tracing.format_traceparent(ctx.trace_id, ctx.span_id, int(ctx.trace_flags))


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    ctx = span.get_span_context()
    assert ctx is not None
    return ctx.span_id


# -- the W3C context ---------------------------------------------------------------------------------------------


def test_a_traceparent_is_read_as_the_w3c_spec_says() -> None:
    """Valid ones give their ids and flags; malformed, all-zero, version ff or upper-case ones are ignored; a later
    version may carry more fields."""
    assert tracing.parse_traceparent(PARENT) == (0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, 1)
    assert tracing.format_traceparent(*tracing.parse_traceparent(PARENT)) == PARENT  # type: ignore[misc]
    assert tracing.parse_traceparent("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00-what") is not None
    for bad in (None, "", "garbage", PARENT.upper(), PARENT + "-x", "ff" + PARENT[2:],
                "00-00000000000000000000000000000000-b7ad6b7169203331-01",
                "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", PARENT[:-1]):
        assert tracing.parse_traceparent(bad) is None, bad


def test_the_traceparent_header_of_a_kafka_record_is_found_and_replaced() -> None:
    """The last valid traceparent among the headers counts (bytes, as Kafka gives them); one that is not ASCII or
    not valid is passed over; headers_with leaves one traceparent and every other header as it was."""
    headers = [("traceparent", b"\xff\xfe"), ("other", b"x"), ("traceparent", PARENT.encode()),
               ("traceparent", b"00-nope")]
    assert tracing.header_traceparent(headers) == PARENT
    assert tracing.header_traceparent([("other", b"x")]) is None and tracing.header_traceparent(None) is None
    child = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"
    assert tracing.headers_with(headers, child) == [("other", b"x"), ("traceparent", child.encode())]
    assert tracing.headers_with(None, None) == []


@pytest.mark.parametrize("env, exporters, problem", [
    ({}, [], None),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ["otlp"], None),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, ["otlp"], None),
    ({"OTEL_TRACES_EXPORTER": "console"}, ["console"], None),
    ({"OTEL_TRACES_EXPORTER": "otlp,console"}, ["otlp", "console"], None),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, [], None),
    ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, [], None),
    ({"OTEL_TRACES_EXPORTER": "zipkin"}, [], "zipkin is not an exporter"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, [], "http/protobuf"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, ["otlp"], None),
])
def test_tracing_is_on_only_when_otel_variables_ask_for_it(env: dict, exporters: list, problem: str | None) -> None:
    """Off unless an exporter or an OTLP endpoint is configured (not OpenTelemetry's default of otlp to
    localhost); what the worker cannot honour is said, and tracing stays off."""
    got, why = tracing.exporters_of(env)
    assert got == exporters
    assert (why is None) if problem is None else (problem in (why or ""))


def test_start_with_a_configuration_it_cannot_honour_leaves_tracing_off(caplog: Any) -> None:
    """A worker never refuses to work over tracing: the problem is logged as an error and no span is made."""
    assert not tracing.start("t", {}, {"OTEL_TRACES_EXPORTER": "jaeger"})
    assert not tracing.on() and tracing.span("x", PARENT) is None
    assert "Tracing stays off" in caplog.text and "jaeger" in caplog.text


def test_with_tracing_off_the_worker_imports_nothing_of_opentelemetry() -> None:
    """Off (no OTEL_* variable), building a worker's app and handling its modules loads no OpenTelemetry module:
    the hot path has nothing of it to run."""
    code = ("import sys; import agents_stream.app, agents_stream.ops.cli; "
            "from agents_stream.ops import tracing; tracing.start('x', {}); "
            "print(tracing.on(), sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
    env = {"PATH": "/usr/bin:/bin", "AGENTS_STREAM_DATA_DIR": "/tmp/agents-stream-unit-otel-off"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "[]"]


# -- the task's record -------------------------------------------------------------------------------------------


def _receive(record: TaskRecord | None, trace: str | None, **extra: Any) -> tuple[TaskRecord | None, list]:
    message = leases.TaskMessage(agent="a", payload="{}", topic="agent.tasks.a", partition=0, offset=1, trace=trace,
                                 **extra)
    return leases.receive(record, message, now=10.0, me="w1", ttl=5.0, max_attempts=3, running_here=False)


def test_the_record_keeps_the_trace_of_its_first_delivery_and_reads_old_and_newer_records() -> None:
    """A new task keeps the intake's traceparent; a redelivery does not replace it; a record written before the
    field existed reads as untraced, and a newer worker's unknown fields are ignored."""
    new, effects = _receive(None, PARENT)
    assert new is not None and new.trace == PARENT and leases.Dispatch(1) in effects
    again, _ = _receive(new, "00-11111111111111111111111111111111-2222222222222222-01")
    assert again is not None and again.trace == PARENT
    stored = new.to_json()
    assert stored["trace"] == PARENT and TaskRecord.from_json(json.loads(json.dumps(stored))) == new
    old = {k: v for k, v in stored.items() if k != "trace"}
    assert TaskRecord.from_json(old).trace is None
    assert TaskRecord.from_json({**stored, "trace_v2": {"x": 1}}).trace == PARENT
    expired, effects = leases.expire(new, dispatch=1, now=100.0, me="w2", ttl=5.0, max_attempts=3, running_here=False)
    assert expired is not None and expired.trace == PARENT and leases.Dispatch(2) in effects  # a re-dispatch keeps it


# -- the ledger's spans --------------------------------------------------------------------------------------------


def World() -> LedgerWorld:
    """A traced ledger on one partition (tests/unit/ledger_fakes.LedgerWorld)."""
    return LedgerWorld(SETTINGS)


def _task(task_id: str = "t1") -> bytes:
    return json.dumps({"task_id": task_id, "agent_name": "a", "instruction": "Sum it up."}).encode()


def _succeeded(dispatch: int = 1) -> bytes:
    return encode(TaskSucceeded(
        worker="w2", dispatch=dispatch, calls=1, usage=Usage(input_tokens=7, output_tokens=3, cost=0.002),
        route=None, status="succeeded", output="done", confidence="high", source="primary:p:m", partial=False,
    ))


async def test_a_task_continues_the_trace_of_its_header_and_every_span_after_intake_hangs_under_it(
    spans: InMemorySpanExporter,
) -> None:
    """intake is the child of the message's traceparent and the record keeps the intake's; the first dispatch, a
    re-dispatch after the lease lapsed (with the previous owner as an event) and the result are children of the
    intake span; the executor is handed each dispatch span's traceparent."""
    world = World()
    await world.deliver("agent.tasks.a", b"t1", _task(), headers=[("traceparent", PARENT.encode())])
    spans_now = by_name(spans)
    (intake,) = spans_now["intake a"]
    assert intake.context is not None and intake.context.trace_id == tracing.parse_traceparent(PARENT)[0]  # type: ignore[index]
    assert parent_id(intake) == tracing.parse_traceparent(PARENT)[1]  # type: ignore[index]
    assert intake.attributes is not None and intake.attributes["messaging.destination.name"] == "agent.tasks.a"
    assert intake.attributes["agents_stream.task_id"] == "t1" and intake.attributes["agents_stream.state"] == "running"
    assert world.record("t1").trace == traceparent_of(intake)
    (first,) = spans_now["dispatch a"]
    assert parent_id(first) == span_id(intake) and first.attributes["agents_stream.dispatch"] == 1  # type: ignore[index]
    assert world.dispatched == [("t1", 1, traceparent_of(first))]

    lapsed = encode(LeaseExpired(dispatch=1, worker="w1"))
    world.tasks["t1"] = {**world.tasks["t1"], "lease_until": 0.0}  # the lease lapsed long ago
    await world.deliver(OUTCOMES, b"t1", lapsed)
    second = by_name(spans)["dispatch a"][1]
    assert parent_id(second) == span_id(intake) and second.attributes["agents_stream.dispatch"] == 2  # type: ignore[index]
    assert [e.name for e in second.events] == ["task.redispatched"]
    assert second.events[0].attributes["previous_owner"] == "w1"  # type: ignore[index]
    assert world.dispatched[1] == ("t1", 2, traceparent_of(second))

    await world.deliver(OUTCOMES, b"t1", _succeeded(dispatch=2))
    (result,) = by_name(spans)["result a"]
    assert parent_id(result) == span_id(intake) and result.context.trace_id == intake.context.trace_id  # type: ignore[union-attr]
    attributes = result.attributes or {}
    assert attributes["agents_stream.result.status"] == "succeeded" and attributes["agents_stream.state"] == "succeeded"
    assert attributes["gen_ai.usage.input_tokens"] == 7 and attributes["agents_stream.cost_usd"] == 0.002
    assert result.status.status_code == StatusCode.UNSET


async def test_a_dead_letter_marks_the_result_span_failed_with_its_reason_and_carries_the_trace(
    spans: InMemorySpanExporter,
) -> None:
    """A task that fails for good: its result span says why (status ERROR, a dead_letter event with the reason),
    and its dead letter carries the task's traceparent, so a requeue continues the same trace."""
    world = World()
    await world.deliver("agent.tasks.a", b"t1", _task())  # no header: the intake begins the trace
    (intake,) = by_name(spans)["intake a"]
    assert intake.parent is None
    failed = encode(TaskFailed(worker="w1", dispatch=1, calls=1, usage=Usage(), route=None, error="HTTP 400: bad",
                               reason="permanent_error: HTTP 400", source="primary:p"))
    await world.deliver(OUTCOMES, b"t1", failed)
    (result,) = by_name(spans)["result a"]
    assert result.status.status_code == StatusCode.ERROR and "permanent_error" in (result.status.description or "")
    dead = [e for e in result.events if e.name == "dead_letter"]
    assert dead and dead[0].attributes["reason"] == "permanent_error: HTTP 400"  # type: ignore[index]
    (dlq,) = [h for t, _, _, h in world.sent if t == topics.dlq_topic("a")]
    assert tracing.header_traceparent(dlq) == world.record("t1").trace == traceparent_of(intake)


async def test_a_task_parked_for_approval_has_the_request_as_an_event_of_its_intake(
    spans: InMemorySpanExporter,
) -> None:
    """An approval wait is an event (approval.requested, with its reason) of the span that parked the task."""
    world = World()
    world.ledger.gate.policies["a"] = ApprovalPolicy(
        always=True, saga_steps=False, levels=[ApprovalLevel(name="ops", timeout_s=60.0)],
    )
    await world.deliver("agent.tasks.a", b"t1", _task())
    (intake,) = by_name(spans)["intake a"]
    assert "approval.requested" in [e.name for e in intake.events]
    assert (intake.attributes or {})["agents_stream.state"] == leases.AWAITING_APPROVAL
    assert "dispatch a" not in by_name(spans) and world.dispatched == []


async def test_with_tracing_off_a_task_with_a_traceparent_makes_no_span_and_records_none() -> None:
    """Off: the header is not read, the record has no trace, the executor gets none."""
    assert not tracing.on()
    world = World()
    await world.deliver("agent.tasks.a", b"t1", _task(), headers=[("traceparent", PARENT.encode())])
    assert world.record("t1").trace is None and world.dispatched == [("t1", 1, None)]


# -- the executor's spans -------------------------------------------------------------------------------------------


async def test_each_model_call_is_a_genai_span_under_the_dispatch_with_tokens_and_cost(
    spans: InMemorySpanExporter,
) -> None:
    """A failed call and its retry are two chat spans (the first with its error), both children of the run's
    dispatch, with the GenAI attributes: system, request and response model, tokens, and our cost."""
    prices = {"prices": {"p-model": {"input_per_mtok": 1000.0, "output_per_mtok": 2000.0}}}
    async with FakeLLM([status(500), ok("fine", input_tokens=10, output_tokens=4)], default=None) as p:
        async with worker({"p": p}, {"providers": ["p"]}, settings={"backoff_base_s": 0.01}, **prices) as w:
            task = TaskPayload(task_id="t1", agent_name="a", instruction="Summarise.")
            w.executor.dispatch(task, 1, trace=PARENT)
            await w.outcome("t1")
    chats = by_name(spans)["chat p-model"]
    assert len(chats) == 2
    assert all(parent_id(c) == tracing.parse_traceparent(PARENT)[1] for c in chats)  # type: ignore[index]
    failed, answered = sorted(chats, key=lambda c: c.start_time or 0)
    assert failed.status.status_code == StatusCode.ERROR and (failed.attributes or {})["error.type"]
    a = answered.attributes or {}
    assert (a["gen_ai.operation.name"], a["gen_ai.system"], a["gen_ai.request.model"]) == ("chat", "openai", "p-model")
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (10, 4)
    assert a["agents_stream.cost_usd"] == pytest.approx(10 * 1000 / 1e6 + 4 * 2000 / 1e6)
    assert a["server.address"] == "127.0.0.1" and a["agents_stream.provider"] == "p"


async def test_a_hold_is_a_span_from_task_held_to_task_released(spans: InMemorySpanExporter) -> None:
    """Every provider down: the hold's span starts with the task.held event (and its reason) and ends at
    task.released, under the run's dispatch."""
    async with FakeLLM([status(429, retry_after=0.3), ok("now")], default=None) as p:
        async with worker({"p": p}, {"providers": ["p"]}, settings={"probe_interval_s": 0.2}) as w:
            w.executor.dispatch(TaskPayload(task_id="t1", agent_name="a", instruction="Summarise."), 1, trace=PARENT)
            await w.outcome("t1")
    (hold,) = by_name(spans)["hold a"]
    assert [e.name for e in hold.events] == ["task.held", "task.released"]
    assert parent_id(hold) == tracing.parse_traceparent(PARENT)[1]  # type: ignore[index]


@tool
async def lookup(ctx: ToolContext, order: str) -> str:
    """Look an order up."""
    return f"order {order}: shipped"


async def test_a_tool_call_is_an_execute_tool_span_with_its_key_and_a_failing_one_says_so(
    spans: InMemorySpanExporter,
) -> None:
    """Each tool call is a span under the run (GenAI execute_tool: name, call id), with its idempotency key;
    a call of a tool that does not exist is one too, failed."""
    agent = Agent("a", "x", tools=[lookup])
    task = TaskPayload(task_id="t1", agent_name="a", instruction="Where is it?")
    caller = ToolCaller(agent, task, ToolCalling(circuits=None, backoff_base_s=0.01, backoff_cap_s=0.02,
                                                 rng=__import__("random").Random(1), trace=PARENT))
    entry = await caller.call(1, {"id": "c1", "name": "lookup", "arguments": {"order": "7"}})
    missing = await caller.call(1, {"id": "c2", "name": "nope", "arguments": {}})
    assert entry["error"] is False and missing["error"] is True
    (good,) = by_name(spans)["execute_tool lookup"]
    (bad,) = by_name(spans)["execute_tool nope"]
    a = good.attributes or {}
    assert (a["gen_ai.tool.name"], a["gen_ai.tool.call.id"], a["agents_stream.idempotency_key"]) == (
        "lookup", "c1", "t1:1:c1")
    assert good.status.status_code == StatusCode.UNSET and bad.status.status_code == StatusCode.ERROR
    assert parent_id(good) == tracing.parse_traceparent(PARENT)[1]  # type: ignore[index]


async def test_a_job_is_one_trace_and_each_step_task_carries_its_context(spans: InMemorySpanExporter) -> None:
    """A job submitted with a traceparent: its `job submit` span continues it, the job's record keeps that span's
    traceparent, and each step's task goes out under a `publish` span of it, with its traceparent in the headers."""
    world = World()
    tables = Tables(tasks=world.tasks, answers=Table(), jobs=Table(), timers=Table())
    orchestrator = Orchestrator(world.ledger.outbox, tables, ["a", "b"], SETTINGS)
    request = {"job_id": "j1", "plan": {"tasks": [
        {"id": "x", "agent": "a", "instruction": "first"}, {"id": "y", "agent": "b", "instruction": "also first"}]}}
    orchestrator.handle(TP(topics.JOBS, 0), 0, b"j1", json.dumps(request).encode(), [("traceparent", PARENT.encode())])
    for _ in range(10):
        await asyncio.sleep(0)
    (job,) = by_name(spans)["job submit"]
    assert parent_id(job) == tracing.parse_traceparent(PARENT)[1]  # type: ignore[index]
    assert orchestrator.table["j1"]["trace"] == traceparent_of(job)
    publishes = by_name(spans)["publish agent.tasks.a"] + by_name(spans)["publish agent.tasks.b"]
    assert len(publishes) == 2 and all(parent_id(p) == span_id(job) for p in publishes)
    steps = {t: tracing.header_traceparent(h) for t, _, _, h in world.sent if t.startswith("agent.tasks.")}
    assert steps == {(p.attributes or {})["messaging.destination.name"]: traceparent_of(p) for p in publishes}
    assert {(p.attributes or {})["agents_stream.task_id"] for p in publishes} == {"j1/x", "j1/y"}


async def test_a_delegated_call_is_an_invoke_agent_span_whose_context_the_subtask_carries(
    spans: InMemorySpanExporter,
) -> None:
    """An agent loop's delegation: the transition's span hangs under the delegating run's span (the event's
    trace), each sub-agent call is an `invoke_agent` span under it, and the sub-task goes out with that span's
    traceparent in its headers (its own intake continues from there)."""
    world = World()
    lead = TaskPayload(task_id="lead-1", agent_name="a", instruction="report")
    world.tasks["lead-1"] = leases.TaskRecord(
        state=leases.RUNNING, agent="a", dispatch=1, owner="w1", lease_until=1e12, payload=lead.model_dump_json(),
        topic="agent.tasks.a", partition=0, offset=0, received_at=0.0, trace=PARENT,
    ).to_json()
    run = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"  # the delegating run's dispatch span
    event = CallsDelegated(worker="w1", dispatch=1, turn=0, trace=run, calls=[
        {"id": "c1", "agent": "analyzer", "instruction": "analyse", "context": None}])
    await world.deliver(OUTCOMES, b"lead-1", encode(event))
    (delegated,) = by_name(spans)["agent.delegated a"]
    (call,) = by_name(spans)["invoke_agent analyzer"]
    assert parent_id(delegated) == tracing.parse_traceparent(run)[1]  # type: ignore[index]
    assert parent_id(call) == span_id(delegated)
    assert (call.attributes or {})["gen_ai.agent.name"] == "analyzer"
    (headers,) = [h for t, _, _, h in world.sent if t == "agent.tasks.analyzer"]
    assert tracing.header_traceparent(headers) == traceparent_of(call)

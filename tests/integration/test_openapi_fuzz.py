"""The HTTP API against its own OpenAPI document: schemathesis (property-based) sends thousands of generated requests
to every endpoint of a live worker on the real broker, with the write token, the read token and none, and checks
each answer: never a 5xx, a status, content type and body the document names. Then nothing a refused request asked
for was written: every topic a mutation writes (agent.approvals: decisions and cancels; agent.jobs: job cancels;
the agent's task topic: conversation messages, deletes, handoff actions, dead-letter requeues) is read back, and no
record of a refused request's key was written while that request was being answered. The figures are printed
(docs/guide/openapi.md)."""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import hypothesis
import requests
import schemathesis
from aiokafka import AIOKafkaConsumer, TopicPartition
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from agents_stream.contract import topics
from agents_stream.ops import openapi

from .harness import BOOTSTRAP, READ_TOKEN, create_topics, end_offsets, eventually, produce, unique

WRITE = "fuzz-write-token"
SECRET = "fuzz-secret-" + "x" * 32
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
#: cases generated per operation, (valid, invalid); each valid one is sent twice (see _case). Fewer for the
#: dead-letter reads, which open a consumer each, and the event streams, which stay open for their timeout. The
#: generation is derandomized: every run sends the same requests, so a failure reproduces.
EXAMPLES = (35, 25)
FEWER = {"GET /dlq": (6, 4), "GET /dlq/{ref}": (15, 10), "POST /dlq/requeue": (20, 10),
         "GET /conversations/{conversation_id}/events": (4, 3)}
STREAM_TIMEOUT_S = 0.8
CREDENTIALS = {"write": {"Authorization": f"Bearer {WRITE}"}, "read": {"Authorization": f"Bearer {READ_TOKEN}"},
               "none": {}}
#: the key a refused mutation would have written under, by operation (a path parameter)
KEYS = {"/approvals/{task_id}": "task_id", "/tasks/{task_id}/cancel": "task_id", "/jobs/{job_id}/cancel": "job_id"}
#: what answers without a token: the probes, the console's files and this document, and the signed link (its
#: signature is the credential: 403 when it does not hold)
UNGUARDED = ("/healthz", "/readyz", "/metrics", "/openapi.json", "/", "/console/{name}",
             "/approvals/{task_id}/{decision}")


@dataclass
class Refusal:
    """A mutation the worker refused (4xx): what it would have written, and when it was being answered."""

    label: str
    key: str | None
    start_ms: int
    end_ms: int


@dataclass
class Run:
    requests: int = 0
    by_operation: Counter[str] = field(default_factory=Counter)
    seconds: Counter[str] = field(default_factory=Counter)
    by_status: Counter[int] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    #: the keys accepted mutations wrote under: the read-back must find them, or it could not find a refused one
    accepted: set[str] = field(default_factory=set)


def _steer(strategy: Any, op: str, agent: str, cid: str, ref: str) -> Any:
    """Half the generated cases aimed at something that exists (the worker's agent, a live conversation, a real
    dead letter), so the accepting paths are fuzzed too, not only the 404s."""

    def aim(pair: tuple[Any, bool]) -> Any:
        case, hit = pair
        if op == "GET /dlq" and isinstance(case.query, dict) and not case.query.get("agent"):
            # without an agent a page reads the dead-letter topics of every app on the shared broker: seconds each
            case.query["agent"] = agent
        if not hit:
            return case
        if "conversation_id" in (case.path_parameters or {}):
            case.path_parameters["conversation_id"] = cid
        if "agent" in (case.path_parameters or {}):
            case.path_parameters["agent"] = agent
        if isinstance(case.body, dict) and "agent_name" in case.body:
            case.body["agent_name"] = agent
        if op == "POST /dlq/requeue" and isinstance(case.body, dict):
            case.body["ref"] = ref
        if op == "GET /dlq/{ref}":
            case.path_parameters["ref"] = ref
        return case

    return st.tuples(strategy, st.booleans()).map(aim)


def _fuzz(schema: Any, base: str, agent: str, cid: str, ref: str) -> Run:
    run = Run()
    session = requests.Session()
    for result in schema.get_all_operations():
        operation = result.ok()
        op = f"{operation.method.upper()} {operation.path}"
        positive, negative = FEWER.get(op, EXAMPLES)
        timeout = STREAM_TIMEOUT_S if op.endswith("/events") else 30
        for mode, count in ((schemathesis.GenerationMode.POSITIVE, positive),
                            (schemathesis.GenerationMode.NEGATIVE, negative)):
            strategy = _steer(operation.as_strategy(generation_mode=mode), op, agent, cid, ref)
            _drive(strategy, count, functools.partial(_case, run, session, base, op=op, mode=mode, timeout=timeout))
    return run


def _drive(strategy: Any, count: int, one: Any) -> None:
    """``count`` cases drawn from ``strategy``, each sent by ``one``; a failed check is collected, never raised
    (no shrinking: the run goes on and reports every figure)."""

    @hypothesis.settings(max_examples=count, deadline=None, database=None, derandomize=True,
                         phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
                         suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(case=strategy)
    def send(case: Any) -> None:
        one(case)

    try:
        send()
    except hypothesis.errors.Unsatisfiable:
        pass  # negative cases of an operation that takes nothing (GET /healthz): there are none to make


def _case(run: Run, session: Any, base: str, case: Any, *, op: str, mode: Any, timeout: float) -> None:
    """A generated case sent with the write token; a valid one again with the read token (a mutation) or with
    none (a read), which must both be refused, unless the endpoint answers anyone."""
    _send(run, session, base, case, op=op, who="write", mode=mode, timeout=timeout)
    if mode == schemathesis.GenerationMode.POSITIVE:
        who = "read" if case.operation.method.upper() == "POST" else "none"
        _send(run, session, base, case, op=op, who=who, mode=mode, timeout=timeout)


def _send(run: Run, session: Any, base: str, case: Any, *, op: str, who: str, mode: Any, timeout: float) -> None:
    operation = case.operation
    headers = CREDENTIALS[who]
    start_ms = int(time.time() * 1000)
    response = case.call(base_url=base, session=session, headers=headers, timeout=timeout)
    end_ms = int(time.time() * 1000) + 1
    run.requests += 1
    run.by_operation[op] += 1
    run.seconds[op] += (end_ms - start_ms) / 1000
    run.by_status[response.status_code] += 1
    try:
        case.validate_response(response, checks=CHECKS, headers=headers)
    except (AssertionError, BaseExceptionGroup) as exc:  # a check failed: collected, the run goes on
        run.failures.append(f"{op} ({who}, {mode.value}): {str(exc)[:1500]}")
    if who != "write" and operation.path not in UNGUARDED and response.status_code != 401:
        run.failures.append(f"{op} with the {who} token answered {response.status_code}, not 401")
    if operation.method.upper() != "POST":
        return
    params = case.path_parameters or {}
    key = params.get(KEYS.get(operation.path, "conversation_id"))
    key = unquote(key) if isinstance(key, str) else None  # the case holds it as sent: percent-encoded
    if 400 <= response.status_code < 500:
        # a refused requeue must write nothing at all on the agent's topic
        run.refusals.append(Refusal(op, "*" if op == "POST /dlq/requeue" else key, start_ms, end_ms))
    elif 200 <= response.status_code < 300 and key is not None and op != "POST /conversations/{conversation_id}/token":
        run.accepted.add(key)


async def _records(topic: str, since: dict[int, int]) -> list[Any]:
    """The records of ``topic`` from the offsets ``since`` to its end now."""
    ends = await end_offsets(topic)
    consumer = AIOKafkaConsumer(bootstrap_servers=BOOTSTRAP, enable_auto_commit=False, group_id=None)
    await asyncio.wait_for(consumer.start(), 30)
    found: list[Any] = []
    try:
        parts = [TopicPartition(topic, p) for p, end in ends.items() if end > since.get(p, 0)]
        if not parts:
            return found
        consumer.assign(parts)
        for tp in parts:
            consumer.seek(tp, since.get(tp.partition, 0))
        deadline = time.monotonic() + 60
        while [tp for tp in parts if await consumer.position(tp) < ends[tp.partition]]:
            assert time.monotonic() < deadline, f"could not read {topic} to its end within 60 s"
            for records in (await consumer.getmany(timeout_ms=500)).values():
                found.extend(r for r in records if r.offset < ends[r.partition])
    finally:
        await consumer.stop()
    return found


def _written_by_refused(records: list[Any], refusals: list[Refusal], own_topic: str) -> list[str]:
    """The records written while a refused request asking for them was answered: by key (the decision's task, the
    job, the conversation), or any record on the agent's topic while a requeue was refused."""
    found = []
    for record in records:
        key = record.key.decode("utf-8", "replace") if record.key is not None else None
        for refusal in refusals:
            if not refusal.start_ms < record.timestamp <= refusal.end_ms:
                continue
            if refusal.key == key or (refusal.key == "*" and record.topic == own_topic):
                found.append(f"{record.topic}:{record.partition}:{record.offset} key {key!r} during refused "
                             f"{refusal.label}")
    return found


async def test_every_endpoint_holds_to_the_openapi_document_under_fuzzing(cluster_factory):
    agent = unique("fuzz")
    own = topics.task_topic(agent)
    await create_topics([own, f"{own}.dlq", topics.APPROVALS, topics.JOBS])
    c = cluster_factory([agent], None, AGENTS_STREAM_API_TOKEN=WRITE, AGENTS_STREAM_APPROVAL_SECRET=SECRET,
                        AGENTS_STREAM_CONVERSATION_SECRET=SECRET, AGENTS_STREAM_JOBS="0")
    worker = await c.started("a")
    base = f"http://127.0.0.1:{worker.web_port}"
    served = requests.get(f"{base}/openapi.json", timeout=10)
    assert served.status_code == 200 and served.json() == openapi.document(), "the served document is not the model's"

    # something to aim at: a conversation the agent answered, a dead letter (a record that is not a task)
    cid = unique("conv")
    posted = requests.post(f"{base}/conversations/{cid}/messages", json={"agent_name": agent, "text": "hello"},
                           headers={"Authorization": f"Bearer {WRITE}"}, timeout=30)
    assert posted.status_code == 202, posted.text
    poison = f"poison-{uuid.uuid4().hex[:8]}"
    await produce(own, [(poison.encode(), b"not json")])
    letters = await eventually(lambda: _dead_letters(base, agent), timeout=60, what="the poison record's dead letter")
    ref = letters[0]["ref"]

    watched = [own, topics.APPROVALS, topics.JOBS]
    before = {topic: await end_offsets(topic) for topic in watched}
    schema = schemathesis.openapi.from_dict(served.json())  # as the worker serves it (equal to the model's)
    # the orchestrator does not run here (it would read every test's jobs on the shared agent.jobs): no job view
    schema = schema.exclude(method="GET", path="/jobs/{job_id}")
    started = time.monotonic()
    run = await asyncio.to_thread(_fuzz, schema, base, agent, cid, ref)
    took = time.monotonic() - started
    written, keys = [], set()
    for topic in watched:
        records = await _records(topic, before[topic])
        keys |= {r.key.decode("utf-8", "replace") for r in records if r.key is not None}
        written += _written_by_refused(records, run.refusals, own)

    statuses = ", ".join(f"{code}: {n}" for code, n in sorted(run.by_status.items()))
    print(f"\nschemathesis {schemathesis.__version__}: {run.requests} requests to {len(run.by_operation)} operations "
          f"in {took:.0f} s; failures {len(run.failures)}; refused mutations {len(run.refusals)}, records written "
          f"by them {len(written)}; statuses {statuses}")
    for op, n in sorted(run.by_operation.items()):
        print(f"  {n:5d}  {run.seconds[op]:6.1f} s  {op}")
    documented = {f"{m.upper()} {p}" for p, ops in openapi.document()["paths"].items() for m in ops}
    assert set(run.by_operation) == documented - {"GET /jobs/{job_id}"}, "an operation was not fuzzed"
    assert run.requests >= 2000, f"only {run.requests} requests"
    assert not run.failures, f"{len(run.failures)} failures, the first ones:\n" + "\n\n".join(run.failures[:8])
    assert run.accepted and run.accepted <= keys, f"accepted but not read back: {sorted(run.accepted - keys)[:10]}"
    assert run.refusals and not written, "\n".join(written[:20])
    assert run.by_status[202] > 0 and run.by_status[401] > 0, statuses  # both sides of the guard were fuzzed


def _dead_letters(base: str, agent: str) -> list[dict[str, Any]]:
    page = requests.get(f"{base}/dlq?agent={agent}", headers={"Authorization": f"Bearer {READ_TOKEN}"}, timeout=30)
    return page.json().get("dead_letters", []) if page.status_code == 200 else []


def test_the_fuzz_audit_finds_a_record_written_for_a_refused_request() -> None:
    """The check itself can fail: a record of a refused request's key inside its window is found, one before it
    (an earlier accepted request's) and one of another key are not."""

    @dataclass
    class Rec:
        topic: str
        partition: int
        offset: int
        key: bytes | None
        timestamp: int

    refusals = [Refusal("POST /tasks/{task_id}/cancel", "t1", 1000, 1010),
                Refusal("POST /dlq/requeue", "*", 2000, 2010)]
    records = [Rec("agent.approvals", 0, 1, b"t1", 1005), Rec("agent.approvals", 0, 2, b"t1", 1000),
               Rec("agent.approvals", 0, 3, b"t2", 1005), Rec("own", 1, 4, b"x", 2003),
               Rec("other", 1, 5, b"x", 2003)]
    found = _written_by_refused(records, refusals, "own")
    assert [f.split(" ")[0] for f in found] == ["agent.approvals:0:1", "own:1:4"]

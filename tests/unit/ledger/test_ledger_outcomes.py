"""The ledger applies typed outcome and cache events: the TaskResult it stores and emits keeps today's bytes.

A task's stored result is re-emitted byte for byte on every redelivery, so its JSON is pinned here for each kind
of terminal outcome the executor sends (an answer, a cached answer, the partial result, a failure).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from agents_stream.tables import leases
from agents_stream.tables.definitions import Tables
from faust.types import TP

from agents_stream.contract import topics
from agents_stream.contract.events import (
    JOB_EVENTS,
    CacheLookup,
    CacheReply,
    CacheStore,
    Heartbeat,
    JobTaskResult,
    OutcomeEvent,
    decode,
    encode,
)
from agents_stream.contract.events import OUTCOMES as OUTCOMES_FAMILY
from agents_stream.contract.models import TaskPayload
from agents_stream.execution import run as outcome
from agents_stream.execution.run import Answer, Rejected, Run
from agents_stream.kafka.outbox import Outbox
from agents_stream.ledger import records as records_module
from agents_stream.ledger.cache import AnswerCache
from agents_stream.ledger.ledger import Ledger
from agents_stream.ops.notify import Notifier
from agents_stream.settings import Settings
from tests.unit.ledger_fakes import EVENT_TIMESTAMP, FaustEvent, NoRuns, Table, faust_event, recording_outbox

OUTCOMES = topics.outcomes_topic(Settings().app_id)
ANSWERS = topics.answers_topic(Settings().app_id)
AT = "2026-12-01T10:00:00.000Z"
AT_S = EVENT_TIMESTAMP  # AT in seconds since the epoch: the outcome record's Kafka timestamp
TASK = TaskPayload(task_id="t1", agent_name="a", instruction="Sum it up.", job_id="j1")



async def _no_lookup(dlq: str, source: tuple[str, int, int], since: float) -> None:
    raise AssertionError("a first dead letter looks nothing up")


def _outbox() -> tuple[Outbox, list[tuple[str, bytes | None]]]:
    """An outbox whose sends are kept as (topic, value) and confirmed at once."""
    return recording_outbox(_no_lookup)


def _event(tp: TP, offset: int, key: bytes, value: bytes, timestamp: float | None = AT_S) -> FaustEvent:
    return faust_event(tp, offset, key, value, timestamp=timestamp)


async def _spin() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def _run() -> Run:
    return Run(TASK, 1, "w2", calls=2, input_tokens=10, output_tokens=5, cost=0.25, route="easy: short ")


def _succeeded() -> OutcomeEvent:
    return outcome.succeeded(_run(), Answer({"n": 1}, "medium", "alternate:alt:alt-model"))


def _cached() -> OutcomeEvent:
    return outcome.succeeded(_run(), Answer("yesterday's", "low", "cache:t0"), cached_at=12.5)


def _partial() -> OutcomeEvent:
    return outcome.partial(_run())


def _failed() -> OutcomeEvent:
    return outcome.rejected(_run(), Rejected("invalid_output: no n", "the answer never matched", "primary:p"))


USAGE = '"usage":{"input_tokens":10,"output_tokens":5,"cost":0.25}'
RESULTS = [
    (_succeeded, '{"schema_version":1,"task_id":"t1","agent_name":"a","status":"succeeded","output":{"n":1},'
                 '"confidence":"medium","source":"alternate:alt:alt-model","partial":false,"attempts":1,'
                 f'{USAGE},"job_id":"j1","error":null,"completed_at":"{AT}"}}'),
    (_cached, '{"schema_version":1,"task_id":"t1","agent_name":"a","status":"succeeded","output":"yesterday\'s",'
              '"confidence":"low","source":"cache:t0","partial":false,"attempts":1,'
              f'{USAGE},"job_id":"j1","error":null,"completed_at":"{AT}"}}'),
    (_partial, '{"schema_version":1,"task_id":"t1","agent_name":"a","status":"partial","output":null,'
               '"confidence":"failed","source":"none","partial":true,"attempts":1,'
               f'{USAGE},"job_id":"j1","error":"every provider of the agent was unavailable","completed_at":"{AT}"}}'),
    (_failed, '{"schema_version":1,"task_id":"t1","agent_name":"a","status":"failed","output":null,'
              '"confidence":"failed","source":"primary:p","partial":false,"attempts":1,'
              f'{USAGE},"job_id":"j1","error":"the answer never matched","completed_at":"{AT}"}}'),
]


@pytest.mark.parametrize("make, expected", RESULTS, ids=["succeeded", "cached", "partial", "failed"])
async def test_a_terminal_outcome_stores_and_emits_the_result_of_today(
    make: Any, expected: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The outcome crosses the topic as its JSON; the ledger's TaskResult for it is today's, byte for byte (its
    completed_at is the outcome record's timestamp), and the job's fan-in carries the same result."""
    monkeypatch.setattr(records_module, "utcnow_iso", lambda: "never the wall clock")
    ledger, tasks, outbox, sent = _running_ledger()
    value = encode(make())
    tp = TP(OUTCOMES, 0)
    ledger.handle(_event(tp, 9, b"t1", value))
    await _spin()
    assert tasks["t1"]["result"] == expected
    assert [v for t, v in sent if t == topics.RESULTS] == [expected.encode()]
    fanned = [decode(v, JOB_EVENTS) for t, v in sent if t == topics.JOB_EVENTS]
    assert len(fanned) == 1 and isinstance(fanned[0], JobTaskResult)
    assert fanned[0].result.model_dump(mode="json") == json.loads(expected)


def _running_ledger() -> tuple[Ledger, Table, Outbox, list[tuple[str, bytes | None]]]:
    """A ledger whose table holds task t1 running under dispatch 1 (owner w2)."""
    outbox, sent = _outbox()
    tasks = Table()
    tables = Tables(tasks=tasks, answers=Table(), jobs=Table(), timers=Table())
    ledger = Ledger(
        Settings(), executor=NoRuns(), worker_id="w1", tables=tables, watermark=outbox.watermark,
        outbox=outbox, notifier=Notifier(),
    )
    record = leases.TaskRecord(
        state=leases.RUNNING, agent="a", dispatch=1, owner="w2", lease_until=1e12, payload=TASK.model_dump_json(),
        topic="agent.tasks.a", partition=0, offset=4, received_at=0.0,
    )
    tasks["t1"] = record.to_json()
    return ledger, tasks, outbox, sent


async def test_two_ledgers_that_apply_one_outcome_at_different_times_answer_with_the_same_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A partition's new owner and an old one that has not yet noticed it lost it both apply the same outcome
    record: the results they send are one result (a duplicate of the same bytes), whatever their clocks say."""
    clock = iter(["2026-12-01T10:00:01.000Z", "2026-12-01T10:00:09.000Z"])
    monkeypatch.setattr(records_module, "utcnow_iso", lambda: next(clock))
    value = encode(_succeeded())
    results = []
    for _ in range(2):
        ledger, _, _, sent = _running_ledger()
        ledger.handle(_event(TP(OUTCOMES, 0), 9, b"t1", value))
        await _spin()
        results += [v for t, v in sent if t == topics.RESULTS]
    assert len(results) == 2 and results[0] == results[1]
    assert json.loads(results[0])["completed_at"] == AT


async def test_an_outcome_record_without_a_timestamp_completes_at_the_time_it_is_applied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(records_module, "utcnow_iso", lambda: "2026-12-01T11:11:11.111Z")
    ledger, tasks, _, _ = _running_ledger()
    ledger.handle(_event(TP(OUTCOMES, 0), 9, b"t1", encode(_succeeded()), timestamp=None))
    await _spin()
    assert json.loads(tasks["t1"]["result"])["completed_at"] == "2026-12-01T11:11:11.111Z"


async def test_a_heartbeat_read_late_extends_the_lease_from_when_it_was_sent() -> None:
    """A partition's new owner reads a dead worker's last heartbeats after the rebalance: they must not give the
    dead worker's lease a fresh full length (its tasks would wait that much longer to be taken over)."""
    ledger, tasks, _, _ = _running_ledger()
    tasks["t1"] = {**tasks["t1"], "lease_until": time.time() - 5}  # lapsing: a beat of 20 s ago is older still
    sent_at = time.time() - 20
    beat = encode(Heartbeat(worker="w2", dispatch=1, owner="w2"))
    ledger.handle(_event(TP(OUTCOMES, 0), 9, b"t1", beat, timestamp=sent_at))
    await _spin()
    lease_until = tasks["t1"]["lease_until"]
    ttl = Settings().lease_ttl_s
    assert lease_until <= sent_at + ttl + 0.01, f"the lease was renewed from the time it was read: {lease_until}"
    assert lease_until >= sent_at + ttl - 0.01, "a heartbeat sent in the lease's last third renews it"


async def test_the_cache_stores_a_good_answer_and_replies_to_a_lookup_with_it() -> None:
    """A store keeps the five fields of the answer; a lookup gets them back as a cache reply to its task, and an
    entry no store wrote is answered as a miss (not an error inside the ledger)."""
    outbox, sent = _outbox()
    answers = Table()
    cache = AnswerCache(answers, outbox, answers_topic=ANSWERS, outcomes_topic=OUTCOMES, worker_id="w1", agents={"a"})
    tp = TP(ANSWERS, 3)
    store = CacheStore(task_id="t0", output={"n": 1}, source="primary:p:p-model", confidence="high", at=2.5)
    cache.on_event(tp, 0, b"fp", encode(store))
    assert answers["fp"] == '{"task_id": "t0", "output": {"n": 1}, "source": "primary:p:p-model", ' \
        '"confidence": "high", "at": 2.5}'
    cache.on_event(tp, 1, b"fp", encode(CacheLookup(task_id="t1", dispatch=2)))
    answers["bad"] = '{"task_id": "t0"}'
    cache.on_event(tp, 2, b"bad", encode(CacheLookup(task_id="t2", dispatch=1)))
    cache.on_event(tp, 3, b"none", encode(CacheLookup(task_id="t3", dispatch=1)))
    await _spin()
    replies = [decode(v, OUTCOMES_FAMILY) for t, v in sent if t == OUTCOMES]
    assert replies == [
        CacheReply(dispatch=2, worker="w1", answer=store.answer()),
        CacheReply(dispatch=1, worker="w1", answer=None),
        CacheReply(dispatch=1, worker="w1", answer=None),
    ]

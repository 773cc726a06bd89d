"""A malformed or mistyped record of an internal topic is skipped with an alert and never holds its partition's commit;
what the circuits log says about Retry-After, presence and spend stays bounded.

docs/decisions.md, "Internal topics cannot stall a partition".
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from agents_stream.tables import leases
from agents_stream.tables.definitions import Tables
from faust.types import TP

from agents_stream.contract import topics
from agents_stream.contract.events import CIRCUITS, EventDecodeError, decode
from agents_stream.contract.jsonsafe import MAX_ANSWER_DEPTH, MAX_DEPTH
from agents_stream.contract.models import TaskPayload
from agents_stream.execution.outputs import FormatError, OutputSpec
from agents_stream.kafka.outbox import Outbox
from agents_stream.ledger.ledger import Ledger
from agents_stream.ledger.spend import add_spend, spend_key
from agents_stream.ops.notify import Notifier
from agents_stream.orchestrator import Orchestrator
from agents_stream.resilience.circuits import MAX_RETRY_AFTER_S
from agents_stream.resilience.presence import MAX_WORKERS, Presence
from agents_stream.settings import Settings
from tests.unit.ledger_fakes import FakeRuns, Table, faust_event, recording_outbox

SETTINGS = Settings()
OUTCOMES = topics.outcomes_topic(SETTINGS.app_id)
ANSWERS = topics.answers_topic(SETTINGS.app_id)
TASK = TaskPayload(task_id="t1", agent_name="a", instruction="Sum it up.", job_id="j1")
NOON = 1_795_953_600.0  # 2026-11-29 12:00 UTC



def outbox() -> tuple[Outbox, list[tuple[str, bytes | None]]]:
    """An outbox whose sends are kept as (topic, value) and confirmed at once."""
    return recording_outbox()


def ledger() -> tuple[Ledger, Outbox, list[tuple[str, bytes | None]]]:
    box, sent = outbox()
    tasks = Table()
    tables = Tables(tasks=tasks, answers=Table(), jobs=Table(), timers=Table())
    record = leases.TaskRecord(
        state=leases.RUNNING, agent="a", dispatch=1, owner="w2", lease_until=1e12, payload=TASK.model_dump_json(),
        topic="agent.tasks.a", partition=0, offset=4, received_at=0.0,
    )
    tasks["t1"] = record.to_json()
    led = Ledger(
        SETTINGS, executor=FakeRuns(), worker_id="w1", tables=tables, watermark=box.watermark,
        outbox=box, notifier=Notifier(), orchestrator=Orchestrator(box, tables, ["a"], SETTINGS),
    )
    return led, box, sent


def deep(n: int) -> str:
    return "[" * n + "]" * n


SUCCEEDED = (
    '{"schema_version":1,"kind":"succeeded","worker":"w2","dispatch":1,"calls":1,'
    '"usage":{"input_tokens":1,"output_tokens":1,"cost":%s},"route":null,"status":"succeeded","output":%s,'
    '"confidence":"high","source":"p","partial":false}'
)
STORE = '{"schema_version":1,"kind":"store","task_id":"t1","source":"p","confidence":"high","at":1.0,"output":%s}'
FANNED = '{"schema_version":1,"kind":"result","result":{"task_id":"j1/a","status":"succeeded","output":%s}}'
BAD = [
    (OUTCOMES, b"t1", SUCCEEDED % ("0.1", deep(300))),  # deeper than the result can be written: held on main
    (OUTCOMES, b"t1", SUCCEEDED % ("0.1", deep(900))),
    (OUTCOMES, b"t1", SUCCEEDED % ("NaN", "1")),  # a NaN cost would make the day's spend NaN
    (OUTCOMES, b"t1", SUCCEEDED % ("1e400", "1")),  # overflows to Infinity
    (OUTCOMES, b"t1", (SUCCEEDED % ("0.1", '"x"')).replace('"dispatch":1', '"dispatch":"1"')),  # a mistyped field
    (OUTCOMES, b"t1", '{"schema_version":1,"kind":"step","worker":"w2","dispatch":1,"index":0,"output":%s}'
     % deep(400)),
    (ANSWERS, b"fp", STORE % deep(300)),  # the cached answer could not be written: held on main
    (ANSWERS, b"fp", STORE % "Infinity"),
    (topics.JOB_EVENTS, b"j1", FANNED % deep(300)),
    (topics.APPROVALS, b"t1", '{"task_id":"t1","decision":"approve","by":"x","comment":%s}' % deep(300)),
    (topics.JOBS, b"j1", '{"job_id":"j1","plan":%s}' % deep(300)),
]


@pytest.mark.parametrize("topic, key, value", BAD, ids=[f"{t}-{i}" for i, (t, _, _) in enumerate(BAD)])
async def test_a_bad_internal_record_is_skipped_and_its_offset_is_committed(topic: str, key: bytes, value: str) -> None:
    """Deep nesting, NaN or Infinity, a wrong type: the record changes nothing, and the commit passes it."""
    led, box, sent = ledger()
    tp = TP(topic, 0)
    before = dict(led.table)
    led.handle(faust_event(tp, 9, key, value.encode()))
    for _ in range(10):
        await asyncio.sleep(0)
    assert box.watermark.open_count(tp) == 0
    assert box.watermark.commit_offset(tp) == 10
    assert dict(led.table) == before
    assert not [v for t, v in sent if t == topics.RESULTS]


async def test_a_record_an_internal_topic_cannot_apply_is_skipped_with_an_alert(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever makes the ledger fail on a record of an internal topic (here a bug), it is skipped with an alert,
    and the commit passes it: only a task's offset is held (a restart reads the task again)."""
    led, box, sent = ledger()

    def broken(*args: Any) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(led.cache, "on_event", broken)
    tp = TP(ANSWERS, 2)
    led.handle(faust_event(tp, 5, b"fp", (STORE % "1").encode()))
    for _ in range(10):
        await asyncio.sleep(0)
    assert box.watermark.commit_offset(tp) == 6
    alerts = [json.loads(v or b"{}") for t, v in sent if t == topics.CONTROL]
    assert [a["event"] for a in alerts] == ["alert.internal_record_skipped"]
    assert "a bug" in alerts[0]["details"]["error"]


def test_a_record_nested_deeper_than_the_limit_is_no_event() -> None:
    """The limit is the whole record's nesting, said in the reason."""
    hello = '{"v":1,"id":"i","kind":"hello","worker":"w","at":1.0,"spend":{"a":{"d":{"0":1.0}}},"x":%s}'
    decode(hello % deep(MAX_DEPTH - 2), CIRCUITS)
    with pytest.raises(EventDecodeError, match=f"nested deeper than {MAX_DEPTH} levels"):
        decode(hello % deep(MAX_DEPTH), CIRCUITS)


def test_presence_forgets_quiet_workers_and_keeps_a_bounded_number() -> None:
    """A worker not heard from within the horizon is dropped (not only ignored), a presence dated ahead counts from
    now, and a flood of invented workers keeps the most recent MAX_WORKERS."""
    p = Presence(horizon_s=15.0)
    p.hello("old", NOON - 10, ["e"], "app", {}, now=NOON - 10)
    p.hello("ahead", NOON + 1e9, ["e"], "app", {}, now=NOON)
    assert p.live("e", "me", NOON) == 3
    p.hello("w", NOON + 20, ["e"], "app", {}, now=NOON + 20)
    assert "old" not in p.workers and "ahead" not in p.workers
    for i in range(MAX_WORKERS + 50):
        p.hello(f"forged-{i}", NOON + 21, ["e"], "app", {}, now=NOON + 21)
    assert len(p.workers) == MAX_WORKERS
    assert f"forged-{MAX_WORKERS + 49}" in p.workers and "w" not in p.workers


def test_presence_keeps_spend_of_today_and_yesterday_only() -> None:
    """Spend reports of other days, negative or non-finite amounts are not kept; a new day drops the day before
    yesterday."""
    p = Presence(horizon_s=15.0)
    spend = {"a": {"2026-11-29": {"0": 1.5}, "2026-11-28": {"0": 2.0}, "2026-11-27": {"0": 4.0},
                   "1999-01-01": {"0": 8.0}}, "b": {"2026-11-29": {"0": -3.0, "1": float("nan")}}}
    p.hello("w", NOON, [], "app", spend, now=NOON)
    assert {k[2] for k in p.spent} == {"2026-11-29", "2026-11-28"}
    assert p.spend("app", "a", "2026-11-29") == 1.5 and p.spend("app", "b", "2026-11-29") == 0
    p.hello("w", NOON + 86_400, [], "app", {}, now=NOON + 86_400)
    assert {k[2] for k in p.spent} == {"2026-11-29"}


async def test_a_forged_retry_after_keeps_a_provider_shut_at_most_the_bound() -> None:
    """A Retry-After of a year (or an ``until`` a year ahead) on the log shuts the provider for MAX_RETRY_AFTER_S."""
    from tests.unit.resilience.test_circuits import Cluster, raw

    for fields in ({"retry_after": 3e7, "until": 1000.0 + 3e7}, {"until": 1000.0 + 3e7}):
        cl = Cluster(1)
        cl.log.send(b"k", raw("rate_limited", provider=cl.workers[0].describe()["p"]["endpoint"], **fields))
        cl.pump()
        ok, until = cl.workers[0].available("p")
        assert not ok and until == pytest.approx(1000.0 + MAX_RETRY_AFTER_S)


async def test_the_first_cost_of_a_day_deletes_the_spend_of_older_days() -> None:
    """The task table keeps an agent's spend of today and yesterday per partition, not one key per day forever;
    a cost that is no amount adds nothing."""
    box, sent = outbox()
    table = Table()
    tp = TP("agent.tasks.a", 3)
    day = 86_400
    for back in (5, 2, 1):
        add_spend(table, box, tp, "a", 1.0, NOON - back * day)
    assert spend_key("a", "2026-11-24", 3) not in table  # deleted when 2026-11-27 began
    assert set(table) == {spend_key("a", d, 3) for d in ("2026-11-27", "2026-11-28")}
    sends = add_spend(table, box, tp, "a", 1.0, NOON)
    assert len(sends) == 2  # today's write and the delete of 2026-11-27
    assert set(table) == {spend_key("a", d, 3) for d in ("2026-11-28", "2026-11-29")}
    assert add_spend(table, box, tp, "a", float("nan"), NOON) == []
    assert json.loads(table[spend_key("a", "2026-11-29", 3)])["usd"] == 1.0


def test_an_answer_nested_deeper_than_the_ledger_keeps_is_a_format_error() -> None:
    """A provider's answer nested deeper than MAX_ANSWER_DEPTH is refused where it is parsed (a format retry, then
    invalid_output), instead of an outcome the ledger must skip."""
    spec = OutputSpec.from_schema({"type": "array"})
    assert spec.check(deep(MAX_ANSWER_DEPTH)) is not None
    with pytest.raises(FormatError, match=f"nested deeper than {MAX_ANSWER_DEPTH} levels"):
        spec.check(deep(MAX_ANSWER_DEPTH + 1))

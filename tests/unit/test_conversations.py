"""Conversations: the message contract, a round's task id, the state machine (tables/conversations.py) and the
ledger's part (ledger/conversations.py) — one reply per message, double texting, history, crashes replayed."""

from __future__ import annotations

import json
from typing import Any

import pytest
from agents_stream.tables import conversations as machine
from agents_stream.tables.conversation_events import CONTENT_CHARS, round_events
from agents_stream.tables.conversations import ConversationRecord
from agents_stream.tables.leases import TaskRecord

from agents_stream.config import AgentConfig
from agents_stream.contract import topics
from agents_stream.contract.conversations import (
    ConversationMessage,
    conversation_of,
    message_digest,
    message_from,
    round_task_id,
)
from agents_stream.contract.errors import PoisonMessage
from agents_stream.contract.events import TaskFailed, TaskSucceeded, Usage, encode
from agents_stream.contract.models import decode_record, parse_task
from agents_stream.execution.history import earlier_turns, with_history
from agents_stream.providers.conversation import AssistantTurn, UserText
from agents_stream.settings import Settings
from tests.unit.ledger_fakes import LedgerWorld

AGENT = "support"
TASKS = topics.task_topic(AGENT)
OUTCOMES = topics.outcomes_topic(Settings().app_id)


def _message(text: str, message_id: str, conversation: str = "c-1", agent: str = AGENT, **extra: Any) -> bytes:
    body = {"conversation_id": conversation, "message_id": message_id, "agent_name": agent, "text": text, **extra}
    return json.dumps(body).encode()


def _entry(message_id: str, text: str = "hi", digest: str | None = None) -> dict[str, Any]:
    return {"id": message_id, "digest": digest or f"d-{text}", "text": text, "user": None, "context": {}}


# -- the contract ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("partitions", [1, 3, 12, 48])
def test_a_round_lands_on_its_conversations_partition_and_names_it(partitions: int) -> None:
    for cid in ["c-1", "support/42", "x#y", "ünïcode", "a" * 200]:
        home = topics.partition_for(cid.encode(), partitions)
        for number in (1, 2, 17):
            task_id = round_task_id(cid, number, partitions)
            assert topics.partition_for(task_id.encode(), partitions) == home
            assert conversation_of(task_id) == (cid, number)
            assert round_task_id(cid, number, partitions) == task_id  # every worker derives the same id
            assert conversation_of(f"{task_id}/call_1") is None  # a round's sub-task is no round


def test_a_producer_cannot_send_a_run() -> None:
    forged = {"task_id": "conv:c-1#1", "agent_name": AGENT, "instruction": "refund everything"}
    with pytest.raises(PoisonMessage) as exc:
        parse_task(json.dumps(forged).encode(), agent=AGENT, max_bytes=10_000)
    assert exc.value.reason == "reserved_task_id"
    carried = {"task_id": "t-1", "agent_name": AGENT, "instruction": "x",
               "conversation": {"conversation_id": "c", "message_ids": ["m"], "history": []}}
    with pytest.raises(PoisonMessage) as exc:
        parse_task(json.dumps(carried).encode(), agent=AGENT, max_bytes=10_000)
    assert exc.value.reason == "reserved_task_id"


@pytest.mark.parametrize("body, reason", [
    ({"conversation_id": "c", "message_id": "m", "agent_name": AGENT}, "schema_violation"),  # no text
    ({"conversation_id": "c", "message_id": "m", "agent_name": AGENT, "text": ""}, "schema_violation"),
    ({"conversation_id": "c\n", "message_id": "m", "agent_name": AGENT, "text": "x"}, "schema_violation"),
    ({"conversation_id": "c", "message_id": "m", "agent_name": AGENT, "text": 5}, "schema_violation"),
    ({"conversation_id": "c", "message_id": "m", "agent_name": "billing", "text": "x"}, "agent_mismatch"),
    ({"conversation_id": "c" * 201, "message_id": "m", "agent_name": AGENT, "text": "x"}, "schema_violation"),
])
def test_a_bad_message_has_its_reason(body: dict[str, Any], reason: str) -> None:
    text, _ = decode_record(json.dumps(body).encode(), 10_000)
    with pytest.raises(PoisonMessage) as exc:
        message_from(text, agent=AGENT)
    assert exc.value.reason == reason


def test_the_same_message_has_one_digest_and_another_text_another() -> None:
    a = ConversationMessage(conversation_id="c", message_id="m", agent_name=AGENT, text="refund me")
    b = ConversationMessage.model_validate_json(_message("refund me", "m", "c"))
    assert message_digest(a) == message_digest(b)
    assert message_digest(a) != message_digest(a.model_copy(update={"text": "refund me twice"}))


# -- the state machine ---------------------------------------------------------------------------------------------

def test_a_first_message_starts_round_one_and_its_end_is_the_reply() -> None:
    record, effects = machine.receive(None, agent=AGENT, message=_entry("m1"), policy="enqueue", now=1.0)
    assert record is not None and record.answering == 1 and effects == [machine.StartRound(1, ("m1",))]
    ended, effects = machine.round_ended(record, number=1, status="succeeded", text="Refunded.", task_id="t",
                                         error=None, completed_at=2.0, now=2.0)
    assert ended is not None and ended.status == "idle"
    assert [type(e) for e in effects] == [machine.SendReply]
    assert effects[0].reply["message_ids"] == ["m1"] and effects[0].reply["text"] == "Refunded."  # type: ignore[union-attr]
    again, effects = machine.round_ended(ended, number=1, status="succeeded", text="x", task_id="t", error=None,
                                       completed_at=3.0, now=3.0)
    assert again is ended and effects == []  # a redelivered end changes nothing


def test_a_message_sent_again_gets_its_one_reply_and_another_text_under_its_id_is_refused() -> None:
    record, _ = machine.receive(None, agent=AGENT, message=_entry("m1", "a"), policy="enqueue", now=1.0)
    same, effects = machine.receive(record, agent=AGENT, message=_entry("m1", "a"), policy="enqueue", now=1.5)
    assert same is record and effects == [machine.StartRound(1, ("m1",))]  # its round again, idempotent
    done, _ = machine.round_ended(record, number=1, status="succeeded", text="A", task_id="t", error=None,
                                completed_at=2.0, now=2.0)
    assert done is not None
    again, effects = machine.receive(done, agent=AGENT, message=_entry("m1", "a"), policy="enqueue", now=3.0)
    assert again is done and [e.reply["text"] for e in effects] == ["A"]  # type: ignore[union-attr]
    conflict, effects = machine.receive(done, agent=AGENT, message=_entry("m1", "b"), policy="enqueue", now=3.0)
    assert conflict is done and effects == [
        machine.Refuse("message_conflict", "message_id 'm1' was sent before with other content"),
    ]
    other, effects = machine.receive(done, agent="billing", message=_entry("m9"), policy="enqueue", now=3.0)
    assert other is done and [e.reason for e in effects] == ["conversation_agent_mismatch"]  # type: ignore[union-attr]


def test_enqueued_messages_are_answered_together_by_the_next_round_which_sees_the_history() -> None:
    record, _ = machine.receive(None, agent=AGENT, message=_entry("m1", "my package never came"),
                                policy="enqueue", now=1.0)
    for i, text in [(2, "order 7"), (3, "and order 9")]:
        record, effects = machine.receive(record, agent=AGENT, message=_entry(f"m{i}", text), policy="enqueue",
                                          now=1.0 + i)
        assert effects == [] and record is not None and record.answering == 1
    record, effects = machine.round_ended(record, number=1, status="succeeded", text="Refunded order 7?", task_id="t1",
                                        error=None, completed_at=5.0, now=5.0)
    assert effects[1:] == [machine.StartRound(2, ("m2", "m3"))]
    assert record is not None and [m["text"] for m in machine.round_messages(record, 2)] == ["order 7", "and order 9"]
    assert machine.history(record, 20) == [
        {"role": "customer", "text": "my package never came"}, {"role": "agent", "text": "Refunded order 7?"},
    ]
    assert machine.history(record, 1) == [{"role": "agent", "text": "Refunded order 7?"}]
    assert machine.history(record, 0) == []


def test_a_rejected_message_is_answered_at_once_and_stays_in_the_history() -> None:
    record, _ = machine.receive(None, agent=AGENT, message=_entry("m1", "first"), policy="reject", now=1.0)
    record, effects = machine.receive(record, agent=AGENT, message=_entry("m2", "second"), policy="reject", now=2.0)
    assert [e.reply["status"] for e in effects] == ["rejected"]  # type: ignore[union-attr]
    assert record is not None and record.answering == 1
    record, effects = machine.round_ended(record, number=1, status="succeeded", text="done", task_id="t1", error=None,
                                        completed_at=3.0, now=3.0)
    assert [type(e) for e in effects] == [machine.SendReply]  # nothing waits: no second round
    assert effects[0].reply["message_ids"] == ["m1"]  # type: ignore[union-attr]
    assert [h["text"] for h in machine.history(record, 20)] == ["first", "done", "second", machine.REJECTED_TEXT]


def test_the_record_survives_its_json() -> None:
    record, _ = machine.receive(None, agent=AGENT, message=_entry("m1"), policy="enqueue", now=1.0)
    assert record is not None
    assert ConversationRecord.from_json(json.loads(json.dumps(record.to_json()))) == record


def test_history_becomes_earlier_turns_and_a_prompts_preamble() -> None:
    world = LedgerWorld(Settings(partitions=1))
    world.ledger.conversations.agents = {AGENT: AgentConfig(providers=["p"])}
    record, _ = machine.receive(None, agent=AGENT, message=_entry("m1", "where is it?"), policy="enqueue", now=1.0)
    assert record is not None
    record, _ = machine.round_ended(record, number=1, status="succeeded", text="Lost; refunded.", task_id="t",
                                  error=None, completed_at=2.0, now=2.0)
    record, effects = machine.receive(record, agent=AGENT, message=_entry("m2", "and the other?"), policy="enqueue",
                                      now=3.0)
    assert record is not None
    task = world.ledger.conversations.round_task("c-1", record, effects[0])  # type: ignore[arg-type]
    assert task.instruction == "and the other?" and conversation_of(task.task_id) == ("c-1", 2)
    assert earlier_turns(task) == [UserText("where is it?"), AssistantTurn("Lost; refunded.")]
    assert with_history(task, task.instruction).endswith("Customer: where is it?\nYou: Lost; refunded.\n\n"
                                                          "The customer's new message:\nand the other?")


# -- the ledger ------------------------------------------------------------------------------------------------------

def _succeeded(output: Any, dispatch: int = 1) -> bytes:
    return encode(TaskSucceeded(
        worker="w1", dispatch=dispatch, calls=1, usage=Usage(), route=None, status="succeeded", output=output,
        confidence="high", source="primary:p:m", partial=False,
    ))


def _world(policy: str = "enqueue") -> LedgerWorld:
    return LedgerWorld(Settings(partitions=1), configs={AGENT: AgentConfig(providers=["p"], double_texting=policy)})


def _replies(world: LedgerWorld) -> list[dict[str, Any]]:
    return [json.loads(v) for v in world.on(topics.REPLIES) if v is not None]


async def test_two_messages_two_rounds_one_reply_each_and_the_second_round_knows_the_first() -> None:
    world = _world()
    await world.deliver(TASKS, b"c-1", _message("my package never came, refund me", "m1"))
    round1 = round_task_id("c-1", 1, 1)
    assert [d[0] for d in world.dispatched] == [round1]
    await world.deliver(TASKS, b"c-1", _message("and order 9 too?", "m2"))  # mid-round: enqueued
    await world.deliver(TASKS, b"c-1", _message("my package never came, refund me", "m1"))  # a double click
    assert [d[0] for d in world.dispatched] == [round1] and _replies(world) == []
    await world.deliver(OUTCOMES, round1.encode(), _succeeded("Refunded order 7."))
    round2 = round_task_id("c-1", 2, 1)
    assert [d[0] for d in world.dispatched] == [round1, round2]
    assert [(r["message_ids"], r["text"]) for r in _replies(world)] == [(["m1"], "Refunded order 7.")]
    second = world.payloads[round2]
    assert second.instruction == "and order 9 too?"
    assert [h.text for h in second.conversation.history] == [  # type: ignore[union-attr]
        "my package never came, refund me", "Refunded order 7.",
    ]
    await world.deliver(OUTCOMES, round2.encode(), _succeeded("Order 9 refunded too."))
    await world.deliver(OUTCOMES, round2.encode(), _succeeded("Order 9 refunded too."))  # redelivered
    await world.deliver(TASKS, b"c-1", _message("and order 9 too?", "m2"))  # sent again after its reply
    assert [(r["message_ids"], r["round"]) for r in _replies(world)] == [(["m1"], 1), (["m2"], 2), (["m2"], 2)]
    assert _replies(world)[1] == _replies(world)[2]  # the same reply, byte for byte
    assert len(world.dispatched) == 2
    assert ConversationRecord.from_json(world.conversations["c-1"]).status == "idle"


async def test_a_failed_round_is_a_reply_that_says_so() -> None:
    world = _world()
    await world.deliver(TASKS, b"c-1", _message("refund me", "m1"))
    round1 = round_task_id("c-1", 1, 1)
    failed = encode(TaskFailed(worker="w1", dispatch=1, calls=1, usage=Usage(), route=None, reason="downstream",
                               error="refused", source="primary:p:m"))
    await world.deliver(OUTCOMES, round1.encode(), failed)
    (reply,) = _replies(world)
    assert reply["status"] == "failed" and reply["text"] and reply["error"]


async def test_bad_messages_are_dead_lettered_and_the_conversation_goes_on() -> None:
    world = _world()
    await world.deliver(TASKS, b"c-1", _message("refund me", "m1"))
    await world.deliver(TASKS, b"c-1", _message("refund me twice", "m1"))  # the id reused with other text
    await world.deliver(TASKS, b"c-1", _message("hi", "m3", agent="billing"))  # another agent on this topic
    await world.deliver(TASKS, b"c-1", b'{"conversation_id": "c-1", "message_id": "m4"}')  # no agent, no text
    requests = [(k, v) for t, k, v, _ in world.sent if t == OUTCOMES]  # each asks the partition's ledger first
    for key, value in requests:
        await world.deliver(OUTCOMES, key, value)  # type: ignore[arg-type]
    dlq = topics.dlq_topic(AGENT)
    reasons = [dict(h)["error_reason"] for t, _, _, h in world.sent if t == dlq]
    assert [r.decode().split(":")[0] for r in reasons] == ["message_conflict", "agent_mismatch", "schema_violation"]
    round1 = round_task_id("c-1", 1, 1)
    await world.deliver(OUTCOMES, round1.encode(), _succeeded("Refunded."))
    await world.deliver(TASKS, b"c-1", _message("thanks", "m5"))
    assert [d[0] for d in world.dispatched] == [round1, round_task_id("c-1", 2, 1)]


async def test_a_crash_before_the_rounds_record_was_written_makes_the_round_again() -> None:
    world = _world()
    await world.deliver(TASKS, b"c-1", _message("refund me", "m1"))
    round1 = round_task_id("c-1", 1, 1)
    del world.tasks[round1]  # the conversation's write landed, the round's did not; the message comes again
    world.dispatched.clear()
    await world.deliver(TASKS, b"c-1", _message("refund me", "m1"))
    assert [d[0] for d in world.dispatched] == [round1]


# -- the event stream -------------------------------------------------------------------------------------------------

def _task(state: str = "running", dispatch: int = 1, steps: list[Any] | None = None) -> TaskRecord:
    return TaskRecord(state=state, agent=AGENT, dispatch=dispatch, owner="w1", lease_until=0.0, payload="{}",
                      topic=TASKS, partition=0, offset=0, received_at=0.0,
                      steps_done=json.dumps(steps) if steps is not None else None)


def test_a_rounds_events_are_its_dispatches_turns_tool_results_and_waits_each_named_once() -> None:
    turn = {"kind": "turn", "turn": 0, "text": "", "calls": [{"id": "c1", "name": "refund", "arguments": {"a": 1}}]}
    tool = {"kind": "tool", "turn": 0, "id": "c1", "name": "refund", "content": "x" * (CONTENT_CHARS + 5),
            "error": False}
    started = round_events(2, None, _task())
    assert [(e["id"], e["kind"]) for e in started] == [("round:2:dispatch:1", "dispatched")]
    acted = round_events(2, _task(), _task(steps=[turn, tool]))
    assert [e["id"] for e in acted] == ["round:2:turn:0", "round:2:tool:0:c1"]
    assert acted[0]["data"]["tool_calls"] == [{"id": "c1", "name": "refund", "arguments": {"a": 1}}]
    assert acted[1]["data"]["cut"] and len(acted[1]["data"]["content"]) == CONTENT_CHARS
    parked = round_events(2, _task(steps=[turn]), _task(state="awaiting_approval", steps=[turn]))
    assert [e["kind"] for e in parked] == ["waiting_for_approval"]
    again = round_events(2, _task(steps=[turn]), _task(dispatch=2, steps=[turn]))
    assert [e["id"] for e in again] == ["round:2:dispatch:2"]  # a re-dispatch: its journal is not shown again
    assert round_events(2, _task(), _task()) == []


async def test_the_ledger_sends_a_conversations_events_with_its_transitions() -> None:
    world = _world("reject")
    await world.deliver(TASKS, b"c-1", _message("refund me", "m1"))
    await world.deliver(TASKS, b"c-1", _message("hello?", "m2"))  # rejected: a round answers m1
    round1 = round_task_id("c-1", 1, 1)
    await world.deliver(OUTCOMES, round1.encode(), _succeeded("Refunded."))
    events = [json.loads(v) for v in world.on(topics.CONVERSATION_EVENTS) if v is not None]
    assert [e["id"] for e in events] == [
        "message:m1", "round:1:started", "round:1:dispatch:1", "message:m2", "reply:1:m2", "reply:1",
    ]
    assert all(e["conversation_id"] == "c-1" for e in events)

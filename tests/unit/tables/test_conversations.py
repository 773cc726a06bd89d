"""Conversations: the message contract, a round's task id, the state machine (tables/conversations.py) and the
ledger's part (ledger/conversation_rounds.py) — one reply per message, double texting, history, crashes replayed."""

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
from agents_stream.contract.conversation_messages import (
    ConversationMessage,
    conversation_of,
    message_digest,
    message_from,
    round_of,
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
            task_id = round_task_id(cid, number, partitions, 42)
            assert topics.partition_for(task_id.encode(), partitions) == home
            assert conversation_of(task_id) == (cid, number) and round_of(task_id) == (cid, 42, number)
            assert round_task_id(cid, number, partitions, 42) == task_id  # every worker derives the same id
            assert round_task_id(cid, number, partitions, 43) != task_id  # a conversation begun again: other ids
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
    text, data = decode_record(json.dumps(body).encode(), 10_000)
    with pytest.raises(PoisonMessage) as exc:
        message_from(text, data, agent=AGENT)
    assert exc.value.reason == reason


def test_the_same_message_has_one_digest_and_another_text_another() -> None:
    a = ConversationMessage(conversation_id="c", message_id="m", agent_name=AGENT, text="refund me")
    b = ConversationMessage.model_validate_json(_message("refund me", "m", "c"))
    assert message_digest(a) == message_digest(b)
    assert message_digest(a) != message_digest(a.model_copy(update={"text": "refund me twice"}))


# -- the state machine ---------------------------------------------------------------------------------------------

class Store:
    """A conversation's keys as the ledger keeps them: each Change applied."""

    def __init__(self) -> None:
        self.keys: dict[str, Any] = {}

    @property
    def head(self) -> ConversationRecord | None:
        data = self.keys.get("c-1")
        return ConversationRecord.from_json(data) if data else None

    def apply(self, change: machine.Change) -> machine.Change:
        for key, value in change.writes.items():
            self.keys[key] = json.loads(json.dumps(value))  # through JSON, as the changelog carries it
        if change.head is not None:
            self.keys["c-1"] = json.loads(json.dumps(change.head.to_json()))
        return change

    def receive(self, message_id: str, text: str = "hi", policy: str = "enqueue", agent: str = AGENT,
                digest: str | None = None, now: float = 1.0) -> machine.Change:
        return self.apply(machine.receive(self.head, self.keys.get, cid="c-1", agent=agent,
                                          message=_entry(message_id, text, digest), policy=policy, now=now, offset=0))

    def end(self, number: int, text: str, now: float = 2.0, status: str = "succeeded") -> machine.Change:
        end = machine.RoundEnd(since=0, number=number, status=status, text=text, task_id=f"t{number}", error=None,
                               completed_at=now)
        return self.apply(machine.round_ended(self.head, self.keys.get, end, cid="c-1", now=now))


def _replies_of(change: machine.Change) -> list[dict[str, Any]]:
    return [e.reply for e in change.effects if isinstance(e, machine.SendReply)]


def test_a_first_message_starts_round_one_and_its_end_is_the_reply() -> None:
    store = Store()
    change = store.receive("m1")
    assert change.effects == [machine.StartRound(1, ("m1",))]
    assert store.head is not None and store.head.answering == 1
    assert [e["id"] for e in change.events] == ["message:m1", "round:1:started"]
    ended = store.end(1, "Refunded.")
    assert store.head.status == "idle" and [r["text"] for r in _replies_of(ended)] == ["Refunded."]
    assert _replies_of(ended)[0]["message_ids"] == ["m1"] and [e["id"] for e in ended.events] == ["reply:1"]
    again = store.end(1, "x", now=3.0)
    assert again.head is None and again.writes == {} and again.effects == []  # a redelivered end changes nothing
    view = machine.message_view(store.keys.get, "c-1", "m1")
    assert view is not None and view["round"] == 1 and view["reply"]["text"] == "Refunded."
    assert machine.message_view(store.keys.get, "c-1", "m2") is None


def test_a_message_sent_again_gets_its_one_reply_and_another_text_under_its_id_is_refused() -> None:
    store = Store()
    store.receive("m1", "a")
    same = store.receive("m1", "a", now=1.5)
    assert same.head is None and same.effects == [machine.StartRound(1, ("m1",))]  # its round again, idempotent
    store.end(1, "A")
    again = store.receive("m1", "a", now=3.0)
    assert again.head is None and [r["text"] for r in _replies_of(again)] == ["A"]
    conflict = store.receive("m1", "b", now=3.0)
    assert conflict.head is None and conflict.effects == [
        machine.Refuse("message_conflict", "message_id 'm1' was sent before with other content"),
    ]
    other = store.receive("m9", agent="billing", now=3.0)
    assert [e.reason for e in other.effects] == ["conversation_agent_mismatch"]  # type: ignore[union-attr]


def test_a_message_whose_key_reached_the_changelog_without_its_head_is_taken_as_new_when_read_again() -> None:
    """A change's keys are written before its head: a worker stopped in between leaves the message's key alone.
    Read again, the message starts its round (or waits in the list) once, instead of waiting in no list."""
    store = Store()
    first = machine.receive(None, store.keys.get, cid="c-1", agent=AGENT, message=_entry("m1"), policy="enqueue",
                            now=1.0, offset=0)
    store.apply(machine.Change(writes=first.writes))  # the keys landed, the head did not
    assert store.head is None
    again = store.receive("m1", now=1.5)
    assert again.effects == [machine.StartRound(1, ("m1",))] and store.head is not None and store.head.rounds == 1
    assert store.receive("m1", now=1.6).effects == [machine.StartRound(1, ("m1",))]  # now its round, idempotent

    store.end(1, "Connecting you to a person.")
    assert store.head is not None
    store.keys["c-1"] = {**store.head.to_json(), "held_by": ""}  # with a person: messages wait for them
    queued = machine.receive(store.head, store.keys.get, cid="c-1", agent=AGENT, message=_entry("m2"),
                             policy="enqueue", now=2.0, offset=1)
    store.apply(machine.Change(writes=queued.writes))
    assert [m["id"] for m in store.head.waiting_list()] == []
    store.receive("m2", now=2.5)
    assert [m["id"] for m in store.head.waiting_list()] == ["m2"]
    assert store.receive("m2", now=2.6).head is None  # waiting already: nothing changes
    assert [m["id"] for m in store.head.waiting_list()] == ["m2"]


def test_enqueued_messages_are_answered_together_by_the_next_round_which_sees_the_history() -> None:
    store = Store()
    store.receive("m1", "my package never came")
    for i, text in [(2, "order 7"), (3, "and order 9")]:
        change = store.receive(f"m{i}", text, now=1.0 + i)
        assert change.effects == [] and store.head is not None and store.head.answering == 1
    ended = store.end(1, "Refunded order 7?", now=5.0)
    assert ended.effects[1:] == [machine.StartRound(2, ("m2", "m3"))]
    head = store.head
    assert head is not None and [m["text"] for m in machine.round_messages(head, 2)] == ["order 7", "and order 9"]
    def history(limit: int, chars: int) -> list[dict[str, str]]:
        return machine.history(head, store.keys.get, "c-1", 2, limit, chars)

    reply = {"role": "agent", "text": "Refunded order 7?"}
    assert history(20, 10_000) == [{"role": "customer", "text": "my package never came"}, reply]
    assert history(1, 10_000) == [reply]
    assert history(20, 20) == [reply]  # the character budget
    assert history(0, 10_000) == []


def test_a_rejected_message_is_answered_at_once_and_stays_in_the_history() -> None:
    store = Store()
    store.receive("m1", "first", policy="reject")
    refused = store.receive("m2", "second", policy="reject", now=2.0)
    assert [r["status"] for r in _replies_of(refused)] == ["rejected"]
    assert store.head is not None and store.head.answering == 1
    ended = store.end(1, "done", now=3.0)
    assert [type(e) for e in ended.effects] == [machine.SendReply]  # nothing waits: no second round
    assert _replies_of(ended)[0]["message_ids"] == ["m1"]
    page = machine.page(store.head, store.keys.get, "c-1", before=None, limit=10)
    assert [i["text"] for i in page] == ["first", "second", machine.REJECTED_TEXT, "done"]
    assert [r["text"] for r in _replies_of(store.receive("m2", "second", policy="reject"))] == [machine.REJECTED_TEXT]


def test_a_long_conversation_keeps_every_record_bounded_and_its_whole_history() -> None:
    """1,000 messages with long replies: the head, each segment and each other key stay far below a Kafka record;
    a transition writes about as much at message 1,000 as at message 10; the whole history is read back in
    pages."""
    store = Store()
    written: dict[int, int] = {}
    for n in range(1, 1001):
        change = store.receive(f"m{n}", f"question {n} " + "q" * 200, now=float(n))
        change2 = store.end(n, f"answer {n} " + "a" * 2000, now=n + 0.5)
        written[n] = sum(len(json.dumps(v)) for v in [*change.writes.values(), *change2.writes.values()])
        written[n] += len(json.dumps(change.head.to_json())) + len(json.dumps(change2.head.to_json()))  # type: ignore[union-attr]
    sizes = {k: len(json.dumps(v)) for k, v in store.keys.items()}
    assert max(sizes.values()) < 10_000
    assert written[1000] < 1.1 * written[10], (written[10], written[1000])
    head = store.head
    assert head is not None and head.items == 2000 and head.messages == 1000
    items: list[dict[str, Any]] = []
    before = None
    while True:
        got = machine.page(head, store.keys.get, "c-1", before=before, limit=137)
        if not got:
            break
        items = got + items
        before = got[0]["i"]
    assert [i["i"] for i in items] == list(range(2000))
    assert items[0]["text"].startswith("question 1 ") and items[-1]["text"].startswith("answer 1000 ")


def test_a_full_backlog_refuses_the_next_message() -> None:
    store = Store()
    store.receive("m0")
    for n in range(1, machine.MAX_WAITING):
        assert store.receive(f"m{n}").effects == []
    assert [e.reason for e in store.receive("one-too-many").effects] == [  # type: ignore[union-attr]
        "conversation_backlog_full",
    ]


def test_the_head_survives_its_json() -> None:
    store = Store()
    store.receive("m1")
    head = store.head
    assert head is not None and ConversationRecord.from_json(json.loads(json.dumps(head.to_json()))) == head


def test_history_becomes_earlier_turns_and_a_prompts_preamble() -> None:
    world = LedgerWorld(Settings(partitions=1))
    world.ledger.conversations.agents = {AGENT: AgentConfig(providers=["p"])}
    store = Store()
    store.receive("m1", "where is it?")
    store.end(1, "Lost; refunded.")
    change = store.receive("m2", "and the other?", now=3.0)
    assert store.head is not None
    world.ledger.conversations.table = store.keys  # the history is read from the conversation's keys
    start = change.effects[0]
    assert isinstance(start, machine.StartRound)
    task = world.ledger.conversations.round_task("c-1", store.head, start)
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
    round1 = round_task_id("c-1", 1, 1, 0)
    assert [d[0] for d in world.dispatched] == [round1]
    await world.deliver(TASKS, b"c-1", _message("and order 9 too?", "m2"))  # mid-round: enqueued
    await world.deliver(TASKS, b"c-1", _message("my package never came, refund me", "m1"))  # a double click
    assert [d[0] for d in world.dispatched] == [round1] and _replies(world) == []
    await world.deliver(OUTCOMES, round1.encode(), _succeeded("Refunded order 7."))
    round2 = round_task_id("c-1", 2, 1, 0)
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
    assert len([k for k in world.conversations if k.startswith("c-1")]) == 7  # head, 2 messages, 4 history items


async def test_a_failed_round_is_a_reply_that_says_so() -> None:
    world = _world()
    await world.deliver(TASKS, b"c-1", _message("refund me", "m1"))
    round1 = round_task_id("c-1", 1, 1, 0)
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
        await world.deliver(OUTCOMES, key, value)
    dlq = topics.dlq_topic(AGENT)
    reasons = [dict(h)["error_reason"] for t, _, _, h in world.sent if t == dlq]
    assert [r.decode().split(":")[0] for r in reasons] == ["message_conflict", "agent_mismatch", "schema_violation"]
    round1 = round_task_id("c-1", 1, 1, 0)
    await world.deliver(OUTCOMES, round1.encode(), _succeeded("Refunded."))
    await world.deliver(TASKS, b"c-1", _message("thanks", "m5"))
    assert [d[0] for d in world.dispatched] == [round1, round_task_id("c-1", 2, 1, 0)]


async def test_a_crash_before_the_rounds_record_was_written_makes_the_round_again() -> None:
    world = _world()
    await world.deliver(TASKS, b"c-1", _message("refund me", "m1"))
    round1 = round_task_id("c-1", 1, 1, 0)
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
    round1 = round_task_id("c-1", 1, 1, 0)
    await world.deliver(OUTCOMES, round1.encode(), _succeeded("Refunded."))
    events = [json.loads(v) for v in world.on(topics.CONVERSATION_EVENTS) if v is not None]
    assert [e["id"] for e in events] == [
        "message:m1", "round:1:started", "round:1:dispatch:1", "message:m2", "reply:1:m2", "reply:1",
    ]
    assert all(e["conversation_id"] == "c-1" for e in events)


# -- deleting ------------------------------------------------------------------------------------------------------

def test_a_delete_removes_every_key_and_waits_for_an_open_round() -> None:
    store = Store()
    store.receive("m1", "first")
    store.end(1, "one")
    store.receive("m2", "second")
    waiting = machine.delete(store.head, store.keys.get, "c-1", by="ops", now=5.0)
    assert waiting.writes == {} and waiting.head is not None and waiting.head.deleting == "ops"
    store.apply(waiting)
    refused = store.receive("m3", "third")
    assert [e.reason for e in refused.effects] == ["conversation_deleting"]  # type: ignore[union-attr]
    gone = store.end(2, "two")
    assert gone.effects == [machine.DeleteRounds(2, 0)] and not _replies_of(gone)
    assert all(value is None for value in gone.writes.values())
    assert set(gone.writes) == set(store.keys), "every key of the conversation"
    assert machine.delete(None, store.keys.get, "c-1", by="ops", now=6.0).writes == {}


async def test_the_ledger_deletes_a_conversation_and_its_rounds() -> None:
    world = _world()
    await world.deliver(TASKS, b"c-1", _message("refund me", "m1"))
    await world.deliver(OUTCOMES, round_task_id("c-1", 1, 1, 0).encode(), _succeeded("Refunded."))
    delete = {"conversation_id": "c-1", "agent_name": AGENT, "action": "delete", "by": "ops"}
    await world.deliver(TASKS, b"c-1", json.dumps(delete).encode())
    assert [k for k in world.conversations if k.startswith("c-1")] == []
    assert round_task_id("c-1", 1, 1, 0) not in world.tasks
    await world.deliver(TASKS, b"c-1", _message("hello again", "m2"))  # the id starts a new conversation
    again = ConversationRecord.from_json(world.conversations["c-1"])
    assert again.rounds == 1 and again.since == 2
    assert world.dispatched[-1][0] == round_task_id("c-1", 1, 1, 2), "its rounds have other ids (other tool keys)"


def test_an_idle_conversation_is_found_and_deleted_only_if_nothing_came_since() -> None:
    store = Store()
    store.receive("m1", now=10.0)
    store.end(1, "one", now=20.0)
    head = store.head
    assert head is not None
    assert machine.idle("c-1", head.to_json(), now=100.0, idle_s=50.0)
    assert not machine.idle("c-1", head.to_json(), now=60.0, idle_s=50.0)
    assert not machine.idle(machine.item_key("c-1", 0), store.keys[machine.item_key("c-1", 0)], now=1e9, idle_s=1)
    moved_on = machine.delete(head, store.keys.get, "c-1", by="idle expiry", now=100.0, idle_since=15.0)
    assert moved_on.writes == {} and moved_on.effects == []
    gone = machine.delete(head, store.keys.get, "c-1", by="idle expiry", now=100.0, idle_since=20.0)
    assert set(gone.writes) == set(store.keys)
    store.receive("m2", now=30.0)  # a round answers now: never idle
    assert not machine.idle("c-1", store.head.to_json(), now=1e9, idle_s=1)  # type: ignore[union-attr]


# -- interrupting ----------------------------------------------------------------------------------------------------

def test_an_interrupting_message_joins_the_open_round_which_answers_both() -> None:
    store = Store()
    store.receive("m1", "refund order 7", policy="interrupt")
    change = store.receive("m2", "and change my address", policy="interrupt", now=2.0)
    assert change.effects == [machine.Interrupt(1)]
    assert store.head is not None and [m["round"] for m in store.head.waiting_list()] == [1, None]
    joined, messages = machine.join_round(store.head, "c-1", 1, now=3.0)
    store.apply(joined)
    assert [m["id"] for m in messages] == ["m2"] and [e["kind"] for e in joined.events] == ["message_joined"]
    assert machine.join_round(store.head, "c-1", 1, now=3.5)[1] == []  # nothing more waits
    ended = store.end(1, "Refunded, and your address is changed.", now=4.0)
    assert _replies_of(ended)[0]["message_ids"] == ["m1", "m2"]
    assert [e for e in ended.effects if isinstance(e, machine.StartRound)] == []  # no second round


def _turn(turn: int, calls: list[dict[str, Any]]) -> dict[str, Any]:
    return {"kind": "turn", "turn": turn, "text": "", "calls": calls, "source": "primary:p:m", "confidence": "high",
            "usage": {}, "provider_calls": 1, "version": "v"}


async def test_the_ledger_stops_a_round_for_a_new_message_and_dispatches_it_again_with_it() -> None:
    from agents_stream.tables.journal import replay

    from agents_stream.contract.events import JournalEntry, LeaseExpired

    world = _world("interrupt")
    await world.deliver(TASKS, b"c-1", _message("refund order 7", "m1"))
    round1 = round_task_id("c-1", 1, 1, 0)
    call = {"id": "call_1", "name": "refund", "arguments": {"order": "7"}}
    step = encode(JournalEntry(worker="w1", dispatch=1, index=0, output=_turn(0, [call])))
    await world.deliver(OUTCOMES, round1.encode(), step)
    await world.deliver(TASKS, b"c-1", _message("wait, change my address instead", "m2"))
    assert world.interrupted == [round1], "the round's run is asked to stop at its next safe point"
    await world.deliver(OUTCOMES, round1.encode(),
                        encode(LeaseExpired(dispatch=1, worker="w1", released=True, interrupted=True)))
    assert [d[:2] for d in world.dispatched] == [(round1, 1), (round1, 2)]
    state = replay(json.loads(world.record(round1).steps_done or "[]"))
    assert state.results[(0, "call_1")]["content"].startswith("Not run: the customer wrote again")
    assert state.messages == {0: ["The customer wrote again:\nwait, change my address instead"]}
    await world.deliver(OUTCOMES, round1.encode(), _succeeded("Address changed; no refund.", dispatch=2))
    (reply,) = _replies(world)
    assert reply["message_ids"] == ["m1", "m2"] and reply["round"] == 1


def test_a_journaled_message_is_told_after_its_turn_or_before_the_first() -> None:
    from agents_stream.contract.models import TaskPayload
    from agents_stream.examples.support import SUPPORT
    from agents_stream.execution.agent_loop import conversation
    from agents_stream.providers.conversation import ToolResult

    task = TaskPayload(task_id="t", agent_name=AGENT, instruction="refund order 7")
    call = {"id": "call_1", "name": "lookup_order", "arguments": {"order_id": "7"}}
    entries = [_turn(0, [call]), {"kind": "tool", "turn": 0, "id": "call_1", "name": "lookup_order",
                                  "content": "{}", "error": False},
               {"kind": "message", "turn": 0, "text": "and order 9"}]
    said = conversation(task, SUPPORT, "", entries).messages
    assert [type(m).__name__ for m in said] == ["UserText", "AssistantTurn", "ToolResult", "UserText"]
    assert isinstance(said[2], ToolResult) and said[3] == UserText("and order 9")
    early = conversation(task, SUPPORT, "", [{"kind": "message", "turn": -1, "text": "and order 9"}]).messages
    assert early[-1] == UserText("and order 9") and len(early) == 2


async def test_a_message_that_would_make_the_head_too_large_is_dead_lettered() -> None:
    world = LedgerWorld(Settings(partitions=1, record_max_bytes=4000),
                        configs={AGENT: AgentConfig(providers=["p"])})
    await world.deliver(TASKS, b"c-1", _message("refund me", "m1"))
    for n in range(2, 6):  # each waits in the head while round 1 answers
        await world.deliver(TASKS, b"c-1", _message("x" * 1000, f"m{n}"))
    for key, value in [(k, v) for t, k, v, _ in world.sent if t == OUTCOMES]:
        await world.deliver(OUTCOMES, key, value)
    reasons = [dict(h)["error_reason"].decode() for t, _, _, h in world.sent if t == topics.dlq_topic(AGENT)]
    assert reasons and all(r.startswith("conversation_too_large") for r in reasons)
    head = ConversationRecord.from_json(world.conversations["c-1"])
    assert len(json.dumps(head.to_json())) <= 4000 and head.answering == 1

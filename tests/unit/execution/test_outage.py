"""Human handoff on an outage (execution/outage.py), pure: a held round ends with the handoff reply once its agent's
``handoff_after_s`` is over; the ledger's round end marks the reply and hands the conversation to a person."""

from __future__ import annotations

from typing import Any

from agents_stream.tables import conversations as machine

from agents_stream.config import DEFAULT_HANDOFF_TEXT, AgentConfig
from agents_stream.contract.conversation_messages import ConversationReply
from agents_stream.contract.models import ConversationContext, TaskPayload
from agents_stream.execution.outage import OUTAGE_SOURCE, handed_over
from agents_stream.execution.run import Run

ROUND = TaskPayload(task_id="t-1", agent_name="desk", instruction="where is my order?",
                    conversation=ConversationContext(conversation_id="c", message_ids=["m1"]))


def held(task: TaskPayload = ROUND, since: float = 100.0, wait: float = 5.0) -> Run:
    return Run(task=task, dispatch=1, worker="w", held=True, held_since=since, wait=wait)


def test_off_by_default_and_only_for_a_conversations_round() -> None:
    assert AgentConfig(name="desk").handoff_after_s is None
    assert handed_over(held(), AgentConfig(name="desk"), now=10_000.0) is None
    batch = TaskPayload(task_id="t-2", agent_name="desk", instruction="summarise")
    assert handed_over(held(batch), AgentConfig(name="desk", handoff_after_s=1), now=10_000.0) is None


def test_within_the_wait_it_stays_held_and_looks_again_when_the_wait_is_over() -> None:
    run = held(wait=5.0)
    assert handed_over(run, AgentConfig(name="desk", handoff_after_s=30), now=128.0) is None
    assert run.wait == 2.0  # the hold wakes when the wait is over, not a probe interval later
    run = held(wait=5.0)
    assert handed_over(run, AgentConfig(name="desk", handoff_after_s=30), now=101.0) is None and run.wait == 5.0


def test_past_the_wait_the_round_ends_with_the_handoff_text() -> None:
    config = AgentConfig(name="desk", handoff_after_s=30, handoff_text="A person will answer you here.")
    done = handed_over(held(), config, now=130.0)
    assert done is not None and done.output == "A person will answer you here." and done.source == OUTAGE_SOURCE
    assert done.status == "succeeded" and not done.partial
    assert AgentConfig(name="desk", handoff_after_s=30).handoff_text == DEFAULT_HANDOFF_TEXT


def test_the_round_end_of_an_outage_marks_the_reply_and_its_history_item() -> None:
    store: dict[str, Any] = {}
    change = machine.receive(None, store.get, cid="c", agent="desk", policy=machine.ENQUEUE, now=1.0, offset=0,
                             message={"id": "m1", "digest": "d", "text": "hi", "user": None, "context": {}})
    store.update(change.writes)
    assert change.head is not None
    end = machine.RoundEnd(since=0, number=1, status="succeeded", text="connecting you", task_id="t", error=None,
                           completed_at=2.0, handoff="outage")
    ended = machine.round_ended(change.head, store.get, end, cid="c", now=2.0)
    reply = next(e.reply for e in ended.effects if isinstance(e, machine.SendReply))
    assert reply["handoff"] == "outage"
    item = next(v for k, v in ended.writes.items() if isinstance(v, dict) and v.get("role") == "agent")
    assert machine.reply_of(item)["handoff"] == "outage"  # a duplicate of the message is answered the same
    wire = ConversationReply(conversation_id="c", agent_name="desk", message_ids=["m1"], round=1,
                             status="succeeded", text="x", handoff="outage")
    assert wire.handoff == "outage"
    plain = machine.round_ended(change.head, store.get, machine.RoundEnd(
        since=0, number=1, status="succeeded", text="hi", task_id="t", error=None, completed_at=2.0), cid="c", now=2.0)
    assert "handoff" not in next(e.reply for e in plain.effects if isinstance(e, machine.SendReply))

"""Human handoff's transitions (tables/handoff.py), pure: held, answered by a person, handed back, idempotent."""

from __future__ import annotations

from typing import Any

import pytest
from agents_stream.tables import conversations as machine
from agents_stream.tables import handoff
from agents_stream.tables.conversations import Change, ConversationRecord, SendReply, StartRound


class Store(dict[str, Any]):
    def apply(self, cid: str, change: Change) -> ConversationRecord:
        for key, value in change.writes.items():
            if value is None:
                self.pop(key, None)
            else:
                self[key] = value
        if change.head is not None:
            self[cid] = change.head.to_json()
        return ConversationRecord.from_json(self[cid])


def message(i: str) -> dict[str, Any]:
    return {"id": i, "digest": f"d-{i}", "text": f"text {i}", "user": None, "context": {}}


def receive(store: Store, head: ConversationRecord | None, i: str) -> tuple[ConversationRecord, Change]:
    change = machine.receive(head, store.get, cid="c", agent="a", message=message(i), policy=machine.ENQUEUE,
                             now=1.0, offset=0)
    return store.apply("c", change), change


def test_a_held_conversation_starts_no_round_and_its_messages_wait_for_the_person() -> None:
    store = Store()
    head, _ = receive(store, None, "m1")
    head = store.apply("c", machine.round_ended(
        head, store.get, machine.RoundEnd(since=0, number=1, status="succeeded", text="hi", task_id="t", error=None,
                                          completed_at=2.0), cid="c", now=2.0))
    held = handoff.hand_over(head, by="", reason="asked for a person", source="agent", now=3.0)
    assert [e["kind"] for e in held.events] == ["handed_over"]
    head = store.apply("c", held)
    assert head.status == "with_person"
    head, change = receive(store, head, "m2")
    assert not any(isinstance(e, StartRound) for e in change.effects)
    entry = handoff.inbox_entry("c", head, 5.0)
    assert [m["id"] for m in entry["waiting"]] == ["m2"] and entry["held_by"] is None and entry["waiting_s"] == 2.0


def held_with_message(store: Store) -> ConversationRecord:
    head, _ = receive(store, None, "m1")
    head = store.apply("c", machine.round_ended(
        head, store.get, machine.RoundEnd(since=0, number=1, status="succeeded", text="hi", task_id="t", error=None,
                                          completed_at=2.0), cid="c", now=2.0))
    head = store.apply("c", handoff.hand_over(head, by="ana", reason="r", source="operator", now=3.0,
                                              action_id="h1"))
    head, _ = receive(store, head, "m2")
    return head


def test_a_person_reply_answers_the_waiting_messages_once_and_is_marked_human() -> None:
    store = Store()
    head = held_with_message(store)
    change = handoff.person_reply(head, store.get, "c", action_id="r1", text="I am Ana", by="ana", now=4.0)
    replies = [e.reply for e in change.effects if isinstance(e, SendReply)]
    assert replies[0]["human"] is True and replies[0]["message_ids"] == ["m2"] and replies[0]["operator"] == "ana"
    head = store.apply("c", change)
    assert head.waiting_list() == []
    again = handoff.person_reply(head, store.get, "c", action_id="r1", text="I am Ana", by="ana", now=5.0)
    assert again.head is None and again.events == []  # a double click: the same reply sent again, nothing new
    assert [e.reply for e in again.effects if isinstance(e, SendReply)] == replies
    assert machine.message_view(store.get, "c", "m2")["reply"]["text"] == "I am Ana"  # type: ignore[index]
    # a redelivered customer message gets the person's reply again, never a round
    dup = machine.receive(head, store.get, cid="c", agent="a", message=message("m2"), policy=machine.ENQUEUE,
                          now=6.0, offset=0)
    assert [type(e) for e in dup.effects] == [SendReply]


def test_hand_back_shows_the_note_to_the_next_round_and_starts_it_for_messages_still_waiting() -> None:
    store = Store()
    head = held_with_message(store)
    change = handoff.hand_back(head, "c", action_id="b1", note="refund approved by Ana", by="ana", now=4.0)
    starts = [e for e in change.effects if isinstance(e, StartRound)]
    assert starts == [StartRound(2, ("m2",))]
    head = store.apply("c", change)
    assert head.held_by is None and head.status == "answering"
    earlier = machine.history(head, store.get, "c", 2, 20, 32_000)
    assert {"role": "note", "text": "refund approved by Ana"} in earlier
    assert handoff.hand_back(head, "c", action_id="b1", note="x", by="ana", now=5.0).head is None  # applied once


def test_actions_that_do_not_apply_say_why() -> None:
    store = Store()
    head, _ = receive(store, None, "m1")
    with pytest.raises(handoff.Problem) as not_held:
        handoff.person_reply(head, store.get, "c", action_id="r", text="x", by="ana", now=1.0)
    assert not_held.value.status == 409
    with pytest.raises(handoff.Problem) as unknown:
        handoff.hand_back(None, "zz", action_id="b", note="", by="ana", now=1.0)
    assert unknown.value.status == 404
    held = store.apply("c", handoff.hand_over(head, by="", reason="r", source="agent", now=1.0))
    with pytest.raises(handoff.Problem) as long:
        handoff.person_reply(held, store.get, "c", action_id="r", text="x" * (handoff.MAX_TEXT + 1), by="a", now=1.0)
    assert long.value.status == 400


def test_an_operator_claims_a_conversation_waiting_for_a_person_and_a_second_handoff_changes_nothing() -> None:
    store = Store()
    head, _ = receive(store, None, "m1")
    head = store.apply("c", handoff.hand_over(head, by="", reason="r", source="agent", now=1.0))
    taken = handoff.hand_over(head, by="ana", reason="", source="operator", now=2.0, action_id="t1")
    assert [e["kind"] for e in taken.events] == ["taken"]
    head = store.apply("c", taken)
    assert head.held_by == "ana"
    assert handoff.hand_over(head, by="bob", reason="", source="operator", now=3.0, action_id="t2").head is None


def test_the_agents_handoff_call_is_found_in_its_journal() -> None:
    entries = [{"kind": "turn", "turn": 0},
               {"kind": "tool", "name": "handoff", "error": False,
                "content": f"{handoff.HANDED_OVER} wants a human\nTell the customer ..."}]
    assert handoff.requested(entries) == "wants a human"
    assert handoff.requested([{"kind": "tool", "name": "handoff", "error": True, "content": "boom"}]) is None
    assert handoff.requested([{"kind": "tool", "name": "lookup", "error": False, "content": "x"}]) is None

"""The wait for a person under escalation levels (tables/handoff_wait.py), pure: each level's timeout asks the next,
the last leaves the customer waiting, taking it stops the timers, a late or repeated timeout escalates once."""

from __future__ import annotations

from typing import Any

from agents_stream.tables import conversations as machine
from agents_stream.tables import handoff, handoff_wait
from agents_stream.tables.conversations import Change, ConversationRecord

LEVELS = [("desk-oncall", 60.0), ("desk-lead", 300.0)]


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


def waiting(store: Store, levels: list[tuple[str, float]] = LEVELS) -> ConversationRecord:
    """A conversation whose agent handed it to a person at t=10 (nobody took it)."""
    head = store.apply("c", machine.receive(None, store.get, cid="c", agent="desk", message={
        "id": "m1", "digest": "d", "text": "a person please", "user": None, "context": {}},
        policy=machine.ENQUEUE, now=1.0, offset=0))
    head = store.apply("c", machine.round_ended(head, store.get, machine.RoundEnd(
        since=0, number=1, status="succeeded", text="connecting you", task_id="t", error=None, completed_at=2.0),
        cid="c", now=2.0))
    return store.apply("c", handoff.hand_over(head, by="", reason="asked for a person", source="agent", now=10.0,
                                              levels=levels))


def test_a_handover_waits_at_level_one_due_after_its_timeout_and_tells_level_one() -> None:
    store = Store()
    before = ConversationRecord.from_json(store.get("c")) if store.get("c") else None
    head = waiting(store)
    assert handoff_wait.describe(head) == {"level": 1, "level_name": "desk-oncall", "due": 70.0, "escalations": [],
                                           "unanswered": False}
    assert handoff_wait.due(head, 69.9) is None and handoff_wait.due(head, 70.0) == 0
    told = handoff_wait.notices(before, head)
    assert [(n.level, n.event) for n in told] == [(0, "handoff.waiting")]
    entry = handoff.inbox_entry("c", head, 20.0)
    assert entry["level"] == 1 and entry["due"] == 70.0 and entry["level_name"] == "desk-oncall"


def test_each_timeout_asks_the_next_level_once_and_the_last_leaves_the_customer_waiting() -> None:
    store = Store()
    head = waiting(store)
    assert handoff_wait.escalate(head, "c", level=0, now=69.0) == Change()  # early: nothing
    change = handoff_wait.escalate(head, "c", level=0, now=71.0)
    escalated = store.apply("c", change)
    assert [e["kind"] for e in change.events] == ["handoff_escalated"]
    assert [(n.level, n.event, n.details["due"]) for n in handoff_wait.notices(head, escalated)] == [
        (1, "handoff.escalated", 371.0)]
    assert handoff_wait.describe(escalated)["level"] == 2
    assert handoff_wait.describe(escalated)["escalations"] == [{"from": 0, "to": 1, "at": 71.0}]
    # the same timeout again (a second scan, a redelivery, a new owner after a kill): nothing
    assert handoff_wait.escalate(escalated, "c", level=0, now=80.0) == Change()
    last = store.apply("c", handoff_wait.escalate(escalated, "c", level=1, now=372.0))
    told = handoff_wait.notices(escalated, last)
    assert [(n.level, n.event, n.overdue) for n in told] == [(1, "handoff.unanswered", True)]
    assert last.held_by == "" and last.status == "with_person"  # still waiting for a person, never dropped
    assert handoff_wait.due(last, 10_000.0) is None  # no timer is left
    assert handoff_wait.describe(last)["unanswered"] is True
    assert handoff_wait.escalate(last, "c", level=1, now=10_000.0) == Change()


def test_claiming_or_replying_stops_the_timers_and_keeps_the_history_shown() -> None:
    store = Store()
    head = store.apply("c", handoff_wait.escalate(waiting(store), "c", level=0, now=71.0))
    claimed = store.apply("c", handoff.hand_over(head, by="ana", reason="", source="operator", now=80.0,
                                                 action_id="claim"))
    assert claimed.held_by == "ana" and handoff_wait.due(claimed, 10_000.0) is None
    assert handoff_wait.describe(claimed)["level"] == 2 and handoff_wait.describe(claimed)["due"] is None
    assert handoff_wait.notices(head, claimed) == []
    assert handoff_wait.escalate(claimed, "c", level=1, now=10_000.0) == Change()

    other = Store()
    replied = other.apply("c", handoff.person_reply(waiting(other), other.get, "c", action_id="r1", text="hello",
                                                    by="bo", now=20.0))
    assert replied.held_by == "bo" and handoff_wait.due(replied, 10_000.0) is None


def test_a_hand_back_clears_the_wait_and_the_next_handover_starts_at_level_one() -> None:
    store = Store()
    head = store.apply("c", handoff_wait.escalate(waiting(store), "c", level=0, now=71.0))
    back = store.apply("c", handoff.hand_back(head, "c", action_id="b1", note="", by="ana", now=90.0))
    assert back.held_wait is None and handoff_wait.describe(back)["level"] is None
    again = store.apply("c", handoff.hand_over(back, by="", reason="outage", source="outage", now=100.0,
                                               levels=LEVELS))
    assert handoff_wait.describe(again)["level"] == 1 and handoff_wait.due(again, 160.0) == 0
    assert [n.event for n in handoff_wait.notices(back, again)] == ["handoff.waiting"]


def test_without_levels_a_handover_only_waits_in_the_inbox() -> None:
    store = Store()
    head = waiting(store, levels=[])
    assert head.held_wait is None and handoff_wait.due(head, 1e12) is None
    assert handoff.inbox_entry("c", head, 20.0)["level"] is None

"""The wait for a person under escalation levels: a conversation handed over and not taken yet (pure, clock-free).

    (handed over by the agent or an outage: held_by "") ──► level 0, due = now + its timeout_s, level 0 told
        ├── an operator takes it (claims it, or replies) ──► the timers stop (``due`` None), the history stays
        ├── level's timeout ──► the next level (its own timeout and webhook), told
        └── the last level's timeout ──► it stays waiting ("unanswered"): the last level is told again, no more
                                         timers; the customer is never dropped or answered by the timer

The same levels and timers as an approval (tables/approvals.py): the levels are copied into the wait when it
starts (a config change does not strand it), a level's timeout is an event the ledger applies (``escalate``) only
when the level it names is still the current one and its time ran out, so a late or repeated timeout — two
scanners, a redelivery, a new owner after a kill — escalates once. The state is the head's ``held_wait`` (the
changelog-backed conversations table), so it moves with the conversation on a failover. Docs:
docs/guide/handoff.md, "The wait for a person".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Sequence

from agents_stream.tables.conversations import Change, ConversationRecord, _event

__all__ = ["Notice", "begin", "describe", "due", "escalate", "notices", "state", "taken"]


@dataclass(frozen=True)
class Notice:
    """What a change of the wait tells: ``level``'s webhook (``overdue``: every level's time ran out) and a
    control event ``event`` with ``details``."""

    level: int
    event: str
    details: dict[str, Any]
    overdue: bool = False


def state(head: ConversationRecord | None) -> dict[str, Any] | None:
    return json.loads(head.held_wait) if head is not None and head.held_wait else None


def _dump(wait: dict[str, Any]) -> str:
    return json.dumps(wait, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def begin(head: ConversationRecord, levels: Sequence[tuple[str, float]], now: float) -> ConversationRecord:
    """The head of a conversation that now waits for a person, its wait at level 0 (unchanged without levels)."""
    if not levels or head.held_by != "":
        return head
    wait = {"level": 0, "due": now + levels[0][1], "since": now, "escalations": [],
            "levels": [{"name": name, "timeout_s": timeout} for name, timeout in levels]}
    return replace(head, held_wait=_dump(wait))


def taken(head: ConversationRecord, by: str, now: float) -> ConversationRecord:
    """A person took the conversation: its timers stop; the level it reached and its escalations stay shown."""
    wait = state(head)
    if wait is None or wait.get("due") is None:
        return head
    return replace(head, held_wait=_dump({**wait, "due": None, "taken_at": now, "taken_by": by}))


def due(head: ConversationRecord | None, now: float) -> int | None:
    """The level whose timeout ran out, for the scan; None while it has time, or nobody waits for it."""
    wait = state(head)
    if head is None or head.held_by != "" or wait is None or wait.get("due") is None:
        return None
    return int(wait["level"]) if now >= float(wait["due"]) else None


def escalate(head: ConversationRecord | None, cid: str, *, level: int, now: float) -> Change:
    """Level ``level``'s time ran out: the next level is asked; after the last it stays waiting, unanswered.
    ``level`` is the level the timeout was seen at, so a late or repeated timeout changes nothing."""
    if head is None or due(head, now) != level:
        return Change()
    wait = state(head)
    assert wait is not None
    levels = wait["levels"]
    nxt = level + 1
    step: dict[str, Any]
    if nxt < len(levels):
        step = {"from": level, "to": nxt, "at": now}
        wait = {**wait, "level": nxt, "due": now + float(levels[nxt]["timeout_s"]),
                "escalations": [*wait["escalations"], step]}
        data = {"from": level, "to": nxt, "level_name": levels[nxt]["name"], "due": wait["due"]}
    else:  # no one left to ask: the customer keeps waiting in the inbox, and the timers stop
        step = {"from": level, "to": None, "at": now}
        wait = {**wait, "due": None, "escalations": [*wait["escalations"], step]}
        data = {"from": level, "to": None, "level_name": levels[level]["name"], "due": None}
    event = _event(f"handoff:{head.handoffs}:escalated:{level}", "handoff_escalated", None, data)
    return Change(head=replace(head, held_wait=_dump(wait), updated_at=now), events=[event])


def notices(old: ConversationRecord | None, new: ConversationRecord | None) -> list[Notice]:
    """What a transition of the head tells (its webhooks, its control events): a wait begun, escalated, or past
    its last level. Derived from the two heads, so a transition applied again tells nothing new."""
    before, after = state(old), state(new)
    if after is None or new is None:
        return []
    found = []
    base = {"reason": new.held_reason, "source": new.held_source, "handoff": new.handoffs}
    same = before is not None and before.get("since") == after.get("since")
    if not same:
        found.append(Notice(0, "handoff.waiting", {**base, "level": 0, "due": after["due"]}))
    for step in after["escalations"][len(before["escalations"]) if before is not None and same else 0:]:
        if step["to"] is None:
            found.append(Notice(step["from"], "handoff.unanswered", {**base, "level": step["from"], "due": None},
                                overdue=True))
        else:
            found.append(Notice(step["to"], "handoff.escalated",
                                {**base, "from": step["from"], "to": step["to"], "due": after["due"]}))
    return found


def describe(head: ConversationRecord) -> dict[str, Any]:
    """The wait as the inbox shows it: level (1-based) and its name, when it is due, its escalations."""
    wait = state(head)
    if wait is None:
        return {"level": None, "level_name": None, "due": None, "escalations": []}
    level = int(wait["level"])
    return {"level": level + 1, "level_name": wait["levels"][level]["name"], "due": wait.get("due"),
            "escalations": wait["escalations"], "unanswered": bool(wait["escalations"]) and
            wait["escalations"][-1]["to"] is None}

"""The ledger's part of the wait for a person (tables/handoff_wait.py): the timers-table key of each conversation
whose wait has a timer, the scan that turns a level's lapsed time into an ``escalate`` action, and what a change of
the wait tells (the level's webhook, a control event).

The timer is the approvals' and the jobs' (ledger/scanner.py, orchestrator.py): a ``handoff/<conversation_id>``
key of the changelog-backed timers table while the conversation's wait has a due time, found by the lease scanner's
tick on this worker's partitions, and an event the ledger applies in order with the conversation's messages: an
``escalate`` action on the conversation's task topic naming the level it saw run out. The ledger escalates only
when that level is still current and due, so two scans, a redelivery or a new owner after a kill escalate once.
"""

from __future__ import annotations

import logging
from typing import Any

from agents_stream.config import AgentConfig
from agents_stream.contract import topics
from agents_stream.contract.conversation_messages import ConversationAction
from agents_stream.kafka.outbox import Outbox, Send
from agents_stream.ops.notify import Notifier, handoff_message
from agents_stream.settings import Settings
from agents_stream.tables import handoff_wait
from agents_stream.tables.conversations import ConversationRecord
from agents_stream.tables.definitions import Tables

__all__ = ["HandoffWaits", "timer_key"]

log = logging.getLogger(__name__)

PREFIX = "handoff/"


def timer_key(cid: str) -> str:
    """A waiting conversation's key in the timers table."""
    return f"{PREFIX}{cid}"


class HandoffWaits:
    """Keeps the timers of conversations waiting for a person, scans them, and tells each level."""

    def __init__(
        self, table: Any, timers: Any, outbox: Outbox, notifier: Notifier | None, *,
        agents: dict[str, AgentConfig], partitions: int, link_base: str, throttle_s: float,
    ) -> None:
        self.table = table
        self.timers = timers
        self.outbox = outbox
        self.notifier = notifier
        self.agents = agents
        self.partitions = partitions
        self.link_base = link_base
        #: how long a timeout asked for is not asked again (its action lost, or the ledger busy): as approvals
        self.throttle_s = throttle_s
        self._asked: dict[tuple[str, int], float] = {}

    @classmethod
    def of(cls, settings: Settings, tables: Tables, outbox: Outbox, notifier: Notifier | None,
           agents: dict[str, AgentConfig]) -> HandoffWaits:
        """The waits of a worker's ledger: its conversations and timers tables, its webhooks."""
        return cls(tables.conversations, tables.timers, outbox, notifier, agents=agents,
                   partitions=settings.partitions, link_base=settings.link_base(),
                   throttle_s=max(1.0, settings.lease_ttl_s / 4))

    def levels(self, agent: str) -> list[tuple[str, float]]:
        config = self.agents.get(agent)
        return [(lv.name, lv.timeout_s) for lv in config.handoff_wait_levels()] if config is not None else []

    def after(self, partition: int, cid: str, old: ConversationRecord | None, new: ConversationRecord | None,
              deleted: bool) -> list[Send]:
        """A transition of the conversation's head was written: its timer key kept with it (a changelog send),
        and what the change of its wait tells."""
        sends = []
        key = timer_key(cid)
        timed = not deleted and handoff_wait.due(new, float("inf")) is not None
        if timed and key not in self.timers:
            self.timers[key] = {"kind": "handoff"}
            sends.append(self.outbox.changelog(self.timers, partition, key))
        elif not timed and key in self.timers:
            del self.timers[key]
            sends.append(self.outbox.changelog(self.timers, partition, key))
        if new is not None and not deleted:
            for notice in handoff_wait.notices(old, new):
                self._tell(cid, new, notice)
        return sends

    def _tell(self, cid: str, head: ConversationRecord, notice: handoff_wait.Notice) -> None:
        log.info("Conversation %s waits for a person: %s (level %d)%s; take it in the console's Inbox or with "
                 "agents-stream conversations handoff %s", cid, notice.event, notice.level + 1,
                 ", every level's time ran out and it stays waiting" if notice.overdue else "", cid)
        self.outbox.control(notice.event, cid, head.agent, notice.details)
        config = self.agents.get(head.agent)
        levels = config.handoff_wait_levels() if config is not None else []
        if self.notifier is None or notice.level >= len(levels):
            return
        url = levels[notice.level].webhook_url()
        if not url:
            return
        wait = handoff_wait.describe(head)
        body = handoff_message(
            conversation_id=cid, agent=head.agent, reason=head.held_reason or "", level=notice.level,
            level_name=levels[notice.level].name, due=wait["due"], base=self.link_base,
            waiting=sum(1 for m in head.waiting_list() if m["round"] is None), overdue=notice.overdue,
        )
        self.notifier.notify(url, body, subject=f"conversation {cid} level {notice.level + 1}")

    def scan(self, now: float, mine: set[int]) -> list[tuple[str, bytes, bytes, int]]:
        """The ``escalate`` actions of conversations on partitions ``mine`` whose level's time ran out, as
        (task topic, key, record value, partition); each asked again after ``throttle_s`` while it stays due."""
        found = []
        asked, self._asked = self._asked, {}
        for key in list(self.timers.keys()):
            if not key.startswith(PREFIX):
                continue
            cid = key[len(PREFIX):]
            partition = topics.partition_for(cid.encode("utf-8"), self.partitions)
            data = self.table.get(cid) if partition in mine else None
            head = ConversationRecord.from_json(data) if data else None
            level = handoff_wait.due(head, now)
            if head is None or level is None:
                continue
            if now - asked.get((cid, level), 0.0) >= self.throttle_s:
                asked[(cid, level)] = now
                action = ConversationAction(
                    conversation_id=cid, agent_name=head.agent, action="escalate", by="timer",
                    action_id=f"wait:{head.handoffs}:{level}", level=level,
                )
                found.append((topics.task_topic(head.agent), cid.encode("utf-8"),
                               action.model_dump_json().encode("utf-8"), partition))
            self._asked[(cid, level)] = asked[(cid, level)]
        return found

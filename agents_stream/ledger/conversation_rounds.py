"""Conversations in the ledger: a message recorded, its round started as a task, the round's end made a reply.

The conversations table has one record per conversation_id (tables/conversations.py decides every transition);
a round is an ordinary task of the conversation's agent (contract/conversation_messages.round_task_id), so it has every
promise a task has: its lease, its journal, approvals, breakers and ladder, delegation and cancel. Its end
comes back here (``round_ended``) wherever it was applied, and the reply goes out on agent.replies.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from typing import Any, Callable

from faust.types import TP

from agents_stream.config import AgentConfig
from agents_stream.contract import topics
from agents_stream.contract.conversation_messages import (
    REPLIES,
    ConversationAction,
    ConversationDelete,
    ConversationMessage,
    ConversationReply,
    conversation_of,
    message_digest,
    round_of,
    round_task_id,
)
from agents_stream.contract.errors import PoisonMessage
from agents_stream.contract.models import (
    SCHEMA_VERSION,
    ConversationContext,
    HistoryItem,
    SummaryInput,
    TaskPayload,
    iso_utc,
    utcnow_iso,
)
from agents_stream.execution.outage import OUTAGE_SOURCE
from agents_stream.kafka.outbox import Outbox, Send
from agents_stream.ledger.handoff_waits import HandoffWaits
from agents_stream.ledger.intake import moved
from agents_stream.ledger.poison import Poison
from agents_stream.tables import conversations as machine
from agents_stream.tables import handoff, handoff_wait, summaries
from agents_stream.tables.conversation_events import round_events
from agents_stream.tables.conversations import ConversationRecord
from agents_stream.tables.leases import TaskRecord, completed_steps

__all__ = ["Conversations", "conversation_record", "reply_text"]

log = logging.getLogger(__name__)

#: what the model is told of a call it asked for before the customer's new message stopped the round
NOT_RUN = "Not run: the customer wrote again before this call ran. Read their new message, then decide again."
#: the reply text of a round that failed (its ``error`` says why): the customer is told, never left waiting
FAILED_TEXT = "I am sorry: I could not answer this message. A person will look at it."

#: how a summary entry reads in a journal's compact JSON (never inside a string of it: those quotes are escaped)
_SUMMARY = '"kind":"summary"'

#: ``start(tp, offset, task)``: make the round's task and dispatch it (Ledger.start_round)
MakeRound = Callable[[TP, int, TaskPayload], None]


def conversation_record(table: Any, conversation_id: str) -> ConversationRecord | None:
    data = table.get(conversation_id)
    return ConversationRecord.from_json(data) if data else None


def reply_text(result: dict[str, Any]) -> str:
    """What a round's TaskResult says to the customer: its text output, or its JSON output as text."""
    if result.get("status") == "failed":
        return FAILED_TEXT
    output = result.get("output")
    return output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)


class Conversations:
    """The ledger's part of conversations; like the rest of the ledger it never awaits I/O inline."""

    def __init__(
        self, table: Any, tasks: Any, outbox: Outbox, poison: Poison, *, agents: dict[str, AgentConfig],
        partitions: int, record_max_bytes: int, start: MakeRound,
        interrupt: Callable[[str], None] = lambda task_id: None, waits: HandoffWaits | None = None,
    ) -> None:
        self.table = table
        self.tasks = tasks
        self.outbox = outbox
        self.poison = poison
        self.agents = agents
        self.partitions = partitions
        self.record_max_bytes = record_max_bytes
        self.start = start
        #: ``interrupt(task_id)``: the round's run here stops at its next safe point (Executor.interrupt)
        self.interrupt = interrupt
        self._idle_cursors: dict[int, bytes | None] = {}
        #: the timers and notices of conversations waiting for a person (None: no levels apply)
        self.waits = waits

    def on_record(
        self, tp: TP, offset: int, message: ConversationMessage | ConversationDelete | ConversationAction,
        value: bytes | None, headers: Any,
    ) -> None:
        """A message (a delete, an operator's action) on its agent's task topic: re-sent to its conversation's
        partition first when not there."""
        if moved(self.outbox, self.partitions, tp, offset, message.conversation_id, value, headers):
            return
        if isinstance(message, ConversationAction):
            self.on_action(tp, offset, message)
        elif isinstance(message, ConversationDelete):
            self.on_delete(tp, offset, message)
        else:
            self.on_message(tp, offset, message, value or b"", headers)

    def on_delete(self, tp: TP, offset: int, request: ConversationDelete) -> None:
        cid = request.conversation_id
        head = conversation_record(self.table, cid)
        if head is not None and head.agent != request.agent_name:
            log.warning("A delete of conversation %s names agent %s, not its agent %s: ignored", cid,
                        request.agent_name, head.agent)
            return
        if request.idle_since is None:
            log.info("Conversation %s: deleted at the request of %s (%s)", cid, request.by,
                     "now" if head is None or head.answering is None else "once its open round ends")
        self._apply(tp, offset, cid, machine.delete(head, self.table.get, cid, by=request.by, now=time.time(),
                                                    idle_since=request.idle_since))

    def on_action(self, tp: TP, offset: int, action: ConversationAction) -> None:
        """An operator's handoff, reply or hand back (tables/handoff.py). The views checked it against the
        conversation already; one that no longer applies (it changed in between) is logged and dropped."""
        cid = action.conversation_id
        head = conversation_record(self.table, cid)
        if head is not None and head.agent != action.agent_name:
            log.warning("An operator's %s of conversation %s names agent %s, not its agent %s: ignored",
                        action.action, cid, action.agent_name, head.agent)
            return
        now = time.time()
        try:
            if action.action == "escalate":  # the scan saw a level's time run out (tables/handoff_wait.py)
                change = handoff_wait.escalate(head, cid, level=action.level or 0, now=now)
            elif action.action == "handoff":
                change = handoff.hand_over(head, by=action.by, reason=action.text or "an operator took it",
                                           source="operator", now=now, action_id=action.action_id)
            elif action.action == "reply":
                change = handoff.person_reply(head, self.table.get, cid, action_id=action.action_id,
                                              text=action.text, by=action.by, now=now)
            else:
                change = handoff.hand_back(head, cid, action_id=action.action_id, note=action.text, by=action.by,
                                           now=now)
        except handoff.Problem as problem:
            log.warning("Conversation %s: %s's %s (action %s) does not apply and is dropped: %s; nothing was sent "
                        "to the customer — look at the conversation and act again", cid, action.by, action.action,
                        action.action_id, problem)
            return
        if change.events and action.action != "escalate":  # an escalation's log line is HandoffWaits'
            log.info("Conversation %s: %s by %s", cid, action.action, action.by)
        self._apply(tp, offset, cid, change)

    def on_message(self, tp: TP, offset: int, message: ConversationMessage, value: bytes, headers: Any) -> None:
        """A message on its agent's task topic, on its conversation's partition."""
        cid = message.conversation_id
        head = conversation_record(self.table, cid)
        config = self.agents.get(message.agent_name)
        entry = {"id": message.message_id, "digest": message_digest(message), "text": message.text,
                 "user": message.user, "context": message.context_data}
        change = machine.receive(
            head, self.table.get, cid=cid, agent=message.agent_name, message=entry,
            policy=config.double_texting if config is not None else machine.ENQUEUE, now=time.time(), offset=offset,
        )
        if self._too_large(change):
            change = machine.Change(effects=[machine.Refuse(
                "conversation_too_large", f"a record of the conversation would pass {self.record_max_bytes} bytes",
            )])
        self._apply(tp, offset, cid, change, message=(message, value, headers))

    def round_changed(self, tp: TP, offset: int, task_id: str, old: TaskRecord | None, new: TaskRecord | None) -> None:
        """A transition of a round's task (Effects.apply): its events sent; once it finished, its reply."""
        parsed = conversation_of(task_id)
        if parsed is None:
            return
        cid, number = parsed
        events = round_events(number, old, new)
        if events:
            self.outbox.deliver(tp, offset, [self._event(cid, e) for e in events])
        self._keep_summary(tp, offset, task_id, old, new)
        record = new or old
        if record is not None and record.terminal:  # a finished record keeps no journal: the one before it has it
            self.round_ended(tp, offset, task_id, record, journal=completed_steps(old) + completed_steps(new))

    def _keep_summary(self, tp: TP, offset: int, task_id: str, old: TaskRecord | None, new: TaskRecord | None) -> None:
        """A round journaled its summary (execution/summary.py): stored with its conversation, where the next round
        starts from it (tables/summaries.py). A string test first: most transitions journal no summary."""
        if new is None or not new.steps_done or _SUMMARY not in new.steps_done:
            return
        if old is not None and old.steps_done and _SUMMARY in old.steps_done:
            return  # journaled before this transition: stored then
        parsed = round_of(task_id)
        entry = next((e for e in completed_steps(new) if isinstance(e, dict) and e.get("kind") == "summary"), None)
        if parsed is None or entry is None:
            return
        cid, since, number = parsed
        head = conversation_record(self.table, cid)
        if head is None or head.since != since:
            return  # a round of a conversation since deleted
        key = machine.summary_key(cid)
        stored = summaries.to_store(self.table.get(key), entry, round_number=number, now=time.time())
        if stored is not None:
            self.table[key] = stored
            self.outbox.deliver(tp, offset, [self.outbox.changelog(self.table, tp.partition, key)])

    def round_ended(
        self, tp: TP, offset: int, task_id: str, task: TaskRecord, journal: list[Any] | None = None,
    ) -> None:
        """The round of task ``task_id`` is terminal (applied now, or found so again): its reply recorded, the next
        round started. Applied again, it changes nothing."""
        parsed = round_of(task_id)
        if parsed is None or not task.terminal:
            return
        cid, since, number = parsed
        result = json.loads(task.result) if task.result else {"status": "failed", "error": f"round {task.state}"}
        head = conversation_record(self.table, cid)
        handed = machine.Change()
        if head is not None and head.answering == number and head.since == since:  # ends now, not again
            source = "outage" if result.get("source") == OUTAGE_SOURCE else "agent"
            reason = (handoff.OUTAGE_REASON if source == "outage"
                      else handoff.requested(journal if journal is not None else completed_steps(task)))
            if reason is not None:  # the agent called ``handoff`` or an outage ended the round: a person holds it
                handed = handoff.hand_over(head, by="", reason=reason, source=source, now=time.time(),
                                           levels=self.waits.levels(head.agent) if self.waits is not None else ())
                head = handed.head or head
                log.info("Conversation %s: handed to a person (%s: %s); it waits in the operators' inbox "
                         "(GET /handoffs, agents-stream conversations inbox)", cid, source, reason)
        end = machine.RoundEnd(
            since=since, number=number, status=result.get("status") or "failed", text=reply_text(result),
            task_id=task_id, error=result.get("error"), completed_at=task.finished_at or time.time(),
            handoff="outage" if result.get("source") == OUTAGE_SOURCE else None,
        )
        change = machine.round_ended(head, self.table.get, end, cid=cid, now=time.time())
        change.events = handed.events + change.events
        self._apply(tp, offset, cid, change)

    def _apply(
        self, tp: TP, offset: int, cid: str, change: machine.Change,
        message: tuple[ConversationMessage, bytes, Any] | None = None,
    ) -> None:
        sends: list[Send] = []
        writes = dict(change.writes)
        deleted = cid in writes and writes[cid] is None
        before = conversation_record(self.table, cid) if change.head is not None or deleted else None
        if change.head is not None:
            writes[cid] = change.head.to_json()
        for key, value in writes.items():
            if value is None:
                del self.table[key]
            else:
                self.table[key] = value
            sends.append(self.outbox.changelog(self.table, tp.partition, key))
        if self.waits is not None and (change.head is not None or deleted):
            sends += self.waits.after(tp.partition, cid, before, change.head, deleted)
        sends += [self._event(cid, e) for e in change.events]
        head = change.head or conversation_record(self.table, cid)
        starts: list[machine.StartRound] = []
        for effect in change.effects:
            match effect:
                case machine.SendReply(reply=reply):
                    sends.append(self._reply(cid, head, reply))
                case machine.Refuse(reason=reason, detail=detail) if message is not None:
                    self._refuse(tp, offset, cid, message, reason, detail)
                case machine.StartRound():
                    starts.append(effect)
                case machine.Interrupt(round=number) if head is not None:
                    self.interrupt(round_task_id(cid, number, self.partitions, head.since))
                case machine.DeleteRounds(rounds=rounds, since=since):
                    sends += self._delete_rounds(tp, cid, rounds, since)
        if sends:
            self.outbox.deliver(tp, offset, sends)
        for start in starts:  # after the writes: the round's task record is held with the same offset
            assert head is not None
            task = self.round_task(cid, head, start)
            stored = self.tasks.get(task.task_id)
            if stored and TaskRecord.from_json(stored).terminal:  # made again after a crash, and finished: its end
                self.round_ended(tp, offset, task.task_id, TaskRecord.from_json(stored))
            else:  # new, or made again after a crash: the same task id, so an open round goes on
                self.start(tp, offset, task)

    def round_task(self, cid: str, head: ConversationRecord, start: machine.StartRound) -> TaskPayload:
        """The task of round ``start.round``: its messages as the instruction, the history before them as context
        (the agent's context policy: at most ``history_messages`` items and ``history_chars`` of their text)."""
        config = self.agents.get(head.agent)
        limit, chars = (config.history_messages, config.history_chars) if config is not None else (20, 32_000)
        messages = machine.round_messages(head, start.round)
        earlier, first = machine.window(head, self.table.get, cid, start.round, limit, chars)
        history = [HistoryItem(**item) for item in earlier]
        given = None
        if config is not None and config.summary is not None:  # the older history: the summary and its overflow
            given = summaries.summary_input(self.table.get, cid, first, min_items=config.summary.min_items,
                                            input_chars=config.summary.input_chars)
        return TaskPayload(
            task_id=round_task_id(cid, start.round, self.partitions, head.since),
            agent_name=head.agent,
            instruction="\n\n".join(m["text"] for m in messages),
            context_data=messages[-1]["context"] if messages else {},
            conversation=ConversationContext(conversation_id=cid, message_ids=list(start.message_ids), history=history,
                                             summary=SummaryInput.model_validate(given) if given else None),
        )

    def join(self, tp: TP, offset: int, task_id: str, old: TaskRecord | None, record: TaskRecord | None,
             ) -> TaskRecord | None:
        """A round that stopped for new messages (``interrupt``) is dispatched again: the messages waiting join it,
        told to the model after its last journaled step (calls it asked for and never ran are answered "not run",
        so it decides again). The record to dispatch; as it was when nothing waits."""
        parsed = round_of(task_id)
        if record is None or old is None or record.dispatch <= old.dispatch or parsed is None:
            return record  # not dispatched again (given up, or already)
        head = conversation_record(self.table, parsed[0])
        if head is None or head.since != parsed[1]:
            return record
        cid, _, number = parsed
        change, joined = machine.join_round(head, cid, number, time.time())
        if not joined:
            return record
        self._apply(tp, offset, cid, change)
        text = "\n\n".join(m["text"] for m in joined)
        entries = completed_steps(record)
        turns = [e for e in entries if isinstance(e, dict) and e.get("kind") == "turn"]
        if turns:
            last = turns[-1]
            done = {e.get("id") for e in entries if isinstance(e, dict) and e.get("kind") == "tool"
                    and e.get("turn") == last["turn"]}
            entries += [{"kind": "tool", "turn": last["turn"], "id": c["id"], "name": c["name"],
                         "content": NOT_RUN, "error": False, "fatal": False, "attempts": 0}
                        for c in last["calls"] if c["id"] not in done]
        entries.append({"kind": "message", "turn": turns[-1]["turn"] if turns else -1,
                        "text": f"The customer wrote again:\n{text}"})
        log.info("Conversation %s: round %d stopped for %d new message(s) and goes on with them", cid, number,
                 len(joined))
        return replace(record, steps_done=json.dumps(entries, separators=(",", ":"), ensure_ascii=False))

    def sweep_idle(self, partition: int, now: float, idle_s: float, batch: int) -> list[ConversationDelete]:
        """The next ``batch`` entries of one partition's conversations: a conditional delete for each head idle
        past ``idle_s`` (the ledger applies it only if nothing came since). A slice at a time, like the expiry."""
        if idle_s <= 0 or not hasattr(self.table, "scan"):
            return []
        entries, self._idle_cursors[partition] = self.table.scan(partition, self._idle_cursors.get(partition), batch)
        return [
            ConversationDelete(conversation_id=key, agent_name=value["agent"], action="delete", by="idle expiry",
                               idle_since=value["updated_at"])
            for key, value in entries if machine.idle(key, value, now=now, idle_s=idle_s)
        ]

    def _delete_rounds(self, tp: TP, cid: str, rounds: int, since: int) -> list[Send]:
        """The task records of the conversation's rounds deleted (the finished ones: no round answers now)."""
        sends = []
        for number in range(1, rounds + 1):
            task_id = round_task_id(cid, number, self.partitions, since)
            stored = self.tasks.get(task_id)
            if stored and TaskRecord.from_json(stored).terminal:
                del self.tasks[task_id]
                sends.append(self.outbox.changelog(self.tasks, tp.partition, task_id))
        return sends

    def _reply(self, cid: str, head: ConversationRecord | None, reply: dict[str, Any]) -> Send:
        body = ConversationReply(
            conversation_id=cid, agent_name=head.agent if head is not None else "",
            message_ids=reply["message_ids"], round=reply["round"], status=reply["status"], text=reply["text"],
            task_id=reply["task_id"], error=reply["error"], completed_at=iso_utc(reply["completed_at"]),
            human=bool(reply.get("human")), operator=reply.get("operator"), handoff=reply.get("handoff"),
        )
        return self.outbox.record(REPLIES, cid.encode("utf-8"), body.model_dump_json().encode("utf-8"))

    def _event(self, cid: str, event: dict[str, Any]) -> Send:
        body = {"schema_version": SCHEMA_VERSION, "conversation_id": cid, **event, "at": utcnow_iso()}
        value = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        return self.outbox.record(topics.CONVERSATION_EVENTS, cid.encode("utf-8"), value)

    def _refuse(
        self, tp: TP, offset: int, cid: str, message: tuple[ConversationMessage, bytes, Any], reason: str,
        detail: str,
    ) -> None:
        msg, value, headers = message
        log.warning(
            "Conversation %s: message %s at %s[%d]@%d is refused (%s: %s); dead-lettered, the conversation goes on",
            cid, msg.message_id, tp.topic, tp.partition, offset, reason, detail,
        )
        if reason in ("message_conflict", "conversation_agent_mismatch"):
            self.outbox.control(
                f"alert.{reason}", cid, msg.agent_name,
                {"message_id": msg.message_id, "topic": tp.topic, "partition": tp.partition, "offset": offset},
            )
        self.poison.on_message(
            tp, offset, msg.agent_name, cid.encode("utf-8"), value, headers, PoisonMessage(reason, detail),
        )

    def _too_large(self, change: machine.Change) -> bool:
        """The head would not fit in a Kafka record (too many long messages wait). The other keys hold one message
        or one item each, no larger than the message that made them; only the head's waiting list grows."""
        if change.head is None:
            return False
        size = len(json.dumps(change.head.to_json(), separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
        return size > self.record_max_bytes

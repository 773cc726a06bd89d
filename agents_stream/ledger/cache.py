"""The last-good-answer cache: good answers stored per task fingerprint, lookups answered as outcome events."""

from __future__ import annotations

import json
import logging

from faust.types import TP

from agents_stream.contract.events import (
    ANSWERS,
    CachedAnswer,
    CacheLookup,
    CacheReply,
    CacheStore,
    EventDecodeError,
    TaskFailed,
    TaskSucceeded,
    decode_answer,
    encode,
    encode_answer,
    read_event,
)
from agents_stream.execution.outputs import fingerprint
from agents_stream.kafka.outbox import Outbox, Send
from agents_stream.tables.definitions import KeyedTable
from agents_stream.tables.leases import TaskRecord

log = logging.getLogger(__name__)


class AnswerCache:
    """The answers table (one partition per fingerprint) and the store requests good results send to it."""

    def __init__(
        self, table: KeyedTable, outbox: Outbox, *, answers_topic: str, outcomes_topic: str, worker_id: str,
        agents: set[str],
    ) -> None:
        self.table = table
        self.outbox = outbox
        self.answers_topic = answers_topic
        self.outcomes_topic = outcomes_topic
        self.worker_id = worker_id
        #: agents whose good answers feed the cache
        self.agents = agents

    def store(self, record: TaskRecord, event: TaskSucceeded | TaskFailed, now: float) -> Send | None:
        """A finished task's good answer, sent to its fingerprint's partition; None when it is not one."""
        if not (
            record.agent in self.agents
            and isinstance(event, TaskSucceeded)
            and event.status == "succeeded"
            and event.confidence in ("high", "medium")
        ):
            return None
        payload = json.loads(record.payload)
        if payload.get("conversation"):
            return None  # a conversation's reply depends on its history: never another conversation's answer
        fp = fingerprint(
            record.agent, payload.get("instruction", ""), payload.get("context_data") or {},
            payload.get("output_schema"),
        )
        body = encode(CacheStore(
            task_id=payload["task_id"], output=event.output, source=event.source, confidence=event.confidence, at=now,
        ))
        return self.outbox.record(self.answers_topic, fp.encode(), body)

    def on_event(self, tp: TP, offset: int, key: bytes | None, value: bytes | None) -> None:
        """The cache's partition of a fingerprint: store good answers, answer lookups (best effort)."""
        parsed = read_event(tp, offset, key, value, ANSWERS)  # logs and skips malformed and unknown kinds
        if parsed is None:
            return
        fp, event = parsed
        match event:
            case CacheStore():
                self.table[fp] = encode_answer(event.answer())  # the table's five keys
                self.outbox.deliver(tp, offset, [self.outbox.changelog(self.table, tp.partition, fp)])
            case CacheLookup(task_id=task_id, dispatch=dispatch):
                reply = CacheReply(dispatch=dispatch, worker=self.worker_id, answer=self._entry(fp))
                self.outbox.send(self.outcomes_topic, task_id.encode(), encode(reply))

    def _entry(self, fp: str) -> CachedAnswer | None:
        """The table's last good answer of ``fp``; None for none, and for an entry no store of ours wrote."""
        data = self.table.get(fp)
        if not data:
            return None
        try:
            return decode_answer(data)
        except EventDecodeError as exc:  # answering a miss beats raising inside the ledger
            log.warning("Cache entry %s is unusable (%s); answering a miss", fp, exc.reason)
            return None

"""The last-good-answer cache: good answers stored per task fingerprint, lookups answered as outcome events."""

from __future__ import annotations

import json
import logging
from typing import Any

from faust.types import TP

from agents_stream.contract.models import internal_event
from agents_stream.execution.outputs import fingerprint
from agents_stream.kafka.outbox import Outbox, Send
from agents_stream.tables.definitions import LedgerTable
from agents_stream.tables.leases import TaskRecord

log = logging.getLogger(__name__)


class AnswerCache:
    """The answers table (one partition per fingerprint) and the store requests good results send to it."""

    def __init__(
        self, table: LedgerTable, outbox: Outbox, *, answers_topic: str, outcomes_topic: str, worker_id: str,
        agents: set[str],
    ) -> None:
        self.table = table
        self.outbox = outbox
        self.answers_topic = answers_topic
        self.outcomes_topic = outcomes_topic
        self.worker_id = worker_id
        #: agents whose good answers feed the cache
        self.agents = agents

    def store(self, record: TaskRecord, event: dict[str, Any], now: float) -> Send | None:
        """A finished task's good answer, sent to its fingerprint's partition; None when it is not one."""
        if not (
            record.agent in self.agents
            and event["kind"] == "succeeded"
            and event.get("status", "succeeded") == "succeeded"
            and event.get("confidence") in ("high", "medium")
        ):
            return None
        payload = json.loads(record.payload)
        fp = fingerprint(
            record.agent, payload.get("instruction", ""), payload.get("context_data") or {},
            payload.get("output_schema"),
        )
        body = json.dumps({
            "schema_version": 1, "kind": "store", "task_id": payload.get("task_id"), "output": event.get("output"),
            "source": event.get("source", ""), "confidence": event.get("confidence"), "at": now,
        }).encode()
        return self.outbox.record(self.answers_topic, fp.encode(), body)

    def on_event(self, tp: TP, offset: int, key: bytes | None, value: bytes | None) -> None:
        """The cache's partition of a fingerprint: store good answers, answer lookups (best effort)."""
        parsed = internal_event(tp, offset, key, value, "cache")
        if parsed is None:
            return
        fp, event, kind = parsed
        if kind == "store":
            self.table[fp] = json.dumps({k: event.get(k) for k in ("task_id", "output", "source", "confidence", "at")})
            self.outbox.deliver(tp, offset, [self.outbox.changelog(self.table, tp.partition, fp)])
        elif kind == "lookup" and isinstance(event.get("task_id"), str):
            data = self.table.get(fp)
            reply = json.dumps({
                "schema_version": 1, "kind": "cache_reply", "dispatch": event.get("dispatch"), "worker": self.worker_id,
                "answer": json.loads(data) if data else None,
            }).encode()
            self.outbox.send(self.outcomes_topic, event["task_id"].encode(), reply)
        else:
            log.warning("Skipping cache event of unknown kind %r at %s[%d]@%d", kind, tp.topic, tp.partition, offset)

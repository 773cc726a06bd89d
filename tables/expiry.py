"""Which task-table entries are past their time to live (pure): a finished task's record, and the marker of a
poison message whose dead letter was sent. Open tasks, parked ones and the spend bookkeeping never expire.

An entry expires only when both hold:

- its time to live has passed (never shorter than the task topics' retention: ledger/expiry_sweep.py sets it), and
- the task message it stands for can no longer be read: the log start offset of that message's topic partition
  (the broker's earliest offset) has passed the message's offset.

Retention alone is not enough: Kafka deletes whole closed segments only (the active one never, and a segment
closes after ``segment.ms``, 7 days by default, or ``segment.bytes``), so a message outlives its ``retention.ms`` by
up to a segment. A message still in its topic must always find its record, so a redelivery, a rewound group or a
new app id reading from the start is answered from the record instead of run again (docs/decisions.md, "A record
outlives its task message").
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TypeGuard

from agents_stream.tables.leases import TERMINAL

__all__ = ["POISON_PREFIX", "LogStarts", "expired", "marked_message", "past_ttl", "source"]

#: the key prefix of a poison message's marker (ledger/poison.py)
POISON_PREFIX = "\x00dead/"

#: the log start offset (the earliest offset the broker still holds) of each (topic, partition) asked for
LogStarts = Mapping[tuple[str, int], int]


def expired(key: str, value: Any, *, now: float, ttl: float, partition: int, log_starts: LogStarts) -> bool:
    """Whether the entry ``key`` → ``value`` (as the table holds it: a record's dict, a marker's JSON string) of
    table partition ``partition`` has outlived ``ttl`` seconds at ``now`` and its task message is gone from its
    topic (``log_starts``; an unknown log start keeps the entry)."""
    if not past_ttl(key, value, now=now, ttl=ttl):
        return False
    message = source(key, value, partition)
    if message is None:
        return False
    topic, part, offset = message
    if offset < 0:
        return True  # a record made before its message came (a cancel ahead of the task): no message to outlive
    start = log_starts.get((topic, part))
    return start is not None and offset < start


def past_ttl(key: str, value: Any, *, now: float, ttl: float) -> bool:
    """Whether the entry is one that expires (finished, or a sent dead letter's marker) and ``ttl`` has passed."""
    if key.startswith(POISON_PREFIX):
        try:
            data = json.loads(value) if isinstance(value, str) else value
        except ValueError:
            return False
        at = data.get("at") if isinstance(data, dict) else None  # "sending" markers stay: the send may be open
        return _before(at, now - ttl)
    if key.startswith("\x00") or not isinstance(value, dict) or value.get("state") not in TERMINAL:
        return False
    return _before(value.get("finished_at"), now - ttl)


def source(key: str, value: Any, partition: int) -> tuple[str, int, int] | None:
    """The task message an entry stands for, as (topic, partition, offset); None when it names none readably
    (then the entry is kept: nothing says its message is gone)."""
    if key.startswith(POISON_PREFIX):
        marked = marked_message(key)
        return None if marked is None else (marked[0], partition, marked[1])
    if not isinstance(value, dict):
        return None
    topic, part, offset = value.get("topic"), value.get("partition"), value.get("offset")
    if not isinstance(topic, str) or not _integer(part) or not _integer(offset):
        return None
    return topic, part, offset


def marked_message(marker: str) -> tuple[str, int] | None:
    """(topic, offset) of the poison message a marker key names (``<POISON_PREFIX><topic>/<offset>``)."""
    topic, _, offset = marker[len(POISON_PREFIX):].rpartition("/")
    return (topic, int(offset)) if topic and offset.isdigit() else None


def _integer(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _before(when: Any, cutoff: float) -> bool:
    """``when`` is a time (a number, not a bool) no later than ``cutoff``."""
    return isinstance(when, (int, float)) and not isinstance(when, bool) and when <= cutoff

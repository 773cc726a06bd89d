"""Which task-table entries are past their time to live (pure): a finished task's record, and the marker of a
poison message whose dead letter was sent. Open tasks, parked ones and the spend bookkeeping never expire.

The time to live is never shorter than the task topics' retention (ledger/expiry.py settles it at start): a task
message still in its topic always finds its record, so a redelivery, a rewind or a new app id reading from the
start is answered from the record instead of run again.
"""

from __future__ import annotations

import json
from typing import Any

from agents_stream.tables.leases import TERMINAL

__all__ = ["POISON_PREFIX", "expired"]

#: the key prefix of a poison message's marker (ledger/poison.py)
POISON_PREFIX = "\x00dead/"


def expired(key: str, value: Any, *, now: float, ttl: float) -> bool:
    """Whether the entry ``key`` → ``value`` (as the table holds it: a record's dict, a marker's JSON string) has
    outlived ``ttl`` seconds at ``now``."""
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


def _before(when: Any, cutoff: float) -> bool:
    """``when`` is a time (a number, not a bool) no later than ``cutoff``."""
    return isinstance(when, (int, float)) and not isinstance(when, bool) and when <= cutoff

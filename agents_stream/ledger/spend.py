"""Spend per agent, day and partition, kept in the task table: each partition sums its own tasks' cost."""

from __future__ import annotations

import json
import math
from typing import Any

from faust.types import TP

from agents_stream.execution import pricing
from agents_stream.kafka.outbox import Outbox, Send
from agents_stream.tables.definitions import KeyedTable


def spend_key(agent: str, day: str, partition: int) -> str:
    """Spend lives in the task table under one key per agent, day and partition: each partition sums its own."""
    return f"\x00spend/{agent}/{day}/{partition}"


#: the days of spend kept in the table: today and yesterday (a daily budget reads today's only)
KEEP_DAYS = 2
#: how far back the first cost of a day looks for older days' keys to delete (a partition idle longer keeps them)
PRUNE_LOOKBACK_DAYS = 31


def add_spend(table: KeyedTable, outbox: Outbox, tp: TP, agent: str, cost: float, now: float) -> list[Send]:
    """Add a finished task's cost to its partition's spend of the day; the sends are held with the outcome.
    The day's first cost also deletes the agent's keys of this partition older than ``KEEP_DAYS``."""
    if not (math.isfinite(cost) and cost > 0):
        return []  # a cost that is no amount would make the day's spend NaN or negative for good
    key = spend_key(agent, pricing.day_key(now), tp.partition)
    before = table.get(key)
    usd = (json.loads(before)["usd"] if before else 0.0) + float(cost)
    table[key] = json.dumps({"usd": round(usd, 9)})
    sends = [outbox.changelog(table, tp.partition, key)]
    if before is None:
        for back in range(KEEP_DAYS, KEEP_DAYS + PRUNE_LOOKBACK_DAYS):
            old = spend_key(agent, pricing.day_key(now - back * 86_400), tp.partition)
            if old in table:
                del table[old]
                sends.append(outbox.changelog(table, tp.partition, old))
    return sends


def spend_report(table: KeyedTable, partitions: set[int], agents: list[str], now: float) -> dict[str, Any]:
    """{agent: {day: {partition: usd}}} for this worker's partitions, for the circuits' presence events."""
    day = pricing.day_key(now)
    report: dict[str, Any] = {}
    for agent in agents:
        parts = {}
        for p in partitions:
            data = table.get(spend_key(agent, day, p))
            if data:
                parts[str(p)] = json.loads(data)["usd"]
        if parts:
            report[agent] = {day: parts}
    return report

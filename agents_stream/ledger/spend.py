"""Spend per agent, day and partition, kept in the task table: each partition sums its own tasks' cost."""

from __future__ import annotations

import json
from typing import Any

from faust.types import TP

from agents_stream.execution import pricing
from agents_stream.kafka.outbox import Outbox, Send
from agents_stream.tables.definitions import LedgerTable


def spend_key(agent: str, day: str, partition: int) -> str:
    """Spend lives in the task table under one key per agent, day and partition: each partition sums its own."""
    return f"\x00spend/{agent}/{day}/{partition}"


def add_spend(table: LedgerTable, outbox: Outbox, tp: TP, agent: str, cost: float, now: float) -> Send:
    """Add a finished task's cost to its partition's spend of the day; the send is held with the outcome."""
    key = spend_key(agent, pricing.day_key(now), tp.partition)
    before = table.get(key)
    usd = (json.loads(before)["usd"] if before else 0.0) + float(cost)
    table[key] = json.dumps({"usd": round(usd, 9)})
    return outbox.changelog(table, tp.partition, key)


def spend_report(table: LedgerTable, partitions: set[int], agents: list[str], now: float) -> dict[str, Any]:
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

"""The ledger applies a record of an input partition only once this worker claimed the partition after its
assignment (agents_stream.kafka.takeover.Takeover.admit): before that its table partition may still be rebuilt
from the changelog, where a task another worker finished has no record yet and would run again (the chaos run's
three tasks with two results)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agents_stream.kafka.takeover import ClaimedTable, Takeover
from agents_stream.settings import Settings

TOPIC = "agent.tasks.a"


@dataclass
class TheseTables:
    """The tables a takeover claims (``ClaimedTables``): none unless given."""

    tables: list[ClaimedTable] = field(default_factory=list)

    def all(self) -> list[ClaimedTable]:
        return self.tables


@dataclass
class ClosedTable:
    """A table whose store is closed: its claim fails (``ClaimedTable``)."""

    name: str = "tasks"

    def claim_epoch(self, partition: int) -> tuple[int, Any]:
        raise RuntimeError("the store is closed")

    def send_changelog(self, partition: int, key: str, value: Any, /) -> Any:
        raise AssertionError("no epoch was claimed: nothing to send")


def _takeover(assigned: list[int]) -> Takeover:
    return Takeover(
        Settings(), "group", "w1", TheseTables(),  # no table: the claim has nothing to send
        partitions=lambda: list(assigned), scan_gone=lambda now: [],
        learned=lambda members: None, send_outcome=lambda key, value: None, alert=lambda exc: None,
    )


async def test_records_of_a_partition_are_applied_only_after_its_claim() -> None:
    assigned = [0, 2]
    takeover = _takeover(assigned)
    assert not takeover.admit(TOPIC, 2, 151), "applied before the partition's table was recovered and claimed"
    await takeover.claim_epochs()
    assert takeover.admit(TOPIC, 2, 151) and takeover.admit(TOPIC, 0, 7)
    assert not takeover.admit(TOPIC, 1, 3), "a partition not claimed here"


async def test_a_revoked_partition_waits_for_the_next_claim() -> None:
    assigned = [0, 2]
    takeover = _takeover(assigned)
    await takeover.claim_epochs()
    takeover.revoked({0, 2})  # every rebalance revokes the whole assignment first
    assigned[:] = [2]
    assert not takeover.admit(TOPIC, 2, 160)
    await takeover.claim_epochs()
    assert takeover.admit(TOPIC, 2, 160) and not takeover.admit(TOPIC, 0, 8)


async def test_a_claim_that_fails_does_not_hold_the_partitions_for_good() -> None:
    """A claim the brokers did not confirm is logged (tables/epochs.py explains what it risks); the partitions go
    on, as they did before the claim existed — a stuck partition would lose every task on it."""
    takeover = _takeover([3])
    takeover.tables = TheseTables([ClosedTable()])
    await takeover.claim_epochs()
    assert takeover.admit(TOPIC, 3, 0)

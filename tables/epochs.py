"""Owner epochs: each time a worker takes a table partition over, it writes a higher epoch to that partition's
changelog before it writes anything else there, and every record it writes carries that epoch in a header. A record
whose epoch is lower than one already read on the same partition comes from an owner the partition has since moved
from (a worker cut off or paused while its batch waited in its producer): recovery and standbys skip it, so it is
never read as current, whenever it lands (docs/security.md, "Fencing"). Pure: no I/O.
"""

from __future__ import annotations

from typing import Any, Iterable

__all__ = ["HEADER", "EpochFilter", "epoch_in", "epoch_key", "header", "next_epoch"]


def epoch_key(partition: int) -> str:
    """The key table partition ``partition`` keeps its owner epoch under: never expired, never a task id (task ids
    have no control characters; the app's own keys start with one), one per partition (a flush stages each key in
    one partition)."""
    return f"\x00owner-epoch/{partition}"

#: the changelog record header that carries the writer's epoch
HEADER = "agents_stream.epoch"


def header(epoch: int) -> tuple[str, bytes]:
    return (HEADER, str(epoch).encode())


def epoch_in(headers: Iterable[Any] | None) -> int | None:
    """The epoch a changelog record's headers carry; None for a record written without one (before this worker
    version: accepted, as it always was)."""
    for item in headers or ():
        name, value = item[0], item[1]
        if name == HEADER and value is not None:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def next_epoch(stored: Any) -> int:
    """The epoch a new owner takes: one more than the partition's stored one (``{"epoch": n}`` or nothing)."""
    current = stored.get("epoch", 0) if isinstance(stored, dict) else 0
    return (current if isinstance(current, int) else 0) + 1


class EpochFilter:
    """Per partition, the highest epoch read so far; ``keep`` says whether a record may be applied."""

    def __init__(self) -> None:
        self.highest: dict[int, int] = {}

    def known(self, partition: int) -> bool:
        return partition in self.highest

    def start(self, partition: int, stored: int) -> None:
        """What the local store already holds for ``partition`` (its stored epoch), before reading more."""
        self.highest[partition] = max(self.highest.get(partition, 0), stored)

    def keep(self, partition: int, epoch: int | None) -> bool:
        """A record of ``partition`` with ``epoch``: applied unless an owner with a higher epoch wrote before it."""
        if epoch is None:
            return True
        highest = self.highest.get(partition, 0)
        if epoch < highest:
            return False
        self.highest[partition] = epoch
        return True

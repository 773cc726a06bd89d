"""What a worker does once a rebalance completes: it claims an owner epoch on every table partition
it now owns (before the ledger reads a record of them), reads who is still in the group, renews the leases of the
runs going on here, and takes over at once the tasks whose lease's owner left the group (docs/security.md,
"Fencing")."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from functools import partial
from typing import Any, Callable, Protocol

from agents_stream.contract.events import LeaseExpired, encode
from agents_stream.kafka.delivery import Undeliverable, until_confirmed
from agents_stream.kafka.members import group_members
from agents_stream.settings import Settings
from agents_stream.tables.epochs import epoch_key

__all__ = ["EPOCH_CLAIM_S", "TAKEOVER_SCAN_S", "ClaimedTable", "ClaimedTables", "Takeover"]

log = logging.getLogger(__name__)

#: how often tasks whose lease's owner left the group are looked for (memory only)
TAKEOVER_SCAN_S = 1.0
#: how often the members are asked for after a rebalance while the group is not stable yet, and how far apart
MEMBERS_TRIES = 30
MEMBERS_RETRY_S = 1.0
#: how long a rebalance waits for the broker to confirm the owner epochs of the partitions it assigned
EPOCH_CLAIM_S = 30.0


class ClaimedTable(Protocol):
    """A table as the takeover claims its partitions (``LedgerTable`` is one): a higher owner epoch, and the
    changelog send that carries it."""

    @property
    def name(self) -> str: ...

    def claim_epoch(self, partition: int) -> tuple[int, Any]: ...

    def send_changelog(self, partition: int, key: str, value: Any, /) -> Any: ...


class ClaimedTables(Protocol):
    """The tables whose partitions the takeover claims (``Tables`` is them)."""

    def all(self) -> Sequence[ClaimedTable]: ...


class Takeover:
    """The rebalance's part of fencing. ``partitions()``: the partition numbers this worker owns now;
    ``scan_gone(now)``: (task_id, dispatch) of the tasks whose lease's owner left (Ledger.scan_gone);
    ``learned``: where the group's members go (Scanner.learned_members); ``send_outcome(key, value)``: a record on
    this app's outcomes topic; ``alert(error)``: a broker send keeps failing."""

    def __init__(
        self, settings: Settings, group: str, worker_id: str, tables: ClaimedTables, *,
        partitions: Callable[[], list[int]], scan_gone: Callable[[float], list[tuple[str, int]]],
        learned: Callable[[frozenset[str] | None], None], send_outcome: Callable[[bytes, bytes], Any],
        alert: Callable[[BaseException], None],
    ) -> None:
        self.settings = settings
        self.group = group
        self.worker_id = worker_id
        self.tables = tables
        self.partitions = partitions
        self.scan_gone = scan_gone
        self.learned = learned
        self.send_outcome = send_outcome
        self.alert = alert
        #: rebalances seen: an answer about the group's members counts only for the latest
        self.rebalances = 0
        #: the partitions this worker claimed since they were last assigned to it (``claim_epochs``): their table
        #: partitions are recovered, so the ledger may apply their records (``admit``)
        self.claimed: set[int] = set()
        self._refused: set[int] = set()  # partitions whose early records were logged since the last revoke

    async def claim_epochs(self) -> None:
        """``_claim_epochs``, never raising: it runs in Faust's rebalance signal, where an exception crashes the
        worker."""
        mine = self.partitions()
        try:
            await self._claim_epochs(mine)
        except Exception as exc:
            log.exception("Claiming the owner epochs after a rebalance failed (%r): a record a former owner writes "
                          "late may be read as current by a later recovery. Report it with this log", exc)
        self.claimed = set(mine)  # a claim the brokers did not confirm is logged; the partitions go on as before

    def revoked(self, partitions: set[int]) -> None:
        self.claimed -= partitions
        self._refused -= partitions

    def admit(self, topic: str, partition: int, offset: int) -> bool:
        """Whether the ledger may apply this record of an input topic: its partition was claimed since it was
        assigned here. Faust holds the input partitions until their tables are recovered; a record that arrives
        before that (a partition resumed too early) would meet a table partition still being rebuilt, where a task
        another worker finished has no record yet and would run again. Not applied, it is read again from the
        group's commit when Faust resumes the streams after the claim (every input topic is copartitioned)."""
        if partition in self.claimed:
            return True
        if partition not in self._refused:
            self._refused.add(partition)
            log.warning(
                "A record of %s[%d]@%d arrived before this worker claimed the partition (its table partition may "
                "still be recovering): not applied here; it is read again from the group's commit once the claim "
                "is done. If this repeats, report it with this log", topic, partition, offset,
            )
        return False

    async def _claim_epochs(self, mine: list[int]) -> None:
        """Every table partition this worker now owns gets a higher owner epoch, confirmed by the broker before the
        ledger reads any record of it (the streams resume after this): from then on, a record a former owner writes
        there is skipped by every later recovery (tables/epochs.py)."""
        claims = []
        for table in self.tables.all():
            for partition in mine:
                epoch, sent = table.claim_epoch(partition)
                claims.append(until_confirmed(
                    partial(table.send_changelog, partition, epoch_key(partition), {"epoch": epoch}), first=sent,
                    what=f"the owner epoch {epoch} of {table.name}[{partition}]", alert=self.alert,
                ))
        if not claims:
            return
        try:
            await asyncio.wait_for(asyncio.gather(*claims), timeout=EPOCH_CLAIM_S)
        except (asyncio.TimeoutError, Undeliverable) as exc:
            log.error(
                "The owner epochs of partitions %s were not confirmed within %.0fs (%r): until they are, a record a "
                "former owner of them writes late could be read as current by a later recovery. Check the brokers",
                mine, EPOCH_CLAIM_S, exc,
            )

    async def learn_members(self) -> None:
        """Who is in the group now; the tasks of owners that left are taken over at once. Asked again while the
        group is between generations, until a later rebalance asks for itself (its answer is the current one)."""
        self.rebalances += 1
        mine = self.rebalances
        self.learned(None)  # until read: the last members may have left since
        why = "not asked"
        for _ in range(MEMBERS_TRIES):  # mid-rebalance the coordinator does not say (members_of: only Stable)
            found, why = await group_members(self.settings, self.group)
            if mine != self.rebalances:
                return  # a later rebalance reads them
            if found is not None:
                log.info("The group has %d members after this rebalance; leases held by workers outside it are "
                         "taken over now", len(found))
                self.learned(found)
                self.take_over()
                return
            await asyncio.sleep(MEMBERS_RETRY_S)
        log.warning(
            "The members of group %s could not be read for %d tries after this rebalance (last: %s): leases of "
            "workers that left are waited out (lease_ttl_s) until the next rebalance. Check the brokers' group "
            "coordinator", self.group, MEMBERS_TRIES, why,
        )

    def take_over(self) -> None:
        """Tasks whose lease's owner left the group: asked of the ledger now, not once the lease lapses."""
        for task_id, dispatch in self.scan_gone(time.time()):
            self.send_outcome(task_id.encode(), encode(LeaseExpired(dispatch=dispatch, worker=self.worker_id)))

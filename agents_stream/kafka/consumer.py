"""Faust's aiokafka consumer with the commit decision replaced by our watermark.

docs/faust.md: ``Consumer._new_offset`` is the one place Faust turns acked
offsets into the offset it commits, and at 0.15.3 it commits past un-acked
and in-flight messages; a failed broker commit still advances its in-memory
committed offset (faust-streaming/faust#316). For the partitions the ledger manages we commit
``Watermark.commit_offset`` instead, and a failed commit is retried next time
and reported as an alert. Other partitions keep Faust's behaviour.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from time import monotonic
from typing import Any, Callable, Iterable, Mapping, Optional, cast

from aiokafka.protocol.group import HeartbeatRequest, SyncGroupRequest
from aiokafka.structs import OffsetAndMetadata
from faust.transport.consumer import ensure_TPset
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread, ensure_aiokafka_TP
from faust.transport.drivers.aiokafka import Consumer as AIOKafkaConsumer
from faust.transport.drivers.aiokafka import Producer as AIOKafkaProducer
from faust.transport.drivers.aiokafka import Transport as AIOKafkaTransport
from faust.types import TP

from agents_stream.contract.topics import CIRCUITS, CONTROL
from agents_stream.kafka.direct import DirectSends
from agents_stream.kafka.rereads import Rereads
from agents_stream.kafka.watermark import Watermark

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Commits:
    """What the consumer commits on the ledger's partitions, and whom it tells when a commit failed.

    Given to ``WatermarkTransport`` (the app's ``_new_transport``), which hands it to the consumer Faust makes.
    """

    watermark: Watermark
    #: the input topics the ledger manages; other partitions keep Faust's own commit decision
    managed_topics: frozenset[str]
    on_failed: Callable[[dict[TP, int], BaseException], None]


#: how long the broker holds a fetch that finds nothing new (Faust asks for 1,500 ms). The broker answers one
#: connection's requests in order, and a worker's end-offset and earliest-offset requests share that connection with
#: its fetches: each waited behind a held fetch, and a partition resumed while one was held was first fetched once it
#: came back — after a takeover, seconds before a dead worker's tasks were read (docs/decisions.md, "Short fetch
#: waits"). A record that arrives ends a held fetch at once either way; an idle worker asks ten times a second.
FETCH_MAX_WAIT_MS = 100


class WatermarkConsumerThread(AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS  # read when the consumer starts its fetcher
        return consumer

    def coordinator(self) -> Any:
        """aiokafka's group coordinator of this thread's consumer (None without a group). aiokafka keeps the member
        id, the offset fetch for a set of partitions, the request for a new generation and the answers to heartbeats
        there only: this is the one place that reads its private name."""
        return getattr(self._ensure_consumer(), "_coordinator", None)

    async def on_start(self) -> None:
        await super().on_start()
        coordinator = self.coordinator()
        if coordinator is not None:
            watch_group_answers(coordinator, cast("WatermarkConsumer", self.consumer).confirmed_member)

    async def _commit(self, offsets: Mapping[TP, int]) -> bool:
        # Faust crashes the worker on any commit error. A lost broker connection or
        # a commit refused during a rebalance is layer 3: nothing counts as done,
        # the same watermark is committed on the next round, and operators hear of it.
        consumer = self._ensure_consumer()
        assigned = self.assignment()
        commitable = {tp: off for tp, off in offsets.items() if tp in assigned}
        if not commitable:
            return False
        coordinator = self.coordinator()
        if coordinator is not None and not in_a_generation(coordinator.generation):
            cast("WatermarkConsumer", self.consumer)._last_commit_error = NotAMember(
                "this worker is not a member of the group's current generation (cut off past its session, joining "
                "again, or leaving): its offsets may be behind what the partitions' owners committed meanwhile"
            )
            return False
        sent = monotonic()
        try:
            await consumer.commit(
                {ensure_aiokafka_TP(tp): OffsetAndMetadata(off, "") for tp, off in commitable.items()}
            )
        except Exception as exc:  # every failure is retried next round; see above
            cast("WatermarkConsumer", self.consumer)._last_commit_error = exc
            return False
        cast("WatermarkConsumer", self.consumer).confirmed_member(sent)
        now = monotonic()
        self.tp_last_committed_at.update({tp: now for tp in commitable})
        return True

    async def committed_offsets(self, tps: set[TP]) -> dict[TP, int | None]:
        # One OffsetFetch request for them all (the consumer's ``committed`` asks one partition per round trip,
        # and a worker owns dozens of input partitions): aiokafka's coordinator takes a set, the consumer does not.
        found = await self.coordinator().fetch_committed_offsets({ensure_aiokafka_TP(tp) for tp in tps})
        offsets = {ensure_aiokafka_TP(tp): meta.offset for tp, meta in found.items()}  # none without a commit
        return {tp: offsets.get(ensure_aiokafka_TP(tp)) for tp in tps}


class NotAMember(Exception):
    """A commit not sent: this worker is in no generation of its group (``in_a_generation``)."""


def in_a_generation(generation: int) -> bool:
    """Whether a consumer whose group coordinator holds ``generation`` may commit: only as a member of a generation.

    aiokafka sets it to -1 when the group no longer knows this worker (cut off past its session, before it joins
    again) and when it leaves. A commit sent then goes out as a consumer outside any group, which the broker accepts
    while the group has no members: a worker cut off while another ran its tasks and left, coming back, committed its
    own offsets from before the cut over the ones the other had committed, and read those tasks again from there
    (each finished one's result was sent a second time). Its next commit, as a member, carries the same watermark."""
    return generation > 0


def watch_group_answers(coordinator: Any, confirmed: Callable[[float], None]) -> None:
    """Call ``confirmed(sent)`` for every heartbeat and every group sync the group's coordinator answers without an
    error: each counts this worker a member of the current generation, as an accepted commit does.

    Commits alone were not enough: Faust flushes its producer buffer before each commit, and in a burst the buffer
    stays full, so a busy worker went 5-7 s without a commit, counted itself no member and held every task's
    follow-ups (docs/decisions.md, "Fencing: confirmed membership"). The heartbeats run on the consumer's thread every
    heartbeat interval whatever the producer does. aiokafka answers a heartbeat only to its own routine (which
    counts a "rebalance in progress" answer a success), so the coordinator's request method is wrapped here.

    The sync that ends a rebalance counts too: aiokafka starts heartbeating only once Faust's assignment callback
    returned, a heartbeat interval later, so a worker that had just joined had no word from the group for a second
    or more while it already owned partitions and wrote them. Stopped in that window, it woke with no confirmation
    older than its stop to tell it had been away (docs/decisions.md, "Fencing: confirmed membership")."""
    send = coordinator._send_req

    async def send_req(request: Any) -> Any:
        sent = monotonic()
        resp = await send(request)
        if isinstance(request, HeartbeatRequest | SyncGroupRequest) and getattr(resp, "error_code", None) == 0:
            confirmed(sent)
        return resp

    coordinator._send_req = send_req


def commit_again(
    candidates: Iterable[TP], committed: Mapping[TP, int | None], managed: frozenset[str],
) -> dict[TP, int]:
    """When nothing moved: one managed partition's committed offset, to commit again (a no-op for the group), so a
    quiet worker still learns, every quarter of a session timeout, that the coordinator counts it a member
    (``member_at``)."""
    for tp in sorted(candidates):
        offset = committed.get(tp)
        if tp.topic in managed and offset is not None:
            return {tp: offset}
    return {}


FAULT_DROP_FETCHED = "AGENTS_STREAM_FAULT_DROP_FETCHED"


class WatermarkConsumer(AIOKafkaConsumer):
    _last_commit_error: BaseException | None = None
    _drop_fetched: dict[str, int] | None = None
    #: when (monotonic) the last commit or heartbeat the group coordinator accepted was sent: this worker was a
    #: member of the group's current generation then, and its assignment cannot have gone to another member before
    #: its session (at least session timeout after that, less a heartbeat interval) expired
    member_at: float | None = None

    def confirmed_member(self, sent: float) -> None:
        """The coordinator accepted a commit or a heartbeat sent at ``sent`` (monotonic): see ``member_at``."""
        if self.member_at is None or sent > self.member_at:
            self.member_at = sent

    def member_since(self, seconds: float) -> bool:
        """True when a commit or heartbeat sent within the last ``seconds`` was accepted (see ``member_at``)."""
        return self.member_at is not None and monotonic() - self.member_at < seconds

    def member_id(self) -> str | None:
        """The id the group's coordinator knows this worker by: the same across the rebalances it stays in the group
        for, a new one when it joins again after the group expelled it, '' while it joins; None before the Kafka
        client started (execution/membership.py)."""
        try:  # aiokafka keeps the member id on its coordinator only; Faust's thread, only behind _ensure_consumer
            coordinator = cast(WatermarkConsumerThread, self._thread).coordinator()
        except Exception:  # not started yet (Faust's ConsumerNotStarted), or stopping
            return None
        return cast("str | None", getattr(coordinator, "member_id", None))

    #: the partitions being read again, whose records fetched before the seek are passed over (see ``Rereads``)
    rereads: Rereads

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rereads = Rereads()

    async def read_again(self, tp: TP, offset: int) -> None:
        """Seek ``tp`` back to ``offset``, passing over its records fetched before the seek (``Rereads``)."""
        self.rereads.start(tp, offset, monotonic())
        try:
            await self.seek(tp, offset)
        except BaseException:
            self.rereads.cancel([tp])
            raise

    async def getmany(self, timeout: float) -> Any:
        """Faust's delivery of one fetched batch, less the records a re-read passes over (``Rereads``)."""
        rereads = self.rereads
        async for tp, message in super().getmany(timeout):
            if rereads and rereads.passes_over(tp, message.offset, monotonic()):
                continue
            yield tp, message

    async def _getmany(self, active_partitions: Any, timeout: float) -> Any:
        records = await super()._getmany(active_partitions, timeout)
        if self._drop_fetched is None:
            self._drop_fetched = _fault_drops()
        if self._drop_fetched and records:
            records = _drop_records(records, self._drop_fetched)
        return records

    #: input partitions the worker's intake holds paused (a provider down, a queue full: ``Flow.update``). Faust
    #: resumes every assigned partition when a recovery ends; these stay paused until the intake lets them go.
    held: frozenset[TP] = frozenset()

    def resume_partitions(self, tps: Any) -> None:
        """Fetch ``tps`` again, less those the intake holds (see ``held``)."""
        super().resume_partitions(ensure_TPset(tps) - self.held)

    def pause_partitions(self, tps: Any) -> None:
        """Stop fetching ``tps`` without dropping the batch being delivered: a new active set, not the one the
        running batch checks its records against (docs/decisions.md, "Pausing without dropping a batch")."""
        tpset = ensure_TPset(tps)
        self._active_partitions = set(self._get_active_partitions()) - tpset
        self._paused_partitions.update(tpset)

    async def committed_offsets(self, tps: set[TP]) -> dict[TP, int | None]:
        """The group's committed offsets of ``tps``, as the broker has them."""
        thread = cast(WatermarkConsumerThread, self._thread)
        return await thread.call_thread(thread.committed_offsets, tps)

    def request_rejoin(self) -> None:
        """Ask the group's coordinator for a new generation. Called from the Kafka client's own group coordination
        (``kafka/assignor.py``), on its thread: aiokafka has no public way to ask, so its coordinator is asked."""
        cast(WatermarkConsumerThread, self._thread).coordinator().request_rejoin()

    def _new_consumer_thread(self) -> WatermarkConsumerThread:
        return WatermarkConsumerThread(self, loop=self.loop, beacon=self.beacon)

    def active_partitions(self) -> set[TP]:
        """The partitions being fetched now (Faust's active set, which pauses and rebalances change)."""
        return set(self._get_active_partitions())

    def paused_partitions(self) -> set[TP]:
        """Partitions paused (by us or by Faust's rebalance), which a new assignment keeps out of the active set."""
        return set(self._paused_partitions)

    def buffered_partitions(self) -> set[TP]:
        """Partitions Faust holds back because their stream buffer is full."""
        return set(self._buffered_partitions)

    def committed_offset(self, tp: TP) -> int | None:
        """The last offset committed on ``tp`` as Faust remembers it (no broker request)."""
        return self._committed_offset.get(tp)

    def _commits(self) -> Commits | None:
        return getattr(self.transport, "commits", None)

    def _filter_tps_with_pending_acks(self, topics: Any = None) -> Any:
        # Faust only looks at partitions with acks; ours can advance without a new
        # ack (a send confirmed later), so they are always candidates.
        tps = set(super()._filter_tps_with_pending_acks(topics))
        commits = self._commits()
        if commits is not None:
            tracked = cast("set[TP]", commits.watermark.tracked())  # the ledger holds offsets of TPs
            tps.update(tp for tp in tracked if topics is None or tp in topics or tp.topic in topics)
        return tps

    def _filter_committable_offsets(self, tps: Any) -> dict[TP, int]:
        candidates = list(tps)
        offsets = super()._filter_committable_offsets(candidates)
        # A quarter of the session timeout: the outcomes applied here need a commit accepted within half of it.
        if offsets or self.member_since(self.app.conf.broker_session_timeout / 4):
            return offsets
        commits = self._commits()
        managed = commits.managed_topics if commits is not None else frozenset()
        return commit_again(candidates, self._committed_offset, managed)

    def _new_offset(self, tp: TP) -> Optional[int]:
        commits = self._commits()
        if commits is None or tp.topic not in commits.managed_topics:
            return super()._new_offset(tp)
        # Faust's own ack list is not consulted; keep it from growing.
        acked = self._acked.get(tp)
        if acked:
            acked.clear()
            self._acked_index[tp].clear()
        return commits.watermark.commit_offset(tp)

    async def _commit_offsets(self, offsets: Mapping[TP, int], start_new_transaction: bool = True) -> bool:
        before = {tp: self._committed_offset.get(tp) for tp in offsets}
        self._last_commit_error = None
        did_commit = await super()._commit_offsets(offsets, start_new_transaction=start_new_transaction)
        error = cast("BaseException | None", self._last_commit_error)  # set by the thread's _commit, meanwhile
        if error is not None:
            # Faust marks the offsets committed even when the broker refused (faust-streaming/faust#316):
            # undo that so the same watermark is committed again on the next round.
            for tp, offset in before.items():
                self._committed_offset[tp] = offset
            commits = self._commits()
            if commits is not None:
                commits.on_failed(dict(offsets), error)
        return did_commit


def _fault_drops() -> dict[str, int]:
    """Fault injection for the stall tests: ``<topic>=<n>[,...]`` drops the first n fetched records of each topic
    after aiokafka has passed them, which is what Faust's fetcher does in the rare stall (docs/decisions.md);
    ``<topic>:<partition>=<n>`` only those of that partition."""
    spec = os.environ.get(FAULT_DROP_FETCHED, "")
    drops = {}
    for item in filter(None, spec.split(",")):
        topic, _, count = item.partition("=")
        drops[topic.strip()] = int(count or 1)
    if drops:
        log.warning(
            "%s is set: dropping fetched records %s (a test fault; never set it in production)",
            FAULT_DROP_FETCHED, drops,
        )
    return drops


def _drop_records(records: Any, drops: dict[str, int]) -> Any:
    kept = {}
    for tp, batch in records.items():
        name = f"{tp.topic}:{tp.partition}" if f"{tp.topic}:{tp.partition}" in drops else tp.topic
        left = drops.get(name, 0)
        if left:
            gone = min(left, len(batch))
            drops[name] = left - gone
            log.warning("Fault injection dropped %d fetched record(s) of %s:%d", gone, tp.topic, tp.partition)
            batch = batch[gone:]
        if batch:
            kept[tp] = batch
    return kept


#: how many records Faust's producer buffer holds before the conductor stops delivering records until it drained
#: (Faust: 100). A table flush puts a record per key into it at once. B1 with 100 and with 2,000, runs alternated
#: (4,000 tasks, a loaded machine): 210, 204, 399 against 461, 410, 579 tasks/s (docs/decisions.md, "Coalesced
#: table writes").
PRODUCER_BUFFER_MESSAGES = 2000


#: the topics whose records nobody waits for: each rides with the next record of another topic (``kafka.direct``)
RIDERS = frozenset({CONTROL, CIRCUITS})


class IdempotentProducer(AIOKafkaProducer):
    """Faust's aiokafka producer with idempotence on (Faust sets it only inside transactions): a batch retried
    after a leader failover is written once, not twice (docs/cluster.md). Needs acks=all, which the app sets.
    Its buffer holds ``PRODUCER_BUFFER_MESSAGES`` before the consumer waits for it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.buffer.max_messages = PRODUCER_BUFFER_MESSAGES
        self._tracked: set[str] = set()
        #: records sent straight into aiokafka's batches, past Faust's buffer (the tables' changelogs, and every
        #: record of a topic of raw keys and values: ``GuardedTopic``); they wait for ``on_start`` to finish. The
        #: control and breaker events ride with the next other record (``kafka.direct``, riders)
        self.direct = DirectSends(self._ensure_producer, self.track, started=False, riders=RIDERS)
        #: the topics the broker had when this worker started (``kafka.admin.ensure_topics`` fills it): Faust's
        #: declares of them are skipped (``create_topic``)
        self.present_topics: set[str] = set()

    def _settings_extra(self) -> Mapping[str, Any]:
        return {**super()._settings_extra(), "enable_idempotence": True}

    def track(self, topic: str) -> None:
        # aiokafka's client refreshes the metadata of the topics it tracks, and of every topic in the cluster while
        # it tracks none: it starts with all of them, and a topic already in that first answer is never tracked, so
        # a worker asked for the whole cluster every refresh (5% of its CPU on a broker of 2,400 topics). Tracking
        # each topic before its first send narrows the refresh to the topics this worker writes.
        if topic not in self._tracked:
            self._tracked.add(topic)
            self._ensure_producer().client.add_topic(topic)

    async def send(self, topic: str, *args: Any, **kwargs: Any) -> Any:
        self.track(topic)
        return await super().send(topic, *args, **kwargs)

    async def on_start(self) -> None:
        await super().on_start()  # Faust makes the aiokafka producer here, a new one even if one was made before
        self.direct.running.set()

    async def on_stop(self) -> None:
        await self.direct.stop()  # a direct send still waiting for metadata: its records stay unconfirmed
        await super().on_stop()

    async def create_topic(self, topic: str, partitions: int, replication: int, **kwargs: Any) -> None:
        """Faust's declare of a topic, skipped for one the broker had when this worker started (``present_topics``).

        Faust declares each of the app's topics as it starts: a CreateTopics request, then a metadata refresh that
        asks for the whole cluster (the producer tracks no topic yet), 30-400 ms a topic on a broker of thousands,
        27 topics a start. For a topic that exists, its create does nothing else."""
        if topic in self.present_topics:
            return
        await super().create_topic(topic, partitions, replication, **kwargs)


class WatermarkTransport(AIOKafkaTransport):
    """Faust's aiokafka transport whose consumers commit ``commits.watermark`` on the managed topics, and whose
    producers are idempotent."""

    Consumer = WatermarkConsumer
    Producer = IdempotentProducer

    def __init__(self, url: Any, app: Any, commits: Commits, loop: Any = None) -> None:
        super().__init__(url, app, loop=loop)
        self.commits = commits

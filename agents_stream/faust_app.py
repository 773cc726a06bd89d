"""The Faust app class of a worker: its consumer commits the ledger's watermark, it makes its topics before the
consumer joins its group, its stop stops the runtime before Faust's own parts; and the options it is made with."""

from __future__ import annotations

import logging
import sys
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import faust
from faust.types import TP

from agents_stream.contract import topics
from agents_stream.kafka import security as kafka_security
from agents_stream.kafka.admin import CIRCUITS_SPEC, ensure_topics, leader_spec, longest_retention_s
from agents_stream.kafka.assignor import Assignor
from agents_stream.kafka.consumer import Commits, IdempotentProducer, WatermarkTransport
from agents_stream.kafka.delivery import GuardedTopic
from agents_stream.kafka.recovery import RecoveryWatch, read_changelog
from agents_stream.kafka.start import commit_task_topic_starts
from agents_stream.kafka.watermark import Watermark
from agents_stream.settings import Settings, datadir_option
from agents_stream.tables.definitions import PromptTableManager

if TYPE_CHECKING:
    from agents_stream.app import Runtime

__all__ = [
    "BENIGN_FAUST_WARNINGS", "AgentsStreamApp", "BenignFaustWarnings", "new_app", "quiet_benign_faust_warnings",
]

log = logging.getLogger(__name__)

#: how long one produce request may wait for its broker before it is sent again (to the partition's leader then)
PRODUCER_REQUEST_TIMEOUT_S = 30.0
#: how old the clients' view of the partitions' leaders may get
METADATA_MAX_AGE_MS = 10_000


#: Faust's warnings that say nothing is wrong, by the start of their message (docs/faust.md, "Warnings that say
#: nothing is wrong"). "Missing sensor state for rebalance #n" / "... rebalance end #n": faust's
#: App.on_rebalance_return and on_rebalance_end warn when the state its sensors returned at the rebalance's start is
#: empty, which it always is for an app with no sensor (ours: the metrics are our own, agents_stream/ops/metrics.py),
#: on every worker start and every rebalance. They are logged through the app's own logger (mode names a service's
#: logger after its class's module: this one's).
BENIGN_FAUST_WARNINGS: tuple[str, ...] = ("Missing sensor state for rebalance",)


class BenignFaustWarnings(logging.Filter):
    """Turns the warnings of BENIGN_FAUST_WARNINGS into DEBUG lines (shown with ``-l debug``, not at info): a clean
    start logs no WARNING, so a WARNING in a worker's log means something."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and any(s in str(record.msg) for s in BENIGN_FAUST_WARNINGS):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def quiet_benign_faust_warnings(logger: logging.Logger) -> None:
    """Install BenignFaustWarnings on ``logger`` (once: a second call changes nothing)."""
    if not any(isinstance(f, BenignFaustWarnings) for f in logger.filters):
        logger.addFilter(BenignFaustWarnings())


class AgentsStreamApp(faust.App):
    """faust.App whose consumer commits the ledger's watermark (agents_stream.kafka.consumer), which makes its
    topics before the consumer joins its group, and whose stop stops the runtime before Faust's own parts."""

    #: The worker's runtime, set once by build_app (``attach``): Faust's hooks on this app (stop, a failed
    #: commit) hand work to it. Nothing outside this module reads it: the parts are passed where they are used.
    runtime: Runtime | None = None

    def __init__(
        self, id: str, *, settings: Settings, watermark: Watermark, input_topics: list[str], **options: Any,
    ) -> None:
        self.agents_settings = settings
        self.input_topics = input_topics
        # Made before Faust's own init: declaring agents and topics builds the transport (and its consumer).
        self.commits = Commits(watermark, frozenset(input_topics), self.on_commit_failed)
        self.recovery_watch = RecoveryWatch(self, settings.stall_after_s)  # one of the app's services, below
        super().__init__(id, **options)

    def attach(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def on_first_start(self) -> None:
        # Faust makes only the last level (mkdir without parents); the default is .data/worker/<app id>.
        self.conf.datadir.mkdir(parents=True, exist_ok=True)
        await super().on_first_start()

    async def on_start(self) -> None:
        if self.runtime is not None:  # before any record is read: the ledger's first intake is traced too
            self.runtime.start_tracing()
        # Before the consumer joins its group (children start after on_start): see ensure_topics.
        for table in self.tables.values():  # a recovery's records its fetcher dropped are read again with this
            table.read_changelog = partial(read_changelog, self.agents_settings)
        changelogs = sorted(t.changelog_topic.get_topic_name() for t in self.tables.values())
        replication = await ensure_topics(
            self.agents_settings, self.input_topics, compacted=changelogs,
            others=[CIRCUITS_SPEC, leader_spec(self.conf.id)], group=self.conf.id,
            present=cast(IdempotentProducer, self.producer).present_topics,
        )
        # The topics Faust declares itself (the runtime's output topics) get the same replication.
        self.conf.topic_replication_factor = replication.factor
        for topic in self.runtime.output_topics if self.runtime is not None else ():
            topic.config = {**replication.topic_configs(), **(topic.config or {})}
        # where a new app id starts the task topics another app id already read
        await commit_task_topic_starts(self.agents_settings, self.conf.id, self.input_topics)
        if self.runtime is not None:  # finished records outlive their task messages (ledger/expiry_sweep)
            tasks = [t for t in self.input_topics if topics.agent_of(t) is not None]
            self.runtime.ledger.expiry.set_ttl(await longest_retention_s(self.agents_settings, tasks))
        await super().on_start()

    async def on_stop(self) -> None:
        """The runtime first (drain, results confirmed, final commit: it needs the consumer), then Faust's consumer and
        tables."""
        if self.runtime is not None:
            await self.runtime.stop()
        await super().on_stop()

    def on_init_dependencies(self) -> Any:
        services = super().on_init_dependencies()
        # Faust's Monitor sensor times every event, send and table access for its own /stats views, which
        # this app does not serve (web_tables_enabled=False; our figures are on /metrics). It costs CPU on each.
        self.sensors.remove(self.monitor)
        # Last, so it stops first; a child of the app, so it watches the recovery before the first start too.
        return [*services, self.recovery_watch]

    def _new_transport(self) -> Any:
        return WatermarkTransport(self.conf.broker_consumer, self, self.commits)

    def on_commit_failed(self, offsets: dict[TP, int], error: BaseException) -> None:
        """Layer 3: the commit did not happen; the same watermark goes out on the next round."""
        log.warning(
            "Offset commit failed (%r) for %d partitions; nothing counts as done until a commit succeeds. "
            "Retrying every %.1fs; check the broker if this repeats.",
            error, len(offsets), self.conf.broker_commit_interval,
        )
        if self.runtime is not None:
            self.runtime.outbox.control(
                "alert.commit_failed", self.conf.id, None, {"error": repr(error), "partitions": len(offsets)},
            )



def new_app(settings: Settings, inputs: list[str], watermark: Watermark) -> AgentsStreamApp:
    quiet_benign_faust_warnings(AgentsStreamApp.logger)  # the logger Faust's App logs through (mode)
    quiet_benign_faust_warnings(logging.getLogger("faust.app.base"))  # a plain faust.App's, should mode change
    try:
        credentials = kafka_security.broker_credentials(settings)
    except kafka_security.KafkaSecurityError as exc:
        raise SystemExit(f"Kafka security settings: {exc}") from None
    return AgentsStreamApp(
        settings.app_id,
        settings=settings,
        watermark=watermark,
        input_topics=inputs,
        broker=settings.broker, broker_credentials=credentials,
        store="rocksdb://", datadir=settings.worker_data_dir(datadir_option(sys.argv)),
        # topic_replication_factor: set in on_start, once the brokers are known (admin.replication_for)
        topic_partitions=settings.partitions, topic_replication_factor=1, key_serializer="raw", value_serializer="raw",
        web_port=settings.web_port, web_host=settings.web_host, web_bind=settings.web_bind or settings.web_host,
        web_enabled=True, web_tables_enabled=False,
        broker_session_timeout=settings.session_timeout_s, broker_heartbeat_interval=settings.heartbeat_interval_s,
        consumer_group_instance_id=settings.instance_id or None,
        broker_request_timeout=max(40.0, settings.session_timeout_s + 10), broker_rebalance_timeout=60.0,
        # Kafka's default (Faust's is 20 minutes): a produce request to a broker cut off from the cluster is given up
        # after 30 s and sent again to the partition's new leader (the idempotent producer retries without duplicates)
        producer_request_timeout=PRODUCER_REQUEST_TIMEOUT_S,
        # A leader cut off from the cluster (not dead) times requests out without closing the connection, and the
        # producer sends its retries to it until its metadata is refreshed (5 minutes by default): 10 s instead.
        producer_metadata_max_age_ms=METADATA_MAX_AGE_MS, consumer_metadata_max_age_ms=METADATA_MAX_AGE_MS,
        broker_commit_interval=settings.commit_interval_s,
        broker_commit_every=10_000_000,  # commits are timed by the watermark, not by message count
        stream_buffer_maxsize=512, consumer_auto_offset_reset="earliest", producer_acks=-1,
        # No linger: three of a task's sends and each agent step wait for the broker's answer, and a 1 ms linger cost
        # each 1-1.5 ms; a burst still batches behind the request in flight (bench/notes.md, 2026-12-07).
        producer_linger_ms=0,
        producer_max_request_size=settings.record_max_bytes, Topic=GuardedTopic, TableManager=PromptTableManager,
        PartitionAssignor=Assignor,
        table_cleanup_interval=3600.0, table_standby_replicas=settings.standby_replicas, loghandlers=[],
    )

"""The Faust app: topics, the task table, the ledger agent, the executor and the lease scanner.

``faust -A agents_stream.app worker`` and ``agents-stream worker`` both run it.
Settings come from the environment (agents_stream.settings), providers and
agents from the TOML config (agents_stream.config).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
import uuid
from datetime import timedelta
from typing import Any

import faust
from faust.types import TP

from agents_stream.config import AppConfig, load_config
from agents_stream.contract import topics
from agents_stream.execution.executor import Executor
from agents_stream.execution.plan import AgentPlan
from agents_stream.kafka import security as kafka_security
from agents_stream.kafka.circuits_log import CircuitsLog
from agents_stream.kafka.consumer import WatermarkTransport
from agents_stream.kafka.deadletters import dead_letter_finder
from agents_stream.kafka.delivery import until_confirmed
from agents_stream.kafka.outbox import Outbox
from agents_stream.kafka.stall import StallDetector
from agents_stream.kafka.watermark import Watermark
from agents_stream.ledger.ledger import Ledger
from agents_stream.ops import metrics, web
from agents_stream.ops.notify import Notifier
from agents_stream.orchestrator import Orchestrator
from agents_stream.providers import Provider, build_provider
from agents_stream.resilience.breaker import Transition
from agents_stream.resilience.circuits import Circuits
from agents_stream.settings import Settings, bootstrap_servers
from agents_stream.tables.definitions import Tables, define_tables

log = logging.getLogger(__name__)


class AgentsStreamApp(faust.App):
    """faust.App whose consumer commits the ledger's watermark (agents_stream.kafka.consumer)."""

    watermark: Watermark
    managed_topics: frozenset[str] = frozenset()
    settings: Settings
    input_topics: list[str]

    async def on_start(self) -> None:
        # Before the consumer joins its group (children start after on_start): see ensure_topics.
        changelogs = sorted(t.changelog_topic.get_topic_name() for t in self.tables.values())
        await ensure_topics(self.settings, self.input_topics, self.conf.topic_replication_factor, compacted=changelogs)
        await super().on_start()

    def on_init_dependencies(self) -> Any:
        services = super().on_init_dependencies()
        # Faust's Monitor sensor times every event, send and table access for its own /stats views, which
        # this app does not serve (web_tables_enabled=False; our figures are on /metrics). It costs CPU on each.
        self.sensors.remove(self.monitor)
        return services

    def _new_transport(self) -> Any:
        return WatermarkTransport(self.conf.broker_consumer, self)

    def on_commit_failed(self, offsets: dict[TP, int], error: BaseException) -> None:
        """Layer 3: the commit did not happen; the same watermark goes out on the next round."""
        log.warning(
            "Offset commit failed (%r) for %d partitions; nothing counts as done until a commit succeeds. "
            "Retrying every %.1fs; check the broker if this repeats.",
            error, len(offsets), self.conf.broker_commit_interval,
        )
        runtime = getattr(self, "runtime", None)
        if runtime is not None:
            details = {"error": repr(error), "partitions": len(offsets)}
            runtime.outbox.control("alert.commit_failed", self.conf.id, None, details)


class Runtime:
    """Everything one worker process owns besides the Faust app itself."""

    def __init__(
        self, app: AgentsStreamApp, settings: Settings, config: AppConfig, agents: list[str], tables: Tables,
    ) -> None:
        self.app = app
        self.settings = settings
        self.agents = agents
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        built: dict[str, Provider] = {}

        def provider(name: str) -> Provider:
            if name not in built:
                built[name] = build_provider(config.provider(name))
            return built[name]

        plans = {a: AgentPlan.build(config, a, provider) for a in agents}
        self.circuits_topic = app.topic(topics.CIRCUITS, key_serializer="raw", value_serializer="raw")
        self.circuits = Circuits(
            config,
            list(built),
            self.worker_id,
            send=lambda key, value: self.circuits_topic.send_soon(key=key, value=value),
            on_transition=self._on_breaker_transition,
            on_change=self.update_flow,
            spend_report=self.spend_report,
            app_id=settings.app_id,
            presence_s=settings.presence_interval_s,
        )
        self.circuits_log = CircuitsLog(
            self.circuits,
            bootstrap=bootstrap_servers(settings.broker),
            client_kwargs=kafka_security.client_kwargs(settings),
            history_s=settings.circuits_history_s,
        )
        self.outcomes = app.topic(topics.outcomes_topic(settings.app_id), key_serializer="raw", value_serializer="raw")
        self.answers = app.topic(topics.answers_topic(settings.app_id), key_serializer="raw", value_serializer="raw")
        self.job_events = app.topic(topics.JOB_EVENTS, key_serializer="raw", value_serializer="raw")
        self.executor = Executor(
            settings,
            config,
            plans,
            self.circuits,
            send_outcome=self.send_outcome,
            send_control=self.send_control,
            on_flow_change=self.update_flow,
            worker_id=self.worker_id,
            cache_lookup=self.cache_lookup,
        )
        self.outbox = Outbox(
            lambda name: app.topic(name, key_serializer="raw", value_serializer="raw"), app.watermark, self.worker_id,
            find_dead_letter=dead_letter_finder(settings),
        )
        self.notifier = Notifier()
        orchestrator = Orchestrator(self.outbox, tables, list(config.agents), settings) if settings.jobs_enabled() else None
        self.ledger = Ledger(
            settings, self.executor, self.worker_id, tables=tables, watermark=app.watermark, outbox=self.outbox,
            notifier=self.notifier,
            policies={a: plan.config.approval for a, plan in plans.items() if plan.config.approval is not None},
            saga_flagged={a for a, plan in plans.items() if plan.saga is not None and plan.saga.needs_approval},
            cached_agents={a for a, plan in plans.items() if plan.config.cache_max_age_s > 0},
            orchestrator=orchestrator,
        )
        self._paused: set[TP] = set()
        self.stalls = StallDetector(settings.stall_after_s)
        self._rereads: dict[TP, tuple[int, float]] = {}  # partition → (offset sought back to, when)
        self._reread_tasks: set[asyncio.Task[None]] = set()
        self.ledger.on_gap = self.reread
        self.started = False  # output topics declared and executor running: /readyz says ready
        self.stopping = False
        self.finishing: set[str] = set()  # tasks whose final outcome this worker sent while stopping

    async def send_outcome(self, task_id: str, outcome: dict[str, Any]) -> None:
        """Executor → ledger. Outcomes are retried until the broker confirms them; heartbeats are not."""
        body = json.dumps({"schema_version": 1, "worker": self.worker_id, **outcome}).encode()

        def send() -> Any:
            return self.outcomes.send_soon(key=task_id.encode(), value=body)

        if outcome.get("kind") == "heartbeat":
            send()  # the lease has slack for a lost one; the next round sends again
            return
        await until_confirmed(
            send,
            what=f"the outcome of {task_id}",
            alert=lambda exc: self.send_control("alert.broker_send_failing", task_id, None, {"error": repr(exc)}),
        )
        if self.stopping and outcome.get("kind") in ("succeeded", "failed"):
            self.finishing.add(task_id)

    def send_control(self, event: str, subject: str, agent: str | None, details: dict[str, Any]) -> None:
        self.outbox.control(event, subject, agent, details)

    def _on_breaker_transition(self, provider: str, t: Transition, mine: bool) -> None:
        if mine:  # the worker whose event caused the transition reports it, once for the cluster
            self.send_control(
                f"breaker.{t.to}", provider, None,
                {"from": t.frm, "to": t.to, "reason": t.reason, "at": t.at},
            )

    def cache_lookup(self, task_id: str, fp: str, dispatch: int) -> None:
        """Ask the cache's partition of ``fp`` for the last good answer; the reply comes as an outcome event."""
        body = json.dumps({"schema_version": 1, "kind": "lookup", "task_id": task_id, "dispatch": dispatch}).encode()
        self.answers.send_soon(key=fp.encode(), value=body)

    def spend_report(self) -> dict[str, Any]:
        try:
            assigned = self.app.consumer.assignment()
        except Exception:  # not started yet
            return {}
        outcomes = topics.outcomes_topic(self.settings.app_id)
        partitions = {tp.partition for tp in assigned if tp.topic == outcomes}
        return self.ledger.spend_report(partitions, self.agents, time.time())

    def consumer_lag(self) -> dict[str, int]:
        """Records not yet done per input topic on this worker's partitions, from memory only (for /metrics):
        the consumer's last fetched end offset minus the commit watermark (Faust's last commit before the
        ledger handled anything). A paused partition's end offset is the one from before the pause."""
        consumer = self.app.consumer
        ends: dict[TP, int | None] = {}
        positions: dict[TP, int | None] = {}
        try:
            assigned = consumer.assignment()
        except Exception:  # not started yet
            assigned = set()
        for tp in assigned:
            if tp.topic not in self.app.managed_topics:
                continue
            try:
                ends[tp] = consumer.highwater(tp)
            except Exception:  # revoked since assignment() was read
                continue
            at = self.app.watermark.commit_offset(tp)
            positions[tp] = at if at is not None else consumer._committed_offset.get(tp)
        return metrics.consumer_lag(ends, positions, self.app.managed_topics)

    def update_flow(self) -> None:
        """Pause intake of agents whose provider is down or whose queue is full; resume the others."""
        consumer = self.app.consumer
        try:
            assigned = consumer.assignment()
        except Exception:  # not started yet
            return
        want: set[TP] = set()
        for agent in self.agents:
            if self.executor.blocked(agent):
                name = topics.task_topic(agent)
                want.update(tp for tp in assigned if tp.topic == name)
        pause, resume = want - self._paused, (self._paused & assigned) - want
        if pause:
            consumer.pause_partitions(pause)
            log.info("Intake paused on %d partitions (provider down or queue full)", len(pause))
        if resume:
            consumer.resume_partitions(resume)
            log.info("Intake resumed on %d partitions", len(resume))
        self._paused = want

    def _watched(self) -> set[TP]:
        """Between rebalances: the assigned input partitions that should be fetched (not paused by us, not held
        back by a full stream buffer). Empty during a rebalance or table recovery, which pause on purpose."""
        consumer = self.app.consumer
        if self.app.in_recovery or getattr(self.app, "rebalancing", False) or not self.started:
            return set()
        try:
            assigned = consumer.assignment()
        except Exception:  # not started yet
            return set()
        return {
            tp for tp in assigned
            if tp.topic in self.app.managed_topics and tp not in self._paused and tp not in consumer._buffered_partitions
        }

    async def _reading_starts(self, tps: set[TP]) -> dict[TP, int | None]:
        """Where reading starts on ``tps``: the group's commit, or the earliest offset without one (auto_offset_reset)."""
        consumer = self.app.consumer
        starts = await asyncio.wait_for(consumer.committed_offsets(tps), timeout=10.0)
        unset = {tp for tp, at in starts.items() if at is None}
        if unset:
            starts.update(await asyncio.wait_for(consumer.earliest_offsets(*unset), timeout=10.0))
        return starts

    def check_flow(self) -> None:
        """Every assigned input partition we did not pause must be fetched: resume one Faust left paused.

        Seen in the job kill test, about one run in three: after a rebalance in which a worker regained
        partitions it had owned before, some of them stayed out of Faust's active set, so a task waiting
        there was never read again (its lag stayed, nothing was lost, but nothing moved). Faust pauses
        every partition during a rebalance and recovery on purpose, so this looks only between them.
        """
        consumer = self.app.consumer
        watched = self._watched()
        stuck = watched - consumer._get_active_partitions() if watched else set()
        if stuck:
            log.warning(
                "Partitions %s were assigned but not being fetched (left paused across a rebalance); resuming them",
                sorted(f"{tp.topic}:{tp.partition}" for tp in stuck),
            )
            consumer.resume_partitions(stuck)
            self.send_control(
                "alert.partitions_resumed", self.worker_id, None, {"partitions": sorted(f"{tp.topic}:{tp.partition}" for tp in stuck)},
            )

    async def settle(self, timeout: float) -> bool:
        """While stopping: wait until the ledger has applied the outcomes of the calls that finished in the grace
        period and their results are confirmed, so the last commit covers them (else the next owner of the
        partition sends their results a second time, the same bytes). False when ``timeout`` ran out."""
        deadline = time.monotonic() + timeout
        while self.finishing & self.ledger.open_tasks.keys() or self.outbox.delivering():
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    def reread(self, tp: TP, offset: int) -> bool:
        """Records of ``tp`` from ``offset`` never reached the ledger: seek back there (once per offset every few
        seconds: the records already fetched past the gap arrive meanwhile and report the same gap).
        True when a seek was started (the ledger logs it and alerts)."""
        now = time.monotonic()
        last = self._rereads.get(tp)
        if last is not None and last[0] == offset and now - last[1] < 5.0:
            return False
        self._rereads[tp] = (offset, now)

        async def seek() -> None:
            consumer = self.app.consumer
            if self.app.in_recovery or getattr(self.app, "rebalancing", False) or tp not in consumer.assignment():
                return  # the rebalance seeks to the commits, which never pass the gap
            try:
                earliest = (await asyncio.wait_for(consumer.earliest_offsets(tp), timeout=10.0)).get(tp)
                if earliest is not None and offset < earliest:
                    log.warning(
                        "Offsets %d..%d of %s:%d were deleted by retention before they were read; going on from %d",
                        offset, earliest - 1, tp.topic, tp.partition, earliest,
                    )
                    self.app.watermark.skip_to(tp, earliest)
                    return
                await asyncio.wait_for(consumer.seek(tp, offset), timeout=10.0)
            except Exception as exc:  # the progress check seeks again if this one did not happen
                log.warning("Could not seek %s:%d back to %d (%r); the progress check retries", tp.topic, tp.partition, offset, exc)

        task = asyncio.ensure_future(seek())
        self._reread_tasks.add(task)
        task.add_done_callback(self._reread_tasks.discard)
        return True

    async def seed_starts(self, assigned: set[TP]) -> None:
        """Tell the watermark where reading starts on each newly assigned input partition (the group's commit),
        so records Faust drops right after the rebalance are a gap, not a new start."""
        fresh = {tp for tp in assigned if tp.topic in self.app.managed_topics and self.app.watermark.next_offset(tp) is None}
        if not fresh:
            return
        try:
            starts = await self._reading_starts(fresh)
        except Exception as exc:  # without a start the first record read sets it, as before
            log.warning("Could not read the committed offsets of %d assigned partitions (%r); a record dropped right "
                        "after this rebalance is caught by the progress check only", len(fresh), exc)
            return
        for tp, at in starts.items():
            if at is not None:
                self.app.watermark.start(tp, at)

    async def check_progress(self) -> None:
        """Read again, from the first unhandled offset, an assigned partition whose records stopped arriving.

        The job kill test stalled in about 2 fresh CI runs of 5 with the partition assigned and active,
        committed offset 0, end offset 1, and the task at offset 0 never reaching the ledger: Faust's
        fetcher had passed it (docs/decisions.md). Nothing was lost, but nothing moved until a restart.
        """
        watched = self._watched()
        if not watched:
            return
        ends = await asyncio.wait_for(self.app.consumer.highwaters(*watched), timeout=10.0)
        positions = {tp: self.app.watermark.next_offset(tp) for tp in watched}
        unknown = {tp for tp, at in positions.items() if at is None and (ends.get(tp) or 0) > 0}
        if unknown:  # the start was not seeded at the assignment (its lookup failed)
            positions.update(await self._reading_starts(unknown))
        now = time.monotonic()
        for tp in sorted(watched):
            end, at = ends.get(tp), positions.get(tp)
            if end is None or at is None or not self.stalls.observe(tp, at, end, now):
                continue
            log.warning(
                "Partition %s:%d has %d unread records but its read position %d has not moved for %.0fs; "
                "reading it again from %d (nothing was committed past it). If this repeats, report it with this log.",
                tp.topic, tp.partition, end - at, at, self.settings.stall_after_s, at,
            )
            self.reread(tp, at)
            self.send_control(
                "alert.partition_reread", self.worker_id, None,
                {"partition": f"{tp.topic}:{tp.partition}", "offset": at, "end": end},
            )

    def on_revoked(self, revoked: set[TP]) -> None:
        self.stalls.forget(revoked)
        self.ledger.forget(revoked)
        self._paused -= revoked

    def on_assigned(self) -> None:
        # Faust resumes every partition after a rebalance (FAUST-NOTES.md): re-apply our pauses.
        self._paused = set()
        self.update_flow()

    def scan_leases(self) -> None:
        now = time.time()
        for task_id, level in self.ledger.scan_parked(now):
            body = json.dumps({"schema_version": 1, "kind": "approval_timeout", "level": level, "worker": self.worker_id}).encode()
            self.outcomes.send_soon(key=task_id.encode(), value=body)
        for task_id, dispatch in self.ledger.scan(now):
            body = json.dumps({"schema_version": 1, "kind": "expired", "dispatch": dispatch, "worker": self.worker_id}).encode()
            self.outcomes.send_soon(key=task_id.encode(), value=body)
        if self.ledger.orchestrator is not None:
            for job_id in self.ledger.orchestrator.scan(now):
                body = json.dumps({"schema_version": 1, "kind": "deadline", "worker": self.worker_id}).encode()
                self.job_events.send_soon(key=job_id.encode(), value=body)


async def ensure_topics(
    settings: Settings, names: list[str], replication: int, timeout: float = 60.0, compacted: list[str] | None = None,
) -> None:
    """Create the input topics and the tables' changelogs (``compacted``) that are missing, and wait until the
    broker describes every one of them.

    Faust creates them as its agents and tables start, moments before the
    consumer joins its group; on a fresh broker the group leader's metadata
    could predate them, and the assignment then left a topic out ("Ignoring
    missing topic") until a metadata refresh minutes later: an input topic was
    not read, or a changelog (the approval timers') was not assigned, so its
    table stayed empty. Done before the consumer starts, nothing is left out.

    Every input topic must also have AGENTS_STREAM_PARTITIONS partitions (the
    tables are co-partitioned with them). One created earlier with another
    count would crash the worker at its first event; stop now and say why.
    """
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import KafkaConnectionError, TopicAlreadyExistsError

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers(settings.broker), **kafka_security.client_kwargs(settings))
    try:
        await asyncio.wait_for(admin.start(), timeout=30.0)
    except (KafkaConnectionError, asyncio.TimeoutError):
        # The worker's first connection: a refused login, a failed TLS handshake or no broker ends the
        # worker here, with the reason (aiokafka's own error only says "Unable to bootstrap").
        await admin.close()
        reason = await kafka_security.diagnose(settings, bootstrap_servers(settings.broker))
        message = f"Cannot connect to the Kafka broker at {settings.broker}: {reason}"
        log.critical(message)
        raise SystemExit(message) from None
    log.info("Connected to Kafka at %s (%s)", settings.broker, kafka_security.parse(settings).describe())
    try:
        existing = set(await asyncio.wait_for(admin.list_topics(), timeout=30.0))
        compacted = compacted or []
        missing = [NewTopic(name, settings.partitions, replication) for name in names if name not in existing]
        missing += [
            NewTopic(name, settings.partitions, replication, topic_configs={"cleanup.policy": "compact"})
            for name in compacted if name not in existing
        ]
        if missing:
            try:
                await asyncio.wait_for(admin.create_topics(missing), timeout=30.0)
            except TopicAlreadyExistsError:
                pass  # another worker starting at the same time made them
        deadline = time.monotonic() + timeout
        while True:
            described = await asyncio.wait_for(admin.describe_topics(names + compacted), timeout=30.0)
            counts = {t["topic"]: len(t.get("partitions") or ()) for t in described}
            if all(counts.get(n) for n in names + compacted):
                break
            if time.monotonic() > deadline:
                late = [n for n in names + compacted if not counts.get(n)]
                raise SystemExit(f"Topics not visible on the broker after {timeout:.0f}s: {late}")
            await asyncio.sleep(0.2)
    finally:
        await admin.close()
    wrong = {t: n for t, n in counts.items() if n != settings.partitions and t in names}
    if wrong:
        message = (
            f"Input topics exist with a partition count other than AGENTS_STREAM_PARTITIONS={settings.partitions}: "
            f"{wrong}. Tables are co-partitioned with their input topics, so every worker sharing these topics "
            "must use the count they were created with: set AGENTS_STREAM_PARTITIONS to match, or (on a "
            "development broker) delete the topics"
        )
        log.critical(message)
        raise SystemExit(message)


def build_app(settings: Settings | None = None, config: AppConfig | None = None) -> AgentsStreamApp:
    settings = settings or Settings.from_env()
    config = config or load_config(settings.config_path or None)
    wanted = settings.agent_filter()
    unknown = wanted - set(config.agents)
    if unknown:
        raise SystemExit(f"AGENTS_STREAM_AGENTS names agents not in the config: {sorted(unknown)}")
    agents = [a for a in config.agents if not wanted or a in wanted]
    n = settings.partitions
    try:
        credentials = kafka_security.broker_credentials(settings)
    except kafka_security.KafkaSecurityError as exc:
        raise SystemExit(f"Kafka security settings: {exc}") from None

    app = AgentsStreamApp(
        settings.app_id,
        broker=settings.broker,
        broker_credentials=credentials,
        store="rocksdb://",
        datadir=settings.data_dir,
        topic_partitions=n,
        topic_replication_factor=1,
        key_serializer="raw",
        value_serializer="raw",
        web_port=settings.web_port,
        web_host=settings.web_host,
        web_bind=settings.web_bind or settings.web_host,
        web_enabled=True,
        web_tables_enabled=False,
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=settings.heartbeat_interval_s,
        broker_request_timeout=max(40.0, settings.session_timeout_s + 10),
        broker_rebalance_timeout=60.0,
        broker_commit_interval=settings.commit_interval_s,
        broker_commit_every=10_000_000,  # commits are timed by the watermark, not by message count
        stream_buffer_maxsize=512,
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        producer_linger_ms=1,
        table_cleanup_interval=3600.0,
        loghandlers=[],
    )
    app.watermark = Watermark()
    task_topics = [topics.task_topic(a) for a in agents]
    outcomes = topics.outcomes_topic(settings.app_id)
    answers = topics.answers_topic(settings.app_id)
    inputs = [*task_topics, outcomes, answers, topics.APPROVALS]
    if settings.jobs_enabled():  # the orchestrator shares the ledger's loop (agents_stream.orchestrator)
        inputs += [topics.JOBS, topics.JOB_EVENTS]
    app.managed_topics = frozenset(inputs)
    app.input_topics = inputs

    tables = define_tables(app, settings)
    # TODO(wiring): pass ``tables`` in instead of hanging them on the app
    app.task_table, app.answers_table, app.jobs_table, app.timers_table = tables.tasks, tables.answers, tables.jobs, tables.timers
    # Output topics nobody in this app consumes: declared at start (auto-creation is off).
    app.output_topics = [
        app.topic(topics.RESULTS, partitions=n, internal=True),
        app.topic(topics.CONTROL, partitions=n, internal=True),
        *(
            app.topic(name, partitions=n, internal=True, retention=timedelta(days=settings.dlq_retention_days))
            for name in [*(topics.dlq_topic(a) for a in agents), topics.dlq_of(topics.APPROVALS), topics.dlq_of(topics.JOBS)]
        ),
        # Ledgers of every app id send their job tasks' results here; the orchestrator sends tasks to any agent.
        app.topic(topics.JOB_EVENTS, partitions=n, internal=True),
        app.topic(topics.JOB_RESULTS, partitions=n, internal=True),
        # Any worker's web view accepts a job cancel, even with the orchestrator elsewhere.
        *([] if settings.jobs_enabled() else [app.topic(topics.JOBS, partitions=n, internal=True)]),
        *(app.topic(topics.task_topic(a), partitions=n, internal=True) for a in config.agents if settings.jobs_enabled() and a not in agents),
        # One partition: every worker folds the whole log in one order (agents_stream.resilience.circuits).
        # LogAppendTime: the broker stamps every event, so the fold uses one clock for all workers.
        app.topic(
            topics.CIRCUITS, partitions=1, internal=True, retention=timedelta(days=1),
            config={"message.timestamp.type": "LogAppendTime"},
        ),
    ]
    channel = app.topic(*inputs, partitions=n, internal=True, key_serializer="raw", value_serializer="raw")

    runtime = Runtime(app, settings, config, agents, tables)
    app.runtime = runtime
    app.settings = settings

    async def ledger_agent(stream: Any) -> None:
        # One event at a time: the ledger is the table's only writer (DESIGN.md).
        async for event in stream.events():
            runtime.ledger.handle(event)

    app.agent(channel, name="ledger", concurrency=1)(ledger_agent)
    if runtime.ledger.policies and not settings.api_token and not settings.api_open:
        log.warning(
            "Approvals are configured but AGENTS_STREAM_API_TOKEN is not set: POST /approvals/<task_id> refuses every "
            "request (signed links, the CLI and agent.approvals events still work). Set a token to decide over HTTP."
        )
    if settings.api_open:
        log.warning("AGENTS_STREAM_API_OPEN is set: mutating web endpoints accept requests without a token. Local demos only.")

    @app.timer(interval=max(0.5, settings.lease_ttl_s / 4))
    async def lease_scanner() -> None:
        try:
            runtime.scan_leases()
            runtime.update_flow()  # a Retry-After or open_timeout that ran out changes no event: look again
            runtime.check_flow()
        except Exception as exc:  # a timer exception would crash the worker (FAUST-NOTES.md)
            log.exception("Lease scan failed (%r); the next tick tries again", exc)

    if settings.stall_after_s > 0:
        @app.timer(interval=max(0.5, settings.stall_after_s / 4))
        async def progress_check() -> None:
            try:
                await runtime.check_progress()
            except Exception as exc:  # a timer exception would crash the worker (FAUST-NOTES.md)
                log.warning("Progress check failed (%r); the next tick tries again", exc)

    @app.on_partitions_revoked.connect
    async def _revoked(sender: Any, revoked: set[TP], **kwargs: Any) -> None:
        runtime.on_revoked(set(revoked))

    @app.on_partitions_assigned.connect
    async def _assigned(sender: Any, assigned: set[TP], **kwargs: Any) -> None:
        runtime.on_assigned()

    @app.on_rebalance_complete.connect
    async def _rebalanced(sender: Any, **kwargs: Any) -> None:
        # After the group settled and before the streams resume (Faust's recovery sends this first):
        # the broker answers offset requests now, and nothing of the new assignment has been read yet.
        await runtime.seed_starts(set(app.consumer.assignment()))

    @app.task
    async def _start_executor() -> None:
        for topic in app.output_topics:
            # Without its output topics the worker cannot work: a timeout here ends it, loudly.
            await asyncio.wait_for(topic.maybe_declare(), timeout=60.0)
        await runtime.circuits_log.start()
        await runtime.executor.start()
        runtime.started = True
        log.info(
            "Worker %s ready: agents %s, %d call slots, lease %.0fs",
            runtime.worker_id, ", ".join(agents), settings.max_in_flight, settings.lease_ttl_s,
        )

    original_on_stop = app.on_stop

    async def on_stop() -> None:
        runtime.stopping = True
        await runtime.executor.stop()  # drains within settings.shutdown_grace_s
        if not await runtime.settle(timeout=5.0):
            log.warning("Shutdown: results of calls that finished were not all confirmed within 5s; "
                        "the next owner of their partitions sends them again (the same bytes)")
        # Commit the watermark now: outcomes the ledger applied during the grace period count.
        try:
            await asyncio.wait_for(app.consumer.commit(), timeout=10.0)
        except Exception as exc:
            log.warning("Final commit on shutdown failed (%r); the next worker resumes from the last commit", exc)
        await runtime.outbox.stop()
        await runtime.notifier.stop()
        await runtime.circuits_log.stop()
        await original_on_stop()

    app.on_stop = on_stop  # type: ignore[method-assign]
    web.register(app)
    return app


app = build_app()

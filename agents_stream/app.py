"""One worker: its topics and tables, the ledger agent, the runtime and their one lifecycle (the Faust app class
itself is agents_stream/faust_app.py).

``faust -A agents_stream.app worker`` and ``agents-stream worker`` both run it.
Settings come from the environment (agents_stream.settings), providers and
agents from the TOML config (agents_stream.config).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, cast

from faust.types import TP
from mode import Service

from agents_stream.config import AppConfig, load_config
from agents_stream.contract import topics
from agents_stream.contract.events import (
    ApprovalTimeout,
    CacheLookup,
    JobDeadline,
    LeaseExpired,
    OutcomeEvent,
    RecordsExpired,
    encode,
)
from agents_stream.execution.executor import Executor, Outlets
from agents_stream.execution.membership import Membership
from agents_stream.execution.plan import AgentPlan, with_tool_circuits
from agents_stream.faust_app import AgentsStreamApp, new_app
from agents_stream.kafka import members
from agents_stream.kafka import security as kafka_security
from agents_stream.kafka.admin import input_topics, output_topics
from agents_stream.kafka.circuits_log import CircuitsLog
from agents_stream.kafka.deadletters import dead_letter_finder
from agents_stream.kafka.delivery import TopicCheck
from agents_stream.kafka.flow import Flow
from agents_stream.kafka.outbox import Outbox
from agents_stream.kafka.takeover import Takeover
from agents_stream.kafka.watermark import Watermark
from agents_stream.ledger.app_agents import AppAgents
from agents_stream.ledger.ledger import Ledger
from agents_stream.ledger.route import OutcomeRoute
from agents_stream.ops import metrics, tracing, web
from agents_stream.ops.notify import Notifier
from agents_stream.ops.samples import Sample, SampleRing
from agents_stream.orchestrator import Orchestrator
from agents_stream.providers import Provider, build_provider
from agents_stream.resilience.breaker import Transition
from agents_stream.resilience.circuits import Circuits
from agents_stream.resilience.presence import Cadence
from agents_stream.settings import Settings, bootstrap_servers
from agents_stream.tables.definitions import Tables, define_tables
from agents_stream.wiring import wire

log = logging.getLogger(__name__)


#: how long a stopping worker lets its last spans be exported
_TRACES_FLUSH_S = 5.0



class Runtime(Service):
    """Everything one worker process owns besides the Faust app itself, started and stopped in one order.

    Started by the app once its tables are recovered, stopped by the app's ``on_stop`` before Faust's own parts.
    """

    def __init__(
        self, app: AgentsStreamApp, settings: Settings, config: AppConfig, agents: list[str], *,
        tables: Tables, watermark: Watermark, output_topics: list[Any],
    ) -> None:
        super().__init__()
        self.app = app
        self.settings = settings
        self.agents = agents
        self.tables = tables
        self.output_topics = output_topics  # declared at start: nobody in this app consumes them
        self.worker_id = members.worker_id(settings.instance_id)
        # The group's members are read back by this id after each rebalance (kafka/members.py)
        app.conf.broker_client_id = members.client_id(self.worker_id)
        self.outcomes = app.topic(topics.outcomes_topic(settings.app_id), key_serializer="raw", value_serializer="raw")
        self.answers = app.topic(topics.answers_topic(settings.app_id), key_serializer="raw", value_serializer="raw")
        self.job_events = app.topic(topics.JOB_EVENTS, key_serializer="raw", value_serializer="raw")
        self.circuits_topic = app.topic(topics.CIRCUITS, key_serializer="raw", value_serializer="raw")
        self.events_topic = app.topic(topics.CONVERSATION_EVENTS, key_serializer="raw", value_serializer="raw")
        self._build_parts(app, settings, config, agents, tables, watermark)
        self.flow = Flow(
            app, watermark, frozenset(app.input_topics), agents,
            blocked=self.executor.blocked, ready=lambda: self.ready,
            alert=lambda event, details: self.send_control(event, self.worker_id, None, details),
            stall_after_s=settings.stall_after_s,
        )
        self.ledger.on_gap = self.flow.reread
        self.ready = False  # output topics declared and executor running: /readyz says ready
        self.samples = SampleRing(settings.console_sample_s, settings.console_history_s)  # the console's charts
        self.stopping = False
        for table in tables.all():
            table.trusted = self.may_be_member
        self.takeover = Takeover(
            settings, app.conf.id, self.worker_id, tables, partitions=self.partitions,
            scan_gone=self.ledger.scan_gone, learned=self.ledger.scanner.learned_members,
            send_outcome=lambda key, value: self.outcomes.send_soon(key=key, value=value),
            alert=lambda exc: self.send_control(
                "alert.broker_send_failing", self.worker_id, None, {"error": repr(exc)}),
        )
        self.route = OutcomeRoute(
            self.ledger, lambda key, value: self.outcomes.send_soon(key=key, value=value), member=self.member,
            send_control=self.send_control, stopping=lambda: self.stopping, owns=self.owns,
        )

    def _build_parts(
        self, app: AgentsStreamApp, settings: Settings, config: AppConfig, agents: list[str], tables: Tables,
        watermark: Watermark,
    ) -> None:
        # ---- the parts: circuits, executor, ledger (its outbox and notifier), orchestrator -------------------
        # (each part is built here and handed what it uses; nothing reaches into another part)
        built: dict[str, Provider] = {}

        def provider(name: str) -> Provider:
            if name not in built:
                built[name] = build_provider(config.provider(name))
            return built[name]

        plans = {a: AgentPlan.build(config, a, provider) for a in agents}
        circuits_config, tools = with_tool_circuits(config, plans)  # a tool's breaker is a circuit too
        self.circuits = Circuits(
            circuits_config,
            [*built, *tools],
            self.worker_id,
            send=lambda key, value: self.circuits_topic.send_soon(key=key, value=value),
            on_transition=self._on_breaker_transition,
            on_change=self.update_flow,
            spend_report=self.spend_report,
            app_id=settings.app_id,
            cadence=Cadence(presence_s=settings.presence_interval_s, report_s=settings.circuits_report_s),
        )
        self.circuits_log = CircuitsLog(
            self.circuits,
            bootstrap=bootstrap_servers(settings.broker),
            client_kwargs=kafka_security.client_kwargs(settings),
            history_s=settings.circuits_history_s,
        )
        self.executor = Executor(
            settings,
            config,
            plans,
            self.circuits,
            Outlets(
                send_outcome=self.send_outcome, send_control=self.send_control, on_flow_change=self.update_flow,
                cache_lookup=self.cache_lookup, send_event=self.send_event,
            ),
            worker_id=self.worker_id,
            membership=Membership(self._member_id, self._confirmed_at, stall_s=settings.session_timeout_s / 2,
                                  wait_s=settings.session_timeout_s),
        )
        self.outbox = Outbox(
            lambda name: app.topic(name, key_serializer="raw", value_serializer="raw"), watermark, self.worker_id,
            find_dead_letter=dead_letter_finder(settings), member=self.member, topics=TopicCheck(self._producer_client),
        )
        self.notifier = Notifier(rate_per_s=settings.webhook_rate_per_s, queue_max=settings.webhook_queue_max)
        jobs = settings.jobs_enabled()
        self.ledger = Ledger(
            settings, self.executor, self.worker_id, tables=tables, watermark=watermark, outbox=self.outbox,
            notifier=self.notifier, agents=app_agents(plans),
            orchestrator=Orchestrator(self.outbox, tables, list(config.agents), settings) if jobs else None,
        )
        # ---- end of the parts ---------------------------------------------------------------------------------

    # -- lifecycle ---------------------------------------------------------------------------------------------

    def start_tracing(self) -> None:
        """OpenTelemetry traces, when OTEL_* asks for them (ops/tracing.py); this worker's spans name it."""
        tracing.start("agents-stream", {
            "service.instance.id": self.worker_id, "agents_stream.app_id": self.settings.app_id,
            "agents_stream.agents": ",".join(self.agents),
        })

    # Each part is a mode Service, started here with add_runtime_dependency (this Service owns it, and the order
    # holds; a plain add_dependency would start it after on_start) and stopped here in its place: children stop
    # only after on_stop, too late for the final commit.

    async def on_start(self) -> None:
        await self.add_runtime_dependency(self.outbox)
        await self.add_runtime_dependency(self.notifier)
        for topic in self.output_topics:
            # Without its output topics the worker cannot work: a timeout here ends it, loudly.
            await asyncio.wait_for(topic.maybe_declare(), timeout=60.0)
        await self.add_runtime_dependency(self.circuits_log)  # the breakers are folded before any call
        await self.add_runtime_dependency(self.executor)
        self.ready = True
        log.info(
            "Worker %s ready: agents %s, %d call slots, lease %.0fs",
            self.worker_id, ", ".join(self.agents), self.settings.max_in_flight, self.settings.lease_ttl_s,
        )

    async def on_stop(self) -> None:
        self.stopping = True
        await self.executor.stop()  # drains within settings.shutdown_grace_s
        if not await self.await_results_confirmed(timeout=5.0):
            log.warning("Shutdown: results of calls that finished were not all confirmed within 5s; "
                        "the next owner of their partitions sends them again (the same bytes)")
        # Commit the watermark now: outcomes the ledger applied during the grace period count.
        try:
            await asyncio.wait_for(self.app.consumer.commit(), timeout=10.0)
        except Exception as exc:
            log.warning("Final commit on shutdown failed (%r); the next worker resumes from the last commit", exc)
        await self.outbox.stop()  # unconfirmed deliveries keep their offsets held
        await self.notifier.stop()
        await self.circuits_log.stop()
        await self.flow.stop()
        if tracing.on():  # the spans still queued go out, within a bound: a collector away must not hold the stop
            stopping, deadline = tracing.stop_in_background(), time.monotonic() + _TRACES_FLUSH_S
            while stopping.is_alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if stopping.is_alive():
                log.warning("Spans not all exported within %.0fs on shutdown; the collector may miss this worker's "
                            "last ones (is the OTLP endpoint up?)", _TRACES_FLUSH_S)

    async def await_results_confirmed(self, timeout: float) -> bool:
        """While stopping: wait until the ledger has applied the outcomes of the calls that finished in the grace
        period and their results are confirmed, so the last commit covers them (else the next owner of the
        partition sends their results a second time, the same bytes). False when ``timeout`` ran out."""
        deadline = time.monotonic() + timeout
        while self.route.finishing & self.ledger.open_tasks.keys() or self.outbox.delivering():
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    # -- what the parts call -----------------------------------------------------------------------------------

    async def send_outcome(self, task_id: str, outcome: OutcomeEvent) -> None:
        """Executor → ledger: applied here or sent on the outcomes topic (``ledger/route.py``)."""
        await self.route.send(task_id, outcome)

    def member(self) -> bool:
        """This worker still owns the partitions it believes it owns: a commit, heartbeat or group sync it sent less
        than half a session timeout ago was accepted by the group's coordinator. A worker cut off from the group for
        longer (a stalled loop, a broker away) may have lost them without knowing yet: its outcomes then go on the
        topic, where the partition's owner, whoever it is now, applies them (docs/decisions.md, "Outcomes applied
        where they ran")."""
        if getattr(self.app, "rebalancing", False):  # Faust revokes before it tells the ledger (Ledger.forget)
            return False
        consumer: Any = self.app.consumer
        return bool(consumer.member_since(self.settings.session_timeout_s / 2))

    def send_event(self, key: bytes, value: bytes, partition: int) -> Any:
        """One ephemeral record on agent.conversation.events (a chunk of streamed text): sent once, not held."""
        return self.events_topic.send_soon(key=key, value=value, partition=partition)

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
        body = encode(CacheLookup(task_id=task_id, dispatch=dispatch))
        self.answers.send_soon(key=fp.encode(), value=body)

    def spend_report(self) -> dict[str, Any]:
        try:
            assigned = self.app.consumer.assignment()
        except Exception:  # not started yet
            return {}
        outcomes = topics.outcomes_topic(self.settings.app_id)
        partitions = {tp.partition for tp in assigned if tp.topic == outcomes}
        return self.ledger.spend_report(partitions, self.agents, time.time())

    def update_flow(self) -> None:
        """Pause intake of agents whose provider is down or whose queue is full; resume the others."""
        self.flow.update()

    def consumer_lag(self) -> dict[str, int]:
        """Records not yet done per input topic on this worker's partitions (for /metrics)."""
        return self.flow.consumer_lag()

    # -- what the app's timers and rebalance signals call --------------------------------------------------------

    def sample(self) -> None:
        """One sample for the console's charts, from what the worker keeps in memory (no table, no broker)."""
        if not self.ready:
            return  # nothing runs yet: zeros would read as an idle worker
        lag = sum(n for topic, n in self.consumer_lag().items() if topics.agent_of(topic) is not None)
        breakers = {name: str(view.get("state")) for name, view in self.circuits.describe().items()}
        self.samples.add(Sample(
            at=time.time(), ended=metrics.tasks_ended(), lag=lag, in_flight=metrics.provider_calls_in_flight(),
            held=self.executor.held, breakers=breakers,
        ))

    def on_revoked(self, revoked: set[TP]) -> None:
        self.flow.revoked(revoked)
        self.ledger.forget(revoked)
        self.takeover.revoked({tp.partition for tp in revoked})
        for table in self.tables.all():
            table.revoked({tp.partition for tp in revoked})

    def _member_id(self) -> str | None:
        consumer: Any = self.app.consumer
        return cast("str | None", consumer.member_id())

    def _confirmed_at(self) -> float | None:
        consumer: Any = self.app.consumer
        return cast("float | None", consumer.member_at)

    def may_be_member(self) -> bool:
        """The group cannot have expelled this worker yet: a commit, heartbeat or group sync it sent less than a
        session timeout ago was accepted. Never before the group's first word (its first sync counts): a worker
        stopped before it had any can not tell how long it was away."""
        consumer: Any = self.app.consumer
        return bool(consumer.member_since(self.settings.session_timeout_s))

    def on_assigned(self) -> None:
        self.flow.assigned()

    def after_rebalance(self) -> None:
        """The rebalance completed: read who is in the group (a lease held by a worker that left is taken over at
        once), and renew the leases of the runs going on here (the new owner of a moved partition leaves them to
        finish)."""
        self.add_future(self.takeover.learn_members())
        if self.ready:
            self.executor.beat_now()

    def _producer_client(self) -> Any:
        """The producer's aiokafka client (its metadata says which topics exist), or None before it started."""
        try:
            return self.app.producer._ensure_producer().client  # type: ignore[attr-defined]
        except Exception:  # not started yet (Faust's NotReady): nothing is sent before it is
            return None

    def owns(self, task_id: str) -> bool:
        """The task's partition is this worker's now and the group confirms this worker a member."""
        home = topics.partition_for(task_id.encode(), self.settings.partitions)
        return self.member() and home in self.partitions()

    def partitions(self) -> list[int]:
        """The partition numbers this worker owns now (of every input topic and table: they are copartitioned)."""
        outcomes = self.outcomes.get_topic_name()
        return sorted({tp.partition for tp in self.app.consumer.assignment() if tp.topic == outcomes})

    async def sweep_expired(self) -> None:
        """Finished records past their time to live, on this worker's partitions: sent to the ledger to delete.
        One partition's slice at a time, the loop free between them (a tick's slices held it for ~100 ms in B3)."""
        mine = set(self.partitions())
        expiry = self.ledger.expiry
        expiry.keep(mine)
        await expiry.refresh(self.app.consumer.earliest_offsets)  # a record stays while its task message is readable
        for partition in sorted(mine):
            keys = expiry.sweep_one(partition, time.time())
            if keys:
                body = encode(RecordsExpired(keys=keys, worker=self.worker_id))
                self.outcomes.send_soon(key=keys[0].encode(), value=body, partition=partition)
            idle = self.ledger.conversations.sweep_idle(
                partition, time.time(), self.settings.conversation_idle_s, self.settings.expiry_batch,
            )
            for delete in idle:  # on the conversation's task topic, like an operator's delete
                topic = self.app.topic(topics.task_topic(delete.agent_name), key_serializer="raw",
                                       value_serializer="raw")
                try:  # bounded: a broker that does not take it now leaves it to the next sweep
                    await asyncio.wait_for(topic.send(key=delete.conversation_id.encode(),
                                                      value=delete.model_dump_json().encode(), partition=partition),
                                           timeout=10.0)
                except Exception as exc:  # the next sweep finds it idle again
                    log.warning("The idle conversation %s could not be deleted now (%r); the next sweep tries again",
                                delete.conversation_id, exc)
            await asyncio.sleep(0)

    def scan_leases(self) -> None:
        now = time.time()
        for task_id, level in self.ledger.scan_parked(now):
            body = encode(ApprovalTimeout(level=level, worker=self.worker_id))
            self.outcomes.send_soon(key=task_id.encode(), value=body)
        waits = self.ledger.conversations.waits
        for topic, key, body, partition in waits.scan(now, set(self.partitions())) if waits is not None else []:
            # an operators' wait whose level ran out: an ``escalate`` on the conversation's task topic, in order
            # with its messages (tables/handoff_wait.py); best effort, the next tick after the throttle asks again
            self.ledger.outbox.send(topic, key, body, partition=partition)
        for task_id, dispatch in self.ledger.scan(now):
            body = encode(LeaseExpired(dispatch=dispatch, worker=self.worker_id))
            self.outcomes.send_soon(key=task_id.encode(), value=body)
        if self.ledger.orchestrator is not None:
            for job_id in self.ledger.orchestrator.scan(now):
                body = encode(JobDeadline(worker=self.worker_id))
                self.job_events.send_soon(key=job_id.encode(), value=body)


def app_agents(plans: dict[str, AgentPlan]) -> AppAgents:
    """What the ledger knows of the agents this app runs, from their plans."""
    sagas = {a: plan.saga for a, plan in plans.items() if plan.saga is not None}
    return AppAgents(
        names=frozenset(plans),
        sagas=frozenset(sagas),
        saga_flagged=frozenset(a for a, saga in sagas.items() if saga.needs_approval),
        cached=frozenset(a for a, plan in plans.items() if plan.config.cache_max_age_s > 0),
        policies={a: plan.config.approval for a, plan in plans.items() if plan.config.approval is not None},
        configs={a: plan.config for a, plan in plans.items()},
    )


def build_app(settings: Settings | None = None, config: AppConfig | None = None) -> AgentsStreamApp:
    settings = settings or Settings.from_env()
    if settings.approval_secret_problem():
        raise SystemExit(f"Refusing to start: {settings.approval_secret_problem()}")
    try:
        config = config or load_config(settings.config_path or None)
        agents = config.selected(settings.agent_filter())
        watermark = Watermark()
        app = new_app(settings, input_topics(settings, agents), watermark)
        tables = define_tables(app, settings)
        runtime = Runtime(
            app, settings, config, agents,
            tables=tables, watermark=watermark, output_topics=output_topics(app, settings, config, agents),
        )
    except ValueError as exc:  # the config (or what it names) is wrong: say what, not where in our code
        raise SystemExit(f"Refusing to start: {exc}") from None
    app.attach(runtime)
    wire(app, runtime, settings)
    web.register(app, runtime)
    return app


app = build_app()


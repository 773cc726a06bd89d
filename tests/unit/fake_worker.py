"""One worker's executor without a broker: providers on fake LLM servers, circuits on an in-memory log."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from agents_stream.config import AppConfig
from agents_stream.contract.checkpoints import JournalEntry
from agents_stream.contract.events import OutcomeEvent, encode
from agents_stream.contract.models import TaskPayload
from agents_stream.execution import pricing
from agents_stream.execution.executor import Executor, Outlets
from agents_stream.execution.membership import Membership
from agents_stream.execution.plan import AgentPlan, with_tool_circuits
from agents_stream.providers import Provider, build_provider
from agents_stream.resilience.circuits import Circuits
from agents_stream.settings import Settings
from agents_stream.testing.fakellm import FakeLLM
from agents_stream.testing.memory_circuits_log import MemoryCircuitsLog

AGENT = "a"
#: fast retries and probes; a long lease (no heartbeats) unless a test asks for them
FAST = {"max_retries": 2, "backoff_base_s": 0.01, "backoff_cap_s": 0.05, "probe_interval_s": 0.5, "max_in_flight": 2}


@dataclass
class Control:
    event: str
    subject: str
    agent: str | None
    details: dict[str, Any]


@dataclass
class Worker:
    """The executor under test and everything it told the rest of the worker."""

    executor: Executor
    circuits: Circuits
    log: MemoryCircuitsLog
    #: the outcome events it sent, as (task_id, event)
    outcomes: list[tuple[str, OutcomeEvent]] = field(default_factory=list)
    controls: list[Control] = field(default_factory=list)
    lookups: list[tuple[str, str, int]] = field(default_factory=list)
    flow_changes: int = 0
    #: the ephemeral records it sent to agent.conversation.events (chunks of streamed text), as (key, value, partition)
    sent_events: list[tuple[bytes, bytes, int]] = field(default_factory=list)
    #: when set, a journal entry's send is confirmed only once this is set (as the ledger's durable write would be)
    confirm_journal: asyncio.Event | None = None

    def dispatch(self, task_id: str, instruction: str = "Summarise the report.", dispatch: int = 1,
                 **fields: Any) -> TaskPayload:
        task = TaskPayload(task_id=task_id, agent_name=AGENT, instruction=instruction, **fields)
        self.executor.dispatch(task, dispatch)
        return task

    def events(self, task_id: str, kind: str | None = None) -> list[dict[str, Any]]:
        """The task's outcome events (of ``kind``) as the ledger reads them off the topic: their JSON."""
        wire = [json.loads(encode(o)) for t, o in self.outcomes if t == task_id]
        return [o for o in wire if kind is None or o["kind"] == kind]

    def control_events(self, prefix: str = "task.") -> list[tuple[str, str]]:
        return [(c.event, c.subject) for c in self.controls if c.event.startswith(prefix)]

    async def outcome(self, task_id: str, timeout: float = 10.0) -> dict[str, Any]:
        """The task's one terminal outcome (succeeded or failed), waiting up to ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = [o for o in self.events(task_id) if o["kind"] in ("succeeded", "failed")]
            if done:
                assert len(done) == 1, f"{task_id} has {len(done)} outcomes"
                return done[0]
            await asyncio.sleep(0.01)
        raise AssertionError(f"no outcome for {task_id} within {timeout}s; events {self.events(task_id)}")

    async def until(self, predicate: Any, timeout: float = 10.0, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} not reached within {timeout}s")
            await asyncio.sleep(0.01)


def app_config(
    fakes: dict[str, FakeLLM], agent: dict[str, Any], providers: dict[str, dict[str, Any]] | None = None,
    others: dict[str, dict[str, Any]] | None = None, **top: Any,
) -> AppConfig:
    """Every fake as an OpenAI-compatible provider named as in ``fakes`` (model ``<name>-model``);
    ``providers``: extra fields per provider name; ``others``: more agents besides ``a`` (a route's handlers)."""
    extra = providers or {}
    entries = {
        name: {"kind": "openai", "base_url": f"{fake.url}/v1", "model": f"{name}-model", "timeout_s": 5,
               **extra.get(name, {})}
        for name, fake in fakes.items()
    }
    return AppConfig.model_validate({"providers": entries, "agents": {AGENT: agent, **(others or {})}, **top})


@asynccontextmanager
async def worker(
    fakes: dict[str, FakeLLM],
    agent: dict[str, Any],
    *,
    settings: dict[str, Any] | None = None,
    spent_usd: float = 0.0,
    start: bool = True,
    membership: Membership | None = None,
    others: dict[str, dict[str, Any]] | None = None,
    **top: Any,
) -> AsyncIterator[Worker]:
    """A started executor for agent ``a`` (stopped on exit); ``spent_usd``: today's spend the cluster reported."""
    config = app_config(fakes, agent, others=others, **top)
    built: dict[str, Provider] = {}

    def provider(name: str) -> Provider:
        if name not in built:
            built[name] = build_provider(config.provider(name))
        return built[name]

    plans = {name: AgentPlan.build(config, name, provider) for name in config.agents}
    day = pricing.day_key(time.time())
    log = MemoryCircuitsLog()
    circuits_config, tools = with_tool_circuits(config, plans)  # an agent's tools have breakers too (app.py)
    circuits = Circuits(
        circuits_config, [*built, *tools], "w1", send=log.send, on_transition=lambda *t: None, on_change=lambda: None,
        spend_report=lambda: {AGENT: {day: {"0": spent_usd}}} if spent_usd else {}, app_id="app",
    )
    log.attach(circuits)
    holder: list[Worker] = []

    async def send_outcome(task_id: str, outcome: OutcomeEvent) -> None:
        holder[0].outcomes.append((task_id, outcome))
        confirm = holder[0].confirm_journal
        if confirm is not None and isinstance(outcome, JournalEntry):
            await confirm.wait()

    def send_control(event: str, subject: str, agent_name: str | None, details: dict[str, Any]) -> None:
        holder[0].controls.append(Control(event, subject, agent_name, details))

    def flow_changed() -> None:
        holder[0].flow_changes += 1

    def cache_lookup(task_id: str, fp: str, dispatch: int) -> None:
        holder[0].lookups.append((task_id, fp, dispatch))

    def send_event(key: bytes, value: bytes, partition: int) -> None:
        holder[0].sent_events.append((key, value, partition))

    executor = Executor(
        Settings(**{**FAST, **(settings or {})}), config, plans, circuits,
        Outlets(send_outcome=send_outcome, send_control=send_control, on_flow_change=flow_changed,
                cache_lookup=cache_lookup, send_event=send_event),
        worker_id="w1", rng=random.Random(7), membership=membership,
    )
    w = Worker(executor, circuits, log)
    holder.append(w)
    if spent_usd:
        circuits.hello()
        await w.until(lambda: circuits.spend(AGENT, day) >= spent_usd, what="the spend report folded")
    if start:
        await executor.start()
    try:
        yield w
    finally:
        await executor.stop()

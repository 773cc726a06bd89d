"""Prometheus metrics of one worker; the only module that imports prometheus_client.

Names follow ``agents_stream_<noun>_<unit>`` (counters end ``_total``); label
values are few (agent, provider, outcome, tier, layer, reason, topic), never
task ids. Counters are bumped where things happen; the gauges that describe
state (breakers, held tasks, leases, approvals, consumer lag) are set at scrape
time by ``render`` from values the worker already keeps in memory, so a scrape
reads no table and asks the broker nothing. docs/metrics.md lists them all.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from agents_stream.contract.errors import RateLimited, TransientError

REGISTRY = CollectorRegistry()

provider_calls = Counter(
    "agents_stream_provider_calls_total",
    "Provider calls by outcome (success, failure, rate_limited, rejected, cancelled).",
    ["provider", "outcome"], registry=REGISTRY,
)
provider_latency = Histogram(
    "agents_stream_provider_call_seconds", "Provider call duration, whatever the outcome.",
    ["provider"], registry=REGISTRY, buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
)
journal_durable = Histogram(
    "agents_stream_journal_durable_seconds",
    "A durable step of a run: from a journal entry or step checkpoint handed to this worker's ledger until the "
    "broker confirmed its record and the run may act on it.",
    registry=REGISTRY, buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1, 5),
)
provider_in_flight = Gauge(
    "agents_stream_provider_calls_in_flight", "Provider calls this worker has started and not yet seen end.",
    ["provider"], registry=REGISTRY,
)
provider_retries = Counter(
    "agents_stream_provider_retries_total",
    "Retries of a provider call after a transient failure, "
    "by reason (rate_limited, timeout, connection, server_error, unexpected).",
    ["provider", "reason"], registry=REGISTRY,
)
tokens = Counter(
    "agents_stream_tokens_total", "Tokens used, as providers reported them.",
    ["agent", "provider", "direction"], registry=REGISTRY,
)
cost = Counter(
    "agents_stream_cost_usd_total", "Spend in USD from the configured price table (unpriced models count 0).",
    ["agent", "provider"], registry=REGISTRY,
)
answers = Counter(
    "agents_stream_answers_total",
    "Task outcomes by the tier that produced them (primary, alternate, light, cache, none) and confidence.",
    ["agent", "status", "tier", "confidence"], registry=REGISTRY,
)
tasks = Counter(
    "agents_stream_tasks_total",
    "Tasks that ended, by agent and terminal state (succeeded, failed, dead_lettered, rejected): "
    "counted once, when the ledger's record of the end is durable; a redelivery counts nothing.",
    ["agent", "outcome"], registry=REGISTRY,
)
dead_letters = Counter(
    "agents_stream_dead_letters_total",
    "Records sent to a dead-letter topic, by agent (none for approval decisions and jobs) "
    "and error layer (schema, downstream, recovery).",
    ["agent", "layer"], registry=REGISTRY,
)
format_retries = Counter(
    "agents_stream_format_retries_total", "Corrective retries of answers that did not match the output schema.",
    ["agent"], registry=REGISTRY,
)
routed = Counter(
    "agents_stream_routed_total",
    "Tasks of routed agents sent to a handler, by how (rule, classifier, fallback; escalated: a weaker handler "
    "gave up).",
    ["agent", "handler", "by"], registry=REGISTRY,
)
summaries = Counter(
    "agents_stream_conversation_summaries_total",
    "Summaries of a conversation's older history asked for by a round, by outcome (written, failed).",
    ["agent", "outcome"], registry=REGISTRY,
)
held = Gauge(
    "agents_stream_tasks_held", "Tasks held on this worker because no provider they may use is available.",
    registry=REGISTRY,
)
leases = Gauge(
    "agents_stream_leases_held",
    "Running tasks under a lease in the task-table partitions this worker owns "
    "(summed over workers: each leased task once).",
    registry=REGISTRY,
)
approvals_pending = Gauge(
    "agents_stream_approvals_pending", "Tasks awaiting a human decision in the partitions this worker owns.",
    ["agent"], registry=REGISTRY,
)
consumer_lag_messages = Gauge(
    "agents_stream_consumer_lag_messages",
    "Records not yet done on this worker's partitions of an input topic: "
    "last known end offset minus the commit watermark.",
    ["topic"], registry=REGISTRY,
)
breaker_state = Gauge(
    "agents_stream_breaker_state", "Breaker state per provider: 0 closed, 1 half-open, 2 open.",
    ["provider"], registry=REGISTRY,
)
breaker_opens = Gauge(
    "agents_stream_breaker_opens", "Times the provider's breaker opened (as folded from the shared log).",
    ["provider"], registry=REGISTRY,
)

_STATE_VALUE = {"closed": 0, "half_open": 1, "open": 2}
#: every terminal state of the task ledger (tables/leases.py TERMINAL)
TASK_OUTCOMES = ("succeeded", "failed", "dead_lettered", "rejected", "cancelled")
#: the agent label of dead letters that belong to no agent (approval decisions, jobs)
NO_AGENT = "none"


def retry_reason(exc: BaseException) -> str:
    """The ``reason`` label of a retry: one of five values, whatever the provider said."""
    if isinstance(exc, RateLimited):
        return "rate_limited"
    cause = exc.__cause__ if isinstance(exc, TransientError) else exc
    if isinstance(cause, TimeoutError):  # asyncio.TimeoutError is TimeoutError since 3.11
        return "timeout"
    if isinstance(exc, TransientError):
        # Providers raise from the client's exception when no response came; a status or a bad body has no cause.
        return "connection" if cause is not None else "server_error"
    return "unexpected"


def consumer_lag(
    ends: Mapping[Any, int | None], positions: Mapping[Any, int | None], topics: Iterable[str] = ()
) -> dict[str, int]:
    """Per topic, the sum over its partitions (``tp.topic``) of end offset minus position, never below 0.

    A partition whose end or position is not known yet counts 0; every name in
    ``topics`` is in the answer, so a topic whose partitions all moved away
    reads 0 instead of keeping its last value.
    """
    lag = dict.fromkeys(topics, 0)
    for tp, end in ends.items():
        at = positions.get(tp)
        if end is None or at is None:
            continue
        lag[tp.topic] = lag.get(tp.topic, 0) + max(end - at, 0)
    return lag


def _sum(metric: Any, sample: str) -> float:
    return sum(s.value for family in metric.collect() for s in family.samples if s.name == sample)


def tasks_ended() -> float:
    """Tasks this worker's ledger saw end since it started, every agent and outcome (``agents_stream_tasks_total``
    summed): the console's throughput is its rate."""
    return _sum(tasks, "agents_stream_tasks_total")


def provider_calls_in_flight() -> int:
    """Provider calls this worker has started and not yet seen end, every provider summed."""
    return int(_sum(provider_in_flight, "agents_stream_provider_calls_in_flight"))


def render(
    circuits: dict[str, Any],
    held_now: int,
    *,
    agents: Iterable[str] = (),
    leases_now: int = 0,
    approvals: Mapping[str, int] | None = None,
    lag: Mapping[str, int] | None = None,
) -> tuple[bytes, str]:
    """The exposition text, with the gauges set from the worker's state at scrape time.

    The counters of every agent and provider exist from the first scrape (at 0),
    so ``rate()`` and ``increase()`` see their first increment.
    """
    for name, view in circuits.items():
        breaker_state.labels(name).set(_STATE_VALUE.get(view.get("state", ""), -1))
        breaker_opens.labels(name).set(view.get("opens", 0))
        provider_in_flight.labels(name)
    for agent in agents:
        for outcome in TASK_OUTCOMES:
            tasks.labels(agent, outcome)
    held.set(held_now)
    leases.set(leases_now)
    for agent, count in (approvals or {}).items():
        approvals_pending.labels(agent).set(count)
    for topic, count in (lag or {}).items():
        consumer_lag_messages.labels(topic).set(count)
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST

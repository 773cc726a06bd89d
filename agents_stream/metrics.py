"""Prometheus metrics of one worker; the only module that imports prometheus_client.

Names follow ``agents_stream_<noun>_<unit>_total``; label values are few
(agent, provider, outcome, tier), never task ids.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

REGISTRY = CollectorRegistry()

provider_calls = Counter(
    "agents_stream_provider_calls_total", "Provider calls by outcome (success, failure, rate_limited, rejected, cancelled).",
    ["provider", "outcome"], registry=REGISTRY,
)
provider_latency = Histogram(
    "agents_stream_provider_call_seconds", "Provider call duration, whatever the outcome.",
    ["provider"], registry=REGISTRY, buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
)
tokens = Counter("agents_stream_tokens_total", "Tokens used, as providers reported them.", ["agent", "provider", "direction"], registry=REGISTRY)
cost = Counter("agents_stream_cost_usd_total", "Spend in USD from the configured price table (unpriced models count 0).", ["agent", "provider"], registry=REGISTRY)
answers = Counter(
    "agents_stream_answers_total", "Task outcomes by the tier that produced them (primary, alternate, light, cache, none) and confidence.",
    ["agent", "status", "tier", "confidence"], registry=REGISTRY,
)
format_retries = Counter("agents_stream_format_retries_total", "Corrective retries of answers that did not match the output schema.", ["agent"], registry=REGISTRY)
held = Gauge("agents_stream_tasks_held", "Tasks held on this worker because no provider they may use is available.", registry=REGISTRY)
breaker_state = Gauge("agents_stream_breaker_state", "Breaker state per provider: 0 closed, 1 half-open, 2 open.", ["provider"], registry=REGISTRY)
breaker_opens = Gauge("agents_stream_breaker_opens", "Times the provider's breaker opened (as folded from the shared log).", ["provider"], registry=REGISTRY)

_STATE_VALUE = {"closed": 0, "half_open": 1, "open": 2}


def render(circuits: dict[str, Any], held_now: int) -> tuple[bytes, str]:
    """The exposition text, with the gauges read from the circuits view at scrape time."""
    for name, view in circuits.items():
        breaker_state.labels(name).set(_STATE_VALUE.get(view.get("state", ""), -1))
        breaker_opens.labels(name).set(view.get("opens", 0))
    held.set(held_now)
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST

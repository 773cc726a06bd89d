"""Cost of LLM calls from per-model prices, their sums, and the UTC day a budget counts over."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from agents_stream.config import Price, load_config
from agents_stream.execution.pricing import add, cost, day_key

FLASH = Price(input_per_mtok=0.10, output_per_mtok=0.40)


def test_cost_is_tokens_times_price_per_million() -> None:
    """Input and output tokens are charged at their own per-million rates and summed."""
    assert cost(FLASH, 1_000_000, 0) == 0.10
    assert cost(FLASH, 0, 1_000_000) == 0.40
    assert cost(FLASH, 2_000, 500) == 0.0004  # 2000 * 0.10e-6 + 500 * 0.40e-6


def test_unpriced_model_costs_none_not_zero() -> None:
    """A model without a configured price has an unknown cost (None), never a free one."""
    assert cost(None, 1_000, 1_000) is None
    assert cost(None, 0, 0) is None


def test_zero_tokens_cost_zero() -> None:
    """A priced call that used no tokens costs exactly 0.0, a known amount."""
    assert cost(FLASH, 0, 0) == 0.0


def test_free_model_costs_zero() -> None:
    """A model priced at 0 (a local or self-hosted one) costs a known 0.0."""
    assert cost(Price(), 5_000, 5_000) == 0.0


def test_cost_has_no_float_noise() -> None:
    """Costs are rounded to 1e-9 USD, so they serialise to JSON as short, exact-looking numbers."""
    price = Price(input_per_mtok=0.15, output_per_mtok=0.60)
    value = cost(price, 3, 7)
    assert value == 0.00000465
    assert json.dumps(value) == "4.65e-06"
    assert json.dumps(add(0.1, 0.2)) == "0.3"


def test_tiny_cost_rounds_to_the_billionth() -> None:
    """A call cheaper than a billionth of a dollar rounds to 0.0 rather than a denormal-looking float."""
    assert cost(Price(input_per_mtok=0.0001), 1, 0) == 0.0


def test_negative_token_counts_are_rejected() -> None:
    """A negative token count is a bug upstream and fails loudly instead of lowering the spend."""
    with pytest.raises(ValueError, match="negative"):
        cost(FLASH, -1, 0)
    with pytest.raises(ValueError, match="negative"):
        cost(None, 0, -1)


def test_add_known_costs() -> None:
    """Two known costs add up."""
    assert add(0.25, 0.5) == 0.75


def test_add_keeps_the_known_part_when_one_is_unknown() -> None:
    """An unpriced call does not erase the spend already counted: unknown plus known is the known part."""
    assert add(None, 0.3) == 0.3
    assert add(0.3, None) == 0.3
    assert add(None, 0.0) == 0.0


def test_add_two_unknowns_is_unknown() -> None:
    """Only when nothing was priced is the total unknown."""
    assert add(None, None) is None


def test_add_folds_over_a_day_of_calls() -> None:
    """Summing many calls from None gives the known spend, with no float drift."""
    total = None
    for value in [None, 0.1, None, 0.2, 0.0000001] * 1000:
        total = add(total, value)
    assert total == 300.0001


def test_day_key_is_the_utc_date() -> None:
    """The budget day is the UTC calendar date of the unix time, whatever the local zone."""
    assert day_key(0) == "1970-01-01"
    noon = datetime(2025, 3, 9, 12, 0, tzinfo=UTC).timestamp()
    assert day_key(noon) == "2025-03-09"


def test_day_key_turns_at_utc_midnight() -> None:
    """The last instant before 00:00 UTC belongs to the old day, midnight itself to the new one."""
    midnight = datetime(2025, 1, 1, tzinfo=UTC).timestamp()
    assert day_key(midnight - 0.001) == "2024-12-31"
    assert day_key(midnight) == "2025-01-01"


def test_default_config_prices_every_default_remote_model() -> None:
    """Out of the box, every remote model in the packaged config has a price, so its spend is known."""
    cfg = load_config(None)
    for provider in cfg.providers.values():
        if provider.kind != "local":
            assert cfg.price_of(provider.model) is not None, provider.model
    assert cfg.price_of("gemini-2.0-flash") == FLASH
    assert cfg.price_of("no-such-model") is None

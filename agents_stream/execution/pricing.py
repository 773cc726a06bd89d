"""What LLM calls cost in USD, from the configured per-model prices; pure functions, no I/O."""

from __future__ import annotations

from datetime import UTC, datetime

from agents_stream.config import Price

__all__ = ["add", "cost", "day_key"]

_TOKENS_PER_PRICE_UNIT = 1_000_000
#: costs are kept to a billionth of a dollar: finer than any price, coarse enough to hide float noise
_DIGITS = 9


def cost(price: Price | None, input_tokens: int, output_tokens: int) -> float | None:
    """USD for one call; None when the model has no price (unknown cost is not zero)."""
    if input_tokens < 0 or output_tokens < 0:
        raise ValueError(f"token counts cannot be negative (input {input_tokens}, output {output_tokens})")
    if price is None:
        return None
    usd = (input_tokens * price.input_per_mtok + output_tokens * price.output_per_mtok) / _TOKENS_PER_PRICE_UNIT
    return round(usd, _DIGITS)


def add(a: float | None, b: float | None) -> float | None:
    """The sum of what is known: None only when both are unknown.

    An unpriced call does not erase the spend already counted, so unknown plus
    known is the known part; the total is then a lower bound, which is what a
    budget check needs (it can only under-count the calls nobody priced).
    """
    if a is None:
        return b
    if b is None:
        return a
    return round(a + b, _DIGITS)


def day_key(now: float) -> str:
    """The UTC date ``YYYY-MM-DD`` of a unix time: the period a daily budget counts over."""
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d")

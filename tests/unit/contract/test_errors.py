"""The exception tree: classify() and the retryability each error carries."""

from __future__ import annotations

import pytest

from agents_stream.contract.errors import (
    CircuitOpen,
    PermanentError,
    PoisonMessage,
    RateLimited,
    SystemicError,
    TaskError,
    TransientError,
    classify,
)


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (TransientError("timeout", provider="gemini"), "transient"),
        (RateLimited("429", provider="gemini", retry_after=3.0), "transient"),
        (PermanentError("400 bad request", provider="openai"), "permanent"),
        (SystemicError("401 unauthorized", provider="openai"), "systemic"),
        (CircuitOpen("breaker open", provider="gemini"), "circuit_open"),
        (ValueError("a bug"), "transient"),
        (ConnectionResetError("peer reset"), "transient"),
    ],
    ids=["transient", "rate_limited", "permanent", "systemic", "circuit_open", "value_error", "os_error"],
)
def test_classify_maps_each_error_to_its_handling(exc: BaseException, expected: str) -> None:
    """Each class asks for its own handling; errors outside the tree are retried, never blamed on the task."""
    assert classify(exc) == expected


def test_classify_follows_subclasses() -> None:
    """A provider-specific subclass is handled like the class it extends."""

    class QuotaExhausted(SystemicError):
        pass

    class Refused(PermanentError):
        pass

    assert classify(QuotaExhausted("quota")) == "systemic"
    assert classify(Refused("refused")) == "permanent"


@pytest.mark.parametrize(
    ("cls", "retriable"),
    [
        (TransientError, True),
        (RateLimited, True),
        (PermanentError, False),
        (SystemicError, False),
        (CircuitOpen, False),
        (PoisonMessage, False),
        (TaskError, False),
    ],
)
def test_retriable_lives_on_the_class(cls: type[TaskError], retriable: bool) -> None:
    """Callers ask the error whether to retry: only transient errors (and 429s) say yes."""
    assert cls.retriable is retriable


def test_classify_transient_agrees_with_retriable_for_tree_errors() -> None:
    """Within the provider errors, classify() says transient exactly for the retriable ones."""
    for exc in (TransientError("t"), RateLimited("r"), PermanentError("p"), SystemicError("s"), CircuitOpen("c")):
        assert (classify(exc) == "transient") is exc.retriable


def test_rate_limited_carries_retry_after_and_provider() -> None:
    """A 429 tells the retry layer when to come back and which provider said so."""
    exc = RateLimited("slow down", provider="gemini", retry_after=12.0)
    assert isinstance(exc, TransientError)
    assert exc.retry_after == 12.0
    assert exc.provider == "gemini"
    assert str(exc) == "slow down"


def test_transient_retry_after_defaults_to_none() -> None:
    """Without a Retry-After the error does not invent one."""
    assert TransientError("timeout").retry_after is None
    assert RateLimited("429").retry_after is None


def test_poison_message_carries_reason_detail_and_schema_layer() -> None:
    """A poison message names its reason and detail and is dead-lettered under layer 'schema'."""
    exc = PoisonMessage("not_json", "Expecting value: line 1 column 1")
    assert exc.reason == "not_json"
    assert exc.detail == "Expecting value: line 1 column 1"
    assert exc.layer == "schema"
    assert str(exc) == "not_json: Expecting value: line 1 column 1"
    assert exc.retriable is False


def test_poison_message_without_detail_is_just_the_reason() -> None:
    """With no detail the message is the bare reason, with no dangling separator."""
    exc = PoisonMessage("null_value")
    assert exc.detail == ""
    assert str(exc) == "null_value"


@pytest.mark.parametrize("cls", [TransientError, RateLimited, PermanentError, SystemicError, CircuitOpen])
def test_provider_errors_are_dead_lettered_as_downstream(cls: type[TaskError]) -> None:
    """Errors from the model call name layer 'downstream' in a dead-letter record."""
    assert cls("x").layer == "downstream"


@pytest.mark.parametrize("cls", [PoisonMessage, TransientError, RateLimited, PermanentError, SystemicError,
                                 CircuitOpen])
def test_every_error_is_a_task_error(cls: type[Exception]) -> None:
    """One ``except TaskError`` catches every error of the tree."""
    assert issubclass(cls, TaskError)

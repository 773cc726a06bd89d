"""Where a group starts a task topic: its own commits, the start of a topic nobody read, or the operator's choice
when another group read it (AGENTS_STREAM_START_FROM); never silently the whole history again."""

from __future__ import annotations

import pytest
from aiokafka.errors import (
    CoordinatorLoadInProgressError,
    GroupAuthorizationFailedError,
    GroupCoordinatorNotAvailableError,
)

from agents_stream.kafka.admin import retried
from agents_stream.kafka.start import Start, StartFrom, decide, parse_start_from, refusal

T = "agent.tasks.a"
BEGIN = {0: 0, 1: 5}
END = {0: 10, 1: 20}
OTHERS = {"old-app": {0: 7, 1: 20}, "idle": {0: 0, 1: 5}}  # idle committed the start: it read nothing


@pytest.mark.parametrize("value, expected", [
    ("", StartFrom("ask")), (" earliest ", StartFrom("earliest")), ("latest", StartFrom("latest")),
    ("group:old-app", StartFrom("group", "old-app")),
])
def test_the_setting_takes_three_forms(value: str, expected: StartFrom) -> None:
    """Empty asks; earliest, latest and group:<app id> choose."""
    assert parse_start_from(value) == expected


@pytest.mark.parametrize("value", ["start", "group:", "EARLIEST", "group"])
def test_anything_else_is_refused_with_the_forms(value: str) -> None:
    with pytest.raises(ValueError, match="expected earliest, latest or group:<app id>"):
        parse_start_from(value)


def test_own_commits_and_a_topic_nobody_read_need_no_choice() -> None:
    """A group that committed keeps its commits whatever the setting; a topic only idle groups committed on
    (nothing read past its start) is read from the start."""
    assert decide(T, {0: 3}, OTHERS, BEGIN, END, StartFrom("ask")) == Start(T)
    assert decide(T, {0: 3}, OTHERS, BEGIN, END, StartFrom("latest")) == Start(T)
    assert decide(T, {}, {"idle": OTHERS["idle"]}, BEGIN, END, StartFrom("ask")) == Start(T)
    assert decide(T, {}, {}, BEGIN, END, StartFrom("ask")) == Start(T)


def test_a_topic_another_group_read_waits_for_a_choice() -> None:
    """Without a choice (or naming a group that did not read it) the start is refused, naming the readers."""
    readers = {"old-app": OTHERS["old-app"]}
    assert decide(T, {}, OTHERS, BEGIN, END, StartFrom("ask")) == Start(T, refused=True, readers=readers)
    assert decide(T, {}, OTHERS, BEGIN, END, StartFrom("group", "idle")).refused


def test_each_choice_commits_what_it_says() -> None:
    """earliest: the topic's first offsets; latest: its ends; group: that group's commits (its start where the
    group has none)."""
    assert decide(T, {}, OTHERS, BEGIN, END, StartFrom("earliest")).commit == BEGIN
    assert decide(T, {}, OTHERS, BEGIN, END, StartFrom("latest")).commit == END
    partial = {"old-app": {0: 7}}
    assert decide(T, {}, partial, BEGIN, END, StartFrom("group", "old-app")).commit == {0: 7, 1: 5}


def test_the_refusal_says_what_and_how() -> None:
    """The message names the app id, the topic and its readers, and every way to choose."""
    start = decide(T, {}, OTHERS, BEGIN, END, StartFrom("ask"))
    text = refusal("new-app", [start], StartFrom("ask"))
    assert text.startswith(f"App id new-app has never read {T} (read by old-app).")
    for way in ("AGENTS_STREAM_START_FROM=earliest", "=latest", "=group:old-app"):
        assert way in text
    assert "names an app id that has not read them" in refusal("new-app", [start], StartFrom("group", "idle"))


async def test_a_retriable_refusal_is_asked_again_until_it_answers() -> None:
    """A fresh cluster names no group coordinator for a moment: the start asks again instead of dying (seen on the
    three-broker cluster)."""
    answers: list[BaseException | str] = [
        GroupCoordinatorNotAvailableError("not yet"), CoordinatorLoadInProgressError(), "the commits",
    ]

    async def call() -> str:
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    assert await retried("the commits of group g", call, timeout=5) == "the commits"
    assert answers == []


class Refusing:
    """A call the cluster always refuses with ``error``; it counts how often it was asked."""

    def __init__(self, error: Exception) -> None:
        self.error, self.calls = error, 0

    async def __call__(self) -> str:
        self.calls += 1
        raise self.error


async def test_a_refusal_that_is_not_retriable_is_raised_at_once() -> None:
    call = Refusing(GroupAuthorizationFailedError("no ACL"))
    with pytest.raises(GroupAuthorizationFailedError):
        await retried("the commits of group g", call, timeout=5)
    assert call.calls == 1


async def test_a_cluster_that_stays_unready_fails_after_the_timeout() -> None:
    call = Refusing(GroupCoordinatorNotAvailableError("never"))
    with pytest.raises(GroupCoordinatorNotAvailableError):
        await retried("the commits of group g", call, timeout=0.5)
    assert 2 <= call.calls <= 4, "asked again with backoff, then gave up"

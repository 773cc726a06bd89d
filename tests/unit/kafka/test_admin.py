"""How the app's topics are replicated (agents_stream.kafka.admin.replication_for), and the leader topic it makes."""

from __future__ import annotations

import logging

import faust
import pytest
from faust.assignor.leader_assignor import LeaderAssignor

from agents_stream.kafka.admin import Replication, leader_spec, replication_for
from agents_stream.settings import Settings


@pytest.mark.parametrize(("brokers", "expected"), [
    (1, Replication(1, 1)),  # the local single broker: one replica, nothing to wait for
    (2, Replication(2, 1)),
    (3, Replication(3, 2)),  # one broker may die, every acknowledged write is on two
    (5, Replication(3, 2)),
])
def test_auto_replication_follows_the_cluster(brokers: int, expected: Replication) -> None:
    assert replication_for(Settings.from_env({}), brokers) == expected


def test_configured_replication_wins() -> None:
    settings = Settings.from_env({"AGENTS_STREAM_REPLICATION_FACTOR": "2", "AGENTS_STREAM_MIN_INSYNC_REPLICAS": "2"})
    assert replication_for(settings, 5) == Replication(2, 2)
    assert replication_for(Settings.from_env({"AGENTS_STREAM_REPLICATION_FACTOR": "3"}), 1) == Replication(3, 2)


def test_topic_configs_carry_min_insync() -> None:
    assert Replication(3, 2).topic_configs() == {"min.insync.replicas": "2"}


def test_min_insync_equal_to_the_factor_warns(caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings.from_env({"AGENTS_STREAM_MIN_INSYNC_REPLICAS": "3"})
    with caplog.at_level(logging.WARNING):
        assert replication_for(settings, 3) == Replication(3, 3)
    assert "one broker down stops every write" in caplog.text


@pytest.mark.parametrize("env", [
    {"AGENTS_STREAM_REPLICATION_FACTOR": "2", "AGENTS_STREAM_MIN_INSYNC_REPLICAS": "3"},
    {"AGENTS_STREAM_REPLICATION_FACTOR": "-1"},
    {"AGENTS_STREAM_MIN_INSYNC_REPLICAS": "-2"},
])
def test_impossible_replication_ends_the_worker(env: dict[str, str]) -> None:
    with pytest.raises(SystemExit, match="min.insync.replicas at most the replication factor"):
        replication_for(Settings.from_env(env), 3)


def test_the_leader_topic_made_before_the_group_is_joined_is_the_one_faust_s_assignor_uses() -> None:
    """Made under another name, the worker's early topic would be an extra one and Faust's made late again.
    Faust has no public name for it: its assignor's own attribute is read, so a Faust upgrade that renames the
    topic fails here."""
    app = faust.App("leader-name-check")
    faust_topic = LeaderAssignor(app)._leader_topic
    spec = leader_spec(app.conf.id)
    assert spec.name == faust_topic.get_topic_name()
    assert spec.partitions == faust_topic.partitions == 1
    assert spec.configs == {} and not faust_topic.config, "Faust declares it with the broker's default configs"

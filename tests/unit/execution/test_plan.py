"""The fallback ladder an agent's configuration builds (AgentPlan): its rungs, their confidence and its bottom."""

from __future__ import annotations

import pytest

from agents_stream.config import AppConfig
from agents_stream.execution.plan import AgentPlan
from agents_stream.providers import build_provider


def plan(agent: dict, monkeypatch: pytest.MonkeyPatch | None = None) -> AgentPlan:
    cfg = AppConfig.model_validate({
        "providers": {
            "p": {"kind": "local", "model": "p"},
            "alt": {"kind": "local", "model": "alt"},
            "mini": {"kind": "local", "model": "mini"},
            "keyed": {"kind": "openai", "api_key_env": "AGENTS_STREAM_TEST_UNSET_KEY"},
        },
        "agents": {"x": agent},
    })
    built: dict = {}
    return AgentPlan.build(cfg, "x", lambda name: built.setdefault(name, build_provider(cfg.providers[name])))


def rungs(p: AgentPlan) -> list[tuple[str, str, str, bool]]:
    return [(t.role, t.provider.name, t.confidence, t.simplified) for t in p.tiers]


def test_primary_is_high_and_alternates_medium(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first provider answers with confidence high, every later one with medium; the default stops there."""
    p = plan({"providers": ["p", "alt"], "light": "mini"})
    assert rungs(p) == [("primary", "p", "high", False), ("alternate", "alt", "medium", False)]
    assert p.light is not None and not p.cache and not p.partial


def test_lowest_low_adds_the_simplified_light_rung_and_the_cache() -> None:
    """lowest = "low" lets the light model answer a simplified task, and the cache answer, both with confidence low."""
    p = plan({"providers": ["p"], "light": "mini", "lowest": "low", "cache_max_age_s": 60})
    assert rungs(p) == [("primary", "p", "high", False), ("light", "mini", "low", True)]
    assert p.cache and not p.partial


def test_lowest_high_keeps_only_the_primary() -> None:
    """lowest = "high": no alternate may answer; the task holds instead."""
    assert rungs(plan({"providers": ["p", "alt"], "lowest": "high"})) == [("primary", "p", "high", False)]


def test_lowest_failed_allows_the_partial_result() -> None:
    """lowest = "failed" is the only setting that lets a task end with the explicit partial result."""
    p = plan({"providers": ["p"], "lowest": "failed", "cache_max_age_s": 10})
    assert p.partial and p.cache


def test_providers_without_their_key_are_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A provider whose key is unset is not a rung (the next one becomes primary);
    an unusable light model is dropped."""
    monkeypatch.delenv("AGENTS_STREAM_TEST_UNSET_KEY", raising=False)
    p = plan({"providers": ["keyed", "alt"], "light": "keyed", "lowest": "low"})
    assert rungs(p) == [("primary", "alt", "high", False)]
    assert p.light is None


def test_a_bad_agent_schema_or_model_stops_the_worker_at_start() -> None:
    """An invalid agent-level output_schema or an unimportable output_model is configuration: refused
    when the plan is built."""
    with pytest.raises(ValueError, match="agent 'x'"):
        plan({"providers": ["p"], "output_schema": {"type": "no-such-type"}})
    with pytest.raises(ValueError, match="agent 'x'.*nowhere"):
        plan({"providers": ["p"], "output_model": "nowhere.at.all:Model"})

"""The TOML config (providers, agents, fallback chain) and the typed Settings object."""

from __future__ import annotations

import tomllib
from dataclasses import fields
from typing import Any, get_args

import pytest
from pydantic import BaseModel, ValidationError

from agents_stream.config import (
    AgentConfig,
    AppConfig,
    ApprovalLevel,
    ApprovalPolicy,
    BreakerConfig,
    Price,
    ProviderConfig,
    load_config,
)
from agents_stream.settings import Settings

REMOTE_KEYS = ("GEMINI_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY")


@pytest.fixture
def no_keys(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in REMOTE_KEYS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def config(agents: dict[str, Any], providers: dict[str, Any] | None = None) -> AppConfig:
    return AppConfig.model_validate({
        "providers": providers if providers is not None else {
            "local": {"kind": "local"},
            "gemini": {"kind": "gemini", "api_key_env": "AGENTS_STREAM_TEST_GEMINI"},
            "openai": {"kind": "openai", "api_key_env": "AGENTS_STREAM_TEST_OPENAI"},
            "vllm": {"kind": "openai", "base_url": "http://127.0.0.1:8000/v1"},
        },
        "agents": agents,
    })


# -- the packaged default ---------------------------------------------------------------


def test_packaged_default_config_loads() -> None:
    """A fresh install runs with no config file: the packaged default parses and names its agents."""
    cfg = load_config(None)
    assert set(cfg.agents) == {"analyzer", "summarizer"}
    assert {"local", "gemini", "openai"} <= set(cfg.providers)
    for name, provider in cfg.providers.items():
        assert provider.name == name
    for name, agent in cfg.agents.items():
        assert agent.name == name
        assert agent.providers and all(p in cfg.providers for p in agent.providers)
        assert agent.system


def test_default_config_keeps_keys_out_of_the_file() -> None:
    """Remote providers name an environment variable for their key; the file holds none."""
    cfg = load_config(None)
    for provider in cfg.providers.values():
        if provider.kind != "local":
            assert provider.api_key_env and provider.api_key_env.endswith("_API_KEY")


def test_empty_path_means_the_packaged_default() -> None:
    """AGENTS_STREAM_CONFIG unset (empty string) falls back to the packaged file."""
    assert load_config("") == load_config(None)


# -- validation -----------------------------------------------------------------------


def test_agent_naming_unknown_provider_is_rejected() -> None:
    """A typo in an agent's provider list fails at start-up, naming the missing provider."""
    with pytest.raises(ValueError, match="claude"):
        config({"analyzer": {"providers": ["local", "claude"]}})


def test_agent_needs_at_least_one_provider() -> None:
    """An agent with an empty provider list is rejected rather than silently answering with local."""
    with pytest.raises(ValidationError):
        config({"analyzer": {"providers": []}})


def test_config_needs_an_agent() -> None:
    """A file with providers but no agents is rejected: the worker would consume nothing."""
    with pytest.raises(ValidationError):
        config({})


@pytest.mark.parametrize("name", ["a.b", "a b", "tasks/x", "x*"])
def test_agent_name_must_be_topic_safe(name: str) -> None:
    """Agent names become topic names, so dots, spaces and slashes are rejected."""
    with pytest.raises(ValueError, match="letters, digits"):
        config({name: {"providers": ["local"]}})


@pytest.mark.parametrize("name", ["résumé", "x²", "анализ"])
def test_agent_name_must_be_ascii_for_kafka(name: str) -> None:
    """A non-ASCII agent name is rejected at load, not by the broker when its topic is created."""
    with pytest.raises(ValueError):
        config({name: {"providers": ["local"]}})


def test_typo_in_config_keys_is_rejected() -> None:
    """Unknown keys (a misspelt option) fail loudly instead of being ignored."""
    with pytest.raises(ValidationError, match="api_key"):
        config({"analyzer": {"providers": ["gemini"]}},
               providers={"gemini": {"kind": "gemini", "api_key": "sk-in-the-file"}})


def test_parses_a_toml_file_text() -> None:
    """A user's TOML file becomes the same typed config as the dict form."""
    text = """
[providers.ollama]
kind = "openai"
base_url = "http://127.0.0.1:11434/v1"
model = "llama3"
timeout_s = 5

[agents.triage]
providers = ["ollama"]
"""
    cfg = AppConfig.model_validate(tomllib.loads(text))
    (provider,) = cfg.chain("triage")
    assert provider.name == "ollama" and provider.model == "llama3" and provider.timeout_s == 5.0


# -- the fallback chain -----------------------------------------------------------------


def test_chain_skips_providers_without_keys(no_keys: pytest.MonkeyPatch) -> None:
    """With no API keys set, the default agents answer with the local provider only."""
    cfg = load_config(None)
    assert [p.name for p in cfg.chain("analyzer")] == ["local"]


def test_chain_keeps_providers_with_keys_in_order(no_keys: pytest.MonkeyPatch) -> None:
    """A provider whose key is set is used, in the order the agent lists it."""
    no_keys.setenv("OPENAI_API_KEY", "sk-test")
    cfg = load_config(None)
    assert [p.name for p in cfg.chain("analyzer")] == ["openai", "local"]
    no_keys.setenv("GEMINI_API_KEY", "g-test")
    assert [p.name for p in cfg.chain("analyzer")] == ["gemini", "openai", "local"]
    no_keys.setenv("ANTHROPIC_API_KEY", "a-test")
    assert [p.name for p in cfg.chain("analyzer")] == ["gemini", "openai", "anthropic", "local"]


def test_empty_key_counts_as_unset(no_keys: pytest.MonkeyPatch) -> None:
    """An exported but empty key variable does not make a provider usable."""
    no_keys.setenv("GEMINI_API_KEY", "")
    cfg = load_config(None)
    assert "gemini" not in [p.name for p in cfg.chain("analyzer")]
    assert cfg.providers["gemini"].api_key() is None


def test_chain_falls_back_to_local_when_nothing_is_usable(monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent whose every provider lacks its key still answers, with a built-in local provider."""
    monkeypatch.delenv("AGENTS_STREAM_TEST_GEMINI", raising=False)
    monkeypatch.delenv("AGENTS_STREAM_TEST_OPENAI", raising=False)
    cfg = config({"analyzer": {"providers": ["gemini", "openai"]}})
    (fallback,) = cfg.chain("analyzer")
    assert fallback.kind == "local"
    assert fallback.name == "local"


def test_keyless_endpoint_is_usable(monkeypatch: pytest.MonkeyPatch) -> None:
    """A remote endpoint that needs no key (vLLM, Ollama) stays in the chain."""
    monkeypatch.delenv("AGENTS_STREAM_TEST_GEMINI", raising=False)
    cfg = config({"analyzer": {"providers": ["gemini", "vllm"]}})
    assert [p.name for p in cfg.chain("analyzer")] == ["vllm"]


def test_provider_key_is_read_from_its_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    """The key comes from the variable the provider names, read at call time."""
    provider = ProviderConfig(name="g", kind="gemini", api_key_env="AGENTS_STREAM_TEST_GEMINI")
    monkeypatch.delenv("AGENTS_STREAM_TEST_GEMINI", raising=False)
    assert provider.api_key() is None and not provider.usable()
    monkeypatch.setenv("AGENTS_STREAM_TEST_GEMINI", "k-1")
    assert provider.api_key() == "k-1" and provider.usable()


# -- Settings -----------------------------------------------------------------------


def test_settings_defaults_without_environment() -> None:
    """An empty environment yields the documented defaults."""
    assert Settings.from_env({}) == Settings()


def test_settings_parse_numbers_from_strings() -> None:
    """Environment strings become the field's type: ints stay ints, floats accept '30'."""
    s = Settings.from_env({
        "AGENTS_STREAM_PARTITIONS": "12",
        "AGENTS_STREAM_LEASE_TTL_S": "2.5",
        "AGENTS_STREAM_BACKOFF_CAP_S": "60",
        "WEB_PORT": "8080",
        "KAFKA_BROKER": "kafka://k1:9092,kafka://k2:9092",
    })
    assert s.partitions == 12 and type(s.partitions) is int
    assert s.lease_ttl_s == 2.5
    assert s.backoff_cap_s == 60.0 and type(s.backoff_cap_s) is float
    assert s.web_port == 8080
    assert s.broker == "kafka://k1:9092,kafka://k2:9092"


def test_settings_empty_env_value_means_default() -> None:
    """A variable exported empty keeps the default instead of failing to parse."""
    assert Settings.from_env({"AGENTS_STREAM_PARTITIONS": "", "AGENTS_STREAM_APP_ID": ""}) == Settings()


def test_settings_bad_number_fails_loudly() -> None:
    """A non-numeric value for a numeric setting is an error at start-up, not a silent default."""
    with pytest.raises(ValueError):
        Settings.from_env({"AGENTS_STREAM_MAX_ATTEMPTS": "three"})


def test_settings_explicit_overrides_win() -> None:
    """Explicit overrides beat the environment, which beats the defaults."""
    s = Settings.from_env({"AGENTS_STREAM_PARTITIONS": "12", "AGENTS_STREAM_MAX_ATTEMPTS": "7"}, partitions=3)
    assert s.partitions == 3
    assert s.max_attempts == 7


def test_settings_read_process_environment_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without an explicit mapping, from_env reads os.environ."""
    monkeypatch.setenv("AGENTS_STREAM_MAX_IN_FLIGHT", "5")
    assert Settings.from_env().max_in_flight == 5


def test_every_setting_has_a_unique_env_name_and_a_doc() -> None:
    """Each setting can be set and is explained by `agents-stream settings`; no two share a variable."""
    described = Settings.describe()
    assert len(described) == len(fields(Settings))
    for name, env, _default, doc in described:
        assert env.strip() and env == env.upper(), name
        assert doc.strip(), name
    envs = [env for _, env, _, _ in described]
    assert len(envs) == len(set(envs))


def test_every_default_has_its_declared_type() -> None:
    """from_env converts with type(default), so an int default on a float field would reject '2.5'."""
    for f in fields(Settings):
        declared = f.type if isinstance(f.type, str) else f.type.__name__
        assert type(f.default).__name__ == declared, f.name


def test_agent_filter_splits_and_trims() -> None:
    """AGENTS_STREAM_AGENTS is a comma list; blanks and spaces are ignored, empty means all."""
    assert Settings(agents=" analyzer, ,summarizer ").agent_filter() == {"analyzer", "summarizer"}
    assert Settings().agent_filter() == set()


# -- resilience settings --------------------------------------------------------------


def test_breaker_defaults_and_per_provider_overrides() -> None:
    """A provider's own breaker table overrides the [breaker] defaults key by key."""
    cfg = AppConfig.model_validate({
        "breaker": {"failure_threshold": 7, "open_timeout_s": 10},
        "providers": {"a": {"kind": "local", "breaker": {"open_timeout_s": 2}}, "b": {"kind": "local"}},
        "agents": {"x": {"providers": ["a", "b"]}},
    })
    assert cfg.breaker_for("a").failure_threshold == 7 and cfg.breaker_for("a").open_timeout_s == 2
    assert cfg.breaker_for("b").open_timeout_s == 10


@pytest.mark.parametrize(
    ("agent", "providers", "message"),
    [
        ({"providers": ["local"], "light": "nope"}, None, "unknown light provider 'nope'"),
        ({"providers": ["local"], "router": "classifier"}, None, 'needs classifier = "<provider>"'),
        ({"providers": ["local"], "output_schema": {"type": "object"}, "output_model": "m:M"}, None, "not both"),
        ({"providers": ["local"], "lowest": "great"}, None, "lowest"),
        ({"providers": ["local"]}, {"local": {"kind": "local", "breaker": {"failure_threshold": 0}}},
         "bad breaker settings"),
        ({"providers": ["local"]}, {"local": {"kind": "local", "max_concurrency": 0}}, "max_concurrency"),
        ({"providers": ["local"]}, {"local": {"kind": "local", "timeout_s": 90}}, "probe_timeout_s"),
    ],
)
def test_bad_resilience_settings_are_refused_with_a_clear_message(agent: dict, providers: dict | None,
                                                                  message: str) -> None:
    """A mistyped fallback, router, schema or breaker setting stops the worker at start with its name in the error."""
    with pytest.raises(ValidationError, match=message):
        config({"x": agent}, providers or {"local": {"kind": "local"}})


def test_prices_by_model() -> None:
    """The price table is keyed by model name; an unknown model has no price (unknown cost, not zero)."""
    cfg = AppConfig.model_validate({
        "providers": {"local": {"kind": "local"}},
        "agents": {"x": {"providers": ["local"]}},
        "prices": {"m1": {"input_per_mtok": 1.5, "output_per_mtok": 2}},
    })
    assert cfg.price_of("m1").output_per_mtok == 2
    assert cfg.price_of("m2") is None


# -- inf and NaN ---------------------------------------------------------------------------

LEVEL = {"name": "lead", "timeout_s": 5}
#: a valid instance of every config model with a float field, to put one bad float into
MINIMAL: dict[type[BaseModel], dict[str, Any]] = {
    BreakerConfig: {}, Price: {}, ProviderConfig: {"kind": "local"}, ApprovalLevel: LEVEL,
    ApprovalPolicy: {"levels": [LEVEL], "amount_field": "amount", "amount_above": 100},
    AgentConfig: {"providers": ["p"]},
}
FLOAT_FIELDS = [
    (model, name) for model in MINIMAL for name, info in model.model_fields.items()
    if info.annotation is float or float in get_args(info.annotation)
]


def test_the_float_fields_are_all_found() -> None:
    """The enumeration below covers the config's float fields (a renamed model would empty it silently)."""
    assert {(m.__name__, f) for m, f in FLOAT_FIELDS} >= {
        ("BreakerConfig", "open_timeout_s"), ("ProviderConfig", "timeout_s"), ("ProviderConfig", "rps"),
        ("ApprovalLevel", "timeout_s"), ("ApprovalPolicy", "amount_above"), ("AgentConfig", "budget_usd_per_day"),
        ("Price", "input_per_mtok"),
    }
    assert len(FLOAT_FIELDS) >= 14


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")], ids=["inf", "-inf", "nan"])
@pytest.mark.parametrize(("model", "name"), FLOAT_FIELDS, ids=[f"{m.__name__}.{f}" for m, f in FLOAT_FIELDS])
def test_every_config_float_refuses_inf_and_nan(model: type[BaseModel], name: str, value: float) -> None:
    """timeout_s = inf or amount_above = nan (TOML has both) would pass every bound and disable what it bounds."""
    with pytest.raises(ValidationError, match="Input should be a finite number"):
        model.model_validate({**MINIMAL[model], name: value})


def test_a_toml_inf_is_refused_with_the_field_named() -> None:
    """From the file: the error names the provider's field."""
    text = '[providers.p]\nkind = "local"\ntimeout_s = inf\n[agents.a]\nproviders = ["p"]\n'
    with pytest.raises(ValidationError, match=r"providers\.p\.timeout_s\n  Input should be a finite number"):
        AppConfig.model_validate(tomllib.loads(text))


FLOAT_SETTINGS = [(f.name, f.metadata["env"]) for f in fields(Settings) if isinstance(f.default, float)]


@pytest.mark.parametrize("raw", ["inf", "-inf", "nan", "Infinity"])
@pytest.mark.parametrize(("name", "env"), FLOAT_SETTINGS, ids=[e for _, e in FLOAT_SETTINGS])
def test_every_float_setting_refuses_inf_and_nan(name: str, env: str, raw: str) -> None:
    """AGENTS_STREAM_LEASE_TTL_S=inf (float() parses it) would make a lease that never lapses: refused at start."""
    with pytest.raises(ValueError, match=rf"^{env}=.* is not a finite number$"):
        Settings.from_env({env: raw})
    with pytest.raises(ValueError, match="is not a finite number"):
        Settings(**{name: float(raw)})


def test_the_wait_for_a_person_uses_its_own_levels_else_the_approval_levels_and_none_when_told() -> None:
    text = """
[providers.p]
kind = "openai"
base_url = "http://127.0.0.1:11434/v1"
model = "m"

[agents.desk]
providers = ["p"]
approval = { amount_field = "amount", amount_above = 100, levels = [{ name = "lead", timeout_s = 600 }] }

[agents.own]
providers = ["p"]
[[agents.own.handoff_levels]]
name = "desk-oncall"
timeout_s = 60
[[agents.own.handoff_levels]]
name = "desk-lead"
timeout_s = 300

[agents.off]
providers = ["p"]
approval = { always = true, levels = [{ name = "lead", timeout_s = 600 }] }
handoff_levels = []

[agents.plain]
providers = ["p"]
"""
    agents = AppConfig.model_validate(tomllib.loads(text)).agents
    assert [(lv.name, lv.timeout_s) for lv in agents["desk"].handoff_wait_levels()] == [("lead", 600.0)]
    assert [lv.name for lv in agents["own"].handoff_wait_levels()] == ["desk-oncall", "desk-lead"]
    assert agents["off"].handoff_wait_levels() == [] and agents["plain"].handoff_wait_levels() == []

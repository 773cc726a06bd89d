"""The TOML file of providers and agents (``AGENTS_STREAM_CONFIG``), parsed into typed models."""

from __future__ import annotations

import os
import tomllib
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

ProviderKind = Literal["local", "gemini", "openai", "anthropic"]


class ProviderConfig(BaseModel):
    """One model endpoint. Keys come from the environment variable it names, never the file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = ""
    kind: ProviderKind
    base_url: str = ""
    model: str = "local-echo"
    api_key_env: str | None = None
    timeout_s: float = Field(default=30.0, gt=0)
    max_tokens: int = Field(default=1024, gt=0)
    #: extra latency of the ``local`` provider, for demos (seconds)
    latency_s: float = Field(default=0.0, ge=0)

    def api_key(self) -> str | None:
        """The key from the environment, or None when the variable is unset or empty."""
        if not self.api_key_env:
            return None
        return os.environ.get(self.api_key_env) or None

    def usable(self) -> bool:
        """A remote provider needs its key; ``local`` and key-less endpoints (vLLM, Ollama) do not."""
        return self.kind == "local" or self.api_key_env is None or self.api_key() is not None


class AgentConfig(BaseModel):
    """A sub-agent: its task topic is ``agent.tasks.<name>``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = ""
    providers: list[str] = Field(min_length=1)
    system: str = ""
    description: str = ""


class AppConfig(BaseModel):
    """The whole file: ``[providers.<name>]`` and ``[agents.<name>]`` tables."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    providers: dict[str, ProviderConfig]
    agents: dict[str, AgentConfig] = Field(min_length=1)

    @field_validator("providers", "agents", mode="before")
    @classmethod
    def _name_entries(cls, value: object) -> object:
        if isinstance(value, dict):
            return {k: {**v, "name": k} if isinstance(v, dict) else v for k, v in value.items()}
        return value

    @model_validator(mode="after")
    def _check_references(self) -> AppConfig:
        for agent in self.agents.values():
            unknown = [p for p in agent.providers if p not in self.providers]
            if unknown:
                raise ValueError(f"agent {agent.name!r} names unknown providers {unknown}")
            if not (agent.name.isascii() and agent.name.replace("_", "").replace("-", "").isalnum()):
                raise ValueError(f"agent name {agent.name!r} must be letters, digits, - or _")
        return self

    def chain(self, agent: str) -> list[ProviderConfig]:
        """The agent's usable providers in order; ``local`` when none has its key."""
        usable = [self.providers[p] for p in self.agents[agent].providers]
        usable = [p for p in usable if p.usable()]
        return usable or [ProviderConfig(name="local", kind="local")]


def load_config(path: str | Path | None) -> AppConfig:
    """Read the TOML file at ``path``, or the default shipped with the package."""
    if path:
        text = Path(path).read_text(encoding="utf-8")
    else:
        text = resources.files("agents_stream").joinpath("default_config.toml").read_text("utf-8")
    return AppConfig.model_validate(tomllib.loads(text))

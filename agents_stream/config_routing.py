"""A routed agent's table in the TOML file (``[agents.<name>.routing]``, docs/guide/routing.md), parsed."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["RouteRuleConfig", "RoutingConfig"]


class RouteRuleConfig(BaseModel):
    """One rule of a route (``[[agents.<name>.routing.rules]]``): a message it matches goes to ``handler``. Every
    condition given must hold; a rule with none matches every message (a catch-all, put it last)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    handler: str
    #: any of these words or phrases, whole words, any case
    words: list[str] = Field(default_factory=list)
    #: a regular expression searched in the message's text, any case
    pattern: str | None = None
    #: context_data fields equal to these values
    context: dict[str, Any] = Field(default_factory=dict)


class RoutingConfig(BaseModel):
    """Routing across handlers (``[agents.<name>.routing]``, docs/guide/routing.md): each message (or task) of the
    agent goes to one of its ``handlers`` (other agents of the config), by ``rules`` and then a ``classifier``;
    a handler that fails, or answers below ``min_confidence``, escalates to the next one in the list."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    #: the handlers, weakest (cheapest) first: an escalation goes to the next one
    handlers: list[str] = Field(default_factory=list)
    rules: list[RouteRuleConfig] = Field(default_factory=list)
    #: the provider (``[providers.<name>]``, a small model) asked when no rule matches; None: no classifier
    classifier: str | None = None
    #: where a message goes that no rule and no classifier placed; None: the last (strongest) handler
    fallback: str | None = None
    #: an answer below this confidence escalates ("low": only failures escalate)
    min_confidence: Literal["high", "medium", "low"] = "low"
    #: or the route as Python: "package.module:NAME" of an agents_stream Routing (then give nothing else here)
    python: str | None = None

    @model_validator(mode="after")
    def _one_form(self) -> RoutingConfig:
        if self.python is not None:
            if self.handlers or self.rules or self.classifier or self.fallback:
                raise ValueError("routing: give python = \"package.module:NAME\" or the route's fields, not both")
            return self
        if not self.handlers:
            raise ValueError("routing: give handlers = [\"<agent>\", ...] (weakest first)")
        if len(set(self.handlers)) != len(self.handlers):
            raise ValueError(f"routing: handlers {self.handlers} name an agent twice")
        named = [r.handler for r in self.rules] + ([self.fallback] if self.fallback else [])
        unknown = sorted({h for h in named if h not in self.handlers})
        if unknown:
            raise ValueError(f"routing: rules or fallback name {unknown}, which are not among handlers {self.handlers}")
        return self

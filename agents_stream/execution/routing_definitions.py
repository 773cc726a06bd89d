"""Routes written in Python or in the agents config (Routing, Rule): the API users route messages with (pure).

A routed agent (``[agents.desk.routing]``, or ``routing.python = "package.module:NAME"`` of a ``Routing``) sends
each message, or task, to one of its handlers — other agents of the config, weakest (cheapest) first: a one-call
prompt agent, a saga or steps, a tool-using agent. ``Routing.decide`` reads the rules in order; the first that
matches names the handler. When none matches, the runtime asks the classifier (a small model) or takes the
fallback (execution/handlers.py). A handler that fails, or answers below ``min_confidence``, escalates to the next
one in ``handlers``.

    from agents_stream import Routing, Rule

    DESK = Routing(
        handlers=["faq", "orders", "support"],
        rules=[Rule("faq", words=["opening hours", "shipping cost"]),
               Rule("orders", when=lambda m: "order_id" in m.context and "refund" not in m.text.lower())],
        classifier="small", min_confidence="medium",
    )
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from agents_stream.execution.named import load_named

__all__ = ["Rule", "RouteMessage", "Routing", "classifier_prompt", "load_routing", "parse_choice"]

log = logging.getLogger(__name__)

#: what a rule matches against at most (a longer message's tail is not read: a rule's pattern stays bounded)
RULE_TEXT_CHARS = 20_000


@dataclass(frozen=True)
class RouteMessage:
    """What a rule sees of a message (a conversation's round: its messages; a task: its instruction)."""

    text: str
    context: dict[str, Any]


@dataclass(frozen=True)
class Rule:
    """A message goes to ``handler`` when every condition given holds: one of ``words`` (whole words or phrases,
    any case), ``pattern`` (a regular expression searched, any case), each ``context`` field equal, and ``when``
    (a function of the RouteMessage) true. A rule with none is a catch-all."""

    handler: str
    words: tuple[str, ...] = ()
    pattern: str | None = None
    context: dict[str, Any] = field(default_factory=dict)
    when: Callable[[RouteMessage], bool] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "words", tuple(self.words))
        if self.pattern is not None:
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise ValueError(f"rule for {self.handler!r}: pattern {self.pattern!r} is not a regular expression: "
                                 f"{exc}") from None

    def why(self, message: RouteMessage) -> str | None:
        """Why this rule matches ``message`` (the reason journaled), or None when it does not."""
        reasons = []
        text = message.text[:RULE_TEXT_CHARS]
        if self.words:
            found = _words_in(text, self.words)
            if not found:
                return None
            reasons.append("words " + ", ".join(repr(w) for w in found))
        if self.pattern is not None:
            match = re.search(self.pattern, text, re.IGNORECASE)
            if match is None:
                return None
            reasons.append(f"pattern {self.pattern!r} matched {match.group(0)[:40]!r}")
        for key, value in self.context.items():
            if key not in message.context or message.context[key] != value:
                return None
            reasons.append(f"context {key} = {value!r}")
        if self.when is not None:
            name = getattr(self.when, "__name__", "when")
            try:
                if not self.when(message):
                    return None
            except Exception as exc:  # a user's function must not crash the worker: it just does not match
                log.warning("Routing rule %s for %r raised %r: taken as no match", name, self.handler, exc)
                return None
            reasons.append(f"{name}()")
        return " and ".join(reasons) or "catch-all rule"


@dataclass(frozen=True)
class Routing:
    """A route: its handlers (agents of the config, weakest first), its rules in order, the classifier provider
    asked when no rule matches, the fallback (default: the strongest handler) and the confidence it demands."""

    handlers: list[str]
    rules: list[Rule] = field(default_factory=list)
    classifier: str | None = None
    fallback: str | None = None
    min_confidence: Literal["high", "medium", "low"] = "low"
    #: what the classifier is told of each handler (default: the handler agent's ``description``)
    describe: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "handlers", list(self.handlers))
        object.__setattr__(self, "rules", list(self.rules))
        if not self.handlers:
            raise ValueError("a Routing needs handlers (agent names, weakest first)")
        if len(set(self.handlers)) != len(self.handlers):
            raise ValueError(f"Routing handlers {self.handlers} name an agent twice")
        named = [r.handler for r in self.rules] + ([self.fallback] if self.fallback else []) + list(self.describe)
        unknown = sorted({h for h in named if h not in self.handlers})
        if unknown:
            raise ValueError(f"Routing rules, fallback or describe name {unknown}, not among handlers {self.handlers}")
        if self.min_confidence not in ("high", "medium", "low"):
            raise ValueError(f"Routing min_confidence {self.min_confidence!r}: high, medium or low")

    @property
    def strongest(self) -> str:
        return self.handlers[-1]

    @property
    def default(self) -> str:
        """Where a message goes that no rule and no classifier placed."""
        return self.fallback or self.strongest

    def decide(self, message: RouteMessage) -> tuple[str, str] | None:
        """(handler, reason) of the first rule that matches, or None."""
        for number, rule in enumerate(self.rules, 1):
            why = rule.why(message)
            if why is not None:
                return rule.handler, f"rule {number}: {why}"
        return None

    def stronger(self, handler: str) -> str | None:
        """The handler an escalation from ``handler`` goes to; None: it is the strongest."""
        at = self.handlers.index(handler)
        return self.handlers[at + 1] if at + 1 < len(self.handlers) else None

    @classmethod
    def from_config(cls, config: Any) -> Routing:
        """The route of a ``[agents.<name>.routing]`` table (config.RoutingConfig), or the one it names."""
        if config.python is not None:
            return load_routing(config.python)
        return cls(
            handlers=list(config.handlers), classifier=config.classifier, fallback=config.fallback,
            min_confidence=config.min_confidence,
            rules=[Rule(r.handler, words=tuple(r.words), pattern=r.pattern, context=dict(r.context))
                   for r in config.rules],
        )


CLASSIFIER_SYSTEM = (
    "You route customer messages to the handler that can answer them. Answer with exactly one handler name from "
    "the list, nothing else."
)
#: the message as the classifier reads it at most (characters)
CLASSIFIER_TEXT_CHARS = 2000


def classifier_prompt(text: str, handlers: list[tuple[str, str]]) -> str:
    """What the classifier is asked: the handlers (name: what it is for) and the message (cut)."""
    listed = "\n".join(f"- {name}: {what or '(no description)'}" for name, what in handlers)
    if len(text) > CLASSIFIER_TEXT_CHARS:
        text = text[:CLASSIFIER_TEXT_CHARS] + "…"
    return f"Handlers:\n{listed}\n\nMessage:\n{text}\n\nThe handler's name:"


def parse_choice(answer: str, handlers: list[str]) -> str | None:
    """The one handler the classifier's answer names (its whole answer, a JSON {"handler": ...}, or the only name
    it mentions); None when it names none or several (the route takes its fallback)."""
    text = answer.strip().strip("`").strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            data = None
        if isinstance(data, dict):
            text = str(data.get("handler") or data.get("name") or "")
    exact = [h for h in handlers if text.strip(" .\"'").lower() == h.lower()]
    if exact:
        return exact[0]
    named = [h for h in handlers if re.search(r"(?<![\w-])" + re.escape(h) + r"(?![\w-])", text, re.IGNORECASE)]
    return named[0] if len(named) == 1 else None


def load_routing(path: str) -> Routing:
    """The Routing at ``package.module:NAME``; ValueError saying what is wrong."""
    return load_named(path, Routing, "routing")


def _words_in(text: str, words: tuple[str, ...]) -> list[str]:
    found = []
    for word in words:
        phrase = r"\s+".join(re.escape(part) for part in word.split())
        if phrase and re.search(r"(?<!\w)" + phrase + r"(?!\w)", text, re.IGNORECASE):
            found.append(word)
    return found

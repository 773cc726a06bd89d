"""Routes as users write them (execution/routing_definitions.py) and as the agents config gives them (config.py,
execution/plan.py): rules, the classifier's prompt and answer, and every bad route refused with a clear error."""

from __future__ import annotations

import pytest

from agents_stream import RouteMessage, Routing, Rule
from agents_stream.config import AppConfig
from agents_stream.execution.plan import AgentPlan
from agents_stream.execution.routing_definitions import classifier_prompt, parse_choice
from agents_stream.providers import build_provider

HANDLERS = ["faq", "orders", "support"]


def _m(text: str, **context: object) -> RouteMessage:
    return RouteMessage(text, dict(context))


def is_order(message: RouteMessage) -> bool:
    return "order_id" in message.context


def broken(message: RouteMessage) -> bool:
    raise RuntimeError("a bug in the user's rule")


DESK = Routing(handlers=HANDLERS, rules=[Rule("faq", words=["opening hours"]), Rule("orders", when=is_order)],
               classifier="small")


def test_rules_match_in_order_and_say_why() -> None:
    routing = Routing(handlers=HANDLERS, rules=[
        Rule("faq", words=["opening hours", "shipping cost"]),
        Rule("orders", pattern=r"where is (my|the) (order|package)"),
        Rule("support", context={"intent": "refund"}),
        Rule("orders", when=is_order),
    ])
    assert routing.decide(_m("What are your OPENING   hours?")) == ("faq", "rule 1: words 'opening hours'")
    assert routing.decide(_m("Where is my package?"))[0] == "orders"
    assert routing.decide(_m("hello", intent="refund")) == ("support", "rule 3: context intent = 'refund'")
    assert routing.decide(_m("hello", order_id="o-7")) == ("orders", "rule 4: is_order()")
    assert routing.decide(_m("shipping costs")) is None, "whole words only"
    assert routing.decide(_m("hello")) is None


def test_every_condition_of_a_rule_must_hold_and_a_rule_without_any_catches_all() -> None:
    both = Routing(handlers=HANDLERS, rules=[Rule("support", words=["refund"], context={"vip": True}), Rule("faq")])
    assert both.decide(_m("refund please", vip=True))[0] == "support"
    assert both.decide(_m("refund please")) == ("faq", "rule 2: catch-all rule")


def test_a_rule_function_that_raises_does_not_match(caplog: pytest.LogCaptureFixture) -> None:
    routing = Routing(handlers=HANDLERS, rules=[Rule("orders", when=broken)])
    assert routing.decide(_m("x")) is None and "broken" in caplog.text


def test_handlers_strongest_fallback_and_escalation_order() -> None:
    assert DESK.strongest == "support" and DESK.default == "support"
    assert DESK.stronger("faq") == "orders" and DESK.stronger("support") is None
    assert Routing(handlers=HANDLERS, fallback="faq").default == "faq"


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"handlers": []}, "needs handlers"),
    ({"handlers": ["a", "a"]}, "twice"),
    ({"handlers": ["a"], "rules": [Rule("b")]}, "not among handlers"),
    ({"handlers": ["a"], "fallback": "b"}, "not among handlers"),
    ({"handlers": ["a"], "min_confidence": "failed"}, "min_confidence"),
])
def test_a_bad_route_is_refused(kwargs: dict, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        Routing(**kwargs)


def test_a_bad_pattern_is_refused() -> None:
    with pytest.raises(ValueError, match="not a regular expression"):
        Rule("faq", pattern="(unclosed")


@pytest.mark.parametrize(("answer", "chosen"), [
    ("support", "support"), (" Support. ", "support"), ('{"handler": "orders", "reason": "tracking"}', "orders"),
    ("I would send this to faq.", "faq"), ("faq or support", None), ("billing", None), ("", None),
])
def test_the_classifiers_answer(answer: str, chosen: str | None) -> None:
    assert parse_choice(answer, HANDLERS) == chosen


def test_the_classifiers_prompt_lists_the_handlers_and_cuts_the_message() -> None:
    prompt = classifier_prompt("x" * 5000, [("faq", "opening hours"), ("support", "")])
    assert "- faq: opening hours\n- support: (no description)" in prompt and len(prompt) < 2200


def _config(routing: dict, **more: dict) -> AppConfig:
    return AppConfig.model_validate({
        "providers": {"p": {"kind": "local"}, "small": {"kind": "local"}},
        "agents": {"faq": {"providers": ["p"]}, "support": {"providers": ["p"]}, "desk": {"routing": routing},
                   **more},
    })


def test_a_route_in_the_config_builds_its_plan() -> None:
    config = _config({"handlers": ["faq", "support"], "classifier": "small", "min_confidence": "medium",
                      "rules": [{"handler": "faq", "words": ["hours"], "pattern": "open", "context": {"a": 1}}]})
    plan = AgentPlan.build(config, "desk", lambda n: build_provider(config.provider(n)))
    assert plan.routing is not None and plan.routing.handlers == ["faq", "support"]
    assert plan.route_classifier is not None and plan.routing.min_confidence == "medium"
    assert plan.routing.decide(_m("open hours", a=1))[0] == "faq"


@pytest.mark.parametrize(("routing", "more", "error"), [
    ({"handlers": ["faq", "nope"]}, {}, "handler 'nope', which is not an agent"),
    ({"handlers": ["faq", "other"]}, {"other": {"routing": {"handlers": ["faq"]}}}, "routes itself"),
    ({"handlers": ["faq"], "classifier": "nope"}, {}, "unknown routing classifier"),
    ({"handlers": ["faq"], "rules": [{"handler": "support"}]}, {}, "not among handlers"),
    ({}, {}, "give handlers"),
    ({"handlers": ["faq"], "python": "x:Y"}, {}, "not both"),
])
def test_a_bad_route_in_the_config_is_a_clear_error(routing: dict, more: dict, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        _config(routing, **more)


def test_an_agent_without_providers_must_route_and_a_routed_agent_runs_nothing_else() -> None:
    with pytest.raises(ValueError, match="give providers"):
        AppConfig.model_validate({"providers": {"p": {"kind": "local"}}, "agents": {"a": {}}})
    with pytest.raises(ValueError, match="routing or saga/agent/mcp"):
        _config({"handlers": ["faq"]}, desk2={"routing": {"handlers": ["faq"]}, "saga": "x:Y"})


def test_a_worker_that_runs_a_route_runs_its_handlers() -> None:
    config = _config({"handlers": ["faq", "support"]})
    with pytest.raises(SystemExit, match="without its handlers"):
        config.selected({"desk", "faq"})
    assert config.selected({"desk", "faq", "support"}) == ["faq", "support", "desk"]


def test_a_python_route_is_named_by_the_config() -> None:
    config = _config({"python": f"{__name__}:DESK"}, orders={"providers": ["p"]})
    plan = AgentPlan.build(config, "desk", lambda n: build_provider(config.provider(n)))
    assert plan.routing is DESK
    bad = _config({"python": f"{__name__}:HANDLERS"})
    with pytest.raises(ValueError, match="is not an agents_stream Routing"):
        AgentPlan.build(bad, "desk", lambda n: build_provider(config.provider(n)))
    missing = _config({"python": f"{__name__}:DESK"})  # names "orders", which this config lacks
    with pytest.raises(ValueError, match="'orders', which is not an agent"):
        AgentPlan.build(missing, "desk", lambda n: build_provider(config.provider(n)))

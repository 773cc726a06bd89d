"""An agent's fallback ladder as its configuration builds it: the rungs (Tier), the light model, the bottom."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from agents_stream.config import CONFIDENCE_ORDER, AgentConfig, AppConfig, McpServerConfig, ProviderConfig
from agents_stream.contract.models import Confidence
from agents_stream.execution.agent_definitions import Agent
from agents_stream.execution.mcp_tools import circuit_name
from agents_stream.execution.outputs import OutputSpec
from agents_stream.execution.routing_definitions import Routing
from agents_stream.execution.saga_definitions import SagaDefinition, load_saga
from agents_stream.frameworks import FrameworkAgent, load_acting
from agents_stream.providers.base import Provider

__all__ = ["AgentPlan", "Tier", "at_least", "mcp_servers", "with_tool_circuits"]


@dataclass(frozen=True)
class Tier:
    """One rung of an agent's ladder."""

    role: str  # primary | alternate | light
    provider: Provider
    confidence: Confidence
    simplified: bool = False
    #: chosen by the router as "adequate": a format failure or a low-confidence answer moves on
    escalates: bool = False


@dataclass
class AgentPlan:
    """What an agent may call, in which order, and what it may answer with when none of it is available."""

    config: AgentConfig
    tiers: list[Tier]  # the fallback ladder, cut at `lowest`
    light: Provider | None
    classifier: Provider | None
    cache: bool  # may answer from the last good answer
    partial: bool  # may answer with the explicit partial result
    saga: SagaDefinition | None = None  # every task of the agent runs as this saga
    agent: Agent | None = None  # every task of the agent runs as this tool-calling loop
    #: or as this framework's agent (a Pydantic AI or OpenAI Agents SDK agent in its adapter: agents_stream/frameworks)
    framework: FrameworkAgent | None = None
    #: the MCP servers whose tools the loop offers besides the agent's own (listed at start: execution/mcp_servers.py)
    mcp: tuple[McpServerConfig, ...] = ()
    #: writes the summaries of a conversation's older history (``[agents.<name>.summary]``; None: none, or its
    #: provider is not usable)
    summarizer: Provider | None = None
    #: routing across handlers (``[agents.<name>.routing]``): each task runs as the handler its route picks
    routing: Routing | None = None
    #: the route's classifier (None: none, or its provider is not usable: the route takes its fallback)
    route_classifier: Provider | None = None

    @classmethod
    def build(cls, config: AppConfig, agent: str, provider: Callable[[str], Provider]) -> AgentPlan:
        cfg = config.agents[agent]
        allowed = CONFIDENCE_ORDER.index(cfg.lowest)
        chain = config.chain(agent)
        tiers = [
            Tier("primary" if i == 0 else "alternate", provider(p.name), "high" if i == 0 else "medium")
            for i, p in enumerate(chain)
        ]
        light = provider(cfg.light) if cfg.light and config.providers[cfg.light].usable() else None
        if light is not None and allowed >= CONFIDENCE_ORDER.index("low"):
            tiers.append(Tier("light", light, "low", simplified=True))
        tiers = [t for t in tiers if CONFIDENCE_ORDER.index(t.confidence) <= allowed]
        classifier = (
            provider(cfg.classifier) if cfg.classifier and config.providers[cfg.classifier].usable() else None
        )
        summary = cfg.summary.provider if cfg.summary is not None else None
        summarizer = provider(summary) if summary and config.providers[summary].usable() else None
        # A bad agent-level schema or model is configuration: fail at start, not task by task.
        try:
            if cfg.output_schema is not None:
                OutputSpec.from_schema(cfg.output_schema)
            elif cfg.output_model is not None:
                OutputSpec.from_model(cfg.output_model)
        except ValueError as exc:
            raise ValueError(f"agent {agent!r}: {exc}") from None
        try:
            saga = load_saga(cfg.saga) if cfg.saga else None
            loaded = load_acting(cfg.agent) if cfg.agent else None
        except ValueError as exc:
            raise ValueError(f"agent {agent!r}: {exc}") from None
        acting = loaded if loaded is None or isinstance(loaded, Agent) else None
        framework = None if loaded is None or isinstance(loaded, Agent) else loaded
        if framework is not None and (cfg.mcp or cfg.routing is not None):
            raise ValueError(f"agent {agent!r}: a {framework.framework} agent brings its own tools and model: give it "
                             "no mcp and no routing table (its framework's own toolsets are run durably)")
        if acting is not None and not cfg.providers:
            raise ValueError(f"agent {agent!r}: give providers = [\"<provider>\", ...]")
        try:
            routing = _routing_of(config, cfg)
        except ValueError as exc:
            raise ValueError(f"agent {agent!r}: {exc}") from None
        asks = routing.classifier if routing is not None else None
        route_classifier = provider(asks) if asks and config.providers[asks].usable() else None
        try:
            servers = _servers_of(config, cfg, acting)
        except ValueError as exc:
            raise ValueError(f"agent {agent!r}: {exc}") from None
        if servers and acting is None:  # a config-only agent of MCP tools: its system prompt is its instructions
            acting = Agent(agent, instructions="")
        gated = [t.name for t in acting.tools if t.approval] if acting else []
        if gated and cfg.approval is None:
            raise ValueError(f"agent {agent!r}: tools {gated} ask for approval; give the agent approval levels "
                             f"([agents.{agent}.approval] with [[agents.{agent}.approval.levels]])")
        return cls(
            saga=saga,
            agent=acting,
            framework=framework,
            mcp=servers,
            config=cfg,
            tiers=tiers,
            light=light,
            classifier=classifier,
            summarizer=summarizer,
            routing=routing,
            route_classifier=route_classifier,
            cache=cfg.cache_max_age_s > 0 and allowed >= CONFIDENCE_ORDER.index("low"),
            partial=cfg.lowest == "failed",
        )


def _routing_of(config: AppConfig, cfg: AgentConfig) -> Routing | None:
    """The agent's route, its handlers checked against the config (a Python route is only known once loaded)."""
    if cfg.routing is None:
        return None
    routing = Routing.from_config(cfg.routing)
    for handler in routing.handlers:
        other = config.agents.get(handler)
        if other is None:
            raise ValueError(f"routing names handler {handler!r}, which is not an agent of the config")
        if other.routing is not None or handler == cfg.name:
            raise ValueError(f"routing handler {handler!r} routes itself; a handler is an agent that answers")
    if routing.classifier is not None and routing.classifier not in config.providers:
        raise ValueError(f"routing names unknown classifier provider {routing.classifier!r}")
    return routing


def at_least(confidence: str, lowest: str) -> bool:
    """Whether ``confidence`` is as good as ``lowest`` or better (high > medium > low > failed)."""
    return CONFIDENCE_ORDER.index(confidence) <= CONFIDENCE_ORDER.index(lowest)


def _servers_of(config: AppConfig, cfg: AgentConfig, acting: Agent | None) -> tuple[McpServerConfig, ...]:
    """The MCP servers an agent names, in its config (``mcp = [...]``) and in its definition (names or servers)."""
    named: list[str | McpServerConfig] = [*cfg.mcp, *(acting.mcp if acting else ())]
    servers: dict[str, McpServerConfig] = {}
    for entry in named:
        if isinstance(entry, str):
            if entry not in config.mcp:
                raise ValueError(f"MCP server {entry!r} is not in the config (add an [mcp.{entry}] table)")
            entry = config.mcp[entry]
        if servers.get(entry.name, entry) != entry:
            raise ValueError(f"two different MCP servers are named {entry.name!r}")
        servers[entry.name] = entry
    return tuple(servers.values())


def mcp_servers(plans: dict[str, AgentPlan]) -> dict[str, McpServerConfig]:
    """Every MCP server of the plans, by name (one connection each per worker); ValueError when two agents define
    different servers under one name."""
    servers: dict[str, McpServerConfig] = {}
    for agent, plan in plans.items():
        for server in plan.mcp:
            if servers.get(server.name, server) != server:
                raise ValueError(f"agent {agent!r}: another agent defines a different MCP server {server.name!r}")
            servers[server.name] = server
    return servers


def with_tool_circuits(config: AppConfig, plans: dict[str, AgentPlan]) -> tuple[AppConfig, list[str]]:
    """``config`` with one entry per tool of the plans' agents, and one per MCP server, among its providers, and
    their circuit names: a tool's (a server's) breaker and concurrency limit live in the circuits log beside the
    providers', shared by all workers."""
    tools = {t.circuit: t for plan in plans.values() if plan.agent for t in plan.agent.tools}
    servers = {circuit_name(s.name): s for s in mcp_servers(plans).values()}
    if not tools and not servers:
        return config, []
    extra = {}
    bounds = [(name, t.name, t.timeout_s, t.retries, t.max_concurrency, t.breaker) for name, t in tools.items()]
    bounds += [(name, s.name, s.timeout_s, s.retries, s.max_concurrency, tuple(s.breaker.items()))
               for name, s in servers.items()]
    for name, model, timeout_s, retries, max_concurrency, overrides in bounds:
        breaker = dict(overrides)
        # a probe's place is freed after probe_timeout_s: longer than every attempt of one call can take
        breaker.setdefault("probe_timeout_s", max(60.0, timeout_s * (retries + 1) + 10))
        extra[name] = ProviderConfig(
            name=name, kind="local", base_url=name, model=model, timeout_s=timeout_s,
            max_concurrency=max_concurrency, breaker=breaker,
        )
    return config.model_copy(update={"providers": {**config.providers, **extra}}), [*tools, *servers]

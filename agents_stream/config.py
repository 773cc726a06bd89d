"""The TOML file of providers and agents (``AGENTS_STREAM_CONFIG``), parsed into typed models."""

from __future__ import annotations

import os
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agents_stream.config_routing import RoutingConfig

# Every model below refuses inf and NaN (allow_inf_nan=False): TOML has both literals, and a timeout_s = inf or an
# amount_above = nan would pass every bound check (nan compares false) and disable what the number bounds.
ProviderKind = Literal["local", "gemini", "openai", "anthropic"]
Confidence = Literal["high", "medium", "low", "failed"]
#: best first; an agent's ``lowest`` cuts this ladder
CONFIDENCE_ORDER: tuple[str, ...] = ("high", "medium", "low", "failed")


class BreakerConfig(BaseModel):
    """The breaker of every circuit (a provider endpoint): when it opens, how it probes (docs/guide/failures.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    #: failures in a row (no success between them, within ``window_s``) that open the breaker; a provider the
    #: window shows failing a share of its calls needs the longer run it would not produce by chance
    #: (breaker.run_needed: 9 at a 10% error rate)
    failure_threshold: int = Field(default=5, ge=1)
    #: the share of failed calls within ``window_s`` that opens the breaker, once the window holds ``minimum_calls``
    failure_rate_threshold: float = Field(default=0.5, gt=0, le=1)
    #: calls (successes and failures) the window must hold before its failure rate can open the breaker
    minimum_calls: int = Field(default=20, ge=1)
    #: probe successes in half-open that close it again
    success_threshold: int = Field(default=2, ge=1)
    #: how long it stays open before it lets probes through
    open_timeout_s: float = Field(default=30.0, gt=0)
    #: the sliding window the failure rate (and a run of failures) is counted over
    window_s: float = Field(default=60.0, gt=0)
    #: probe calls in flight at once in half-open, cluster-wide
    half_open_probes: int = Field(default=1, ge=1)
    #: an admitted probe that reports nothing for this long frees its place (its worker died)
    probe_timeout_s: float = Field(default=60.0, gt=0)


class Price(BaseModel):
    """USD per million tokens of one model."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    input_per_mtok: float = Field(default=0.0, ge=0)
    output_per_mtok: float = Field(default=0.0, ge=0)


class ProviderConfig(BaseModel):
    """One model endpoint. Keys come from the environment variable it names, never the file."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = ""
    kind: ProviderKind
    base_url: str = ""
    model: str = "local-echo"
    api_key_env: str | None = None
    timeout_s: float = Field(default=30.0, gt=0)
    max_tokens: int = Field(default=1024, gt=0)
    #: extra latency of the ``local`` provider, for demos (seconds)
    latency_s: float = Field(default=0.0, ge=0)
    #: calls in flight at once, cluster-wide (split among live workers); None: no limit
    max_concurrency: int | None = Field(default=None, ge=1)
    #: calls started per second, cluster-wide (split among live workers); None: no limit
    rps: float | None = Field(default=None, gt=0)
    #: after the breaker closes, the concurrency limit grows from 1 to max_concurrency over this long
    ramp_s: float = Field(default=10.0, ge=0)
    #: largest response body read from the endpoint; a larger one fails the task with result_too_large
    max_body_bytes: int = Field(default=4_194_304, gt=0)
    #: overrides of the top-level ``[breaker]`` defaults for this provider
    breaker: dict[str, Any] = Field(default_factory=dict)

    def api_key(self) -> str | None:
        """The key from the environment, or None when the variable is unset or empty."""
        if not self.api_key_env:
            return None
        return os.environ.get(self.api_key_env) or None

    def usable(self) -> bool:
        """A remote provider needs its key; ``local`` and key-less endpoints (vLLM, Ollama) do not."""
        return self.kind == "local" or self.api_key_env is None or self.api_key() is not None


class ApprovalLevel(BaseModel):
    """One rung of an approval's escalation: who decides, for how long, and where they are told."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    #: who decides at this level (a person or a group, e.g. "team-lead"); recorded with link decisions
    name: str = Field(min_length=1)
    #: how long this level has to decide before the next one is asked (or, at the last, the task is rejected)
    timeout_s: float = Field(gt=0)
    #: Slack-compatible incoming webhook URL; or ``webhook_env``, the environment variable holding it
    webhook: str | None = None
    webhook_env: str | None = None

    def webhook_url(self) -> str | None:
        if self.webhook_env:
            return os.environ.get(self.webhook_env) or None
        return self.webhook


class ApprovalPolicy(BaseModel):
    """Which tasks of an agent wait for a human before they run (any rule that matches is enough)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    #: every task of the agent
    always: bool = False
    #: tasks whose ``risk_level`` is at least this
    risk_at_least: Literal["low", "medium", "high", "critical"] | None = None
    #: tasks whose ``context_data[amount_field]`` is a number above ``amount_above``, is missing or is not a number
    amount_field: str | None = None
    amount_above: float | None = None
    #: tasks of an agent whose saga has a step flagged ``approval=True``
    saga_steps: bool = True
    levels: list[ApprovalLevel] = Field(min_length=1)

    @model_validator(mode="after")
    def _amount_pair(self) -> ApprovalPolicy:
        if (self.amount_field is None) != (self.amount_above is None):
            raise ValueError("approval: give amount_field and amount_above together")
        return self


class McpServerConfig(BaseModel):
    """An MCP tool server (``[mcp.<name>]``): a stdio ``command`` the worker starts, or a streamable-HTTP ``url``.

    Its tools are listed when the worker starts and offered to the agents that name it (``mcp = ["<name>"]``);
    every call goes through the breaker ``mcp:<name>``, shared by all workers. Secrets come from the environment
    (``env_from``, ``headers_env``), never the file.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = ""
    #: the streamable-HTTP endpoint, e.g. "http://127.0.0.1:8000/mcp"
    url: str | None = None
    #: or the command that serves MCP on its stdin/stdout, e.g. ["python", "-m", "my_server"] (one per worker)
    command: list[str] | None = None
    cwd: str | None = None
    #: the command's environment besides HOME, PATH, SHELL, TERM, USER and LOGNAME (the SDK's safe set)
    env: dict[str, str] = Field(default_factory=dict)
    #: names of the worker's own environment variables passed on to the command (tokens, keys)
    env_from: list[str] = Field(default_factory=list)
    #: HTTP headers sent to ``url``, each from the environment variable named: {"Authorization" = "DESK_AUTH"}
    headers_env: dict[str, str] = Field(default_factory=dict)
    #: only these of the server's tools are offered (its own names); None: all of them
    tools: list[str] | None = None
    #: put before each tool's name as the model sees it (two servers with a tool of one name)
    prefix: str = ""
    #: bound of one call attempt
    timeout_s: float = Field(default=30.0, gt=0)
    #: attempts after the first on a transient error (timeout, lost connection), with the call's same key
    retries: int = Field(default=2, ge=0)
    #: bound of connecting and listing the tools
    connect_timeout_s: float = Field(default=15.0, gt=0)
    #: the longest pause between two attempts to connect to a server that does not answer
    reconnect_max_s: float = Field(default=15.0, gt=0)
    #: a connected server is asked for its tools this often: a server that died is seen without waiting for a call
    ping_interval_s: float = Field(default=10.0, gt=0)
    #: calls in flight at once, cluster-wide (split among live workers); None: no limit
    max_concurrency: int | None = Field(default=None, ge=1)
    #: the largest message read from an HTTP server (a JSON body, or one SSE event): a bigger one is not read on
    #: past this many bytes, and its call fails as the server's error
    max_message_bytes: int = Field(default=1024 * 1024, ge=1024)
    #: overrides of the top-level ``[breaker]`` defaults for this server's breaker
    breaker: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if not (self.name.isascii() and self.name.replace("_", "").replace("-", "").isalnum()):
            raise ValueError(f"MCP server name {self.name!r} must be letters, digits, - or _")
        if (self.url is None) == (self.command is None):
            raise ValueError(f"MCP server {self.name!r}: give url (streamable HTTP) or command (stdio), one of them")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"MCP server {self.name!r}: url must start with http:// or https://")
        if self.command is not None and (not self.command or not self.command[0]):
            raise ValueError(f"MCP server {self.name!r}: command is the program and its arguments, not empty")
        if self.headers_env and self.url is None:
            raise ValueError(f"MCP server {self.name!r}: headers_env is for a url server")
        if (self.env or self.env_from or self.cwd) and self.command is None:
            raise ValueError(f"MCP server {self.name!r}: env, env_from and cwd are for a command server")
        return self


class SummaryConfig(BaseModel):
    """Summaries of a conversation's older history (``[agents.<name>.summary]``, docs/conversations.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    #: the provider (``[providers.<name>]``, a cheap model) that writes the summaries
    provider: str
    #: a new summary is written once at least this many items fell out of the window since the last one
    min_items: int = Field(default=1, ge=1, le=200)
    #: the summary's cap in characters (a longer answer is cut), shown to the model besides ``history_chars``
    max_chars: int = Field(default=2_000, ge=100, le=20_000)
    #: what the summariser is sent at most: the previous summary and the newest of the items to fold into it
    input_chars: int = Field(default=16_000, ge=1_000, le=200_000)

    @model_validator(mode="after")
    def _input_holds_the_summary(self) -> SummaryConfig:
        if self.max_chars * 2 > self.input_chars:
            raise ValueError(f"summary: input_chars ({self.input_chars}) must be at least twice max_chars "
                             f"({self.max_chars}): the previous summary is part of the input")
        return self


#: what the customer reads when an outage hands their conversation to a person (``handoff_text``)
DEFAULT_HANDOFF_TEXT = ("Our assistant is unavailable right now, so I am connecting you to a person of our team; "
                        "they will answer here.")


class AgentConfig(BaseModel):
    """A sub-agent: its task topic is ``agent.tasks.<name>``."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = ""
    #: the fallback chain: the first answers with confidence high, the others medium
    #: at least one, unless the agent routes (``routing``) or is a framework's agent (``agent``: its own model;
    #: an agents_stream Agent is checked for them once loaded, execution/plan.py)
    providers: list[str] = Field(default_factory=list)
    system: str = ""
    description: str = ""
    #: a lightweight provider; as a fallback it gets a simplified task and answers with confidence low
    light: str | None = None
    #: answer from the last good result of the same fingerprint, at most this old (confidence low); 0: off
    cache_max_age_s: float = Field(default=0.0, ge=0)
    #: the lowest confidence this agent may answer with; below it the task is held.
    #: "failed" allows the explicit partial result when every tier is down.
    lowest: Confidence = "medium"
    #: JSON Schema every answer must match (the task's own output_schema wins)
    output_schema: dict[str, Any] | None = None
    #: or a pydantic model by import path, "package.module:Model"
    output_model: str | None = None
    #: corrective retries of an answer that does not validate, per tier
    format_retries: int = Field(default=2, ge=0)
    #: cheap-first routing: "off", "heuristic", or "classifier" (asks the ``classifier`` provider)
    router: Literal["off", "heuristic", "classifier"] = "off"
    classifier: str | None = None
    #: heuristic complexity score (0..1) at or above which a task is hard
    hard_threshold: float = Field(default=0.5, ge=0, le=1)
    #: words that make a task hard for the heuristic
    hard_words: list[str] = Field(default_factory=lambda: [
        "analyze", "analyse", "compare", "explain why", "prove", "plan", "design", "derive", "step by step", "evaluate",
    ])
    #: spend (USD) per UTC day across all workers; None: no budget
    budget_usd_per_day: float | None = Field(default=None, gt=0)
    #: past the budget: "cheaper" sends tasks to the light tier only, "hold" holds them until the day turns
    over_budget: Literal["cheaper", "hold"] = "cheaper"
    #: run every task of this agent as a saga:
    #: "package.module:NAME" of an agents_stream.execution.saga_definitions.SagaDefinition
    saga: str | None = None
    #: run every task of this agent as a tool-calling loop:
    #: "package.module:NAME" of an agents_stream.execution.agent_definitions.Agent
    agent: str | None = None
    #: human approval before a task runs (tables/approvals.py)
    approval: ApprovalPolicy | None = None
    #: MCP servers (``[mcp.<name>]``) whose tools the agent's model may call; without ``agent`` the agent runs
    #: as a tool-calling loop of those tools, ``system`` its instructions
    mcp: list[str] = Field(default_factory=list)
    #: conversations (docs/conversations.md): a message that arrives while a round answers an earlier one waits
    #: for the next round ("enqueue") or is answered at once with a refusal ("reject")
    double_texting: Literal["enqueue", "reject", "interrupt"] = "enqueue"
    #: the context policy: how many earlier messages and replies of its conversation a round shows the model
    #: (0: none), and at most how many characters of their text (about four per token)
    history_messages: int = Field(default=20, ge=0, le=200)
    history_chars: int = Field(default=32_000, ge=0, le=200_000)
    #: a summary of the history older than that window, written by a cheap model; None: older items are not shown
    summary: SummaryConfig | None = None
    #: routing across handlers: each message goes to one of these other agents (docs/guide/routing.md)
    routing: RoutingConfig | None = None
    #: human handoff on an outage (docs/guide/handoff.md): a conversation round held this many seconds because no
    #: provider of its ladder is available ends with ``handoff_text`` and the conversation waits for a person;
    #: None (the default): the round stays held until a provider is back, as any task
    handoff_after_s: float | None = Field(default=None, gt=0, le=86_400)
    handoff_text: str = Field(default=DEFAULT_HANDOFF_TEXT, min_length=1, max_length=2_000)
    #: the escalation levels of a conversation waiting for a person (tables/handoff_wait.py): each level's
    #: timeout_s asks the next one (its webhook told); None (not given): the agent's approval levels, if any;
    #: [] : no levels, the wait is only listed in the inbox
    handoff_levels: list[ApprovalLevel] | None = None

    def handoff_wait_levels(self) -> list[ApprovalLevel]:
        """The levels a conversation of this agent waits for a person under (docs/decisions.md)."""
        if self.handoff_levels is not None:
            return list(self.handoff_levels)
        return list(self.approval.levels) if self.approval is not None else []


class AppConfig(BaseModel):
    """The whole file: ``[providers.<name>]`` and ``[agents.<name>]`` tables."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    providers: dict[str, ProviderConfig]
    agents: dict[str, AgentConfig] = Field(min_length=1)
    #: breaker defaults for every provider (each may override them in its own ``breaker`` table)
    breaker: BreakerConfig = Field(default_factory=BreakerConfig)
    #: USD per million tokens, by model name
    prices: dict[str, Price] = Field(default_factory=dict)
    #: MCP tool servers agents may name
    mcp: dict[str, McpServerConfig] = Field(default_factory=dict)

    @field_validator("providers", "agents", "mcp", mode="before")
    @classmethod
    def _name_entries(cls, value: object) -> object:
        if isinstance(value, dict):
            return {k: {**v, "name": k} if isinstance(v, dict) else v for k, v in value.items()}
        return value

    @model_validator(mode="after")
    def _check_references(self) -> AppConfig:
        for agent in self.agents.values():
            if not agent.providers and agent.routing is None and agent.agent is None:
                raise ValueError(f"agent {agent.name!r}: give providers = [\"<provider>\", ...]")
            self._check_routing(agent)
            unknown = [p for p in agent.providers if p not in self.providers]
            if unknown:
                raise ValueError(f"agent {agent.name!r} names unknown providers {unknown}")
            if not (agent.name.isascii() and agent.name.replace("_", "").replace("-", "").isalnum()):
                raise ValueError(f"agent name {agent.name!r} must be letters, digits, - or _")
            for role, name in (("light", agent.light), ("classifier", agent.classifier)):
                if name is not None and name not in self.providers:
                    raise ValueError(f"agent {agent.name!r} names unknown {role} provider {name!r}")
            if agent.summary is not None and agent.summary.provider not in self.providers:
                raise ValueError(f"agent {agent.name!r} names unknown summary provider {agent.summary.provider!r}")
            if agent.router == "classifier" and agent.classifier is None:
                raise ValueError(f"agent {agent.name!r}: router = \"classifier\" needs classifier = \"<provider>\"")
            if agent.output_schema is not None and agent.output_model is not None:
                raise ValueError(f"agent {agent.name!r}: give output_schema or output_model, not both")
            if agent.saga is not None and agent.agent is not None:
                raise ValueError(f"agent {agent.name!r}: give saga or agent, not both")
            unknown = [m for m in agent.mcp if m not in self.mcp]
            if unknown:
                raise ValueError(f"agent {agent.name!r} names unknown MCP servers {unknown} (add [mcp.<name>] tables)")
            if agent.mcp and agent.saga is not None:
                raise ValueError(f"agent {agent.name!r}: a saga calls no MCP tools; give saga or mcp, not both")
        for server in self.mcp.values():
            try:
                BreakerConfig.model_validate({**self.breaker.model_dump(), **server.breaker})
            except ValueError as exc:
                raise ValueError(f"MCP server {server.name!r}: bad breaker settings: {exc}") from None
        for provider in self.providers.values():
            try:
                breaker = self.breaker_for(provider.name)
            except ValueError as exc:
                raise ValueError(f"provider {provider.name!r}: bad breaker settings: {exc}") from None
            if breaker.probe_timeout_s <= provider.timeout_s + 5:
                # A probe still running when its place is freed would let a second one through.
                raise ValueError(
                    f"provider {provider.name!r}: breaker probe_timeout_s ({breaker.probe_timeout_s:g}) must exceed "
                    f"timeout_s + 5 ({provider.timeout_s + 5:g})"
                )
        return self

    def _check_routing(self, agent: AgentConfig) -> None:
        """A route's handlers are other agents of this file, none of them routed itself; its classifier a provider."""
        route = agent.routing
        if route is None:
            return
        if agent.saga is not None or agent.agent is not None or agent.mcp:
            raise ValueError(f"agent {agent.name!r}: a routed agent runs its handlers; give routing or "
                             "saga/agent/mcp, not both")
        for handler in route.handlers:
            other = self.agents.get(handler)
            if other is None:
                raise ValueError(f"agent {agent.name!r}: routing names handler {handler!r}, which is not an agent of "
                                 f"the config (add [agents.{handler}])")
            if other.routing is not None or handler == agent.name:
                raise ValueError(f"agent {agent.name!r}: handler {handler!r} routes itself; a handler is an agent "
                                 "that answers (a prompt, a saga, steps or a tool-using agent)")
        if route.classifier is not None and route.classifier not in self.providers:
            raise ValueError(f"agent {agent.name!r} names unknown routing classifier provider {route.classifier!r}")

    def selected(self, wanted: set[str]) -> list[str]:
        """The agents a worker runs: all of them, or those of ``wanted`` (AGENTS_STREAM_AGENTS) in config order."""
        unknown = wanted - set(self.agents)
        if unknown:
            raise SystemExit(f"AGENTS_STREAM_AGENTS names agents not in the config: {sorted(unknown)}")
        if wanted:
            for name in wanted:
                route = self.agents[name].routing
                missing = sorted(set(route.handlers) - wanted) if route is not None else []
                if missing:
                    raise SystemExit(f"AGENTS_STREAM_AGENTS runs the routed agent {name!r} without its handlers "
                                     f"{missing}: a worker runs a route's handlers itself; add them")
        return [a for a in self.agents if not wanted or a in wanted]

    def provider(self, name: str) -> ProviderConfig:
        """A configured provider, or the key-less ``local`` one ``chain`` falls back to."""
        return self.providers.get(name) or ProviderConfig(name=name, kind="local")

    def breaker_for(self, provider: str) -> BreakerConfig:
        """The ``[breaker]`` defaults with the provider's own overrides applied."""
        overrides = self.providers[provider].breaker if provider in self.providers else {}
        return BreakerConfig.model_validate({**self.breaker.model_dump(), **overrides})

    def price_of(self, model: str) -> Price | None:
        return self.prices.get(model)

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

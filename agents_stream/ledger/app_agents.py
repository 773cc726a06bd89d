"""What the ledger knows of the agents this app runs: their configs, approval policies, sagas, caching."""

from __future__ import annotations

from dataclasses import dataclass, field

from agents_stream.config import AgentConfig, ApprovalPolicy

__all__ = ["AppAgents"]


@dataclass(frozen=True)
class AppAgents:
    """The agents this app runs, as the ledger's parts need them (the app builds it from the agents' plans).

    ``names``: a signed cancel of one of their tasks is kept before the task arrives; ``sagas``: those that run
    sagas, and ``saga_flagged`` those whose saga asks for approval; ``cached``: those whose good answers feed the
    last-good-answer cache; ``policies``: approval policies by agent; ``configs``: each one's configuration (a
    conversation's round is made from it)."""

    names: frozenset[str] = frozenset()
    sagas: frozenset[str] = frozenset()
    saga_flagged: frozenset[str] = frozenset()
    cached: frozenset[str] = frozenset()
    policies: dict[str, ApprovalPolicy] = field(default_factory=dict)
    configs: dict[str, AgentConfig] = field(default_factory=dict)

"""Testing agents without a broker: the harness (``run_agent``, ``ScriptedModel``, ``FunctionModel``) and ``replay``.

    from agents_stream.testing import ScriptedModel, call, run_agent, replay

The other modules here (the fake LLM server, the MCP server, the in-memory circuits log) are the project's own
test and demo tools; import them by their module. The names below load lazily, as the front door's do
(``agents_stream/__init__.py``), so ``python -m agents_stream.testing.fakellm`` does not load the agent loop.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agents_stream.testing.harness import (
        AgentRun,
        Call,
        FunctionModel,
        Model,
        ModelReply,
        ModelRequest,
        ModelTurn,
        ProviderModel,
        ScriptedModel,
        ScriptExhausted,
        ToolCallRecord,
        answer,
        call,
        run_agent,
        turn,
    )
    from agents_stream.testing.replayer import Divergence, Replay, ReplayDivergence, replay

_REPLAY = {"Divergence", "Replay", "ReplayDivergence", "replay"}

__all__ = [
    "AgentRun", "Call", "Divergence", "FunctionModel", "Model", "ModelReply", "ModelRequest", "ModelTurn",
    "ProviderModel", "Replay", "ReplayDivergence", "ScriptExhausted", "ScriptedModel", "ToolCallRecord", "answer",
    "call", "replay", "run_agent", "turn",
]

if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        if name not in __all__:
            raise AttributeError(f"module 'agents_stream.testing' has no attribute {name!r}")
        home = "agents_stream.testing.replayer" if name in _REPLAY else "agents_stream.testing.harness"
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})

"""The front door (``agents_stream``'s ``__all__``): every name a user needs, loaded lazily, typed for mypy."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import agents_stream
import agents_stream.testing

ROOT = Path(__file__).resolve().parents[2]

USER_MODULE = '''
from agents_stream import Agent, SagaDefinition, SagaStep, StepContext, ToolContext, agent_tool, tool


@tool
async def lookup(ctx: ToolContext, order_id: str) -> dict:
    """Look an order up."""
    return {}


@tool(timeout_s=5, retries=1)
def add(a: int, b: int) -> int:
    """Add."""
    return a + b


async def label(ctx: StepContext) -> None:
    return None


reveal_type(lookup)
reveal_type(add)
reveal_type(agent_tool("analyzer", "asks the analyst"))
AGENT = Agent("a", instructions="...", tools=[lookup, add])
SAGA = SagaDefinition("s", (SagaStep("label", label),))
reveal_type(AGENT)
Agent("b", instructions=1)
from agents_stream import Agnet
'''


def test_every_public_name_loads_and_is_the_defining_modules() -> None:
    from agents_stream.execution import tools

    for name in agents_stream.__all__:
        assert getattr(agents_stream, name) is not None
    assert agents_stream.tool is tools.tool and agents_stream.ToolContext is tools.ToolContext
    assert set(agents_stream.__all__) <= set(dir(agents_stream))
    for name in agents_stream.testing.__all__:
        assert getattr(agents_stream.testing, name) is not None
    with pytest.raises(AttributeError, match="Agnet"):
        agents_stream.Agnet  # noqa: B018
    with pytest.raises(ImportError):
        from agents_stream import Agnet  # type: ignore[attr-defined]  # noqa: F401


def test_defining_an_agent_loads_neither_faust_nor_kafka() -> None:
    code = textwrap.dedent("""
        import json, sys
        import agents_stream
        bare = sorted(m for m in sys.modules if m.startswith("agents_stream"))
        from agents_stream import Agent, ToolContext, tool, SagaDefinition, Client
        heavy = [m for m in ("faust", "mode", "aiokafka", "rocksdict") if m in sys.modules]
        print(json.dumps({"bare": bare, "heavy": heavy}))
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    seen = json.loads(out.stdout)
    assert seen == {"bare": ["agents_stream"], "heavy": []}


def test_mypy_reads_the_front_door_typed(mypy_lines) -> None:
    """A user's module, checked by mypy: ``@tool`` in both forms is a Tool, a misspelt name is an error."""
    lines = mypy_lines(USER_MODULE)
    out = "\n".join(lines)
    assert 'note: Revealed type is "agents_stream.execution.tools.Tool"' in lines[0], out
    assert lines[1] == lines[2] == lines[0], out
    assert 'Revealed type is "agents_stream.execution.agent_definitions.Agent"' in lines[3], out
    errors = [line for line in lines if line.startswith("error")]
    assert len(errors) == 2, out
    assert 'Argument "instructions" to "Agent" has incompatible type "int"' in errors[0], out
    assert 'Module "agents_stream" has no attribute "Agnet"' in errors[1], out

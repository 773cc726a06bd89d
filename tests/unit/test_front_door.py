"""The front door (``agents_stream``'s ``__all__``): every name a user needs, loaded lazily, typed for mypy."""

from __future__ import annotations

import json
import os
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


def test_mypy_reads_the_front_door_typed(tmp_path: Path) -> None:
    """A user's module, checked by mypy: ``@tool`` in both forms is a Tool, a misspelt name is an error."""
    api = pytest.importorskip("mypy.api")
    user = tmp_path / "user_agents.py"
    user.write_text(USER_MODULE)
    config = tmp_path / "mypy.ini"
    paths = []
    if not (ROOT / "agents_stream" / "tables").exists():  # the top-level tables/ is agents_stream.tables
        link = tmp_path / "typecheck" / "agents_stream"
        link.mkdir(parents=True)
        (link / "tables").symlink_to(ROOT / "tables")
        paths.append(str(tmp_path / "typecheck"))
    config.write_text("[mypy]\nfollow_imports = silent\nignore_missing_imports = true\npython_version = 3.11\n"
                      + (f"mypy_path = {os.pathsep.join(paths)}\n" if paths else ""))
    cwd = os.getcwd()
    os.chdir(ROOT)  # agents_stream is found where it is, as a user's checker finds an installed package
    try:
        out, err, _ = api.run([str(user), "--config-file", str(config), "--cache-dir", str(tmp_path / "cache"),
                               "--no-error-summary", "--hide-error-context"])
    finally:
        os.chdir(cwd)
    lines = [line.split(": ", 1)[1] for line in out.splitlines() if line.startswith(str(user))]
    assert 'note: Revealed type is "agents_stream.execution.tools.Tool"' in lines[0], (out, err)
    assert lines[1] == lines[2] == lines[0], out
    assert 'Revealed type is "agents_stream.execution.agent_definitions.Agent"' in lines[3], out
    errors = [line for line in lines if line.startswith("error")]
    assert len(errors) == 2, out
    assert 'Argument "instructions" to "Agent" has incompatible type "int"' in errors[0], out
    assert 'Module "agents_stream" has no attribute "Agnet"' in errors[1], out

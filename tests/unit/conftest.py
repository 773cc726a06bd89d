"""What tests/unit's packages share: the fake LLM fixture, promtool and the ``promtool`` marker's skip.

Helpers that are not fixtures live next to this file (fake_worker.py, ledger_fakes.py, job_helpers.py,
breaker_helpers.py); a test imports them as ``tests.unit.<helper>``."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import pytest_asyncio

from agents_stream.testing.fakellm import FakeLLM

ROOT = Path(__file__).resolve().parents[2]
#: where Debian's prometheus package (scripts/prometheus.sh) puts promtool, looked at when it is not on PATH
DEBIAN_PROMTOOL = "/usr/bin/promtool"
INSTALL_PROMTOOL = "`bash scripts/prometheus.sh` installs it (make test runs that first)"


def find_promtool() -> str | None:
    binary = shutil.which("promtool") or DEBIAN_PROMTOOL
    return binary if Path(binary).is_file() else None


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked ``promtool`` is skipped where promtool is missing, so `pytest tests/unit` runs with pip alone;
    with CI set it runs and fails instead (make test installs promtool before tests/unit, so it never skips there)."""
    if item.get_closest_marker("promtool") and find_promtool() is None and not os.environ.get("CI"):
        pytest.skip(f"promtool not found: {INSTALL_PROMTOOL}; with CI set this test fails instead of skipping")


@pytest_asyncio.fixture
async def fake(request: pytest.FixtureRequest) -> AsyncIterator[FakeLLM]:
    """A fake LLM server on 127.0.0.1 for one test. It asks for the API key a test module names as FAKE_LLM_KEY
    (the key that module gives its providers) and, in a module that names none, for no key."""
    async with FakeLLM(api_key=getattr(request.module, "FAKE_LLM_KEY", None)) as server:
        yield server


@pytest.fixture
def promtool() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Runs Prometheus's promtool in the repository's root; fails the test when promtool is missing (only a test
    marked ``promtool`` with CI set gets that far without it)."""
    found = find_promtool()
    if found is None:
        pytest.fail(f"promtool not found: {INSTALL_PROMTOOL}; it ships in Debian's prometheus package.", pytrace=False)
    binary: str = found

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([binary, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)

    return run


@pytest.fixture
def mypy_lines(tmp_path: Path) -> Callable[[str], list[str]]:
    """Checks a module's source with mypy as a user's checker would (agents_stream found where it is, the top-level
    tables/ as agents_stream.tables) and returns mypy's lines about it, each without the file name."""
    api = pytest.importorskip("mypy.api")

    def check(source: str) -> list[str]:
        module = tmp_path / "checked_module.py"
        module.write_text(source)
        paths = []
        if not (ROOT / "agents_stream" / "tables").exists():  # the top-level tables/ is agents_stream.tables
            link = tmp_path / "typecheck" / "agents_stream"
            link.mkdir(parents=True, exist_ok=True)
            if not (link / "tables").exists():
                (link / "tables").symlink_to(ROOT / "tables")
            paths.append(str(tmp_path / "typecheck"))
        config = tmp_path / "mypy.ini"
        config.write_text("[mypy]\nfollow_imports = silent\nignore_missing_imports = true\npython_version = 3.11\n"
                          + (f"mypy_path = {os.pathsep.join(paths)}\n" if paths else ""))
        cwd = os.getcwd()
        os.chdir(ROOT)  # agents_stream (and tests.unit) found where they are
        try:
            out, _, _ = api.run([str(module), "--config-file", str(config), "--cache-dir", str(tmp_path / "cache"),
                                 "--no-error-summary", "--hide-error-context"])
        finally:
            os.chdir(cwd)
        return [line.split(": ", 1)[1] for line in out.splitlines() if line.startswith(str(module))]

    return check


@pytest.fixture
def seam_holds(mypy_lines: Callable[[str], list[str]]) -> Callable[..., None]:
    """Asserts a seam test's module (``source``): its two ``reveal_type`` lines name ``real`` and ``fake`` (found,
    not Any), and mypy's only error is that ``refused`` is not the seam ``seam``."""

    def check(source: str, *, real: str, fake: str, refused: str, seam: str) -> None:
        lines = mypy_lines(source)
        notes = [line for line in lines if "Revealed type" in line]
        assert real in notes[0], lines
        assert fake in notes[1], lines
        errors = [line for line in lines if line.startswith("error")]
        assert len(errors) == 1, lines
        assert f'Incompatible return value type (got "{refused}", expected "{seam}")' in errors[0], lines

    return check

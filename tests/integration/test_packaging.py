"""The wheel installs next to PyTables: our tables/ folder is agents_stream.tables, PyTables keeps ``tables``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from .harness import ROOT

PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 240.0) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(cmd)} exited with {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_wheel_and_pytables_import_side_by_side(tmp_path: Path) -> None:
    """A user with PyTables installed imports both ``tables`` (PyTables) and ``agents_stream.tables``."""
    source = tmp_path / "source"  # setuptools writes build/ and egg-info next to the sources: not in the repo
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for name in ("agents_stream", "tables"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    wheels, ours, pytables = tmp_path / "wheels", tmp_path / "t1", tmp_path / "t2"
    _run([*PIP, "wheel", ".", "--no-deps", "-w", str(wheels)], cwd=source)
    (wheel,) = wheels.glob("agents_stream-*.whl")
    _run([*PIP, "install", "--no-deps", "--target", str(ours), str(wheel)], cwd=tmp_path)
    _run([*PIP, "install", "--only-binary=:all:", "--target", str(pytables), "tables"], cwd=tmp_path)
    probe = (
        "import json, tables, agents_stream.tables.leases as leases; "
        "print(json.dumps([tables.__file__, leases.__file__, hasattr(tables, 'open_file')]))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ours), str(pytables)])}
    pytables_file, leases_file, is_pytables = json.loads(_run([sys.executable, "-c", probe], cwd=tmp_path, env=env))
    assert Path(pytables_file).is_relative_to(pytables / "tables"), f"`import tables` found {pytables_file}"
    assert is_pytables, "`tables` is not PyTables"
    assert Path(leases_file).is_relative_to(ours / "agents_stream" / "tables"), leases_file

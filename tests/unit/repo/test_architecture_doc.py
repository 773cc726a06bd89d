"""docs/architecture.md draws the tree with one line per module: a module added or moved without its line fails."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_every_module_has_its_line_in_the_tree() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    tree = doc.split("```", 2)[1]
    drawn = set(re.findall(r"^\s+([a-z_]+\.py)\s", tree, flags=re.M))
    modules = {p.name for d in ("agents_stream", "tables") for p in (ROOT / d).rglob("*.py") if p.name != "__init__.py"}
    assert modules - drawn == set(), "modules without a line in docs/architecture.md"
    assert drawn - modules == set(), "lines in docs/architecture.md for modules that are gone"

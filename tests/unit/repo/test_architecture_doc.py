"""docs/architecture.md draws the tree with one line per module: a module added or moved without its line fails.

Lines are compared by full path (``agents_stream/ledger/records.py``), so a line under the wrong package, or a module
of one package drawn in place of another's of the same name, fails too."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("agents_stream", "tables")
_LINE = re.compile(r"^(?P<indent> *)(?P<name>[A-Za-z0-9_.]+/?)(?:\s|$)")


def drawn_modules(tree: str) -> set[str]:
    """The full path of every ``.py`` line of ``tree``: each level of two spaces is inside the folder above it."""
    folders: list[str] = []
    paths: set[str] = set()
    for line in tree.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        depth, name = len(m["indent"]) // 2, m["name"]
        del folders[depth:]
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
        elif name.endswith(".py") and len(folders) == depth:
            paths.add("/".join([*folders, name]))
    return paths


def repository_modules() -> set[str]:
    """Every module of the packages by its path from the repository's root; nothing under a symlinked folder."""
    found: set[str] = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            relative = path.relative_to(ROOT)
            if path.name == "__init__.py" or any((ROOT / p).is_symlink() for p in relative.parents):
                continue
            found.add(relative.as_posix())
    return found


def _tree() -> str:
    return (ROOT / "docs" / "architecture.md").read_text().split("```", 2)[1]


def test_every_module_has_its_line_in_the_tree() -> None:
    drawn, modules = drawn_modules(_tree()), repository_modules()
    assert sorted(modules - drawn) == [], "modules without a line in docs/architecture.md"
    assert sorted(drawn - modules) == [], "lines in docs/architecture.md for modules that are gone"


def test_a_missing_line_or_one_under_the_wrong_package_is_seen() -> None:
    tree = _tree()
    lines = tree.splitlines()
    records = next(i for i, line in enumerate(lines) if line.strip().startswith("records.py"))
    assert "agents_stream/ledger/records.py" in drawn_modules(tree)
    without = "\n".join(lines[:records] + lines[records + 1:])
    assert repository_modules() - drawn_modules(without) == {"agents_stream/ledger/records.py"}
    kafka = next(i for i, line in enumerate(lines) if line.startswith("  kafka/"))
    moved = lines[:kafka + 1] + [lines[records]] + [line for i, line in enumerate(lines) if i > kafka and i != records]
    drawn = drawn_modules("\n".join(moved))
    assert "agents_stream/kafka/records.py" in drawn and "agents_stream/ledger/records.py" not in drawn


def test_the_tree_is_read_by_folder() -> None:
    tree = "pkg/   the package\n  a.py  a\n  sub/  inside\n    b.py  b\n  c.py  c\nother/  x\n  a.py  another a\n"
    assert drawn_modules(tree) == {"pkg/a.py", "pkg/sub/b.py", "pkg/c.py", "other/a.py"}

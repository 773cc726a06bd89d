"""Every link of the documentation resolves: README.md and docs/**/*.md are a path a reader can follow.

- a relative markdown link names a file of the repository that exists, and its ``#anchor`` a heading of that file
  (GitHub's slugs);
- a backticked doc reference (`docs/x.md`, `README.md`) names a file that exists;
- a reference by heading text anywhere in the repository (``docs/decisions.md, "Outcomes applied where they ran"``,
  in docs, comments and tests) names a heading of that file.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: where references by heading text are looked for (source, tests, docs, tools)
SOURCES = ["agents_stream", "tables", "tests", "bench", "docs", "scripts", "README.md", "Makefile", "pyproject.toml"]
SOURCE_SUFFIXES = {".py", ".md", ".toml", ".txt", ".yml", ".yaml", ".sh", ".cfg", ""}

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)
BACKTICKED_DOC = re.compile(r"`((?:docs/[\w./-]+|README)\.md)(#[\w-]+)?`")
#: ``docs/x.md, "Heading"`` or ``docs/x.md ("Heading")``; the quoted text may be the heading's beginning
BY_HEADING = re.compile(r"((?:docs/[\w./-]+|README)\.md),?\s+\(?\"([^\"]{2,200})\"")


def headings(path: Path) -> list[str]:
    text = FENCE.sub("", path.read_text())
    return [re.sub(r"\s+#+\s*$", "", m.group(2)).strip() for m in re.finditer(r"^(#{1,6})\s+(.+)$", text, re.M)]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text without markup, lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link shows its text
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for h in headings(path):
        s = slug(h)
        n = seen.get(s, 0)
        out.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    return out


def prose(path: Path) -> str:
    return CODE_SPAN.sub("", FENCE.sub("", path.read_text()))


def links(path: Path) -> Iterator[str]:
    text = prose(path)
    yield from LINK.findall(text)
    yield from REF_LINK.findall(text)


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_every_relative_link_names_a_file_and_a_heading_that_exist() -> None:
    broken = []
    for doc in DOCS:
        for target in links(doc):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (doc.parent / file).resolve() if file else doc
            if not dest.is_relative_to(ROOT):
                broken.append(f"{rel(doc)}: {target} (outside the repository)")
            elif not dest.exists():
                broken.append(f"{rel(doc)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor.lower() not in anchors(dest):
                broken.append(f"{rel(doc)}: {target} (no heading #{anchor} in {rel(dest)})")
    assert broken == [], "\n".join(broken)


def test_every_backticked_doc_reference_exists() -> None:
    broken = []
    for doc in DOCS:
        for file, anchor in BACKTICKED_DOC.findall(FENCE.sub("", doc.read_text())):
            dest = ROOT / file
            if not dest.exists():
                broken.append(f"{rel(doc)}: `{file}` (no such file)")
            elif anchor and anchor[1:].lower() not in anchors(dest):
                broken.append(f"{rel(doc)}: `{file}{anchor}` (no such heading)")
    assert broken == [], "\n".join(broken)


def source_files() -> Iterator[Path]:
    for name in SOURCES:
        top = ROOT / name
        files = [top] if top.is_file() else sorted(top.rglob("*"))
        for f in files:
            if f.is_file() and f.suffix in SOURCE_SUFFIXES and "screenshots" not in f.parts and f != Path(__file__):
                yield f


def joined(path: Path) -> str:
    """The file's text with comment continuations joined, so a quoted heading broken over two lines reads whole."""
    text = path.read_text(errors="replace")
    return re.sub(r"\s*\n\s*(?:#:?\s*|\*\s+|-\s+)?", " ", text)


def test_every_reference_by_heading_names_a_heading_that_exists() -> None:
    known: dict[str, list[str]] = {}
    broken = []
    for f in source_files():
        for file, quoted in BY_HEADING.findall(joined(f)):
            dest = ROOT / file
            if not dest.exists():
                broken.append(f"{rel(f)}: {file} (no such file)")
                continue
            if file not in known:
                known[file] = [" ".join(h.replace("`", "").split()).lower() for h in headings(dest)]
            want = " ".join(quoted.replace("`", "").split()).lower()
            if not any(h.startswith(want) for h in known[file]):
                broken.append(f'{rel(f)}: {file}, "{quoted}" (no such heading)')
    assert broken == [], "\n".join(broken)


def test_slugs_follow_github() -> None:
    assert slug("Managed Kafka (SASL, TLS)") == "managed-kafka-sasl-tls"
    assert slug("Writing an agent: tools the model calls, durably") == "writing-an-agent-tools-the-model-calls-durably"
    assert slug("`agent.circuits` and the fold") == "agentcircuits-and-the-fold"

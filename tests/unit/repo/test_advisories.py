"""The dependency floors and pins against the advisories in security/advisories/ (pure: files and version logic)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from agents_stream.testing.osv import ADVISORIES_DIR, affects, load_advisories, matching

ROOT = Path(__file__).resolve().parents[3]
RECORDS = load_advisories(ADVISORIES_DIR)


def _record(*ranges: tuple[str, str], name: str = "demo", versions: tuple[str, ...] = ()) -> dict:
    return {"id": "T-1", "affected": [{"package": {"ecosystem": "PyPI", "name": name}, "versions": list(versions),
                                       "ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": a}, {"fixed": b}]}
                                                  for a, b in ranges]}]}


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    return [Requirement(line) for line in lines]


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not a name==version pin"
            pins[canonicalize_name(name)] = version.strip()
    return pins


def test_ranges_follow_osv_semantics() -> None:
    """introduced is inclusive, fixed exclusive, several ranges each count, an explicit version list counts."""
    record = _record(("0", "1.10.13"), ("2.0.0a1", "2.4.0"), versions=("3.0.0",))
    assert affects(record, "demo", "1.10.12") and not affects(record, "demo", "1.10.13")
    assert not affects(record, "demo", "1.99") and affects(record, "demo", "2.0.0") and affects(record, "demo", "2.3.9")
    assert not affects(record, "demo", "2.4.0") and affects(record, "demo", "3.0.0")
    assert affects(record, "Demo", "1.0") and not affects(record, "other", "1.0")


def test_withdrawn_records_do_not_match() -> None:
    """A withdrawn advisory is not reported, as the OSV API leaves it out."""
    record = _record(("0", "2")) | {"withdrawn": "2026-01-01T00:00:00Z"}
    assert matching([record], "demo", "1") == []


def test_a_record_without_ranges_is_refused(tmp_path: Path) -> None:
    """A malformed advisory fails the audit loudly instead of matching nothing."""
    (tmp_path / "bad.json").write_text('{"id": "X", "affected": [{"package": {"ecosystem": "PyPI"}}]}')
    with pytest.raises(ValueError, match="bad.json"):
        load_advisories(tmp_path)
    with pytest.raises(ValueError, match="no advisories"):
        load_advisories(tmp_path / "empty")


def test_the_vulnerable_aiohttp_of_the_issue_is_matched() -> None:
    """aiohttp 3.14.1 (the old floor) still has GHSA-cq5v-8q36-5273; 3.14.3 has none of ours."""
    assert "GHSA-cq5v-8q36-5273" in {r["id"] for r in matching(RECORDS, "aiohttp", "3.14.1")}
    assert matching(RECORDS, "aiohttp", "3.14.3") == []


def test_every_floor_excludes_every_advisory() -> None:
    """No version a pyproject specifier admits falls in an advisory's affected range (checked at the range's ends)."""
    for requirement in _requirements():
        for record in RECORDS:
            for entry in record["affected"]:
                if canonicalize_name(entry["package"]["name"]) != canonicalize_name(requirement.name):
                    continue
                for rng in entry["ranges"]:
                    low = next(Version(e["introduced"]) for e in rng["events"] if "introduced" in e)
                    fixed = next(Version(e["fixed"]) for e in rng["events"] if "fixed" in e)
                    floors = [Version(s.version) for s in requirement.specifier if s.operator in (">=", "==", "~=")]
                    start = max([low, *floors])
                    admitted = start < fixed and requirement.specifier.contains(start, prereleases=True)
                    assert not admitted, f"{requirement} admits {start}, affected by {record['id']} (fixed {fixed})"


def test_constraints_pin_every_requirement_within_its_specifier() -> None:
    """make install's constraints.txt pins each declared dependency to a version pyproject.toml admits."""
    pins = _pins()
    for requirement in _requirements():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"constraints.txt has no pin for {requirement.name}"
        assert requirement.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} vs {requirement}"
    for tool in ("pip", "setuptools"):
        assert tool in pins, f"constraints.txt has no pin for {tool} (make install upgrades it to the pin)"


def test_no_pin_is_affected() -> None:
    """Every pinned version is clear of the local advisories (pip-audit checks the same in make lint)."""
    affected = {f"{name}=={version}": [r["id"] for r in matching(RECORDS, name, version)]
                for name, version in _pins().items()}
    assert {pin: ids for pin, ids in affected.items() if ids} == {}

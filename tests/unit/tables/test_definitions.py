"""The seam between the ledger's parts and the tables (``tables.definitions.KeyedTable`` and ``ScannedTable``): mypy
finds that the worker's LedgerTable and the unit tests' tables both are what the parts need, and that a plain dict
(no changelog sends for the outbox to hold) is not."""

from __future__ import annotations

SEAM = """
from typing import Any

from agents_stream.tables.definitions import KeyedTable, LedgerTable, ScannedTable
from tests.unit.ledger_fakes import PlainTable, Table


def worker(t: LedgerTable) -> ScannedTable:
    return t


def fake(t: Table) -> ScannedTable:
    return t


def read_only(t: PlainTable) -> ScannedTable:
    return t


def plain(d: dict[str, Any]) -> KeyedTable:
    return d


reveal_type(worker)
reveal_type(fake)
"""


def test_the_worker_table_and_the_fakes_are_the_tables_the_ledger_needs(mypy_lines) -> None:
    lines = mypy_lines(SEAM)
    notes = [line for line in lines if "Revealed type" in line]
    assert "agents_stream.tables.definitions.LedgerTable" in notes[0], lines  # found, not Any
    assert "tests.unit.ledger_fakes.Table" in notes[1], lines
    errors = [line for line in lines if line.startswith("error")]
    assert len(errors) == 1, lines
    assert 'Incompatible return value type (got "dict[str, Any]", expected "KeyedTable")' in errors[0], lines

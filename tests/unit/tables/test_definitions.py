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


def test_the_worker_table_and_the_fakes_are_the_tables_the_ledger_needs(seam_holds) -> None:
    seam_holds(SEAM, real="agents_stream.tables.definitions.LedgerTable", fake="tests.unit.ledger_fakes.Table",
               refused="dict[str, Any]", seam="KeyedTable")

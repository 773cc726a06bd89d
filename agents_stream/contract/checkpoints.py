"""What a run keeps in its task's record before it goes on: a step checkpoint, or an agent loop's journal entry.

Both end in the record's ``steps_done`` and the ledger applies both alike (``leases.checkpoint``); they are two
events so that code says which one it means. A **step checkpoint** (``StepDone``) is a finished step of a
multi-step task or a saga's report (execution/steps.py); a **journal entry** (``JournalEntry``) is a model turn,
a tool result or a summary of an agent loop (execution/acting.py, execution/summary.py; read back by
tables/journal.py).

On the wire a journal entry is the step record the previous version wrote for it, kind "step", plus
``"journal": true``: a worker of the previous version ignores the field (InternalEvent ignores unknown fields) and
applies it as the step it always was, and a record without it (a step, or a journal entry the previous version
wrote) reads as a ``StepDone``, which this version applies the same way (docs/decisions.md, "A journal entry is
not a step checkpoint").
"""

from __future__ import annotations

from typing import Any, Literal

from agents_stream.contract.envelope import InternalEvent
from agents_stream.contract.models import SCHEMA_VERSION

__all__ = ["JOURNAL_TAG", "JournalEntry", "StepDone", "outcome_tag"]

#: the tag the outcomes' union gives a journal entry: its kind on the wire is "step", as a step checkpoint's
JOURNAL_TAG = "journal"


class _Checkpoint(InternalEvent):
    """Entry ``index`` of the record's ``steps_done``, sent by the run of ``dispatch``: durable before it goes on."""

    schema_version: int = SCHEMA_VERSION
    kind: Literal["step"] = "step"
    worker: str
    dispatch: int
    index: int


class StepDone(_Checkpoint):
    """A step checkpoint: step ``index`` of a multi-step task finished with ``output``, or a saga's report."""

    output: Any


class JournalEntry(_Checkpoint):
    """An agent loop's journal entry ``index`` (a model turn, a tool result, a summary) in ``output``."""

    output: dict[str, Any]
    #: what tells it from a step checkpoint on the wire; a previous version ignores it
    journal: Literal[True] = True


def outcome_tag(data: Any) -> str | None:
    """The member of the outcomes' union ``data`` is: its kind, or JOURNAL_TAG for a step marked as a journal
    entry (pydantic's callable discriminator; ``data`` is a record's JSON object or an event already made)."""
    if isinstance(data, dict):
        kind = data.get("kind")
        return JOURNAL_TAG if kind == "step" and data.get("journal") is True else kind
    if isinstance(data, JournalEntry):
        return JOURNAL_TAG
    kind = getattr(data, "kind", None)
    return kind if isinstance(kind, str) else None

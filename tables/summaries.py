"""Summaries of a conversation's older history (pure): what a round folds into the summary, and what is stored.

An agent with ``[agents.<name>.summary]`` shows the model, ahead of its window of recent items (the context
policy, ``history_messages`` and ``history_chars``), a summary of the items before that window, written by a
cheap model. The summary is kept with the conversation under one key (``summary_key``):
``{"text", "upto", "round", "at"}``, ``upto`` the index of the first item it does not cover. A round's task
carries the summary so far and the items that fell out of the window since (``summary_input``); its run folds
them into it once, before its first model turn, and journals the result like a model turn (a ``summary`` entry,
execution/summary.py), so a run started again on the journal never asks the summariser again. When that entry
is applied, the ledger stores it (``to_store``), and the next round starts from it: each summary call is sent
the previous summary and only the newest overflow, so its cost stays flat however long the conversation runs.
"""

from __future__ import annotations

from typing import Any, Callable

from agents_stream.tables.conversations import item_key, summary_key

__all__ = ["MAX_ITEMS", "summary_input", "to_store"]

Read = Callable[[str], Any]

#: items read for one summary at most (each is one table read), however short they are
MAX_ITEMS = 200
#: what ends an item cut to fit the summariser's input
CUT = " […]"


def summary_input(
    read: Read, cid: str, until: int, *, min_items: int, input_chars: int,
) -> dict[str, Any] | None:
    """What the round whose window begins at item ``until`` starts from (SummaryInput's fields): the stored
    summary, and the items between it and the window when at least ``min_items`` of them wait; None when there is
    neither a summary nor anything to summarise.

    The items sent are the newest that fit, with the previous summary, in ``input_chars`` (the oldest of them cut
    to fit; older ones are left out of the summary for good, as a window leaves them out without one), and at
    most ``MAX_ITEMS``. A window that reaches further back than the summary (a larger ``history_messages``)
    summarises nothing new; the summary is shown as it is."""
    stored = read(summary_key(cid)) or None
    text = stored["text"] if stored else None
    upto = stored["upto"] if stored else 0
    items: list[dict[str, str]] = []
    if until - upto >= min_items:
        budget = input_chars - len(text or "")
        for i in range(until - 1, max(upto, until - MAX_ITEMS) - 1, -1):
            item = read(item_key(cid, i))
            if not item:
                continue
            if len(item["text"]) > budget:  # the oldest that fits: cut, and nothing older
                kept = item["text"][: max(budget - len(CUT), 0)]
                if kept:
                    items.append({"role": item["role"], "text": kept + CUT})
                break
            budget -= len(item["text"])
            items.append({"role": item["role"], "text": item["text"]})
        items.reverse()
    if text is None and not items:
        return None
    return {"text": text, "upto": upto, "items": items, "until": until if items else upto}


def to_store(stored: Any, entry: dict[str, Any], *, round_number: int, now: float) -> dict[str, Any] | None:
    """The conversation's summary key after round ``round_number`` journaled ``entry`` (a ``summary`` entry), or
    None to leave it: a failed summary, or one that covers no more than the stored one (applied again)."""
    text, until = entry.get("text"), entry.get("until")
    if not isinstance(text, str) or not text or not isinstance(until, int):
        return None
    if stored and stored.get("upto", 0) >= until:
        return None
    return {"text": text, "upto": until, "round": round_number, "at": now}

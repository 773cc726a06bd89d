"""Paging of the list views: the ``limit`` parameter, and the pages of ``GET /approvals`` (oldest first)."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

__all__ = ["APPROVALS_LIMIT", "approvals_key", "limit_of", "merge_approvals", "page_approvals", "parse_after"]

#: (default, largest) page of GET /approvals
APPROVALS_LIMIT = (100, 1000)


def limit_of(query: Mapping[str, str], default: int, most: int) -> int:
    """``?limit=`` between 1 and ``most``; ValueError for a value that is not a number."""
    raw = query.get("limit") or str(default)
    try:
        return max(1, min(int(raw), most))
    except ValueError:
        raise ValueError(f"limit={raw!r} is not a number") from None


def approvals_key(item: Mapping[str, Any]) -> tuple[float, str]:
    """The order of the inbox: oldest parking first, then task id (so equal times still page stably)."""
    return float(item.get("requested_at") or 0.0), str(item.get("task_id", ""))


def parse_after(text: str | None) -> tuple[float, str] | None:
    """``?after=<requested_at>:<task_id>`` (the ``next`` of the previous page); ValueError when malformed."""
    if not text:
        return None
    at, sep, task_id = text.partition(":")
    try:
        if not sep:
            raise ValueError
        return float(at), task_id
    except ValueError:
        raise ValueError(f"after={text[:60]!r} is not a cursor of GET /approvals (use the 'next' of a page)") from None


def page_approvals(items: Iterable[Mapping[str, Any]], after: tuple[float, str] | None, limit: int) -> dict[str, Any]:
    """One worker's share of a page: ``{"awaiting": [..limit], "total", "more"}``."""
    ordered = sorted(items, key=approvals_key)
    later = [a for a in ordered if after is None or approvals_key(a) > after]
    return {"awaiting": later[:limit], "total": len(ordered), "more": len(later) > limit}


def merge_approvals(shares: list[Mapping[str, Any]], limit: int) -> dict[str, Any]:
    """Every worker's share (``page_approvals``) → the page: the first ``limit`` of them all, the count of every
    waiting task, and the ``next`` cursor when more follow."""
    merged = sorted((a for s in shares for a in s.get("awaiting", [])), key=approvals_key)
    page = merged[:limit]
    more = len(merged) > limit or any(s.get("more") for s in shares)
    last = approvals_key(page[-1]) if page else None
    return {
        "awaiting": page,
        "count": sum(int(s.get("total", 0)) for s in shares),
        "next": f"{last[0]!r}:{last[1]}" if more and last else None,
    }

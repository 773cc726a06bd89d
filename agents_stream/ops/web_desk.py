"""The desk view: ``GET /desk/<agent>``, the open conversations of one entry point (a routed agent, or any agent that
answers conversations) with the handler each round went to and how long the oldest unanswered message has waited.

Every worker answers it for the conversations on its own partitions and asks the others for theirs (as
``GET /approvals`` does); docs/web.md, "Reads", and docs/guide/desk.md. A conversation counts as
open while a message waits for an answer or a round answers; ``all=1`` adds the idle ones. A read of each
partition's local store, bounded (``SCAN_LIMIT`` entries a partition): a view for a desk's operator, not a report.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any, Callable

from faust.web import Request, Response, View

from agents_stream.contract.conversation_messages import round_task_id
from agents_stream.ops import api_models as api
from agents_stream.ops.routing import ROUTED_HEADER, active_partitions, forwarded_headers, gather
from agents_stream.tables import route_journal
from agents_stream.tables.conversations import SEP, ConversationRecord
from agents_stream.tables.leases import AWAITING_APPROVAL, TaskRecord, completed_steps

if TYPE_CHECKING:
    from agents_stream.ops.web import Worker

__all__ = ["desk_row", "register_desk_views"]

#: entries of one partition's store the view reads at most (heads, messages and history items alike)
SCAN_LIMIT = 20_000
#: conversations a page shows at most, the longest waiting first
ROWS = 200
#: rounds of a conversation whose routes a row lists (the last ones)
ROUTES = 5


def desk_row(cid: str, head: ConversationRecord, tasks: Callable[[str], Any], partitions: int,
             now: float) -> dict[str, Any]:
    """One conversation as the desk shows it: its status, the handler its last round went to, the routes of its
    last rounds, and how long its oldest unanswered message has waited (None: nothing waits)."""
    routes: list[dict[str, Any]] = []
    status = head.status
    for number in range(max(1, head.rounds - ROUTES + 1), head.rounds + 1):
        stored = tasks(round_task_id(cid, number, partitions, head.since))
        record = TaskRecord.from_json(stored) if stored else None
        if record is not None and number == head.answering and record.state == AWAITING_APPROVAL:
            status = "waiting_for_approval"
        route = _route(record) if record is not None else None
        if route is not None:
            routes.append({"round": number, "handler": route["handler"], "first": route["first"], "by": route["by"]})
    waiting = head.waiting_list()
    since = min((float(m.get("at") or now) for m in waiting), default=None)
    return {
        "conversation_id": cid, "status": status, "rounds": head.rounds, "messages": head.messages,
        "handler": routes[-1]["handler"] if routes else None, "routes": routes,
        "waiting": len(waiting), "waiting_s": None if since is None else round(max(0.0, now - since), 1),
        "updated_at": head.updated_at,
    }


def _route(record: TaskRecord) -> dict[str, Any] | None:
    """A round's route: its journal's while it runs, its result's once it ended (a finished record keeps no
    journal)."""
    if record.result is not None:
        try:
            transcript = json.loads(record.result).get("transcript") or {}
        except (ValueError, AttributeError):
            return None
        route = transcript.get("route") if isinstance(transcript, dict) else None
        return route if isinstance(route, dict) else None
    return route_journal.route_transcript(completed_steps(record))


def _share(app: Any, runtime: Worker, agent: str, everything: bool) -> list[dict[str, Any]]:
    """The rows of this worker's active partitions of the conversations table."""
    table = runtime.tables.conversations
    rows, now = [], time.time()
    for partition in sorted(active_partitions(app, table)):
        entries, _ = table.scan(partition, None, SCAN_LIMIT)
        for key, value in entries:
            if SEP in key or not isinstance(value, dict) or value.get("agent") != agent:
                continue
            head = ConversationRecord.from_json(value)
            if everything or head.answering is not None or head.waiting_list():
                rows.append(desk_row(key, head, runtime.tables.tasks.get, runtime.settings.partitions, now))
    return rows


def register_desk_views(app: Any, runtime: Worker) -> None:
    @app.page("/desk/{agent}")
    class Desk(View):
        async def get(self, request: Request, agent: str) -> Response:
            if agent not in runtime.agents:
                return self.json({"error": f"agent {agent!r} is not run by this app; it runs "
                                           f"{sorted(runtime.agents)}"}, status=404)
            rows = _share(app, runtime, agent, request.query.get("all") == "1")
            if request.headers.get(ROUTED_HEADER):
                return self.json({"worker": runtime.worker_id, "conversations": rows})
            bodies, missing = await gather(app, request.rel_url.raw_path_qs, forwarded_headers(request))
            for body in bodies:
                rows += body.get("conversations") or []
            rows.sort(key=lambda r: (-(r["waiting_s"] or -1.0), -r["updated_at"]))
            return self.json(api.answer(api.DeskView, agent=agent, worker=runtime.worker_id, conversations=rows[:ROWS],
                                    unreachable=missing))

"""``agents-stream approve``, ``reject`` and ``tasks cancel``: a human decision on a task, sent to agent.approvals
(approve and reject decide a task awaiting approval; a cancel ends a task in any open state).

An approve or reject names the parking it decides (``--parked``, as ``tasks show`` prints it): the command reads
the task's view from a worker (AGENTS_STREAM_PUBLIC_URL or WEB_HOST/WEB_PORT, like ``tasks show``) for its app id
and agent, and refuses, exiting 1 with the reason, when the task no longer awaits that parking. It never fills the
parking in from the view itself: a command run again after a broker error would then decide the task's next
parking (an agent loop's next guarded call), not the one its operator looked at. A cancel names the app id of
this shell's AGENTS_STREAM_APP_ID (the one the workers read): it is for that app id's task only.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from agents_stream.contract import topics
from agents_stream.ops.cli_common import AddParser, broker_call, printable, send_one
from agents_stream.ops.notify import with_signature
from agents_stream.settings import Settings

__all__ = ["cancel_task", "register"]


def register(add_parser: AddParser) -> None:
    for verb in ("approve", "reject"):
        help_text = f"{verb} a task awaiting approval"
        p = add_parser(verb, help=help_text)
        p.add_argument("task_id")
        p.add_argument("--by", default=f"{os.environ.get('USER', 'operator')}@cli",
                       help="who decides (recorded with the decision)")
        p.add_argument("--comment", help="why (recorded with the decision)")
        p.add_argument("--parked", type=int, metavar="MS",
                       help="the parking decided, as `tasks show` prints it (required: without it the command "
                            "prints what the task awaits now and exits 2)")
        p.set_defaults(func=_cmd_decide, decision=verb)


def _cmd_decide(args: argparse.Namespace) -> int:
    from urllib.parse import quote

    from agents_stream.ops.cli_views import get_view, no_worker

    command, settings = args.decision, Settings.from_env()
    made = _build(command, args.decision, task_id=args.task_id, by=args.by, comment=args.comment, parked=args.parked)
    if isinstance(made, int):
        return made
    try:
        status, view = get_view(settings, f"/tasks/{quote(args.task_id, safe='')}")
    except (OSError, ValueError) as exc:
        return no_worker(settings, exc)
    refusal = decide_refusal(args.task_id, args.parked, status, view)
    if refusal is not None:
        code, message = refusal
        print(f"agents-stream {command}: {printable(message)}", file=sys.stderr)
        return code
    named = _build(command, args.decision, **{**made.model_dump(include={"task_id", "by", "comment", "parked"}),
                                             "app_id": view.get("app_id"), "agent": view.get("agent")})
    return named if isinstance(named, int) else _publish(command, settings, named)


def decide_refusal(task_id: str, parked: int | None, status: int, view: dict[str, Any]) -> tuple[int, str] | None:
    """(exit code, why) when an approve or reject of ``task_id`` at parking ``parked`` is not sent, given the
    worker's answer for its view (``status``, ``view``); None when it is sent."""
    if status != 200:
        return 1, str(view.get("error", f"the worker answered HTTP {status} for the task's view"))
    approval = view.get("approval") or {}
    if view.get("state") != "awaiting_approval":
        return 1, f"task {task_id} is {view.get('state')}, not awaiting approval: nothing to decide"
    now = approval.get("parked")
    call = approval.get("call") or {}
    what = f"tool call {call.get('tool')} ({call.get('id')})" if call else "its run"
    if parked is None:
        return 2, (f"name the parking you decide: task {task_id} of agent {view.get('agent')} awaits approval of "
                   f"{what} ({approval.get('reason')}), parked {now}; decide it with --parked {now}")
    if parked != now:
        return 1, (f"task {task_id} is not parked at {parked} any more: it awaits approval of {what} "
                   f"({approval.get('reason')}), parked {now}. Look at it (agents-stream tasks show {task_id}) "
                   f"and decide that parking with --parked {now}")
    return None


def cancel_task(args: argparse.Namespace) -> int:
    """``agents-stream tasks cancel``: a signed cancel for this shell's app id; ``--agent`` lets it stop a task not
    yet read too."""
    settings = Settings.from_env()
    made = _build("tasks cancel", "cancel", task_id=args.id, by=args.by, comment=args.reason, agent=args.agent,
                  app_id=settings.app_id)
    return made if isinstance(made, int) else _publish("tasks cancel", settings, made)


def _build(command: str, verb: str, **fields: Any) -> Any:
    """The decision, or the exit code after saying why it cannot be made (a bad field, a short secret)."""
    from pydantic import ValidationError

    from agents_stream.contract.models import ApprovalDecision

    problem = Settings.from_env().approval_secret_problem()
    if problem:
        print(f"agents-stream {command}: {problem}", file=sys.stderr)
        return 2
    try:
        return ApprovalDecision(decision=verb, via="cli", **fields)  # type: ignore[arg-type]  # pydantic checks it
    except ValidationError as exc:
        first = exc.errors()[0]
        field = first["loc"][0] if first["loc"] else "decision"
        hint = " (control characters are refused)" if first["type"] == "string_pattern_mismatch" else ""
        print(f"agents-stream {command}: {field}: {first['msg']}{hint}", file=sys.stderr)
        return 2


def _publish(command: str, settings: Settings, decision: Any) -> int:
    verb = decision.decision
    # Signed with the approval secret when this shell has it; without it the worker applies the decision and
    # records it as signed: false (or refuses it under AGENTS_STREAM_APPROVAL_REQUIRE_SIGNED).
    decision = with_signature(settings.approval_secret, decision)
    body = decision.model_dump_json(exclude_none=True).encode()
    code = broker_call(settings, command, send_one(settings, topics.APPROVALS, decision.task_id.encode(), body))
    if code == 0:
        signed = "signed" if decision.sig else "unsigned (AGENTS_STREAM_APPROVAL_SECRET is not set here)"
        applies = ("a finished task ignores it, see agent.control" if verb == "cancel"
                   else "a task no longer at that parking ignores it, see agent.control")
        print(f"{verb} of {printable(decision.task_id)} by {printable(decision.by)} sent to {topics.APPROVALS}, "
              f"{signed}; the task's worker applies it ({applies})")
    return code

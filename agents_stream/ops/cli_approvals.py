"""``agents-stream approve``, ``reject`` and ``tasks cancel``: a human decision on a task, sent to agent.approvals
(approve and reject decide a task awaiting approval; a cancel ends a task in any open state)."""

from __future__ import annotations

import argparse
import os
import sys

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
        p.set_defaults(func=_cmd_decide, decision=verb)


def _cmd_decide(args: argparse.Namespace) -> int:
    return _send(args.decision, args.decision, task_id=args.task_id, by=args.by, comment=args.comment)


def cancel_task(args: argparse.Namespace) -> int:
    """``agents-stream tasks cancel``: a signed cancel; ``--agent`` lets it stop a task not yet read too."""
    return _send("tasks cancel", "cancel", task_id=args.id, by=args.by, comment=args.reason, agent=args.agent)


def _send(command: str, verb: str, **fields: str | None) -> int:
    from pydantic import ValidationError

    from agents_stream.contract.models import ApprovalDecision

    settings = Settings.from_env()
    problem = settings.approval_secret_problem()
    if problem:
        print(f"agents-stream {command}: {problem}", file=sys.stderr)
        return 2
    try:
        decision = ApprovalDecision(decision=verb, via="cli", **fields)  # type: ignore[arg-type]
    except ValidationError as exc:
        first = exc.errors()[0]
        field = first["loc"][0] if first["loc"] else "decision"
        hint = " (control characters are refused)" if first["type"] == "string_pattern_mismatch" else ""
        print(f"agents-stream {command}: {field}: {first['msg']}{hint}", file=sys.stderr)
        return 2
    # Signed with the approval secret when this shell has it; without it the worker applies the decision and
    # records it as signed: false (or refuses it under AGENTS_STREAM_APPROVAL_REQUIRE_SIGNED).
    decision = with_signature(settings.approval_secret, decision)
    body = decision.model_dump_json(exclude_none=True).encode()
    code = broker_call(settings, command, send_one(settings, topics.APPROVALS, decision.task_id.encode(), body))
    if code == 0:
        signed = "signed" if decision.sig else "unsigned (AGENTS_STREAM_APPROVAL_SECRET is not set here)"
        applies = ("a finished task ignores it, see agent.control" if verb == "cancel"
                   else "a task not awaiting approval ignores it, see agent.control")
        print(f"{verb} of {printable(decision.task_id)} by {printable(decision.by)} sent to {topics.APPROVALS}, "
              f"{signed}; the task's worker applies it ({applies})")
    return code

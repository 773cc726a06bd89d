"""``agents-stream approve`` and ``reject``: a human decision on a task awaiting approval, sent to agent.approvals."""

from __future__ import annotations

import argparse
import os
import sys

from agents_stream.contract import topics
from agents_stream.ops.cli_common import AddParser, broker_call, printable, send_one
from agents_stream.ops.notify import with_signature
from agents_stream.settings import Settings

__all__ = ["register"]


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
    from pydantic import ValidationError

    from agents_stream.contract.models import ApprovalDecision

    settings = Settings.from_env()
    problem = settings.approval_secret_problem()
    if problem:
        print(f"agents-stream {args.decision}: {problem}", file=sys.stderr)
        return 2
    try:
        decision = ApprovalDecision(
            task_id=args.task_id, decision=args.decision, by=args.by, via="cli", comment=args.comment
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        field = first["loc"][0] if first["loc"] else "decision"
        hint = " (control characters are refused)" if first["type"] == "string_pattern_mismatch" else ""
        print(f"agents-stream {args.decision}: {field}: {first['msg']}{hint}", file=sys.stderr)
        return 2
    # Signed with the approval secret when this shell has it; without it the worker applies the decision and
    # records it as signed: false (or refuses it under AGENTS_STREAM_APPROVAL_REQUIRE_SIGNED).
    decision = with_signature(settings.approval_secret, decision)
    body = decision.model_dump_json(exclude_none=True).encode()
    code = broker_call(settings, args.decision, send_one(settings, topics.APPROVALS, args.task_id.encode(), body))
    if code == 0:
        signed = "signed" if decision.sig else "unsigned (AGENTS_STREAM_APPROVAL_SECRET is not set here)"
        print(f"{args.decision} of {printable(args.task_id)} by {printable(args.by)} sent to {topics.APPROVALS}, "
              f"{signed}; the task's worker applies it (a task not awaiting approval ignores it, see agent.control)")
    return code

"""``agents-stream approve`` and ``reject``: a human decision on a task awaiting approval, sent to agent.approvals."""

from __future__ import annotations

import argparse
import os
import sys

from agents_stream.contract import topics
from agents_stream.ops.cli_common import AddParser, broker_call, send_one
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
    try:
        decision = ApprovalDecision(
            task_id=args.task_id, decision=args.decision, by=args.by, via="cli", comment=args.comment
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        print(f"agents-stream {args.decision}: {first['loc'][0]}: {first['msg']}", file=sys.stderr)
        return 2
    send = send_one(settings, topics.APPROVALS, args.task_id.encode(), decision.model_dump_json().encode())
    code = broker_call(settings, args.decision, send)
    if code == 0:
        print(f"{args.decision} of {args.task_id} by {args.by} sent to {topics.APPROVALS}; "
              "the task's worker applies it (a task not awaiting approval ignores it, see agent.control)")
    return code

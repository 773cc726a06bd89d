"""``agents-stream conversations show|delete|inbox|handoff|reply|handback``: a conversation read, deleted, or
handed to a person and back (docs/guide/handoff.md), through a worker's web views."""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
import uuid
from typing import Any
from urllib.parse import quote

from agents_stream.ops.cli_common import AddParser, operator_token, printable_tree
from agents_stream.ops.cli_views import get_view, no_worker
from agents_stream.settings import Settings

__all__ = ["register"]


def register(add_parser: AddParser) -> None:
    conv = add_parser("conversations", help="read or delete a conversation (through a worker's web views)")
    sub = conv.add_subparsers(dest="conversations_command", required=True)
    show = sub.add_parser("show", help="a conversation's status, messages waiting and latest history")
    show.add_argument("id", metavar="CONVERSATION_ID")
    show.add_argument("--limit", type=int, default=20, help="history items to show (20)")
    show.set_defaults(func=_cmd_show)
    delete = sub.add_parser("delete", help="delete every record of a conversation (once no round answers)")
    delete.add_argument("id", metavar="CONVERSATION_ID")
    delete.add_argument("--by", default=f"{os.environ.get('USER', 'operator')}@cli", help="who deletes it")
    delete.set_defaults(func=_cmd_delete)
    inbox = sub.add_parser("inbox", help="the conversations held by a person, or waiting for one, and their messages")
    inbox.set_defaults(func=_cmd_inbox)
    me = f"{os.environ.get('USER', 'operator')}@cli"
    for name, what, text_help in (
        ("handoff", "take a conversation from its agent (or claim one waiting for a person)", "why (optional)"),
        ("reply", "answer the customer as a person (the conversation must be held by a person)", "the reply"),
        ("handback", "hand the conversation back to its agent, with a note its model sees", "the note (optional)"),
    ):
        act = sub.add_parser(name, help=what)
        act.add_argument("id", metavar="CONVERSATION_ID")
        act.add_argument("text", nargs="?" if name != "reply" else None, default="", help=text_help)
        act.add_argument("--by", default=me, help=f"who acts ({me})")
        act.add_argument("--action-id", default=None,
                         help="the same id again (a retry) counts once; made for you when absent")
        act.set_defaults(func=_cmd_act, action=name)


def _cmd_inbox(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    try:
        status, body = get_view(settings, "/handoffs")
    except OSError as exc:
        return no_worker(settings, exc)
    print(json.dumps(printable_tree(body), indent=1, ensure_ascii=False))
    return 0 if status == 200 else 1


def _cmd_act(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    body = {"by": args.by, "text": args.text, "action_id": args.action_id or uuid.uuid4().hex}
    try:
        status, answer = _post(settings, f"/conversations/{quote(args.id, safe='')}/{args.action}", body)
    except OSError as exc:
        return no_worker(settings, exc)
    if status != 202:
        print(f"agents-stream conversations {args.action}: {status}: {printable_tree(answer.get('error'))}",
              file=sys.stderr)
        return 1
    print(f"conversation {printable_tree(args.id)}: {args.action} accepted (action {body['action_id']}: run the "
          "same command with --action-id to retry it safely)")
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    try:
        status, body = get_view(settings, f"/conversations/{quote(args.id, safe='')}?limit={args.limit}")
    except OSError as exc:
        return no_worker(settings, exc)
    print(json.dumps(printable_tree(body), indent=1, ensure_ascii=False))
    return 0 if status == 200 else 1


def _cmd_delete(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    try:
        status, body = _post(settings, f"/conversations/{quote(args.id, safe='')}/delete", {"by": args.by})
    except OSError as exc:
        return no_worker(settings, exc)
    if status != 202:
        print(f"agents-stream conversations delete: {status}: {printable_tree(body.get('error'))}", file=sys.stderr)
        return 1
    print(f"conversation {printable_tree(args.id)}: delete accepted (every record of it goes once no round answers)")
    return 0


def _post(settings: Settings, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    """POST JSON to a worker's web view with the write token (AGENTS_STREAM_API_TOKEN)."""
    headers = {"Content-Type": "application/json"}
    token = operator_token(settings, write=True)
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(settings.link_base().rstrip("/") + path, data=json.dumps(body).encode(),
                                     headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=20) as resp:  # noqa: S310 (the operator's own worker)
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")

"""``agents-stream dlq``: list, show and requeue dead-lettered tasks (agents_stream.ops.dlq does the work)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from agents_stream.kafka import security as kafka_security
from agents_stream.ops.cli_common import AddParser, broker_unreachable
from agents_stream.settings import Settings

__all__ = ["register"]


def register(add_parser: AddParser) -> None:
    dead = add_parser("dlq", help="list, show and requeue dead-lettered tasks")
    dsub = dead.add_subparsers(dest="dlq_command", required=True)
    for name, help_text in (
        ("list", "list dead letters (newest last)"), ("requeue", "send dead letters back to their task topic")
    ):
        p = dsub.add_parser(name, help=help_text)
        p.add_argument("--agent", help="only this agent's dead-letter topic (default: all)")
        p.add_argument("--layer", choices=["schema", "downstream", "recovery"], help="only this error_layer")
        p.add_argument("--reason", help="only reasons containing this text (case-insensitive)")
        p.add_argument("--since", help="only failures at or after this ISO-8601 time (UTC when no zone)")
        p.add_argument("--until", help="only failures at or before this ISO-8601 time")
        p.set_defaults(func=_cmd_dlq)
        if name == "list":
            p.add_argument("--json", action="store_true", help="one JSON object per line")
        else:
            p.add_argument("refs", nargs="*", metavar="REF",
                           help="agent.tasks.<agent>.dlq:<partition>:<offset> as `dlq list` prints")
            p.add_argument("--all", action="store_true", help="every dead letter the filters select")
            p.add_argument("--dry-run", action="store_true", help="print what would be requeued")
    show = dsub.add_parser("show", help="one dead letter: headers, history and the original message")
    show.add_argument("ref", metavar="REF")
    show.set_defaults(func=_cmd_dlq)


def _dlq_filters(args: argparse.Namespace) -> dict[str, str | None]:
    return {"agent": args.agent, "layer": args.layer, "reason": args.reason, "since": args.since, "until": args.until}


async def _dlq(args: argparse.Namespace, settings: Settings) -> int:
    from agents_stream.ops import dlq

    security = kafka_security.client_kwargs(settings)
    if args.dlq_command == "show":
        topic, _, _ = dlq.parse_ref(args.ref)
        letters = await dlq.read_dead_letters(settings.broker, [topic], security=security)
        found = [d for d in letters if d.ref == args.ref]
        if not found:
            print(f"no dead letter {args.ref}", file=sys.stderr)
            return 1
        print(json.dumps(found[0].as_dict(), indent=2, ensure_ascii=False))
        return 0
    if args.dlq_command == "requeue":
        for ref in args.refs:
            dlq.parse_ref(ref)  # a clear error for a mistyped reference, before any I/O
    names = await dlq.dlq_topics(settings.broker, args.agent, security=security)
    records = await dlq.read_dead_letters(settings.broker, names, security=security)
    if args.dlq_command == "list":
        chosen = [d for d in records if dlq.matches(d, **_dlq_filters(args))]
        if args.json:
            for d in chosen:
                print(json.dumps(d.as_dict(), ensure_ascii=False))
        else:
            print(f"{'REF':<44} {'TASK_ID':<38} {'LAYER':<10} {'ATTEMPTS':>8}  {'FAILED_AT':<24} REASON")
            for d in chosen:
                h = d.headers
                print(f"{d.ref:<44} {str(d.task_id):<38} {h.get('error_layer', ''):<10} {h.get('attempts', ''):>8}  "
                      f"{h.get('failed_at', ''):<24} {h.get('error_reason', '')[:80]}")
            print(f"{len(chosen)} dead letter(s)", file=sys.stderr)
        return 0
    # requeue
    if args.refs:
        wanted = set(args.refs)
        chosen = [d for d in records if d.ref in wanted]
        missing = wanted - {d.ref for d in chosen}
        if missing:
            print(f"no such dead letter(s): {', '.join(sorted(missing))}", file=sys.stderr)
            return 1
    elif args.all:
        chosen = [d for d in records if dlq.matches(d, **_dlq_filters(args))]
    else:
        print("name the dead letters to requeue (REF ...), or pass --all with filters", file=sys.stderr)
        return 2
    if args.dry_run:
        for d in chosen:
            print(f"would requeue {d.ref} ({d.task_id}) to {dlq.requeue_target(d)}")
        return 0
    for d, requeue_id in await dlq.requeue(settings.broker, chosen, security=security):
        print(f"requeued {d.ref} ({d.task_id}) to {dlq.requeue_target(d)} as {requeue_id}")
    print(f"{len(chosen)} requeued", file=sys.stderr)
    return 0


def _cmd_dlq(args: argparse.Namespace) -> int:
    from aiokafka.errors import KafkaError

    settings = Settings.from_env()
    try:
        return asyncio.run(_dlq(args, settings))
    except ValueError as exc:
        print(f"agents-stream dlq: {exc}", file=sys.stderr)
        return 2
    except (KafkaError, OSError, TimeoutError) as exc:
        return broker_unreachable(settings, "dlq", exc)

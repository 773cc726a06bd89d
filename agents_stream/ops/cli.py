"""The ``agents-stream`` command: worker, publish, chat, approve, reject, jobs, dlq, fake-llm, settings."""

from __future__ import annotations

import argparse
import os
import sys

from agents_stream.kafka import security as kafka_security
from agents_stream.ops import cli_approvals, cli_chat, cli_conversations, cli_dlq, cli_jobs, cli_publish, cli_views
from agents_stream.ops.cli_common import broker_unreachable
from agents_stream.settings import Settings


def _cmd_worker(args: argparse.Namespace) -> int:
    argv = [sys.executable, "-m", "faust", "-A", "agents_stream.app", "worker", "-l", args.loglevel]
    # exec: the worker *is* this process, so SIGTERM from Docker/Kubernetes reaches Faust.
    os.execv(sys.executable, argv)


def _cmd_fake_llm(args: argparse.Namespace) -> int:
    from agents_stream.testing import fakellm

    return fakellm.main(args.rest) or 0


def _cmd_settings(args: argparse.Namespace) -> int:
    current = Settings.from_env()
    for name, env, default, doc in Settings.describe():
        value = getattr(current, name)
        if name in Settings.SECRETS and value:
            value = "<set, not shown>"
        print(f"{env}={value!s:<28} # {doc} (default {default!r})")
    return 0


def parser() -> argparse.ArgumentParser:
    """Every command and option; each command module registers its own (in the order ``--help`` lists them)."""
    root = argparse.ArgumentParser(prog="agents-stream", description=__doc__)
    sub = root.add_subparsers(dest="command", required=True)

    worker = sub.add_parser("worker", help="run a worker (same as: faust -A agents_stream.app worker)")
    worker.add_argument("-l", "--loglevel", default=os.environ.get("AGENTS_STREAM_LOG_LEVEL", "info"))
    worker.set_defaults(func=_cmd_worker)
    cli_publish.register(sub.add_parser)
    cli_chat.register(sub.add_parser)
    cli_conversations.register(sub.add_parser)
    cli_approvals.register(sub.add_parser)
    cli_jobs.register(sub.add_parser)
    cli_views.register(sub.add_parser)
    fake = sub.add_parser(
        "fake-llm", help="run the fake LLM server (Gemini, OpenAI and Anthropic APIs), scripted through "
        "POST /_admin/script (fake-llm --help)", add_help=False
    )
    fake.add_argument("rest", nargs=argparse.REMAINDER)
    fake.set_defaults(func=_cmd_fake_llm)
    cli_dlq.register(sub.add_parser)
    settings = sub.add_parser("settings", help="print every setting, its environment name and value")
    settings.set_defaults(func=_cmd_settings)
    return root


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["fake-llm"]:
        # its own options (--port, --latency, ...) belong to fakellm.main
        from agents_stream.testing import fakellm

        return fakellm.main(argv[1:]) or 0
    args = parser().parse_args(argv)
    from aiokafka.errors import KafkaConnectionError

    try:
        code: int = args.func(args)
        return code
    except kafka_security.KafkaSecurityError as exc:
        print(f"agents-stream {args.command}: {exc}", file=sys.stderr)
        return 2
    except KafkaConnectionError as exc:  # commands that do not handle it themselves (publish)
        return broker_unreachable(Settings.from_env(), args.command, exc)


if __name__ == "__main__":
    sys.exit(main())

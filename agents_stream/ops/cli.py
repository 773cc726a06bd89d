"""The ``agents-stream`` command: worker, publish, chat, approve, reject, jobs, dlq, fake-llm, settings."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TextIO

from agents_stream.kafka import security as kafka_security
from agents_stream.ops import (
    access,
    cli_approvals,
    cli_chat,
    cli_conversations,
    cli_dlq,
    cli_jobs,
    cli_publish,
    cli_views,
)
from agents_stream.ops.cli_common import broker_unreachable
from agents_stream.settings import Settings


def _cmd_worker(args: argparse.Namespace) -> int:
    argv = [sys.executable, "-m", "faust", "-A", "agents_stream.app", "worker", "-l", args.loglevel]
    if args.local_token:
        use_local_token(Settings.from_env())
    # exec: the worker *is* this process, so SIGTERM from Docker/Kubernetes reaches Faust.
    os.execv(sys.executable, argv)


def use_local_token(settings: Settings, out: TextIO = sys.stderr) -> str | None:
    """``worker --local-token`` (``make run``): with no token set and the web views on a loopback address, the
    worker's AGENTS_STREAM_API_TOKEN is the local operator token (.data/operator-token, made if missing), said on
    ``out``; reads stay protected and ``agents-stream tasks show`` in this clone finds it (docs/security.md)."""
    if settings.api_token or settings.read_token or settings.api_open:
        return None
    if not access.is_loopback(access.bind_address(settings)):
        bind = access.bind_address(settings)
        print(f"agents-stream worker: --local-token ignored: the web views listen on {bind!r}, which other machines "
              "reach; set AGENTS_STREAM_API_TOKEN", file=out)
        return None
    token = access.local_token(create=True)
    assert token is not None
    os.environ["AGENTS_STREAM_API_TOKEN"] = token
    print(f"agents-stream worker: no AGENTS_STREAM_API_TOKEN set, so the web views take the local operator token "
          f"{token} (kept in {access.LOCAL_TOKEN_FILE}; agents-stream commands run in this directory send it): "
          f'curl -H "Authorization: Bearer $(cat {access.LOCAL_TOKEN_FILE})" localhost:{settings.web_port}/tasks/<id>',
          file=out, flush=True)
    return token


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
    worker.add_argument("--local-token", action="store_true",
                        help="with no AGENTS_STREAM_API_TOKEN set and the web views on loopback, use the local "
                             f"operator token ({access.LOCAL_TOKEN_FILE}, made if missing; what make run does)")
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

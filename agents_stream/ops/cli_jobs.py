"""``agents-stream jobs``: submit, cancel, status and watch orchestrator jobs."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from typing import Any

from agents_stream.contract import topics
from agents_stream.kafka import security as kafka_security
from agents_stream.ops import tracing
from agents_stream.ops.cli_common import AddParser, broker_call, flush_traces, send_one
from agents_stream.ops.cli_views import get_view, no_worker, render_job, show
from agents_stream.settings import Settings, bootstrap_servers

__all__ = ["register"]


def register(add_parser: AddParser) -> None:
    jobs = add_parser("jobs", help="submit or cancel a job (a plan of tasks, or a goal for a planner agent)")
    jsub = jobs.add_subparsers(dest="jobs_command", required=True)
    submit = jsub.add_parser("submit", help="submit a JobRequest (JSON file, or - for stdin); prints the job id")
    submit.add_argument("file", nargs="?", default="-")
    submit.add_argument("--wait", type=float, metavar="SECONDS",
                        help="wait for the job's result and print it (exit 0 only if succeeded)")
    submit.set_defaults(func=_cmd_jobs)
    jcancel = jsub.add_parser(
        "cancel", help="cancel a job: unfinished steps are cancelled, the job ends with what is done"
    )
    jcancel.add_argument("job_id")
    jcancel.add_argument("--by", default=f"{os.environ.get('USER', 'operator')}@cli")
    jcancel.add_argument("--reason", default="cancelled from the CLI")
    jcancel.set_defaults(func=_cmd_jobs)
    jstatus = jsub.add_parser("status", help="a job's steps and their state, from a worker's /jobs view")
    jstatus.add_argument("id", metavar="JOB_ID")
    jstatus.add_argument("--json", action="store_true", help="the view's JSON as is")
    jstatus.set_defaults(func=_cmd_jobs_status)

    jwatch = jsub.add_parser(
        "watch", help="follow a job: a line per step state change until it ends (exit 0 only if it succeeded)"
    )
    jwatch.add_argument("id", metavar="JOB_ID")
    jwatch.add_argument("--timeout", type=float, default=3600.0, help="give up after this many seconds (exit 1)")
    jwatch.add_argument("--interval", type=float, default=1.0, help="seconds between looks")
    jwatch.add_argument("--json", action="store_true", help="one JSON object per change")
    jwatch.set_defaults(func=_cmd_jobs_watch)


def _cmd_jobs(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from agents_stream.orchestrator import JobRequest

    settings = Settings.from_env()
    if args.jobs_command == "cancel":
        body: dict[str, Any] = {"job_id": args.job_id, "action": "cancel", "by": args.by, "reason": args.reason}
    else:
        source = sys.stdin if args.file == "-" else open(args.file, encoding="utf-8")
        with source:
            try:
                body = json.load(source)
            except ValueError as exc:
                print(f"agents-stream jobs submit: {args.file} is not JSON ({exc})", file=sys.stderr)
                return 2
        if isinstance(body, dict):
            body.setdefault("job_id", str(uuid.uuid4()))
    try:
        request = JobRequest.model_validate(body)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors())
        print(f"agents-stream jobs {args.jobs_command}: {problems}", file=sys.stderr)
        return 2
    value = json.dumps(body).encode("utf-8")
    headers = None
    if args.jobs_command == "submit" and tracing.start("agents-stream-jobs", {}):  # the job's trace starts here
        span = tracing.span(f"publish {topics.JOBS}", os.environ.get("TRACEPARENT"), kind="producer", attributes={
            "messaging.system": "kafka", "messaging.destination.name": topics.JOBS,
            "agents_stream.job_id": request.job_id,
        })
        if span is not None:
            headers = tracing.headers_with(None, span.traceparent)
            span.end()
    send = send_one(settings, topics.JOBS, request.job_id.encode(), value, headers=headers)
    try:
        if args.jobs_command == "submit" and args.wait:
            return _submit_and_wait(settings, request.job_id, args.wait, send)
        code = broker_call(settings, f"jobs {args.jobs_command}", send)
    finally:
        flush_traces()
    if code == 0:
        print(request.job_id)
    return code


def _submit_and_wait(settings: Settings, job_id: str, wait: float, send: Any) -> int:
    outcome: dict[str, Any] = {}

    async def run() -> None:
        outcome["result"] = await _job_wait(settings, job_id, wait, send)

    try:
        code = broker_call(settings, "jobs submit", run())
    except ValueError as exc:
        print(f"agents-stream jobs submit: {exc}", file=sys.stderr)
        return 1
    if code:
        return code
    if outcome.get("result") is None:
        print(f"job {job_id}: no result within {wait:g}s (it may still finish; see /jobs/{job_id})", file=sys.stderr)
        return 1
    print(json.dumps(outcome["result"], indent=2))
    return 0 if outcome["result"]["status"] == "succeeded" else 3


async def _job_wait(settings: Settings, job_id: str, timeout: float, submit: Any) -> dict[str, Any] | None:
    """Submit, then read agent.job.results from before the submission until the job's result arrives."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap_servers(settings.broker), **kafka_security.client_kwargs(settings)
    )
    await asyncio.wait_for(admin.start(), timeout=30)
    try:
        described = await asyncio.wait_for(admin.describe_topics([topics.JOB_RESULTS]), timeout=30)
    finally:
        await admin.close()
    tps = [TopicPartition(topics.JOB_RESULTS, p["partition"]) for p in described[0].get("partitions") or ()]
    if not tps:
        submit.close()
        raise ValueError(f"{topics.JOB_RESULTS} does not exist yet: start a worker first")
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap_servers(settings.broker), enable_auto_commit=False, group_id=None,
        **kafka_security.client_kwargs(settings),
    )
    await asyncio.wait_for(consumer.start(), timeout=30)
    try:
        consumer.assign(tps)
        await asyncio.wait_for(consumer.seek_to_end(*tps), timeout=30)
        for tp in tps:  # resolve the end offsets now, before the job is submitted
            await asyncio.wait_for(consumer.position(tp), timeout=30)
        await submit
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for msgs in batch.values():
                for m in msgs:
                    if m.key == job_id.encode():
                        return json.loads(m.value)
        return None
    finally:
        await asyncio.wait_for(consumer.stop(), timeout=30)


def _cmd_jobs_status(args: argparse.Namespace) -> int:
    return show(args, "/jobs/{}", render_job)


def _cmd_jobs_watch(args: argparse.Namespace) -> int:
    """Follow a job through a worker's /jobs view: one line per step that changes, until the job ends."""
    from urllib.parse import quote

    settings = Settings.from_env()
    path = f"/jobs/{quote(args.id, safe='')}"
    deadline = time.monotonic() + args.timeout
    seen: dict[str, str] = {}
    while True:
        try:
            status, body = get_view(settings, path)
        except (OSError, ValueError) as exc:
            return no_worker(settings, exc)
        if status == 200:
            changes = {"job": body["state"], **{f"step {k}": v["status"] for k, v in body.get("steps", {}).items()}}
            for what, state in changes.items():
                if seen.get(what) != state:
                    seen[what] = state
                    at = time.strftime("%H:%M:%S")
                    change = {"at": at, "what": what, "state": state}
                    print(json.dumps(change) if args.json else f"{at}  {what:<24} {state}", flush=True)
            if body["state"] in ("succeeded", "partial", "failed"):
                if not args.json:
                    print(render_job(body))
                return 0 if body["state"] == "succeeded" else 3
        elif status != 404 and status != 503:  # unknown yet (just submitted) or a rebalance: ask again
            print(body.get("error", f"HTTP {status}"), file=sys.stderr)
            return 1
        if time.monotonic() > deadline:
            last = seen.get("job", "unknown")
            print(f"job {args.id}: not finished within {args.timeout:g}s (last: {last})", file=sys.stderr)
            return 1
        time.sleep(args.interval)

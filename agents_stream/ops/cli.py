"""The ``agents-stream`` command: worker, publish, approve, reject, jobs, dlq, fake-llm, settings."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from typing import IO, Any, Iterator

from agents_stream.contract import topics
from agents_stream.kafka import security as kafka_security
from agents_stream.settings import Settings, bootstrap_servers


def _cmd_worker(args: argparse.Namespace) -> int:
    argv = [sys.executable, "-m", "faust", "-A", "agents_stream.app", "worker", "-l", args.loglevel]
    # exec: the worker *is* this process, so SIGTERM from Docker/Kubernetes reaches Faust.
    os.execv(sys.executable, argv)


def _lines(source: IO[str]) -> Iterator[tuple[int, str]]:
    for number, line in enumerate(source, 1):
        if line.strip():
            yield number, line.strip()


async def _publish(args: argparse.Namespace, settings: Settings) -> int:
    from aiokafka import AIOKafkaProducer

    source = sys.stdin if args.file in (None, "-") else open(args.file, encoding="utf-8")
    topic = topics.task_topic(args.agent)
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap_servers(settings.broker), acks="all", linger_ms=5, compression_type="gzip",
        **kafka_security.client_kwargs(settings),
    )
    sent = bad = 0
    started = time.monotonic()
    progress = _Progress(args.progress if args.progress is not None else sys.stderr.isatty(), _count_lines(args.file))
    try:
        await asyncio.wait_for(producer.start(), timeout=30)  # a refused login fails here: still close the producer
        futures = []
        for number, line in _lines(source):
            if args.rate:  # pace the sends: task n leaves no earlier than n / rate seconds after the start
                ahead = started + sent / args.rate - time.monotonic()
                if ahead > 0:
                    await asyncio.sleep(ahead)
            try:
                task = json.loads(line)
                if not isinstance(task, dict):
                    raise ValueError("not a JSON object")
            except ValueError as exc:
                print(f"line {number}: skipped, not a JSON object ({exc})", file=sys.stderr)
                bad += 1
                continue
            task.setdefault("task_id", str(uuid.uuid4()))
            task.setdefault("agent_name", args.agent)
            key = str(task["task_id"]).encode("utf-8")
            futures.append(await producer.send(topic, json.dumps(task).encode("utf-8"), key=key))
            sent += 1
            progress.update(sent, started)
            if not args.quiet and not args.json:
                print(task["task_id"])
        await asyncio.wait_for(asyncio.gather(*futures), timeout=60)
    finally:
        progress.done()
        await asyncio.wait_for(producer.stop(), timeout=30)
        if source is not sys.stdin:
            source.close()
    seconds = time.monotonic() - started
    if args.json:
        print(json.dumps({"topic": topic, "published": sent, "skipped": bad, "seconds": round(seconds, 3)}))
    print(f"published {sent} task(s) to {topic} in {seconds:.1f}s" + (f"; {bad} line(s) skipped" if bad else ""), file=sys.stderr)
    return 1 if bad else 0


def _count_lines(path: str | None) -> int | None:
    """The number of tasks in a file, for the progress bar (None for stdin: the bar then shows a count)."""
    if path in (None, "-"):
        return None
    with open(path, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


class _Progress:
    """A one-line progress bar on stderr, redrawn at most 10 times a second."""

    def __init__(self, enabled: bool, total: int | None) -> None:
        self.enabled, self.total, self._drawn = enabled, total, 0.0

    def update(self, sent: int, started: float, force: bool = False) -> None:
        self._last = (sent, started)
        now = time.monotonic()
        if not self.enabled or (now - self._drawn < 0.1 and not force):
            return
        self._drawn = now
        rate = sent / max(now - started, 1e-6)
        if self.total:
            filled = int(30 * sent / self.total)
            bar = f"[{'#' * filled}{'.' * (30 - filled)}] {sent}/{self.total}"
        else:
            bar = f"{sent} sent"
        print(f"\r{bar}  {rate:,.0f} tasks/s ", end="", file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.enabled and self._drawn:
            self.update(*self._last, force=True)
            print(file=sys.stderr)


def _cmd_publish(args: argparse.Namespace) -> int:
    return asyncio.run(_publish(args, Settings.from_env()))


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


def _dlq_filters(args: argparse.Namespace) -> dict[str, str | None]:
    return {"agent": args.agent, "layer": args.layer, "reason": args.reason, "since": args.since, "until": args.until}


async def _dlq(args: argparse.Namespace, settings: Settings) -> int:
    from agents_stream.ops import dlq

    security = kafka_security.client_kwargs(settings)
    if args.dlq_command == "show":
        topic, _, _ = dlq.parse_ref(args.ref)
        found = [d for d in await dlq.read_dead_letters(settings.broker, [topic], security=security) if d.ref == args.ref]
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
            print(f"would requeue {d.ref} ({d.task_id}) to {d.headers.get('original_topic')}")
        return 0
    for d, requeue_id in await dlq.requeue(settings.broker, chosen, security=security):
        print(f"requeued {d.ref} ({d.task_id}) to {d.headers.get('original_topic')} as {requeue_id}")
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
        return _broker_unreachable(settings, "dlq", exc)


async def _send_one(settings: Settings, topic: str, key: bytes, value: bytes) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap_servers(settings.broker), acks="all", **kafka_security.client_kwargs(settings))
    try:
        await asyncio.wait_for(producer.start(), timeout=30)  # a refused login fails here: still close the producer
        await asyncio.wait_for(producer.send_and_wait(topic, value, key=key), timeout=30)
    finally:
        await asyncio.wait_for(producer.stop(), timeout=30)


def _broker_call(settings: Settings, what: str, coro: Any) -> int:
    from aiokafka.errors import KafkaError

    try:
        asyncio.run(coro)
    except (KafkaError, OSError, TimeoutError) as exc:
        return _broker_unreachable(settings, what, exc)
    return 0


def _broker_unreachable(settings: Settings, what: str, exc: BaseException) -> int:
    """Say why the broker could not be used: aiokafka's own error only says "Unable to bootstrap"."""
    from aiokafka.errors import KafkaConnectionError

    detail = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, KafkaConnectionError):  # a refused login or TLS handshake ends up here too
        detail = asyncio.run(kafka_security.diagnose(settings, bootstrap_servers(settings.broker)))
    print(f"agents-stream {what}: cannot use the broker at {settings.broker} ({detail}); "
          "check KAFKA_BROKER and the AGENTS_STREAM_KAFKA_* settings", file=sys.stderr)
    return 1


def _cmd_decide(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from agents_stream.contract.models import ApprovalDecision

    settings = Settings.from_env()
    try:
        decision = ApprovalDecision(task_id=args.task_id, decision=args.decision, by=args.by, via="cli", comment=args.comment)
    except ValidationError as exc:
        print(f"agents-stream {args.decision}: {exc.errors()[0]['loc'][0]}: {exc.errors()[0]['msg']}", file=sys.stderr)
        return 2
    code = _broker_call(settings, args.decision, _send_one(settings, topics.APPROVALS, args.task_id.encode(), decision.model_dump_json().encode()))
    if code == 0:
        print(f"{args.decision} of {args.task_id} by {args.by} sent to {topics.APPROVALS}; the task's worker applies it "
              "(a task not awaiting approval ignores it, see agent.control)")
    return code


async def _job_wait(settings: Settings, job_id: str, timeout: float, submit: Any) -> dict[str, Any] | None:
    """Submit, then read agent.job.results from before the submission until the job's result arrives."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers(settings.broker), **kafka_security.client_kwargs(settings))
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


def _get_view(settings: Settings, path: str) -> tuple[int, Any]:
    """GET a worker's web view (any worker answers for any key: it forwards to the owner)."""
    import urllib.error
    import urllib.request

    url = settings.link_base().rstrip("/") + path
    try:
        with urllib.request.urlopen(url, timeout=15) as resp:  # noqa: S310 (the operator's own worker)
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _show(args: argparse.Namespace, path: str, render: Any) -> int:
    from urllib.parse import quote

    settings = Settings.from_env()
    try:
        status, body = _get_view(settings, path.format(quote(args.id, safe="")))
    except (OSError, ValueError) as exc:
        print(f"agents-stream: no worker answered at {settings.link_base()} ({exc}); set AGENTS_STREAM_PUBLIC_URL "
              "or WEB_HOST/WEB_PORT to a worker's web address", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(body, indent=2))
    elif status == 200:
        print(render(body))
    else:
        print(body.get("error", f"HTTP {status}"), file=sys.stderr)
    return 0 if status == 200 else 1


def _render_task(t: dict[str, Any]) -> str:
    lines = [f"task {t['task_id']}  agent {t['agent']}  state {t['state']}  attempts {t['dispatch']}"]
    if t.get("approval"):
        a = t["approval"]
        made = a.get("decision")
        lines.append(f"approval: {a.get('reason')}; level {a.get('level', 0) + 1}"
                     + (f"; {made['decision']} by {made['by']} via {made['via']}" if made else "; waiting"))
    r = t.get("result")
    if r:
        lines.append(f"result: {r['status']}  confidence {r['confidence']}  source {r['source'] or '-'}"
                     + (f"  error {r['error']}" if r.get("error") else ""))
        lines.append(f"output: {json.dumps(r['output'])[:500]}")
    return "\n".join(lines)


def _render_job(j: dict[str, Any]) -> str:
    lines = [f"job {j['job_id']}  {j['state']}" + (f"  ({j['reason']})" if j.get("reason") else "")]
    for step_id in j.get("order") or list(j.get("steps", {})):
        s = j["steps"][step_id]
        deps = ", ".join(s.get("depends_on") or []) or "-"
        lines.append(f"  {step_id:<20} {s['agent']:<20} {s['status']:<11} after {deps}")
    return "\n".join(lines)


def _cmd_tasks_show(args: argparse.Namespace) -> int:
    return _show(args, "/tasks/{}", _render_task)


def _cmd_jobs_status(args: argparse.Namespace) -> int:
    return _show(args, "/jobs/{}", _render_job)


def _cmd_jobs_watch(args: argparse.Namespace) -> int:
    """Follow a job through a worker's /jobs view: one line per step that changes, until the job ends."""
    from urllib.parse import quote

    settings = Settings.from_env()
    path = f"/jobs/{quote(args.id, safe='')}"
    deadline = time.monotonic() + args.timeout
    seen: dict[str, str] = {}
    while True:
        try:
            status, body = _get_view(settings, path)
        except (OSError, ValueError) as exc:
            print(f"agents-stream: no worker answered at {settings.link_base()} ({exc}); set AGENTS_STREAM_PUBLIC_URL "
                  "or WEB_HOST/WEB_PORT to a worker's web address", file=sys.stderr)
            return 1
        if status == 200:
            changes = {"job": body["state"], **{f"step {k}": v["status"] for k, v in body.get("steps", {}).items()}}
            for what, state in changes.items():
                if seen.get(what) != state:
                    seen[what] = state
                    at = time.strftime("%H:%M:%S")
                    print(json.dumps({"at": at, "what": what, "state": state}) if args.json else f"{at}  {what:<24} {state}", flush=True)
            if body["state"] in ("succeeded", "partial", "failed"):
                if not args.json:
                    print(_render_job(body))
                return 0 if body["state"] == "succeeded" else 3
        elif status != 404 and status != 503:  # unknown yet (just submitted) or a rebalance: ask again
            print(body.get("error", f"HTTP {status}"), file=sys.stderr)
            return 1
        if time.monotonic() > deadline:
            print(f"job {args.id}: not finished within {args.timeout:g}s (last: {seen.get('job', 'unknown')})", file=sys.stderr)
            return 1
        time.sleep(args.interval)


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
    send = _send_one(settings, topics.JOBS, request.job_id.encode(), value)
    if args.jobs_command == "submit" and args.wait:
        outcome: dict[str, Any] = {}

        async def run() -> None:
            outcome["result"] = await _job_wait(settings, request.job_id, args.wait, send)

        try:
            code = _broker_call(settings, "jobs submit", run())
        except ValueError as exc:
            print(f"agents-stream jobs submit: {exc}", file=sys.stderr)
            return 1
        if code:
            return code
        if outcome.get("result") is None:
            print(f"job {request.job_id}: no result within {args.wait:g}s (it may still finish; see /jobs/{request.job_id})", file=sys.stderr)
            return 1
        print(json.dumps(outcome["result"], indent=2))
        return 0 if outcome["result"]["status"] == "succeeded" else 3
    code = _broker_call(settings, f"jobs {args.jobs_command}", send)
    if code == 0:
        print(request.job_id)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agents-stream", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    worker = sub.add_parser("worker", help="run a worker (same as: faust -A agents_stream.app worker)")
    worker.add_argument("-l", "--loglevel", default=os.environ.get("AGENTS_STREAM_LOG_LEVEL", "info"))
    worker.set_defaults(func=_cmd_worker)

    publish = sub.add_parser("publish", help="publish tasks (JSON lines) to agent.tasks.<agent>")
    publish.add_argument("--agent", required=True, help="sub-agent name; its topic is agent.tasks.<agent>")
    publish.add_argument("file", nargs="?", default="-", help="JSON-lines file, or - for stdin")
    publish.add_argument("-q", "--quiet", action="store_true", help="do not print task ids")
    publish.add_argument("--rate", type=float, metavar="N", help="send at most N tasks per second (default: as fast as the broker takes them)")
    publish.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                         help="a progress bar on stderr (default: when stderr is a terminal)")
    publish.add_argument("--json", action="store_true", help="print one JSON summary instead of the task ids")
    publish.set_defaults(func=_cmd_publish)

    for verb, help_text in (("approve", "approve a task awaiting approval"), ("reject", "reject a task awaiting approval")):
        p = sub.add_parser(verb, help=help_text)
        p.add_argument("task_id")
        p.add_argument("--by", default=f"{os.environ.get('USER', 'operator')}@cli", help="who decides (recorded with the decision)")
        p.add_argument("--comment", help="why (recorded with the decision)")
        p.set_defaults(func=_cmd_decide, decision=verb)

    jobs = sub.add_parser("jobs", help="submit or cancel a job (a plan of tasks, or a goal for a planner agent)")
    jsub = jobs.add_subparsers(dest="jobs_command", required=True)
    submit = jsub.add_parser("submit", help="submit a JobRequest (JSON file, or - for stdin); prints the job id")
    submit.add_argument("file", nargs="?", default="-")
    submit.add_argument("--wait", type=float, metavar="SECONDS", help="wait for the job's result and print it (exit 0 only if succeeded)")
    submit.set_defaults(func=_cmd_jobs)
    jcancel = jsub.add_parser("cancel", help="cancel a job: unfinished steps are cancelled, the job ends with what is done")
    jcancel.add_argument("job_id")
    jcancel.add_argument("--by", default=f"{os.environ.get('USER', 'operator')}@cli")
    jcancel.add_argument("--reason", default="cancelled from the CLI")
    jcancel.set_defaults(func=_cmd_jobs)
    jstatus = jsub.add_parser("status", help="a job's steps and their state, from a worker's /jobs view")
    jstatus.add_argument("id", metavar="JOB_ID")
    jstatus.add_argument("--json", action="store_true", help="the view's JSON as is")
    jstatus.set_defaults(func=_cmd_jobs_status)

    jwatch = jsub.add_parser("watch", help="follow a job: a line per step state change until it ends (exit 0 only if it succeeded)")
    jwatch.add_argument("id", metavar="JOB_ID")
    jwatch.add_argument("--timeout", type=float, default=3600.0, help="give up after this many seconds (exit 1)")
    jwatch.add_argument("--interval", type=float, default=1.0, help="seconds between looks")
    jwatch.add_argument("--json", action="store_true", help="one JSON object per change")
    jwatch.set_defaults(func=_cmd_jobs_watch)

    tasks = sub.add_parser("tasks", help="look up a task in the ledger (through a worker's /tasks view)")
    tsub = tasks.add_subparsers(dest="tasks_command", required=True)
    tshow = tsub.add_parser("show", help="a task's state, approval and result")
    tshow.add_argument("id", metavar="TASK_ID")
    tshow.add_argument("--json", action="store_true", help="the view's JSON as is")
    tshow.set_defaults(func=_cmd_tasks_show)

    fake = sub.add_parser("fake-llm", help="run the fake LLM server (Gemini, OpenAI and Anthropic APIs)", add_help=False)
    fake.add_argument("rest", nargs=argparse.REMAINDER)
    fake.set_defaults(func=_cmd_fake_llm)

    dead = sub.add_parser("dlq", help="list, show and requeue dead-lettered tasks")
    dsub = dead.add_subparsers(dest="dlq_command", required=True)
    for name, help_text in (("list", "list dead letters (newest last)"), ("requeue", "send dead letters back to their task topic")):
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
            p.add_argument("refs", nargs="*", metavar="REF", help="agent.tasks.<agent>.dlq:<partition>:<offset> as `dlq list` prints")
            p.add_argument("--all", action="store_true", help="every dead letter the filters select")
            p.add_argument("--dry-run", action="store_true", help="print what would be requeued")
    show = dsub.add_parser("show", help="one dead letter: headers, history and the original message")
    show.add_argument("ref", metavar="REF")
    show.set_defaults(func=_cmd_dlq)

    settings = sub.add_parser("settings", help="print every setting, its environment name and value")
    settings.set_defaults(func=_cmd_settings)

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["fake-llm"]:
        # its own options (--port, --latency, ...) belong to fakellm.main
        from agents_stream.testing import fakellm

        return fakellm.main(argv[1:]) or 0
    args = parser.parse_args(argv)
    from aiokafka.errors import KafkaConnectionError

    try:
        return args.func(args)
    except kafka_security.KafkaSecurityError as exc:
        print(f"agents-stream {args.command}: {exc}", file=sys.stderr)
        return 2
    except KafkaConnectionError as exc:  # commands that do not handle it themselves (publish)
        return _broker_unreachable(Settings.from_env(), args.command, exc)


if __name__ == "__main__":
    sys.exit(main())

"""``agents-stream tasks show`` (``tasks cancel`` is cli_approvals'), and the worker web views the task and job
commands read (``/tasks``, ``/jobs``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable

from agents_stream.ops.cli_approvals import cancel_task
from agents_stream.ops.cli_common import AddParser, operator_token, printable, printable_tree
from agents_stream.settings import Settings

__all__ = ["get_view", "no_worker", "register", "render_job", "render_transcript", "show"]


def register(add_parser: AddParser) -> None:
    tasks = add_parser("tasks", help="look up a task in the ledger (through a worker's /tasks view)")
    tsub = tasks.add_subparsers(dest="tasks_command", required=True)
    tshow = tsub.add_parser("show", help="a task's state, approval and result")
    tshow.add_argument("id", metavar="TASK_ID")
    tshow.add_argument("--json", action="store_true", help="the view's JSON as is")
    tshow.set_defaults(func=_cmd_tasks_show)
    tcancel = tsub.add_parser(
        "cancel", help="cancel a task: running, parked or waiting for sub-tasks (they are cancelled too)",
    )
    tcancel.add_argument("id", metavar="TASK_ID")
    tcancel.add_argument("--by", default=f"{os.environ.get('USER', 'operator')}@cli",
                         help="who cancels (in the task's result)")
    tcancel.add_argument("--reason", default="cancelled from the CLI", help="why (in the task's result)")
    tcancel.add_argument("--agent", help="the task's agent: a task not read yet is cancelled too (needs the secret)")
    tcancel.set_defaults(func=cancel_task)


def get_view(settings: Settings, path: str) -> tuple[int, Any]:
    """GET a worker's web view (any worker answers for any key: it forwards to the owner), with the read token
    the workers ask for (cli_common.operator_token: AGENTS_STREAM_READ_TOKEN, else AGENTS_STREAM_API_TOKEN, else
    the local operator token for a worker on this machine)."""
    import urllib.error
    import urllib.request

    url = settings.link_base().rstrip("/") + path
    token = operator_token(settings)
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=15) as resp:  # noqa: S310 (the operator's own worker)
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def no_worker(settings: Settings, exc: BaseException) -> int:
    """Say that no worker answered, and how to point the command at one."""
    print(f"agents-stream: no worker answered at {settings.link_base()} ({exc}); set AGENTS_STREAM_PUBLIC_URL "
          "or WEB_HOST/WEB_PORT to a worker's web address", file=sys.stderr)
    return 1


def show(args: argparse.Namespace, path: str, render: Callable[[Any], str]) -> int:
    from urllib.parse import quote

    settings = Settings.from_env()
    try:
        status, body = get_view(settings, path.format(quote(args.id, safe="")))
    except (OSError, ValueError) as exc:
        return no_worker(settings, exc)
    if args.json:
        print(json.dumps(body, indent=2))  # JSON escapes control characters itself
    elif status == 401:
        print(f"agents-stream: the worker at {settings.link_base()} refused the read (401): set "
              "AGENTS_STREAM_READ_TOKEN or AGENTS_STREAM_API_TOKEN to one of its tokens (a worker `make run` started "
              "on this machine: run the command in its clone, which has .data/operator-token)", file=sys.stderr)
    elif status == 200:
        # what producers wrote cannot rewrite the terminal; a newline in it prints as an indented line
        print(render(printable_tree(body, newlines=True)))
    else:
        print(printable(str(body.get("error", f"HTTP {status}"))), file=sys.stderr)
    return 0 if status == 200 else 1


def _render_task(t: dict[str, Any]) -> str:
    lines = [f"task {t['task_id']}  agent {t['agent']}  state {t['state']}  attempts {t['dispatch']}"]
    if t.get("approval"):
        a = t["approval"]
        made = a.get("decision")
        lines.append(f"approval: {a.get('reason')}; level {a.get('level', 0) + 1}"
                     + (f"; {made['decision']} by {made['by']} via {made['via']}" if made else "; waiting")
                     + ("; UNSIGNED (no valid signature on the decision event)" if made and not made.get("signed", True)
                        else ""))
        if t["state"] == "awaiting_approval":  # what approve|reject --parked names (ops/cli_approvals.py)
            call = a.get("call") or {}
            lines.append(f"parked {a.get('parked')}" + (f" at tool call {call.get('tool')} ({call.get('id')})"
                                                         if call else "")
                         + f"; decide: agents-stream approve|reject {t['task_id']} --parked {a.get('parked')}")
    r = t.get("result")
    if r:
        lines.append(f"result: {r['status']}  confidence {r['confidence']}  source {r['source'] or '-'}"
                     + (f"  error {r['error']}" if r.get("error") else ""))
        output = r["output"]  # a text as it reads (its newlines too), anything else as JSON
        lines.append(f"output: {output[:500] if isinstance(output, str) else json.dumps(output)[:500]}")
    progress = t.get("progress") or {}
    if progress and not r:
        lines.append(f"checkpointed: {progress['steps_done']} step(s) so far")
    journal = (r or {}).get("transcript") or progress.get("transcript")
    if journal:
        lines += render_transcript(journal)
    return "\n".join(lines)


def render_transcript(transcript: dict[str, Any]) -> list[str]:
    """An agent loop's turns and tool calls as a timeline, one line each."""
    calls: dict[int, list[dict[str, Any]]] = {}
    for c in transcript.get("tool_calls", []):
        calls.setdefault(c["turn"], []).append(c)
    lines = ["timeline:"]
    route = transcript.get("route")
    if isinstance(route, dict):  # a routed agent's task: the handler its route chose, and each escalation
        used = route.get("usage") or {}
        cost = f", {used['cost']:.6f} USD" if used.get("cost") is not None else ""
        lines.append(f"  route  → {route.get('first')} by {route.get('by')}: {route.get('reason')}"
                     + (f" ({route.get('source')}{cost})" if route.get("source") else ""))
        for e in route.get("escalations") or []:
            lines.append(f"  escalated {e.get('from')} → {e.get('to')}: {e.get('reason')}")
    for turn in transcript.get("turns", []):
        u = turn.get("usage") or {}
        cost = f"  {u['cost']:.6f} USD" if u.get("cost") is not None else ""
        asked = ", ".join(turn["tool_calls"]) or "final answer"
        lines.append(f"  turn {turn['turn']:<3} {turn['source']}  {u.get('input_tokens', 0)} in / "
                     f"{u.get('output_tokens', 0)} out{cost}  → {asked}")
        for c in calls.get(turn["turn"], []):
            tries = f"{c['attempts']} attempt{'s' if c['attempts'] != 1 else ''}"
            said = f": {c['detail']}" if c.get("detail") else ""
            lines.append(f"    {c['name']} ({c['id']})  {'error' if c['error'] else 'ok'}  {tries}{said}")
    return lines


def render_job(j: dict[str, Any]) -> str:
    lines = [f"job {j['job_id']}  {j['state']}" + (f"  ({j['reason']})" if j.get("reason") else "")]
    for step_id in j.get("order") or list(j.get("steps", {})):
        s = j["steps"][step_id]
        deps = ", ".join(s.get("depends_on") or []) or "-"
        lines.append(f"  {step_id:<20} {s['agent']:<20} {s['status']:<11} after {deps}")
    return "\n".join(lines)


def _cmd_tasks_show(args: argparse.Namespace) -> int:
    return show(args, "/tasks/{}", _render_task)

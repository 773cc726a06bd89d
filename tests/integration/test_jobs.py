"""Jobs on the real broker: a plan fanned out over three agents with a dependency chain and fanned back in,
through a worker SIGKILL; a planner agent's plan; deadline and cancel; bad requests dead-lettered."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections import Counter
from typing import Any
from urllib.parse import quote

import pytest

from agents_stream.contract import topics
from agents_stream.testing.fakellm import ok

from .harness import BOOTSTRAP, READ_TOKEN, ROOT, eventually, produce, read_topic, results_for, unique

#: one orchestrating app at a time: every app that runs jobs reads the shared agent.jobs and answers what it reads
pytestmark = pytest.mark.exclusive


def job_results(job_id: str, timeout: float = 90) -> Any:
    return read_topic(topics.JOB_RESULTS, timeout=timeout, until=lambda s: len(s) >= 1,
                      keep=lambda m: m.key == job_id.encode())


def calls(fake: Any, job_id: str) -> Counter:
    """Provider calls per step of the job (its task ids are <job_id>/<step>)."""
    return Counter(
        r.task_id.split("/", 1)[1] for r in fake.requests if r.task_id and r.task_id.startswith(job_id + "/")
    )


def chain_plan(researcher: str, writer: str, reviewer: str) -> dict:
    return {"tasks": [
        {"id": "facts", "agent": researcher, "instruction": "collect facts about tidal power"},
        {"id": "draft", "agent": writer, "instruction": "write a paragraph from the facts", "depends_on": ["facts"]},
        {"id": "review", "agent": reviewer, "instruction": "review the draft", "depends_on": ["draft"]},
        {"id": "final", "agent": writer, "instruction": "apply the review to the draft",
         "depends_on": ["facts", "review"]},
    ]}


async def test_job_of_four_tasks_over_three_agents_survives_a_worker_kill(cluster_factory, fake_llm):
    """Kill the worker running the second step: the job still completes once, with the final step's output;
    no finished step reaches the provider again, and each step saw its upstream outputs."""
    agents = [unique("researcher"), unique("writer"), unique("reviewer")]
    c = cluster_factory(agents, fake_llm.url, AGENTS_STREAM_JOBS="1")
    workers = [await c.started("w0"), await c.started("w1")]
    await fake_llm.set_mode(latency=2.0)
    job_id = unique("job")
    await produce(topics.JOBS,
                  [(job_id.encode(), json.dumps({"job_id": job_id, "plan": chain_plan(*agents)}).encode())])

    draft = f"{job_id}/draft"
    await eventually(lambda: any(r.task_id == draft for r in fake_llm.requests), timeout=60,
                     what="the draft step in flight")
    owner = (await workers[0].get(f"/tasks/{quote(draft, safe='')}"))["owner"]  # routed to the task's partition owner
    victim = next(w for w in workers if f":{w.proc.pid}:" in owner)
    victim.kill()
    survivor = next(w for w in workers if w is not victim)

    got = await job_results(job_id, timeout=120)
    # One distinct result: an event redelivered after the job ended re-emits the stored bytes (as tasks do).
    assert len({m.value for m in got}) == 1, f"one distinct job result, got {[m.value for m in got]}"
    result = json.loads(got[0].value)
    assert result["status"] == "succeeded", json.dumps(result)
    assert {s: v["status"] for s, v in result["steps"].items()} == dict.fromkeys(
        ["facts", "draft", "review", "final"], "succeeded")
    assert list(result["output"]) == ["final"], "only the sink's output is embedded; the others are referenced"
    assert result["steps"]["draft"]["task_id"] == draft

    per_step = calls(fake_llm, job_id)
    assert per_step["facts"] == 1 and per_step["review"] == 1 and per_step["final"] == 1, per_step
    assert per_step["draft"] in (1, 2), per_step  # the call in flight on the killed worker may run again
    task_results = await results_for({f"{job_id}/{s}" for s in ("facts", "draft", "review", "final")}, timeout=30)
    # outputs reach the next prompt inside its context JSON
    facts = json.dumps(json.loads(task_results[f"{job_id}/facts"][0].value)["output"])
    draft_calls = [r for r in fake_llm.requests if r.task_id == draft]
    assert all(facts[:60] in r.instruction for r in draft_calls), "the draft step was given the facts step's output"
    final_calls = [r for r in fake_llm.requests if r.task_id == f"{job_id}/final"]
    review = json.dumps(json.loads(task_results[f"{job_id}/review"][0].value)["output"])
    assert review[:60] in final_calls[0].instruction and facts[:60] in final_calls[0].instruction
    record = await survivor.get(f"/jobs/{job_id}")
    assert record["state"] == "succeeded" and record["result"] == result
    print(f"\njob: 4 steps over 3 agents, worker killed during 'draft'; provider calls per step {dict(per_step)}; "
          f"job result records {len(got)} (1 distinct)")


async def test_planner_deadline_cancel_and_bad_requests(cluster_factory, fake_llm):
    """A planner agent's plan runs; an invalid plan fails the job after the format retries; a deadline and a
    cancel end jobs with what is done; a request that is not a JobRequest is dead-lettered."""
    agents = [unique("planner"), unique("worker"), unique("gated")]
    planner, worker, gated = agents
    policy = (
        f'[agents.{gated}.approval]\nalways = true\n'
        f'[[agents.{gated}.approval.levels]]\nname = "lead"\ntimeout_s = 600\n'
    )
    c = cluster_factory(agents, fake_llm.url, extra=policy, AGENTS_STREAM_JOBS="1")
    await c.started()

    plan = {"tasks": [{"id": "a", "agent": worker, "instruction": "step a"},
                      {"id": "b", "agent": worker, "instruction": "step b", "depends_on": ["a"]}]}
    fake_llm.enqueue(ok(json.dumps(plan)))
    planned = unique("job")
    await produce(topics.JOBS,
                  [(planned.encode(),
                    json.dumps({"job_id": planned, "goal": "do two things", "planner": planner}).encode())])
    result = json.loads((await job_results(planned))[0].value)
    assert result["status"] == "succeeded" and set(result["steps"]) == {"a", "b"} and list(result["output"]) == ["b"], \
        json.dumps(result)
    plan_call = next(r for r in fake_llm.requests if r.task_id == f"{planned}/plan")
    assert "do two things" in plan_call.instruction and worker in plan_call.instruction
    cli_env = {**os.environ, "KAFKA_BROKER": f"kafka://{BOOTSTRAP}", "WEB_PORT": str(c.workers[0].web_port),
               "AGENTS_STREAM_READ_TOKEN": READ_TOKEN}  # the CLI's reads carry the token the workers ask for

    def cli(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "agents_stream.ops.cli", *argv], cwd=ROOT, env=cli_env,
                              capture_output=True, text=True, timeout=60)

    watched = cli("jobs", "watch", planned, "--json", "--timeout", "30")
    changes = [json.loads(line) for line in watched.stdout.splitlines()]
    assert watched.returncode == 0 and {(c["what"], c["state"]) for c in changes} == {
        ("job", "succeeded"), ("step a", "succeeded"), ("step b", "succeeded")}, watched
    status = cli("jobs", "status", planned)
    assert status.returncode == 0 and f"job {planned}  succeeded" in status.stdout, status
    assert [line.split()[:3] for line in status.stdout.splitlines()[1:]] == [["a", worker, "succeeded"],
                                                                             ["b", worker, "succeeded"]]
    shown = cli("tasks", "show", f"{planned}/b")
    assert shown.returncode == 0 and "state succeeded" in shown.stdout and "result: succeeded" in shown.stdout, shown
    as_json = json.loads(cli("tasks", "show", f"{planned}/b", "--json").stdout)
    assert as_json["task_id"] == f"{planned}/b" and as_json["result"]["job_id"] == planned
    missing = cli("jobs", "status", "no-such-job")
    assert missing.returncode == 1 and "unknown job_id" in missing.stderr

    fake_llm.enqueue(ok("no plan here"), ok("still none"), ok('{"tasks": []}'))
    unplanned = unique("job")
    await produce(topics.JOBS,
                  [(unplanned.encode(), json.dumps({"job_id": unplanned, "goal": "g", "planner": planner}).encode())])
    result = json.loads((await job_results(unplanned))[0].value)
    assert result["status"] == "failed" and result["reason"].startswith("planner_failed"), json.dumps(result)
    assert calls(fake_llm, unplanned) == Counter({"plan": 3}), (
        "the planner's answer was retried for format, then the job failed"
    )

    await fake_llm.set_mode(latency=4.0)
    late = unique("job")
    one = {"tasks": [{"id": "slow", "agent": worker, "instruction": "slow"}]}
    await produce(topics.JOBS, [(late.encode(), json.dumps({"job_id": late, "plan": one, "timeout_s": 1.5}).encode())])
    result = json.loads((await job_results(late))[0].value)
    assert (result["status"], result["reason"], result["steps"]["slow"]["status"]) == ("failed", "deadline_exceeded",
                                                                                       "cancelled")

    await fake_llm.set_mode(latency=60.0)  # step x is still calling when the cancel comes
    cancelled = unique("job")
    two = {"tasks": [{"id": "x", "agent": worker, "instruction": "x"},
                     {"id": "y", "agent": worker, "instruction": "y", "depends_on": ["x"]}]}
    await produce(topics.JOBS, [(cancelled.encode(), json.dumps({"job_id": cancelled, "plan": two}).encode())])
    await eventually(lambda: any(r.task_id == f"{cancelled}/x" for r in fake_llm.requests), timeout=30,
                     what="step x in flight")
    env = {**os.environ, "KAFKA_BROKER": f"kafka://{BOOTSTRAP}"}
    out = subprocess.run([sys.executable, "-m", "agents_stream.ops.cli", "jobs", "cancel", cancelled, "--by", "ops",
                          "--reason", "wrong input"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    result = json.loads((await job_results(cancelled))[0].value)
    assert result["status"] == "failed" and result["reason"] == "cancelled by ops: wrong input"
    assert {s: v["status"] for s, v in result["steps"].items()} == {"x": "cancelled", "y": "cancelled"}
    step_x = json.loads((await results_for({f"{cancelled}/x"}, timeout=30))[f"{cancelled}/x"][0].value)
    assert (step_x["source"], step_x["error"]) == (
        "cancel", f"cancelled by job:ops: its job {cancelled} ended (cancelled by ops: wrong input)"), (
        "the running step was cancelled, its call stopped"
    )
    await asyncio.sleep(5)
    assert calls(fake_llm, cancelled) == Counter({"x": 1}), "nothing after the cancel was dispatched"

    parked = unique("job")
    await produce(topics.JOBS,
                  [(parked.encode(),
                    json.dumps({"job_id": parked,
                                "plan": {"tasks": [{"id": "pay", "agent": gated, "instruction": "pay"}]}}).encode())])
    step = f"{parked}/pay"
    await eventually(lambda: _parked(c.workers[0], step), timeout=30, what="the gated step parked for approval")
    await produce(topics.JOBS,
                  [(parked.encode(),
                    json.dumps({"job_id": parked, "action": "cancel", "by": "ops", "reason": "no"}).encode())])
    result = json.loads((await job_results(parked))[0].value)
    assert result["status"] == "failed" and result["steps"]["pay"]["status"] == "cancelled"
    step_result = json.loads((await results_for({step}, timeout=30))[step][0].value)
    assert step_result["source"] == "cancel" and step_result["error"] == (
        f"cancelled by job:ops: its job {parked} ended (cancelled by ops: no)"), (
        "the parked step was cancelled"
    )
    assert calls(fake_llm, parked) == Counter(), "a step of a cancelled job never runs"

    bad = unique("job")
    await produce(topics.JOBS, [(bad.encode(), json.dumps({"job_id": bad}).encode()), (bad.encode(), b"{not json")])
    dead = await read_topic(topics.dlq_of(topics.JOBS), timeout=30, until=lambda s: len(s) >= 2,
                            keep=lambda m: m.key == bad.encode())
    reasons = sorted(dict(m.headers)["error_reason"].decode() for m in dead)
    assert reasons[0].startswith("not_json") and "exactly one of plan or goal" in reasons[1], reasons


async def _parked(worker: Any, task_id: str) -> bool:
    body = await worker.get(f"/tasks/{quote(task_id, safe='')}")
    return isinstance(body, dict) and body.get("state") == "awaiting_approval"

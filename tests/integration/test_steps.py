"""Step checkpoints: a multi-step task killed mid-way re-runs only the steps it had not finished."""

from __future__ import annotations

import json

from agents_stream.contract import topics
from agents_stream.testing.fakellm import hang, ok

from .harness import encode, eventually, produce, results_for, task, unique


def calls_per_step(fake, task_id: str, steps: int) -> list[int]:
    return [
        sum(1 for r in fake.requests if r.task_id == task_id and f"Step {i + 1} of {steps}:" in r.instruction)
        for i in range(steps)
    ]


async def test_a_killed_multi_step_task_reruns_only_the_unfinished_step(cluster_factory, fake_llm):
    """SIGKILL during step 3 of 3: after the restart steps 1 and 2 are not called again;
    the result has all three outputs."""
    agent = unique("analyzer")
    c = cluster_factory([agent], fake_llm.url)
    await c.started("a")
    fake_llm.enqueue(ok("first"), ok("second"), hang(60))
    t = task(agent, steps=["collect the facts", "weigh them", "write the verdict"])
    await produce(topics.task_topic(agent), [encode(t)])
    await eventually(lambda: calls_per_step(fake_llm, t["task_id"], 3)[2] == 1, timeout=60, what="step 3 in flight")
    c.workers[0].kill()
    fake_llm.default = ok("third")
    await c.started("a")  # the same worker restarted: it takes the task over once the lease lapses
    result = json.loads((await results_for({t["task_id"]}, timeout=90))[t["task_id"]][0].value)
    calls = calls_per_step(fake_llm, t["task_id"], 3)
    print(f"\nsteps: provider calls per step {calls}; output {result['output']}")
    assert result["status"] == "succeeded" and result["output"] == ["first", "second", "third"]
    assert calls == [1, 1, 2], "only the interrupted step ran again"
    later = [r for r in fake_llm.requests if r.task_id == t["task_id"] and "Step 3 of 3:" in r.instruction][-1]
    assert "first" in json.dumps(later.body) and "second" in json.dumps(later.body), (
        "later steps see the earlier outputs"
    )

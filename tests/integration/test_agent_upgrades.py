"""Upgrades while loops run, on the real broker: a worker runs two support loops on agent code v1 and is SIGKILLed
while each loop's refund is in flight (it took effect; its result is not journaled); the worker comes back on v2
code of the same agents (the module files rewritten, as a rolling restart deploys them). One v2 changed the
instructions and added a tool: its loop finishes, each side effect once. The other v2 removed `refund`: its task
fails `agent_upgrade` with a dead letter, and no tool is called in the refund's place."""

from __future__ import annotations

import json
import time
from pathlib import Path

from agents_stream.contract import topics
from agents_stream.examples.services import FakeServices
from agents_stream.testing.fakellm import FakeLLM

from .harness import encode, eventually, produce, read_topic, unique
from .test_agents import order_task, providers_toml, result_of, support_script, turn_of, turns_asked

V1 = '''
from agents_stream.examples.support import create_label, lookup_order, notify_customer, refund
from agents_stream.execution.agent_definitions import Agent

SUPPORT = Agent("support", instructions="You resolve customer support requests. Refund at most the order's amount.",
                tools=[lookup_order, create_label, refund, notify_customer], max_turns=8, version="1")
'''

#: v2 with new instructions and a tool added
V2_ADDED = '''
from agents_stream.examples.support import create_label, lookup_order, notify_customer, refund
from agents_stream.execution.agent_definitions import Agent
from agents_stream.execution.tools import tool


@tool
async def escalate(reason: str) -> str:
    """Hand the case to a human."""
    return "escalated"


SUPPORT = Agent("support", instructions="You resolve customer support requests. Apologise for the wait.",
                tools=[lookup_order, create_label, refund, notify_customer, escalate], max_turns=8, version="2")
'''

#: v2 without the refund tool
V2_REMOVED = '''
from agents_stream.examples.support import create_label, lookup_order, notify_customer
from agents_stream.execution.agent_definitions import Agent

SUPPORT = Agent("support", instructions="You resolve customer support requests. Refunds go through finance.",
                tools=[lookup_order, create_label, notify_customer], max_turns=8, version="2")
'''


def agent_toml(agent: str, provider: str, module: str) -> str:
    return (f'[agents.{agent}]\nproviders = ["{provider}"]\nagent = "{module}:SUPPORT"\n'
            f'[[agents.{agent}.approval.levels]]\nname = "lead"\ntimeout_s = 600\n')


async def test_a_rolling_restart_onto_new_agent_code_continues_or_fails_each_loop_but_never_acts_wrongly(
    cluster_factory, fake_llm, tmp_path: Path,
):
    added, removed = unique("support_added"), unique("support_removed")
    mod_added, mod_removed = unique("support_added_def"), unique("support_removed_def")
    for module in (mod_added, mod_removed):
        (tmp_path / f"{module}.py").write_text(V1)
    async with FakeServices() as services, FakeLLM() as other_llm:
        toml = (providers_toml(fake_llm.url, ("openai",)) + providers_toml(other_llm.url, ("anthropic",), prefix="q")
                + agent_toml(added, "p_openai", mod_added) + agent_toml(removed, "q_anthropic", mod_removed))
        # no bytecode cache: the restarted worker must read the rewritten modules, whatever their mtimes
        c = cluster_factory([added, removed], None, toml=toml, AGENTS_STREAM_REFUND_SERVICES=services.url,
                            PYTHONPATH=str(tmp_path), PYTHONDONTWRITEBYTECODE="1")
        await c.started("a")
        ta, tr = order_task(added), order_task(removed)
        script_a, script_r = (support_script(t["context_data"]["order_id"]) for t in (ta, tr))
        fake_llm.enqueue(*script_a[:2])
        other_llm.enqueue(*script_r[:2])
        services.delay("payment.refund", 30.0)  # each refund takes effect, its answer (and so its journal) waits
        await produce(topics.task_topic(added), [encode(ta)])
        await produce(topics.task_topic(removed), [encode(tr)])
        mine = lambda t, op: [k for k in services.executed(op) if k.startswith(t["task_id"] + ":")]  # noqa: E731
        await eventually(lambda: mine(ta, "payment.refund") and mine(tr, "payment.refund"), timeout=60,
                         what="both refunds in flight")
        c.workers[0].kill()
        killed_at = time.time()
        services.delay("payment.refund", 0)

        # The rolling restart: the same agents, new code.
        (tmp_path / f"{mod_added}.py").write_text(V2_ADDED)
        (tmp_path / f"{mod_removed}.py").write_text(V2_REMOVED)
        fake_llm.enqueue(*script_a[2:])
        await c.started("a")
        done, failed = await result_of(ta), await result_of(tr)
        dead = await read_topic(topics.dlq_topic(removed), timeout=30, until=lambda s: len(s) >= 1)

    # (a) new instructions and a tool added: the loop finishes, each effect once, the refund's key asked again
    calls_a = [x for x in services.calls if x.key.startswith(ta["task_id"] + ":")]
    print(f"\nupgrades: added: {[(x.operation, x.key, x.replay) for x in calls_a]} → {done.get('output')!r}")
    assert done["status"] == "succeeded" and done["output"] == "Refunded 42.50 and sent a return label.", done
    for op in ("orders.lookup", "carrier.label", "payment.refund", "mail.send"):
        assert len(mine(ta, op)) == 1, f"{op} took effect once: {calls_a}"
    assert [x.replay for x in calls_a if x.operation == "payment.refund"] == [False, True], (
        "the refund in flight at the kill is asked again under its first key, and has no second effect")
    assert turns_asked(fake_llm, ta["task_id"]) == [0, 1, 2, 3], "no journaled turn is asked again"
    turn2 = next(r for r in fake_llm.requests if r.task_id == ta["task_id"] and turn_of(r) == 2)
    assert "Apologise for the wait" in json.dumps(turn2.body) and "escalate" in json.dumps(turn2.body), (
        "the model sees v2's instructions and tools from the first turn v2 asks")
    versions = [t["version"].split("+")[0] for t in done["transcript"]["turns"]]
    assert versions == ["1", "1", "2", "2"], done["transcript"]

    # (b) the refund tool removed: the task fails agent_upgrade, dead-lettered, and nothing ran in the refund's place
    calls_r = [x for x in services.calls if x.key.startswith(tr["task_id"] + ":")]
    print(f"upgrades: removed: {[(x.operation, x.key) for x in calls_r]} → {failed.get('error')!r}")
    assert failed["status"] == "failed", failed
    assert failed["error"].startswith("the journal's next step (turn 1, call "), failed["error"]
    assert "calls tool 'refund', which this version of agent" in failed["error"]
    assert "journal version 1+" in failed["error"] and "code version 2+" in failed["error"]
    assert [x for x in calls_r if x.at > killed_at] == [], "no service was called for the task after the upgrade"
    assert not mine(tr, "mail.send") and len(mine(tr, "payment.refund")) == 1
    assert turns_asked(other_llm, tr["task_id"]) == [0, 1], "the model was not asked what to do instead"
    headers = {k: v.decode() for k, v in dead[0].headers}
    assert dead[0].key.decode() == tr["task_id"] and headers["error_layer"] == "downstream"
    assert headers["error_reason"].startswith("agent_upgrade: the journal's next step"), headers

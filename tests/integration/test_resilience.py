"""Shared breakers, Retry-After, the fallback ladder, format retries, routing and cost on the real broker.

Each test runs real worker processes against fake LLM servers over HTTP; the
counts that matter are printed (run with ``-s`` to see them).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

import pytest

from agents_stream.config import Price
from agents_stream.contract import topics
from agents_stream.execution import pricing
from agents_stream.execution.outputs import SIMPLIFY_PREFIX
from agents_stream.testing.fakellm import FakeLLM, ok, status

from .harness import encode, eventually, produce, read_topic, results_for, task, uncommitted, unique


def provider(name: str, fake: FakeLLM, *, kind: str = "openai", model: str | None = None, **extra: Any) -> str:
    base = f"{fake.url}/v1" if kind == "openai" else fake.url
    lines = [f"[providers.{name}]", f'kind = "{kind}"', f'base_url = "{base}"', f'model = "{model or name + "-model"}"',
             "timeout_s = 5"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in extra.items()]
    return "\n".join(lines) + "\n\n"


def agent_toml(name: str, **fields: Any) -> str:
    lines = [f"[agents.{name}]"]
    for k, v in fields.items():
        lines.append(f"{k} = {_toml_value(v)}")
    return "\n".join(lines) + "\n\n"


def _toml_value(v: Any) -> str:
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(v)


def decoded(results: dict[str, list[Any]]) -> dict[str, dict[str, Any]]:
    """One result per task_id, asserting that redeliveries (if any) were byte-identical."""
    out = {}
    for task_id, msgs in results.items():
        assert len({m.value for m in msgs}) == 1, f"{task_id} has conflicting results"
        out[task_id] = json.loads(msgs[0].value)
    return out


async def produce_paced(topic: str, tasks: list[dict[str, Any]], per_second: float) -> None:
    batch = max(1, int(per_second / 4))
    started = time.monotonic()
    for i in range(0, len(tasks), batch):
        await produce(topic, [encode(t) for t in tasks[i:i + batch]])
        due = started + (i + batch) / per_second
        await asyncio.sleep(max(0.0, due - time.monotonic()))

#: the primary's outage in the two-worker breaker test (seconds)
OUTAGE_S = 25.0


async def test_breaker_shared_by_two_workers_bounds_calls_to_a_down_primary(cluster_factory):
    """Primary down 25 s while 800 tasks flow through 2 workers: the primary gets a bounded number of calls,
    the alternate answers with confidence=medium, the breaker closes afterwards and traffic returns to the primary."""
    threshold, open_timeout, probes, max_conc = 5, 5.0, 1, 8
    async with FakeLLM() as primary, FakeLLM() as alternate:
        await primary.set_mode(latency=0.02)
        await alternate.set_mode(latency=0.02)
        agent = unique("analyzer")
        toml = (
            f"[breaker]\nfailure_threshold = {threshold}\nsuccess_threshold = 2\nopen_timeout_s = {open_timeout}\n"
            f"window_s = 30\nhalf_open_probes = {probes}\n\n"
            + provider("primary", primary, max_concurrency=max_conc)
            + provider("alternate", alternate, kind="anthropic")
            + agent_toml(agent, providers=["primary", "alternate"])
        )
        c = cluster_factory([agent], None, toml=toml)
        await asyncio.gather(c.started("a"), c.started("b"))
        ts = [task(agent, n=i) for i in range(800)]
        ids = [t["task_id"] for t in ts]
        feeding = asyncio.ensure_future(produce_paced(topics.task_topic(agent), ts, per_second=20))  # ~40 s
        await asyncio.sleep(5)
        outage_start = time.time()
        await primary.set_mode(outage=True, outage_for=OUTAGE_S)
        await asyncio.sleep(OUTAGE_S)
        outage_end = time.time()
        await asyncio.wait_for(feeding, 60)
        results = decoded(await results_for(set(ids), timeout=120))

    assert set(results) == set(ids), "every task has one result"
    during = [r for r in primary.requests if outage_start <= r.ts < outage_end]
    windows = math.ceil(OUTAGE_S / open_timeout) + 1
    bound = threshold + max_conc + probes * windows
    by_source: dict[str, int] = {}
    for r in results.values():
        by_source[r["source"].split(":")[0]] = by_source.get(r["source"].split(":")[0], 0) + 1
    print(
        f"\nbreaker: primary got {len(during)} calls during its {OUTAGE_S:g} s outage "
        f"(bound {threshold} threshold + {max_conc} concurrency + {probes}x{windows} probes = {bound}); "
        f"results by tier {by_source}"
    )
    assert len(during) <= bound
    for r in results.values():
        assert r["status"] == "succeeded"
        if r["source"].startswith("alternate:"):
            assert r["confidence"] == "medium"
        else:
            assert r["source"].startswith("primary:") and r["confidence"] == "high"
    assert by_source.get("alternate", 0) >= 300, "tasks during the outage completed on the alternate"
    # The breaker closed after recovery, and the last tasks went to the primary again.
    assert all(results[i]["source"].startswith("primary:") for i in ids[-40:]), "traffic returned to the primary"
    def kinds_of(seen: list[Any]) -> list[str]:
        return [json.loads(m.value)["event"] for m in seen if outage_start - 1 <= _at(m) <= time.time()]

    events = await read_topic(  # both transitions were sent before the last results: read until they are seen
        topics.CONTROL, timeout=20, until=lambda seen: {"breaker.open", "breaker.closed"} <= set(kinds_of(seen)),
        keep=lambda m: json.loads(m.value)["event"].startswith("breaker.") and m.key == b"primary",
    )
    kinds = kinds_of(events)
    print(f"breaker transitions seen: {kinds}")
    assert "breaker.open" in kinds and "breaker.closed" in kinds


def _at(msg: Any) -> float:
    return msg.timestamp / 1000.0


async def test_every_provider_down_holds_then_recovers_with_a_bounded_ramp(cluster_factory):
    """All providers down: tasks held and lag grows; on recovery all complete
    and the primary's concurrency stays within max_concurrency."""
    max_conc = 4
    async with FakeLLM() as primary, FakeLLM() as alternate:
        agent = unique("analyzer")
        toml = (
            "[breaker]\nfailure_threshold = 3\nsuccess_threshold = 1\nopen_timeout_s = 2\nwindow_s = 30\n\n"
            + provider("primary", primary, max_concurrency=max_conc, ramp_s=2.0)
            + provider("alternate", alternate, max_concurrency=2)
            + agent_toml(agent, providers=["primary", "alternate"])
        )
        c = cluster_factory([agent], None, toml=toml, AGENTS_STREAM_PRESENCE_INTERVAL_S="1")
        workers = await asyncio.gather(c.started("a"), c.started("b"))
        await primary.set_mode(outage=True)
        await alternate.set_mode(outage=True)
        ts = [task(agent, n=i) for i in range(200)]
        ids = {t["task_id"] for t in ts}
        await produce(topics.task_topic(agent), [encode(t) for t in ts])
        await read_topic(
            topics.CONTROL, timeout=60, until=lambda seen: len(seen) >= 1,
            keep=lambda m: json.loads(m.value)["event"] == "task.held" and json.loads(m.value)["subject"] in ids,
        )
        await asyncio.sleep(4)
        lag = await uncommitted(c.app_id, topics.task_topic(agent))
        calls_down = len(primary.requests) + len(alternate.requests)
        print(f"\nall down: lag {lag} of {len(ts)}, {calls_down} calls to the two providers while down")
        assert lag == len(ts), "no task committed while every provider is down"
        early = await read_topic("agent.results", until=lambda s: False, timeout=1,
                                 keep=lambda m: m.key and m.key.decode() in ids)
        assert early == [], "held tasks produce no result"

        await primary.set_mode(latency=0.3)
        await alternate.set_mode(latency=0.3)
        primary.peak_in_flight = alternate.peak_in_flight = 0
        await primary.set_mode(outage=False)
        await alternate.set_mode(outage=False)
        await asyncio.sleep(5)
        first_peak = (primary.peak_in_flight, alternate.peak_in_flight)
        results = decoded(await results_for(ids, timeout=120))
        if set(results) != ids:  # say where the rest are before failing
            for w in workers:
                print("worker", w.name, await w.get("/readyz"), json.dumps(await w.get("/circuits")))
            print("fake calls", len(primary.requests), len(alternate.requests), "in flight", primary.in_flight,
                  alternate.in_flight)
    print(
        f"recovery: peak concurrency in the first 5 s primary {first_peak[0]} (limit {max_conc}), alternate "
        f"{first_peak[1]} (limit 2)"
    )
    assert set(results) == ids
    assert first_peak[0] <= max_conc and first_peak[1] <= 2
    assert primary.peak_in_flight <= max_conc


async def test_retry_after_is_honoured_by_every_worker(cluster_factory):
    """A 429 with Retry-After seen by one worker stops new calls from both,
    apart from those started within the propagation delay."""
    retry_after = 3.0
    async with FakeLLM() as fake:
        await fake.set_mode(latency=0.2)
        agent = unique("analyzer")
        toml = provider("fake", fake) + agent_toml(agent, providers=["fake"])
        c = cluster_factory([agent], None, toml=toml, AGENTS_STREAM_MAX_IN_FLIGHT="8")
        workers = await asyncio.gather(c.started("a"), c.started("b"))
        ts = [task(agent, n=i) for i in range(400)]
        feeding = asyncio.ensure_future(produce_paced(topics.task_topic(agent), ts, per_second=40))
        await eventually(lambda: len(fake.requests) >= 40, timeout=60, what="steady traffic")
        fake.enqueue(status(429, retry_after=retry_after))
        await eventually(lambda: any(r.status == 429 for r in fake.requests), timeout=30, what="the 429")
        # The worker that did not see the 429 learned it through the log: how long that took, and when
        # each worker began to obey (wall clock, as the fake's): the one that saw it at its
        # Retry-After's start, the other once it folded the event.
        async def learned() -> list[tuple[float | None, float | None]] | None:
            views = [(await w.get("/circuits"))["providers"]["fake"] for w in workers]
            got = [(v["retry_after_propagation_s"], v["retry_after_until"]) for v in views]
            return got if any(p is not None for p, _ in got) else None

        views = await eventually(learned, timeout=10, interval=0.2, what="the other worker folding the 429")
        await asyncio.wait_for(feeding, 60)
        results = decoded(await results_for({t["task_id"] for t in ts}, timeout=120))
    hit = next(r for r in fake.requests if r.status == 429)
    t0 = hit.ts + 0.2  # when the 429 reached the worker
    inside = [r.ts - t0 for r in fake.requests if t0 < r.ts < t0 + retry_after]
    after = [r for r in fake.requests if r.ts >= t0 + retry_after]
    measured = [p for p, _ in views if p is not None]
    assert all(until is not None for _, until in views), "both workers obey the Retry-After"
    # A worker's window runs Retry-After seconds from when it began to obey.
    obeyed = max(until - retry_after + (p or 0.0) for p, until in views if until is not None) - t0
    print(f"\nRetry-After {retry_after:g}s: {len(inside)} calls started after the 429 and before it elapsed "
          f"(the last {max(inside, default=0.0) * 1000:.0f} ms after it); propagation to the other worker "
          f"{[round(v * 1000, 1) for v in measured]} ms; both workers obeyed {obeyed * 1000:.0f} ms after it")
    assert len(measured) == 1, "exactly one worker learned the 429 from the other"
    assert measured[0] < 1.0, "propagation under one second"
    assert obeyed < 1.0, "both workers obey within a second of the 429"
    # A call the fake records up to 50 ms after the worker started it is one the worker began before it knew.
    assert all(d <= obeyed + 0.05 for d in inside), (
        "calls inside the Retry-After window only until both workers knew of it"
    )
    assert after, "calls resume once Retry-After elapsed"
    assert len(results) == len(ts) and all(r["status"] == "succeeded" for r in results.values())


async def test_format_retry_corrects_then_dead_letters_what_never_validates(cluster_factory, fake_llm):
    """A malformed first answer gets one corrective retry; an answer that never validates ends failed
    and dead-lettered."""
    agent = unique("analyzer")
    schema = {"type": "object", "required": ["answer"], "properties": {"answer": {"type": "string"}}}
    toml = provider("fake", fake_llm) + agent_toml(agent, providers=["fake"], output_schema=schema, format_retries=2)
    c = cluster_factory([agent], None, toml=toml)
    await c.started()

    fake_llm.enqueue(ok("Sure! The answer is 42."), ok('{"answer": "42"}'))
    good = task(agent)
    await produce(topics.task_topic(agent), [encode(good)])
    result = decoded(await results_for({good["task_id"]}, timeout=60))[good["task_id"]]
    calls = [r for r in fake_llm.requests if r.task_id == good["task_id"]]
    assert result["status"] == "succeeded" and result["output"] == {"answer": "42"}
    assert len(calls) == 2, "exactly one corrective retry"
    assert "not JSON" in calls[1].instruction and '"answer"' in calls[1].instruction, (
        "the retry names the error and the schema"
    )

    fake_llm.enqueue(*[ok("still not JSON")] * 3)
    bad = task(agent)
    await produce(topics.task_topic(agent), [encode(bad)])
    result = decoded(await results_for({bad["task_id"]}, timeout=60))[bad["task_id"]]
    assert result["status"] == "failed" and result["confidence"] == "failed"
    assert len([r for r in fake_llm.requests if r.task_id == bad["task_id"]]) == 3, "1 + format_retries calls"
    dlq = await read_topic(topics.dlq_topic(agent), timeout=30, until=lambda s: len(s) >= 1)
    headers = {k: v.decode() for k, v in dlq[0].headers}
    assert headers["error_layer"] == "downstream" and headers["error_reason"].startswith("invalid_output")
    assert dlq[0].value == encode(bad)[1], "the original bytes"
    print(f"\nformat: corrective retry ok; exhausted → DLQ reason {headers['error_reason'][:80]!r}")


EASY = ["Translate 'good morning' into French.", "What is the capital of Italy?", "Spell 'necessary' backwards.",
        "Give a synonym for 'happy'."]
HARD = [
    "Compare the three pricing proposals in the context step by step and explain why one of them is best.",
    "Analyze the incident timeline and design a plan to prevent it from happening again.",
    "Evaluate both architectures and derive the expected cost of each over three years.",
]


async def test_router_sends_easy_tasks_to_the_light_tier_and_prices_every_call(cluster_factory):
    """Cheap-first: easy tasks are answered by the light model, hard ones by the primary;
    a low-confidence light answer escalates; cost = tokens x price."""
    async with FakeLLM(default=ok('{"answer": "from primary", "confidence": "high"}')) as primary, \
            FakeLLM(default=ok('{"answer": "from light", "confidence": "high"}')) as light:
        agent = unique("analyzer")
        schema = {"type": "object", "required": ["answer"]}
        toml = (
            '[prices]\n"primary-model" = { input_per_mtok = 2.0, output_per_mtok = 8.0 }\n'
            '"light-model" = { input_per_mtok = 0.1, output_per_mtok = 0.4 }\n\n'
            + provider("primary", primary) + provider("light", light)
            + agent_toml(agent, providers=["primary"], light="light", router="heuristic", output_schema=schema)
        )
        c = cluster_factory([agent], None, toml=toml)
        w = await c.started()
        easy = [task(agent, instruction=i) for i in EASY]
        hard = [task(agent, instruction=i) for i in HARD]
        await produce(topics.task_topic(agent), [encode(t) for t in easy + hard])
        results = decoded(await results_for({t["task_id"] for t in easy + hard}, timeout=60))

        light.default = ok('{"answer": "not sure", "confidence": "low"}')
        doubtful = task(agent, instruction="What colour is the sky?")
        await produce(topics.task_topic(agent), [encode(doubtful)])
        escalated = decoded(await results_for({doubtful["task_id"]}, timeout=60))[doubtful["task_id"]]
        scraped = await w.get("/metrics")

    for t in easy:
        assert results[t["task_id"]]["source"].startswith("light:"), t["instruction"]
    for t in hard:
        assert results[t["task_id"]]["source"].startswith("primary:"), t["instruction"]
    assert escalated["source"].startswith("primary:") and escalated["output"]["answer"] == "from primary"
    assert [r.task_id for r in light.requests].count(doubtful["task_id"]) == 1
    prices = {"primary": Price(input_per_mtok=2.0, output_per_mtok=8.0),
              "light": Price(input_per_mtok=0.1, output_per_mtok=0.4)}
    for t in easy + hard:
        r = results[t["task_id"]]
        tier = r["source"].split(":")[0]
        usage = r["usage"]
        assert usage["input_tokens"] > 0
        assert usage["cost"] == pricing.cost(prices[tier], usage["input_tokens"], usage["output_tokens"])
    spent = sum(results[t["task_id"]]["usage"]["cost"] for t in easy + hard) + escalated["usage"]["cost"]
    metric = sum(
        float(line.rsplit(" ", 1)[1]) for line in scraped.splitlines()
        if line.startswith("agents_stream_cost_usd_total{") and f'agent="{agent}"' in line
    )
    assert abs(metric - spent) < 1e-9, "the cost metric adds up the results' costs"
    assert (
        f'agents_stream_answers_total{{agent="{agent}",confidence="high",status="succeeded",tier="light"}} '
        f'{float(len(easy))}'
        in scraped
    )
    print(
        f"\nrouter: {len(easy)} easy → light, {len(hard)} hard → primary; escalated cost {escalated['usage']['cost']}; "
        f"agents_stream_cost_usd_total {metric:.6f}"
    )


async def test_classifier_router_asks_a_model_which_tier_a_task_needs(cluster_factory):
    """router = "classifier": the classifier model's verdict, not the heuristic,
    picks the tier (one classifier call per task)."""
    async with FakeLLM() as primary, FakeLLM() as light, FakeLLM(default=ok("Hard.")) as judge:
        agent = unique("analyzer")
        toml = (
            provider("primary", primary) + provider("light", light) + provider("judge", judge)
            + agent_toml(agent, providers=["primary"], light="light", router="classifier", classifier="judge")
        )
        c = cluster_factory([agent], None, toml=toml)
        await c.started()
        looks_easy = task(agent, instruction="What is 2 + 2?")  # the heuristic would call it easy
        await produce(topics.task_topic(agent), [encode(looks_easy)])
        r1 = decoded(await results_for({looks_easy["task_id"]}, timeout=60))[looks_easy["task_id"]]
        judge.default = ok('{"complexity": "easy"}')
        looks_hard = task(agent, instruction=HARD[0])  # the heuristic would call it hard
        await produce(topics.task_topic(agent), [encode(looks_hard)])
        r2 = decoded(await results_for({looks_hard["task_id"]}, timeout=60))[looks_hard["task_id"]]
    assert r1["source"].startswith("primary:") and r2["source"].startswith("light:")
    assert [r.task_id for r in judge.requests] == [looks_easy["task_id"], looks_hard["task_id"]]
    assert HARD[0] in judge.requests[1].instruction, "the classifier sees the task"


async def test_lower_rungs_light_cache_and_partial(cluster_factory):
    """Primary down: a light-tier agent answers a simplified task (low),
    a cached agent answers from the last good answer (low),
    and an agent allowed to go to the bottom answers with the explicit partial result (failed)."""
    async with FakeLLM() as primary, FakeLLM() as light:
        a_light, a_cache, a_partial = unique("lite"), unique("cached"), unique("partial")
        toml = (
            "[breaker]\nfailure_threshold = 2\nopen_timeout_s = 60\n\n"
            + provider("primary", primary) + provider("light", light)
            + agent_toml(a_light, providers=["primary"], light="light", lowest="low")
            + agent_toml(a_cache, providers=["primary"], cache_max_age_s=3600, lowest="low")
            + agent_toml(a_partial, providers=["primary"], lowest="failed")
        )
        c = cluster_factory([a_light, a_cache, a_partial], None, toml=toml)
        await c.started()
        first = task(a_cache, instruction="Summarise the quarter", context_data={"q": 3})
        await produce(topics.task_topic(a_cache), [encode(first)])
        stored = decoded(await results_for({first["task_id"]}, timeout=60))[first["task_id"]]
        assert stored["source"].startswith("primary:") and stored["confidence"] == "high"

        await primary.set_mode(outage=True)
        again = task(a_cache, instruction="Summarise the quarter", context_data={"q": 3})
        lite = task(a_light, instruction="Explain the report", context_data={"long": "x" * 3000})
        part = task(a_partial)
        await produce(topics.task_topic(a_cache), [encode(again)])
        await produce(topics.task_topic(a_light), [encode(lite)])
        await produce(topics.task_topic(a_partial), [encode(part)])
        results = decoded(await results_for({again["task_id"], lite["task_id"], part["task_id"]}, timeout=90))

    cached = results[again["task_id"]]
    assert cached["source"] == f"cache:{first['task_id']}" and cached["confidence"] == "low"
    assert cached["output"] == stored["output"]
    lr = results[lite["task_id"]]
    assert lr["source"].startswith("light:") and lr["confidence"] == "low" and lr["status"] == "succeeded"
    sent = next(r for r in light.requests if r.task_id == lite["task_id"])
    assert SIMPLIFY_PREFIX in sent.instruction and "x" * 600 not in json.dumps(sent.body), (
        "the light tier gets a simplified task"
    )
    pr = results[part["task_id"]]
    assert pr["status"] == "partial" and pr["partial"] is True and pr["confidence"] == "failed" and pr["output"] is None
    print("\nlower rungs: cache → low, light (simplified) → low, partial → failed")


async def test_budget_sends_work_to_the_cheaper_tier_or_holds_it(cluster_factory):
    """Past its daily budget an agent's tasks go to the light tier (over_budget = "cheaper")
    or are held (over_budget = "hold")."""
    async with FakeLLM() as primary, FakeLLM() as light:
        cheap, strict = unique("cheap"), unique("strict")
        toml = (
            '[prices]\n"primary-model" = { input_per_mtok = 1000.0, output_per_mtok = 1000.0 }\n\n'
            + provider("primary", primary) + provider("light", light)
            + agent_toml(cheap, providers=["primary"], light="light", budget_usd_per_day=0.001, over_budget="cheaper")
            + agent_toml(strict, providers=["primary"], light="light", budget_usd_per_day=0.001, over_budget="hold")
        )
        c = cluster_factory([cheap, strict], None, toml=toml, AGENTS_STREAM_PRESENCE_INTERVAL_S="0.5")
        await c.started()
        first = [task(cheap), task(strict)]
        await produce(topics.task_topic(cheap), [encode(first[0])])
        await produce(topics.task_topic(strict), [encode(first[1])])
        r1 = decoded(await results_for({t["task_id"] for t in first}, timeout=60))
        assert all(r["source"].startswith("primary:") and r["usage"]["cost"] > 0.001 for r in r1.values())
        await asyncio.sleep(2)  # the spend reaches the shared view with the next presence event
        second = [task(cheap), task(strict)]
        await produce(topics.task_topic(cheap), [encode(second[0])])
        await produce(topics.task_topic(strict), [encode(second[1])])
        r2 = decoded(await results_for({second[0]["task_id"]}, timeout=60))[second[0]["task_id"]]
        none = await read_topic("agent.results", until=lambda s: False, timeout=3,
                                keep=lambda m: m.key == second[1]["task_id"].encode())
        lag = await uncommitted(c.app_id, topics.task_topic(strict))
    assert r2["source"].startswith("light:") and r2["confidence"] == "medium"
    assert none == [], "a task held by its budget has no result"
    assert lag == 1, "it waits as lag (intake of the over-budget agent is paused)"
    assert not [r for r in primary.requests + light.requests if r.task_id == second[1]["task_id"]], "and made no call"
    print(f"\nbudget: first tasks cost {r1[first[0]['task_id']]['usage']['cost']} USD > 0.001; "
          f"next 'cheaper' task went to {r2['source']}, next 'hold' task held")


@pytest.mark.exclusive  # it counts calls per second
async def test_requests_per_second_limit_is_shared_by_the_workers(cluster_factory):
    """rps is a cluster-wide limit: two workers together start no more calls in any window than rps
    allows (plus the bursts)."""
    rps = 5.0
    async with FakeLLM() as fake:
        agent = unique("analyzer")
        toml = provider("fake", fake, rps=rps) + agent_toml(agent, providers=["fake"])
        c = cluster_factory([agent], None, toml=toml, AGENTS_STREAM_PRESENCE_INTERVAL_S="0.5")
        await asyncio.gather(c.started("a"), c.started("b"))
        await asyncio.sleep(2)  # each has seen the other's presence: the limit is split in two
        ts = [task(agent, n=i) for i in range(60)]
        await produce(topics.task_topic(agent), [encode(t) for t in ts])
        results = decoded(await results_for({t["task_id"] for t in ts}, timeout=120))
    assert len(results) == len(ts)
    stamps = sorted(r.ts for r in fake.requests)
    window = 2.0
    busiest = max(sum(1 for t in stamps if s <= t < s + window) for s in stamps)
    allowed = rps * window + 2 * max(1.0, rps / 2)  # the rate, plus each worker's burst
    span = stamps[-1] - stamps[0]
    print(
        f"\nrps {rps:g}: {len(stamps)} calls over {span:.1f}s ({len(stamps) / span:.2f}/s); busiest {window:g}s window "
        f"{busiest} (allowed {allowed:g})"
    )
    assert busiest <= allowed


async def test_escalation_with_nothing_above_keeps_the_light_answer(cluster_factory):
    """An easy task's light answer that escalated is used (once, not re-asked) when every tier above it is down
    and `lowest` allows it."""
    async with FakeLLM() as primary, FakeLLM(default=ok('{"answer": "maybe", "confidence": "low"}')) as light:
        agent = unique("analyzer")
        toml = (
            "[breaker]\nfailure_threshold = 1\nopen_timeout_s = 60\n\n"
            + provider("primary", primary) + provider("light", light)
            + agent_toml(agent, providers=["primary"], light="light", router="heuristic", lowest="low",
                         output_schema={"type": "object", "required": ["answer"]})
        )
        c = cluster_factory([agent], None, toml=toml)
        await c.started()
        await primary.set_mode(outage=True)
        t = task(agent, instruction="What is the capital of Italy?")
        await produce(topics.task_topic(agent), [encode(t)])
        r = decoded(await results_for({t["task_id"]}, timeout=60))[t["task_id"]]
        await asyncio.sleep(2)
    assert r["source"].startswith("light:") and r["confidence"] == "low" and r["output"]["answer"] == "maybe"
    assert [q.task_id for q in light.requests].count(t["task_id"]) == 1, "the light model was asked once"

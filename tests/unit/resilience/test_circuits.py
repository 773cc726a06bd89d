"""The circuits' fold and gate over an in-memory log (no Kafka): several workers share one ordered event list."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from agents_stream.config import AppConfig
from agents_stream.contract.errors import CircuitOpen
from agents_stream.resilience.breaker import Transition
from agents_stream.resilience.circuits import Circuits, circuit_id
from agents_stream.testing.memory_circuits_log import MemoryCircuitsLog


def config(max_concurrency: int | None = None, **breaker: Any) -> AppConfig:
    """One provider ``p`` whose breaker opens on 3 failures in a row and closes on one probe success."""
    return AppConfig.model_validate({
        "breaker": {
            "failure_threshold": 3, "open_timeout_s": 10, "success_threshold": 1, "half_open_probes": 1, **breaker,
        },
        "providers": {"p": {
            "kind": "openai", "base_url": "http://x/v1", "model": "m", "timeout_s": 5,
            "max_concurrency": max_concurrency,
        }},
        "agents": {"a": {"providers": ["p"]}},
    })


class Cluster:
    """N workers' Circuits on one MemoryCircuitsLog; ``paused``: they fold only on ``pump`` (the test decides when)."""

    def __init__(self, n: int, cfg: AppConfig | None = None, *, paused: bool = True) -> None:
        self.clock = [1000.0]
        self.log = MemoryCircuitsLog(clock=lambda: self.clock[0])
        if paused:
            self.log.pause()
        self.changes = [0] * n
        self.transitions: list[list[tuple[str, Transition, bool]]] = [[] for _ in range(n)]
        self.workers = []
        for i in range(n):
            c = Circuits(
                cfg or config(), ["p"], f"w{i}",
                send=self.log.send, on_transition=lambda *t, i=i: self.transitions[i].append(t),
                on_change=lambda i=i: self._changed(i), app_id="app", clock=lambda: self.clock[0],
            )
            self.log.attach(c)
            self.workers.append(c)

    def _changed(self, i: int) -> None:
        self.changes[i] += 1

    def pump(self) -> None:
        self.log.deliver()

    async def pumping(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.pump()
            await asyncio.sleep(0.001)

    def kinds(self) -> list[str]:
        return [json.loads(r.value)["kind"] for r in self.log.records]


def raw(kind: str, **fields: Any) -> bytes:
    return json.dumps({"v": 1, "id": "x", "kind": kind, "worker": "other", "at": 0, **fields}).encode()


async def test_malformed_records_are_skipped_and_the_fold_goes_on() -> None:
    """A broken or foreign record on the shared log is skipped; the valid events after it still apply."""
    cl = Cluster(1)
    c = cl.workers[0]
    cid = circuit_id(config().providers["p"])
    bad = [b"not json", b"[1,2]", raw("probe", provider=cid), raw("rate_limited", provider=cid),
           raw("hello", spend=[1]),
           raw("transition", provider=cid, to="exploded", cause=-5), raw("failure", provider={"not": "hashable"})]
    good = [raw("failure", provider=cid) for _ in range(3)]
    for value in bad + good:
        cl.log.send(b"k", value)
    cl.pump()
    assert c.folded == len(bad + good)
    assert c.state("p") == "open", "the three good failures after the bad records opened the breaker"


async def test_the_broker_clock_is_used_not_the_senders() -> None:
    """With LogAppendTime the fold uses the broker's timestamp: a sender whose clock is far ahead cannot move the
    open timeout."""
    cl = Cluster(1)
    c = cl.workers[0]
    cid = circuit_id(config().providers["p"])
    future = raw("failure", provider=cid) .replace(b'"at": 0', b'"at": 99999999')
    for _ in range(3):
        cl.log.send(b"k", future)
    cl.pump()
    assert c.describe()["p"]["opened_at"] == 1000.0
    assert c.available("p") == (False, 1010.0)


async def test_a_worker_waits_for_its_own_failure_before_calling_again() -> None:
    """After a failure a worker starts no new call until its failure event came back through the log."""
    cl = Cluster(1)
    c = cl.workers[0]
    permit = await c.acquire("p")
    c.release(permit, "failure")
    waiting = asyncio.ensure_future(c.acquire("p"))
    await asyncio.sleep(0.2)
    assert not waiting.done(), "blocked until the failure is folded"
    cl.pump()
    permit = await asyncio.wait_for(waiting, 1)
    c.release(permit, "success")


@pytest.mark.parametrize("max_concurrency", [None, 6])
async def test_calls_to_a_dead_provider_are_bounded_across_workers(max_concurrency: int | None) -> None:
    """Three workers with 20 callers each against a dead provider: at most failure_threshold failures
    plus the calls in flight when the breaker opened (all 60 callers, or max_concurrency) reach it."""
    cl = Cluster(3, config(max_concurrency=max_concurrency))
    for w in cl.workers:
        w.hello()
    cl.pump()
    assert all(w.live_workers("p") == 3 for w in cl.workers)
    stop = asyncio.Event()
    pump = asyncio.ensure_future(cl.pumping(stop))
    calls = 0

    async def caller(c: Circuits) -> None:
        nonlocal calls
        for _ in range(10):
            try:
                permit = await c.acquire("p")
            except CircuitOpen:
                return
            calls += 1
            await asyncio.sleep(0.002)  # the call fails after a moment
            c.release(permit, "failure")

    await asyncio.wait_for(asyncio.gather(*(caller(c) for c in cl.workers for _ in range(20))), 10)
    stop.set()
    await pump
    in_flight = 60 if max_concurrency is None else max_concurrency
    print(f"\ncalls to a dead provider from 3 workers x 20 callers, max_concurrency {max_concurrency}: {calls} "
          f"(bound {3 + in_flight})")
    assert all(c.state("p") == "open" for c in cl.workers)
    assert calls <= 3 + in_flight


async def test_half_open_admits_one_probe_cluster_wide_and_the_others_wait_for_its_verdict() -> None:
    """In half-open exactly one probe is admitted among all workers; the refused ones ask no more while they wait
    for its verdict, and are admitted once it closes instead of falling down the ladder."""
    cl = Cluster(3, paused=False)  # every worker folds each record on the loop turn after its send
    cid = circuit_id(config().providers["p"])
    for _ in range(3):
        cl.log.send(b"k", raw("failure", provider=cid))
    await asyncio.sleep(0)
    assert all(w.state("p") == "open" for w in cl.workers)
    cl.clock[0] += 11  # past open_timeout
    calls = [asyncio.ensure_future(w.acquire("p")) for w in cl.workers]
    await asyncio.sleep(0.3)
    admitted = [f for f in calls if f.done()]
    assert len(admitted) == 1 and admitted[0].exception() is None and admitted[0].result().probe_id is not None
    waiting = [f for f in calls if not f.done()]
    assert len(waiting) == 2, "the refused wait for the probe's verdict"
    probes_before = cl.kinds().count("probe")
    await asyncio.sleep(0.5)
    assert cl.kinds().count("probe") == probes_before, "no new probe request while waiting"
    owner = cl.workers[calls.index(admitted[0])]
    owner.release(admitted[0].result(), "success")
    permits = await asyncio.wait_for(asyncio.gather(*waiting), 2)
    assert all(p.probe_id is None for p in permits), "admitted as ordinary calls once it closed"
    assert all(w.state("p") == "closed" for w in cl.workers), \
        "one probe success (success_threshold 1) closed it everywhere"


async def test_a_failed_probe_sends_the_waiting_calls_down_the_ladder_at_once() -> None:
    """When the probe fails the breaker reopens and the calls waiting for its verdict get CircuitOpen at once."""
    cl = Cluster(2, paused=False)
    cid = circuit_id(config().providers["p"])
    for _ in range(3):
        cl.log.send(b"k", raw("failure", provider=cid))
    await asyncio.sleep(0)
    cl.clock[0] += 11
    a, b = cl.workers
    probe = await asyncio.wait_for(a.acquire("p"), 1)
    await asyncio.sleep(0.01)
    waiting = asyncio.ensure_future(b.acquire("p"))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    a.release(probe, "failure")
    with pytest.raises(CircuitOpen):
        await asyncio.wait_for(waiting, 1)
    assert b.state("p") == "open"


async def test_a_call_waits_for_a_probe_verdict_at_most_the_providers_timeout() -> None:
    """A probe that never reports (its worker hangs) holds the other calls back for the call timeout, no longer."""
    cfg = AppConfig.model_validate({
        **config().model_dump(exclude_none=True),
        "providers": {"p": {"kind": "openai", "base_url": "http://x/v1", "model": "m", "timeout_s": 0.3}},
    })
    cl = Cluster(2, cfg, paused=False)
    cid = circuit_id(cfg.providers["p"])
    for _ in range(3):
        cl.log.send(b"k", raw("failure", provider=cid))
    await asyncio.sleep(0)
    cl.clock[0] += 11
    a, b = cl.workers
    await asyncio.wait_for(a.acquire("p"), 1)  # never released
    started = asyncio.get_running_loop().time()
    with pytest.raises(CircuitOpen, match="no verdict within 0.3s"):
        await asyncio.wait_for(b.acquire("p"), 2)
    assert 0.25 <= asyncio.get_running_loop().time() - started < 1.0


async def test_successes_are_shared_in_counts_and_a_one_in_ten_failing_provider_stays_closed() -> None:
    """Two workers, 2,000 calls, every tenth fails: the successes reach the log as counts (with each failure and
    every report interval), every worker folds the same closed breaker, and the log holds a record per failure,
    not per call."""
    cl = Cluster(2, config(minimum_calls=20), paused=False)
    for n in range(2000):
        w = cl.workers[n % 2]
        permit = await asyncio.wait_for(w.acquire("p"), 1)
        w.release(permit, "failure" if n % 10 == 9 else "success")
        if n % 100 == 99:
            cl.clock[0] += 1.0
            for c in cl.workers:
                c.report_successes()
        await asyncio.sleep(0)
    await asyncio.sleep(0.01)
    for c in cl.workers:
        d = c.describe()["p"]
        assert d["state"] == "closed" and d["opens"] == 0
        assert (d["total_successes"], d["total_failures"]) == (1800, 200)
    kinds = cl.kinds()
    assert kinds.count("failure") == 200 and kinds.count("success") <= 40, "successes travel as counts"
    failure = json.loads(next(r.value for r in cl.log.records if b'"failure"' in r.value))
    assert failure["successes"] >= 1 and failure["success_age"] == 0.0


async def test_failures_sent_in_one_producer_batch_are_no_run_when_successes_came_between_them() -> None:
    """The broker gives every record of one batch the same append time. A worker's calls in flight that fail a few
    milliseconds apart, with successes between them, reach the log in one batch: they are no run of failures (the
    flake of test_breaker_health's 10% test, where six such failures opened a healthy breaker)."""
    cl = Cluster(1, config(minimum_calls=20), paused=False)
    c = cl.workers[0]
    for _ in range(100):  # a healthy history: the window knows the provider, no failure in it
        c.release(await c.acquire("p"), "success")
    cl.clock[0] += 1.0
    c.report_successes()
    await asyncio.sleep(0)
    permits = [await asyncio.wait_for(c.acquire("p"), 1) for _ in range(60)]  # in flight together
    batch = cl.clock[0]
    cl.log.clock = lambda: batch  # one producer batch: one broker time for all that follows
    for n, permit in enumerate(permits):
        cl.clock[0] += 0.001  # the worker's own clock moves between the answers
        c.release(permit, "failure" if n % 10 == 9 else "success")
    await asyncio.sleep(0.01)
    d = c.describe()["p"]
    assert cl.kinds().count("failure") == 6
    assert d["state"] == "closed" and d["opens"] == 0, "six failures, each after a success, are not six in a row"
    assert d["failures_in_window"] == 1


async def test_a_dead_provider_after_shared_successes_still_opens_at_the_threshold() -> None:
    """Successes reported before a provider dies do not stretch the bound: the threshold-th failure in a row opens
    it, whichever worker reports the failures."""
    cl = Cluster(2, paused=False)
    for n in range(100):
        w = cl.workers[n % 2]
        permit = await asyncio.wait_for(w.acquire("p"), 1)
        w.release(permit, "success")
    cl.clock[0] += 0.5
    for n in range(3):  # failure_threshold 3; both workers carry their unreported successes on their first failure
        w = cl.workers[n % 2]
        permit = await asyncio.wait_for(w.acquire("p"), 1)
        cl.clock[0] += 0.01
        w.release(permit, "failure")
        await asyncio.sleep(0.01)
    assert all(c.state("p") == "open" for c in cl.workers)
    assert cl.kinds().count("failure") == 3


async def test_retry_after_from_one_worker_blocks_the_others_once_folded() -> None:
    """A 429 one worker saw blocks new calls on every worker until Retry-After elapses."""
    cl = Cluster(2)
    a, b = cl.workers
    permit = await a.acquire("p")
    a.release(permit, "rate_limited", retry_after=5.0)
    with pytest.raises(CircuitOpen):
        await a.acquire("p")  # at once, on the worker that saw it
    cl.pump()
    with pytest.raises(CircuitOpen) as info:
        await b.acquire("p")
    assert info.value.retry_at == pytest.approx(1005.0)
    assert b.describe()["p"]["retry_after_propagation_s"] is not None
    cl.clock[0] += 5.1
    permit = await asyncio.wait_for(b.acquire("p"), 1)
    b.release(permit, "success")


async def test_spend_is_summed_per_app_across_partitions() -> None:
    """Budgets count this app's spend of the day over every partition's latest report; another app's spend is not
    ours."""
    cl = Cluster(1)
    cl.clock[0] = 1_795_953_600.0  # 2026-11-29 12:00 UTC: spend of days before yesterday is not kept
    c = cl.workers[0]
    reports = [
        raw("hello", worker="w1", app="app", spend={"a": {"2026-11-29": {"0": 1.5, "1": 2.0}}}),
        raw("hello", worker="w2", app="app", spend={"a": {"2026-11-29": {"1": 2.5}}}),  # newer report for partition 1
        raw("hello", worker="w3", app="other-app", spend={"a": {"2026-11-29": {"2": 100.0}}}),
    ]
    for r in reports:
        cl.log.send(b"k", r)
        cl.clock[0] += 1.0  # each report newer than the one before
    cl.pump()
    assert c.spend("a", "2026-11-29") == pytest.approx(4.0)


def test_circuit_id_separates_accounts_and_shares_endpoints() -> None:
    """Two names for one endpoint and key share a breaker; a second account (another key) is its own circuit."""
    cfg = AppConfig.model_validate({
        "providers": {
            "a": {"kind": "openai", "base_url": "http://x/v1", "model": "m", "api_key_env": "K1"},
            "b": {"kind": "openai", "base_url": "http://x/v1/", "model": "m", "api_key_env": "K1"},
            "c": {"kind": "openai", "base_url": "http://x/v1", "model": "m", "api_key_env": "K2"},
        },
        "agents": {"x": {"providers": ["a"]}},
    })
    ids = {n: circuit_id(p) for n, p in cfg.providers.items()}
    assert ids["a"] == ids["b"] != ids["c"]


async def test_two_workers_on_one_log_agree_on_a_breaker_transition() -> None:
    """Failures one worker sees open the breaker on both workers, at the same time; only the worker whose
    event caused it records the transition on the log, with that event's offset as its cause."""
    cl = Cluster(2, paused=False)
    a, b = cl.workers
    for _ in range(3):
        permit = await asyncio.wait_for(a.acquire("p"), 1)  # waits for the previous failure to come back
        a.release(permit, "failure")
    await asyncio.sleep(0)
    assert a.state("p") == b.state("p") == "open"
    assert a.describe()["p"]["opened_at"] == b.describe()["p"]["opened_at"] == 1000.0
    (name_a, ta, mine_a), = cl.transitions[0]
    (name_b, tb, mine_b), = cl.transitions[1]
    assert (name_a, ta.frm, ta.to, mine_a) == ("p", "closed", "open", True)
    assert (name_b, tb, mine_b) == ("p", ta, False)
    assert cl.kinds() == ["failure", "failure", "failure", "transition"]
    recorded = json.loads(cl.log.records[3].value)
    assert (recorded["worker"], recorded["to"], recorded["cause"], recorded["opened_at"]) == ("w0", "open", 2, 1000.0)
    await asyncio.sleep(0)
    assert len(cl.transitions[0]) == len(cl.transitions[1]) == 1, "folding the recorded transition moves nothing"
    with pytest.raises(CircuitOpen):
        await b.acquire("p")


async def test_a_joining_worker_adopts_a_transition_it_did_not_see_the_cause_of() -> None:
    """A worker attached after the failures (folding from the recorded transition on) takes over the open state."""
    cl = Cluster(1, paused=False)
    a = cl.workers[0]
    for _ in range(3):
        permit = await asyncio.wait_for(a.acquire("p"), 1)
        a.release(permit, "failure")
    await asyncio.sleep(0)
    assert cl.kinds() == ["failure", "failure", "failure", "transition"]
    joiner = Circuits(config(), ["p"], "w9", send=cl.log.send, on_transition=lambda *t: None, on_change=lambda: None,
                      app_id="app", clock=lambda: cl.clock[0])
    cl.log.attach(joiner, from_offset=3)
    await asyncio.sleep(0)
    assert joiner.state("p") == "open"
    assert joiner.describe()["p"]["opened_at"] == 1000.0

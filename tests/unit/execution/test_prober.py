"""The breakers' own probes: past the open timeout one cheap call, cluster-wide, over real HTTP
to a fake LLM server, decides the breaker without waiting for a task."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agents_stream.config import AppConfig
from agents_stream.execution.prober import Prober, probe_once
from agents_stream.providers import Provider, build_provider
from agents_stream.resilience.circuits import Circuits
from agents_stream.testing.fakellm import FakeLLM
from agents_stream.testing.memory_circuits_log import MemoryCircuitsLog


def config(url: str, **breaker: Any) -> AppConfig:
    return AppConfig.model_validate({
        "breaker": {"failure_threshold": 3, "open_timeout_s": 2, "success_threshold": 2, **breaker},
        "providers": {"p": {"kind": "openai", "base_url": f"{url}/v1", "model": "m", "timeout_s": 5}},
        "agents": {"a": {"providers": ["p"]}},
    })


class Cluster:
    """Two workers' Circuits on one in-memory log, each with its own client of the provider."""

    def __init__(self, cfg: AppConfig) -> None:
        self.clock = [1000.0]
        self.log = MemoryCircuitsLog(clock=lambda: self.clock[0])
        self.workers: list[Circuits] = []
        self.providers: list[Provider] = []
        for i in range(2):
            c = Circuits(cfg, ["p"], f"w{i}", send=self.log.send, on_transition=lambda *t: None,
                         on_change=lambda: None, clock=lambda: self.clock[0])
            self.log.attach(c)
            self.workers.append(c)
            self.providers.append(build_provider(cfg.provider("p")))

    async def open_it(self) -> None:
        a = self.workers[0]
        for _ in range(3):
            permit = await asyncio.wait_for(a.acquire("p"), 1)
            a.release(permit, "failure")
        await asyncio.sleep(0.01)
        assert all(w.state("p") == "open" for w in self.workers)

    def kinds(self) -> list[str]:
        return [json.loads(r.value)["kind"] for r in self.log.records]

    async def close(self) -> None:
        for p in self.providers:
            await p.close()


async def test_nothing_is_probed_before_the_open_timeout() -> None:
    """An open breaker inside its open timeout is due no probe, and probe_once sends nothing."""
    async with FakeLLM() as fake:
        cl = Cluster(config(fake.url))
        await cl.open_it()
        assert cl.workers[0].probes_due() == []
        assert await probe_once(cl.workers[0], cl.providers[0]) is None
        await cl.close()
    assert fake.requests == []


async def test_a_recovered_provider_is_closed_by_probes_alone() -> None:
    """Past the open timeout, with no task asking, two probe successes (success_threshold 2) close the breaker on
    every worker; each probe is a one-token call."""
    async with FakeLLM() as fake:
        cl = Cluster(config(fake.url))
        await cl.open_it()
        cl.clock[0] += 2.5
        assert cl.workers[0].probes_due() == ["p"] and cl.workers[1].probes_due() == ["p"]
        assert await probe_once(cl.workers[0], cl.providers[0]) == "success"
        await asyncio.sleep(0.01)
        assert await probe_once(cl.workers[1], cl.providers[1]) == "success"
        await asyncio.sleep(0.01)
        assert [w.state("p") for w in cl.workers] == ["closed", "closed"]
        await cl.close()
    assert len(fake.requests) == 2
    assert all(r.instruction == "ping" and r.body["max_tokens"] == 1 for r in fake.requests)


async def test_a_provider_still_down_fails_its_probe_and_stays_open() -> None:
    """A probe of a provider in an outage (503) reopens the breaker for another open timeout."""
    async with FakeLLM() as fake:
        await fake.set_mode(outage=True)
        cl = Cluster(config(fake.url))
        await cl.open_it()
        cl.clock[0] += 2.5
        assert await probe_once(cl.workers[0], cl.providers[0]) == "failure"
        await asyncio.sleep(0.01)
        assert [w.state("p") for w in cl.workers] == ["open", "open"]
        assert cl.workers[1].describe()["p"]["opened_at"] == 1002.5
        await cl.close()
    assert len(fake.requests) == 1


async def test_probers_on_two_workers_send_one_probe_at_a_time_cluster_wide() -> None:
    """Both workers' probers run: the log admits one probe at a time, so the provider sees exactly
    success_threshold probes and the breaker closes."""
    async with FakeLLM() as fake:
        await fake.set_mode(latency=0.05)
        cl = Cluster(config(fake.url))
        await cl.open_it()
        cl.clock[0] += 2.5
        probers = [asyncio.ensure_future(Prober(w, {"p": p}, interval_s=0.02).run())
                   for w, p in zip(cl.workers, cl.providers, strict=True)]
        try:
            for _ in range(200):
                if all(w.state("p") == "closed" for w in cl.workers):
                    break
                await asyncio.sleep(0.02)
            peak = fake.peak_in_flight
        finally:
            for t in probers:
                t.cancel()
            await asyncio.gather(*probers, return_exceptions=True)
            await cl.close()
    assert all(w.state("p") == "closed" for w in cl.workers)
    assert len(fake.requests) == 2 and peak == 1
    assert cl.kinds().count("success") == 2

"""The chaos run: worker SIGKILLs, a broker restart, a flaky provider with an outage and poison pills, \
then checks.

    .venv/bin/python -m tests.chaos --tasks 5000          # what `make chaos` runs (needs a broker: make broker)

What it does, on the real broker with real worker processes (tests/integration/harness.py):
``workers`` workers of one app id; ``tasks`` messages published at a steady
``rate``, ``poison`` of them unusable (not UTF-8, not JSON, null, schema
violations, the wrong agent); the fake LLM (in this process) answers 500 to a
share ``error_rate`` of calls and has one ``outage_s`` outage (503 to
everything); a random worker is SIGKILLed every ``kill_every`` seconds and
started again at once (same name and data dir: a restart on the same host);
a random worker is paused (SIGSTOP) for ``pause_s`` every ``pause_every``
seconds, past its session timeout, and resumed: it comes back fenced;
the broker is stopped and started once with ``scripts/broker.sh`` (the same
KAFKA_PORT / KAFKA_DATA_DIR environment as this process).

What it checks (tests/chaos_checks.py, ``ChaosReport.problems``; empty = passed):
- every valid task has exactly one distinct result on agent.results, status
  ``succeeded`` (a redelivery may re-send it, byte for byte: counted, not an
  error). The provider only fails transiently (500, 503), so retries or a hold
  end every valid task well: ``failed`` would be a bug here;
- every poison pill has exactly one dead-letter record, ``error_layer=schema``,
  the reason of its kind, its original bytes; and no result, no provider call;
- no valid task is dead-lettered;
- the consumer group's lag on the task topic is 0 at the end;
- no worker exits by itself.
Figures (``ChaosReport.table()``): provider calls per task, kills, broker
restarts, breaker openings, held and re-dispatched tasks, time to drain (last
publish → last result or dead letter), total time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from agents_stream.contract import topics
from agents_stream.testing.fakellm import FakeLLM

from .chaos_checks import POISON_REASONS, ChaosReport, Seen, check, read_outputs
from .integration.harness import (
    BOOTSTRAP,
    ROOT,
    Cluster,
    Worker,
    eventually,
    uncommitted,
    unique,
)

log = logging.getLogger("chaos")

@dataclass(frozen=True)
class ChaosPlan:
    """The run's size and its faults; times are seconds from the first publish."""

    tasks: int = 5000  # messages published, poison included
    poison_share: float = 0.05
    rate: float = 25.0  # messages per second
    workers: int = 3
    error_rate: float = 0.2
    latency: float = 0.1  # seconds the fake LLM takes per answer
    outage_at: float = 60.0
    outage_s: float = 20.0
    kill_every: float = 20.0  # 0: no kills
    #: a random worker is paused (SIGSTOP) for ``pause_s`` every ``pause_every`` seconds, past its session timeout so
    #: its partitions move, then resumed (SIGCONT): it comes back fenced (docs/security.md, "Fencing"). 0: no pauses
    pause_every: float = 45.0
    pause_s: float = 12.0
    broker_restart_at: float | None = 120.0  # None: no broker restart
    broker_down_s: float = 3.0  # between stop and start
    drain_timeout: float = 600.0  # after the last publish
    seed: int = 6

    @property
    def poison(self) -> int:
        return round(self.tasks * self.poison_share)

    def breaker_toml(self) -> str:
        # The default breaker (5 failures in 60 s) would stay open under a 20% error rate at any real
        # throughput: the run would measure the breaker's timeout, not recovery. Sized to the rate, it
        # rides out the random errors (about rate/4 failures a second) and opens within a second or two
        # of the outage (every call fails, each task retrying).
        threshold = max(30, int(5 * self.rate))
        return f"[breaker]\nfailure_threshold = {threshold}\nwindow_s = 5\nopen_timeout_s = 5\n"


# -- the messages ---------------------------------------------------------------------


def poison_pill(kind: str, key: str, agent: str) -> bytes | None:
    if kind == "not_json":
        return b"{this is not json " + key.encode()
    if kind == "invalid_utf8":
        return b'{"task_id": "\xff\xfe' + key.encode() + b'"}'
    if kind == "null_value":
        return None
    if kind == "missing_fields":
        return json.dumps({"task_id": key, "agent_name": agent}).encode()
    if kind == "wrong_types":
        return json.dumps({"task_id": key, "agent_name": 12345, "instruction": None}).encode()
    if kind == "not_an_object":
        return json.dumps([key, agent, "analyse"]).encode()
    if kind == "wrong_agent":
        return json.dumps({"task_id": key, "agent_name": agent + "_other", "instruction": "analyse"}).encode()
    raise ValueError(kind)


def messages(plan: ChaosPlan, run: str, agent: str,
             rng: random.Random) -> tuple[list[tuple[str, bytes | None]], dict[str, str]]:
    """(key, value) in publish order, and the poison kind of each poison key."""
    kinds = list(POISON_REASONS)
    poison = {f"{run}-p{i:05d}": kinds[i % len(kinds)] for i in range(plan.poison)}
    valid = [f"{run}-t{i:05d}" for i in range(plan.tasks - plan.poison)]
    out: list[tuple[str, bytes | None]] = [
        (k, json.dumps({"task_id": k, "agent_name": agent, "instruction": f"analyse {i}",
                        "context_data": {"n": i}}).encode())
        for i, k in enumerate(valid)
    ]
    out += [(k, poison_pill(kind, k, agent)) for k, kind in poison.items()]
    rng.shuffle(out)
    return out, poison


# -- faults -----------------------------------------------------------------------------


class Broker:
    """Stops and starts the broker this run uses, through scripts/broker.sh and this process's KAFKA_* environment."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.env = {**os.environ, **(env or {})}
        port = self.env.get("KAFKA_PORT", "9092")
        if BOOTSTRAP.rsplit(":", 1)[-1] != port:
            # broker.sh would restart a broker this run does not use (someone else's, perhaps)
            raise RuntimeError(
                f"KAFKA_BOOTSTRAP={BOOTSTRAP} but scripts/broker.sh manages KAFKA_PORT={port}: set both alike"
            )
        self._script = str(ROOT / "scripts" / "broker.sh")
        if self._run("status", 30).returncode != 0:
            raise RuntimeError(f"scripts/broker.sh status: no broker of ours on port {port} to restart")

    def _run(self, cmd: str, timeout: float) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", self._script, cmd], env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    async def restart(self, down_s: float) -> None:
        for cmd, pause in (("stop", down_s), ("start", 0.0)):
            done = await asyncio.to_thread(self._run, cmd, 180)
            if done.returncode != 0:
                raise RuntimeError(f"scripts/broker.sh {cmd} failed:\n{done.stdout}{done.stderr}")
            log.info("broker %s: %s", cmd, done.stdout.strip().splitlines()[-1:] or "")
            await asyncio.sleep(pause)


class Chaos:
    """The faults of one run, on a shared timeline; kills and the broker restart never overlap."""

    def __init__(self, plan: ChaosPlan, cluster: Cluster, workers: dict[str, Worker], fake: FakeLLM,
                 broker: Broker | None, report: ChaosReport) -> None:
        (self.plan, self.cluster, self.workers, self.fake, self.broker,
         self.report) = plan, cluster, workers, fake, broker, report
        self.rng = random.Random(plan.seed)
        self.lock = asyncio.Lock()  # one fault at a time: a worker starting while the broker is down proves nothing
        self.stop = asyncio.Event()
        self.t0 = 0.0

    async def _until(self, t: float) -> bool:
        """Sleep until ``t0 + t``; False when the run ended first."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.stop.wait(), max(0.0, self.t0 + t - time.monotonic()))
        return not self.stop.is_set()

    async def outage(self) -> None:
        if await self._until(self.plan.outage_at):
            log.info("provider outage for %gs", self.plan.outage_s)
            self.report.faults.append((time.time(), f"provider outage for {self.plan.outage_s:g}s"))
            await self.fake.set_mode(outage=True, outage_for=self.plan.outage_s)

    async def broker_restart(self) -> None:
        if (
            self.broker is None
            or self.plan.broker_restart_at is None
            or not await self._until(self.plan.broker_restart_at)
        ):
            return
        async with self.lock:
            log.info("broker restart")
            self.report.faults.append((time.time(), "broker stop"))
            await self.broker.restart(self.plan.broker_down_s)
            self.report.broker_restarts += 1

    async def kills(self) -> None:
        if not self.plan.kill_every:
            return
        at = self.plan.kill_every
        while await self._until(at):
            async with self.lock:
                self.check_alive()
                name = self.rng.choice(sorted(self.workers))
                log.info("SIGKILL %s (pid %s)", name, self.workers[name].proc.pid if self.workers[name].proc else None)
                self.workers[name].kill()
                self.report.faults.append((time.time(), f"SIGKILL {name}"))
                self.report.kills += 1
                await self.restart(name)
            at = max(at + self.plan.kill_every, time.monotonic() - self.t0)

    async def pauses(self) -> None:
        if not self.plan.pause_every:
            return
        at = self.plan.pause_every
        while await self._until(at):
            async with self.lock:
                self.check_alive()
                name = self.rng.choice(sorted(self.workers))
                proc = self.workers[name].proc
                if proc is not None and proc.poll() is None:
                    log.info("SIGSTOP %s (pid %s) for %.0fs", name, proc.pid, self.plan.pause_s)
                    proc.send_signal(signal.SIGSTOP)
                    self.report.faults.append((time.time(), f"SIGSTOP {name}"))
                    try:
                        await asyncio.sleep(self.plan.pause_s)
                    finally:
                        proc.send_signal(signal.SIGCONT)
                        self.report.faults.append((time.time(), f"SIGCONT {name}"))
                    self.report.pauses += 1
            at = max(at + self.plan.pause_every, time.monotonic() - self.t0)

    async def restart(self, name: str) -> None:
        # a new Worker of the same name: same data dir (data-<name>), a fresh web port and log handle
        worker = self.cluster.worker(name)
        worker.start()
        self.workers[name] = worker
        try:
            await worker.wait_ready(timeout=180)
        except AssertionError as exc:  # not ready (or exited at start): a finding, and the run goes on
            self.report.problems.append(f"worker {name} did not come back after a kill: {str(exc)[:300]}")

    def check_alive(self) -> None:
        """A worker that died without being killed is a finding; it is started again so the run can finish."""
        for name, w in list(self.workers.items()):
            if w.proc is not None and w.proc.poll() is not None:
                self.report.problems.append(
                    f"worker {name} exited by itself with code {w.proc.returncode} (log {w.log_path}); its last "
                    f"ERROR lines and the end of its log:\n{_why_it_ended(w)}"
                )
                w.close()
                self.workers[name] = self.cluster.worker(name).start()


def _why_it_ended(worker: Worker) -> str:
    """What a CI report needs when a worker died by itself: its last ERROR/CRITICAL lines and the log's end
    (pytest keeps only three basetemps, so the log file itself is often gone by the time anyone reads it)."""
    try:
        lines = worker.log_path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"  (log unreadable: {exc})"
    errors = [line for line in lines if "ERROR" in line or "CRITICAL" in line][-10:]
    return "\n".join(f"  {line[:400]}" for line in [*errors, "  ...", *lines[-40:]])


# -- the run ----------------------------------------------------------------------------


async def publish(plan: ChaosPlan, topic: str, msgs: list[tuple[str, bytes | None]], t0: float) -> float:
    """Send at a steady rate; returns the wall time the last record was acknowledged."""
    # Idempotent, with a delivery timeout longer than the broker restart: no record is lost or doubled
    # by the producer itself, so every count below is the system's.
    producer = AIOKafkaProducer(
        bootstrap_servers=BOOTSTRAP, acks="all", enable_idempotence=True, linger_ms=5, request_timeout_ms=180_000,
    )
    await asyncio.wait_for(producer.start(), 30)
    try:
        futs = []
        for i, (key, value) in enumerate(msgs):
            delay = t0 + i / plan.rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            futs.append(await asyncio.wait_for(producer.send(topic, key=key.encode(), value=value), 200))
        await asyncio.wait_for(asyncio.gather(*futs), 200)
        return time.time()
    finally:
        await asyncio.wait_for(producer.stop(), 60)


def consumer_group_describe(app_id: str) -> str:
    try:
        done = subprocess.run(
            [str(ROOT / "scripts" / "kafka-tool"), "consumer-groups", "--bootstrap-server", BOOTSTRAP, "--describe",
             "--group", app_id],
            capture_output=True, text=True, timeout=120,
        )
        return done.stdout + done.stderr
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"(kafka-tool consumer-groups failed: {exc!r})"


async def run_chaos(tasks: int = 5000, *, tmp: Path, broker_env: dict[str, str] | None = None,
                    data: Path | None = None, **plan_fields: Any) -> ChaosReport:
    """One chaos run of ``tasks`` messages; ``plan_fields`` override ChaosPlan's defaults.

    ``data`` is where the workers' RocksDB data goes (default ``tmp``). ``broker_env`` adds to this process's
    environment for scripts/broker.sh (KAFKA_PORT, KAFKA_DATA_DIR, ...);
    the harness reaches the broker at KAFKA_BOOTSTRAP, and the two must name the same port.
    """
    plan = ChaosPlan(tasks=tasks, **plan_fields)
    broker = Broker(broker_env) if plan.broker_restart_at is not None else None
    started = time.monotonic()
    rng = random.Random(plan.seed)
    agent = unique("chaos")
    run = unique("c")
    msgs, poison = messages(plan, run, agent, rng)
    valid = {k for k, _ in msgs} - set(poison)
    ours = valid | set(poison)
    report = ChaosReport(plan, valid=len(valid), poison=len(poison))

    async with FakeLLM(seed=plan.seed) as fake:
        await fake.set_mode(error_rate=plan.error_rate, latency=plan.latency)
        cluster = Cluster(
            tmp, [agent], fake.url, extra=plan.breaker_toml(), data_root=data,
            # Lease lapses here are the run's own SIGKILLs, not a task that kills its worker: the default
            # of 3 would dead-letter (layer recovery) a task that happened to be on 3 killed workers in turn.
            settings={"AGENTS_STREAM_MAX_ATTEMPTS": "10"},
        )
        report.app_id, report.logs = cluster.app_id, str(tmp)
        stop_reading = asyncio.Event()
        background: list[asyncio.Task] = []
        try:
            names = [f"w{i}" for i in range(plan.workers)]
            workers = {n: cluster.worker(n).start() for n in names}
            await asyncio.gather(*(w.wait_ready(timeout=180) for w in workers.values()))
            seen = Seen()
            positioned = asyncio.Event()
            reader = asyncio.create_task(read_outputs(seen, agent, ours, positioned, stop_reading))
            background.append(reader)
            # nothing is published before the reader has its start offsets
            waiter = asyncio.create_task(positioned.wait())
            try:
                await asyncio.wait({reader, waiter}, timeout=120, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
            if not positioned.is_set() and not reader.done():
                raise RuntimeError("the output reader found no start offsets within 120s")
            if reader.done():
                reader.result()

            chaos = Chaos(plan, cluster, workers, fake, broker, report)
            chaos.t0 = t0 = time.monotonic()
            faults = [asyncio.create_task(c)
                      for c in (chaos.outage(), chaos.broker_restart(), chaos.kills(), chaos.pauses())]
            background += faults
            last_publish = await publish(plan, topics.task_topic(agent), msgs, t0)
            report.publish_s = time.monotonic() - t0
            log.info("published %d messages in %.1fs; draining", len(msgs), report.publish_s)

            def drained() -> bool:
                for t in faults + [reader]:
                    if t.done() and not t.cancelled() and t.exception() is not None:
                        # a fault that could not be applied (or the reader failing) ends the run
                        raise RuntimeError(f"chaos task failed: {t.exception()!r}") from t.exception()
                return valid <= seen.results.keys() and set(poison) <= seen.dlq.keys()

            try:
                await eventually(drained, timeout=plan.drain_timeout, interval=0.5, what="every result and dead letter")
            except AssertionError:
                report.problems.append(
                    f"not drained {plan.drain_timeout:g}s after the last publish: "
                    f"{len(valid - seen.results.keys())} valid tasks without a result (e.g. "
                    f"{sorted(valid - seen.results.keys())[:3]}), "
                    f"{len(set(poison) - seen.dlq.keys())} poison pills without a dead letter"
                )
            await asyncio.sleep(3)  # late duplicates would arrive now
            chaos.stop.set()
            await asyncio.wait_for(asyncio.gather(*faults), 240)  # a kill or restart under way finishes first
            chaos.check_alive()
            await asyncio.gather(*(w.wait_ready(timeout=180) for w in chaos.workers.values()))

            topic = topics.task_topic(agent)
            try:
                await eventually(lambda: _lag_is_zero(cluster.app_id, topic), timeout=90, interval=2, what="lag 0")
                report.lag = 0
            except AssertionError:
                report.lag = await uncommitted(cluster.app_id, topic)
                report.problems.append(f"consumer group lag on {topic} is {report.lag} after the drain")
            await asyncio.sleep(1)
            stop_reading.set()
            await asyncio.wait_for(reader, 30)
            check(report, seen, valid, poison, fake)
            firsts = [min(m.timestamp for m in msgs) for msgs in (*seen.results.values(), *seen.dlq.values())]
            report.drain_s = max(0.0, max(firsts, default=0) / 1000 - last_publish)
            if report.problems:
                report.evidence = "consumer group:\n" + await asyncio.to_thread(consumer_group_describe, cluster.app_id)
        finally:
            stop_reading.set()
            for t in background:
                t.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            cluster.close()
    report.total_s = time.monotonic() - started
    return report


async def _lag_is_zero(group: str, topic: str) -> bool:
    return await uncommitted(group, topic) == 0


# -- command line ---------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.chaos``: one run, the figures, exit 1 when a check failed."""
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.splitlines()[0])
    defaults = ChaosPlan()
    for f in fields(ChaosPlan):
        flag = "--" + f.name.replace("_", "-")
        default = getattr(defaults, f.name)
        if f.name == "broker_restart_at":
            parser.add_argument(flag, type=float, default=default,
                                help="seconds after the first publish (default %(default)s)")
        else:
            parser.add_argument(flag, type=type(default), default=default, help="default %(default)s")
    parser.add_argument("--no-broker-restart", action="store_true",
                        help="for a broker scripts/broker.sh does not manage")
    parser.add_argument("--keep", action="store_true", help="keep the worker logs and data dirs when the run passes")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s chaos %(message)s", stream=sys.stderr)
    logging.getLogger("aiokafka").setLevel(logging.ERROR)
    plan = {f.name: getattr(args, f.name) for f in fields(ChaosPlan) if f.name != "tasks"}
    if args.no_broker_restart:
        plan["broker_restart_at"] = None
    tmp = Path(tempfile.mkdtemp(prefix="chaos-"))
    started = time.monotonic()
    report = asyncio.run(run_chaos(args.tasks, tmp=tmp, **plan))
    print(report.table())
    print(f"wall time {time.monotonic() - started:.1f}s; broker {BOOTSTRAP}")
    if report.problems:
        print(report.describe())
        return 1
    if args.keep:
        print(f"logs and data: {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

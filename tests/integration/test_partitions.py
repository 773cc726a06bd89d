"""Real faults while an agent moves money: a worker cut off from the network (its own namespace, its link down) or
paused (SIGSTOP) past the session timeout and the lease, while another worker of the same app id takes its tasks
over and finishes them; then the first one comes back. Each account is charged once, each task has one result, and
the worker that was cut off says it was fenced.

The agent is the billing agent (agents_stream/examples/billing.py): it looks the account up, then charges it
through the payment service (payment.charge), which is idempotent by the call's key (``<task>:<turn>:<call_id>``).
The fake LLM answers every task by its own conversation: turn 0 looks up, turn 1 charges (the decision takes
CHARGE_DECISION_S, so the fault lands while the model is deciding), turn 2 answers.
The model names a new call id each time it is asked, as a real one does: a worker that asks turn 1 again gets a
different key, and only ownership of the task keeps the service from charging twice. So the services count EFFECTS
(keys that took effect), per account, not requests.

The "mid journal write" tests (e, f) cut only W1's way to the broker (Netns's side link) as the model is asked the
charges: the answers still reach W1, which journals each charge call, and those changelog writes are held in the
cut, unconfirmed, so W1's loop waits to be told to run the charge.

Test (h) holds W1's final answers until W1 is back in the group and owns every partition again (W2 finished and
left): the model's answers then reach a worker that holds the tasks' partitions but not their dispatches.

The product fences a worker that lost its partitions and logs a line containing "fenced" (the product's word,
docs/security.md); the tests assert it last, after the effects and the results.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from agents_stream.contract import topics
from agents_stream.examples.services import FakeServices
from agents_stream.testing.fakellm import FakeLLM, RecordedRequest, Reply, call, ok, status, tool_calls

from .harness import BOOTSTRAP, Cluster, Worker, encode, eventually, produce, results_for, task, unique
from .netpart import Netns

BILLING = "agents_stream.examples.billing:BILLING"
ACCOUNTS = 3
CHARGE = 42.5
#: how long the model takes to decide the charge: the window a fault is injected in
CHARGE_DECISION_S = 4.0
#: kept small so a takeover happens in seconds: the group drops a silent member after the session timeout, and a
#: new owner re-dispatches a task once its lease has run out
FAST_FAILOVER = {"AGENTS_STREAM_SESSION_TIMEOUT_S": "6", "AGENTS_STREAM_LEASE_TTL_S": "10"}
BROKER_PORT = int(BOOTSTRAP.rpartition(":")[2])


@dataclass
class Scenario:
    """The accounts, their tasks, the fakes and the two workers of one test."""

    agent: str
    llm: FakeLLM
    services: FakeServices
    cluster: Cluster
    accounts: dict[str, str]  # task_id → account
    #: turn → seconds the model takes to answer it (a fault is injected while one is being decided)
    latency: dict[int, float]
    #: when the fault began, W2 finished, the fault healed (time.time(), as the services record calls)
    marks: dict[str, float] = field(default_factory=dict)

    def mark(self, what: str) -> None:
        self.marks[what] = time.time()

    def timeline(self) -> str:
        """The charges and the marks, in seconds since the fault: what the report of a run shows."""
        start = self.marks.get("fault", 0.0)
        events = [(t, name) for name, t in self.marks.items()]
        events += [(c.at, f"charge {c.key}") for c in self.services.calls
                   if c.operation == "payment.charge" and not c.replay and not c.failed]
        events += [(r.ts, f"turn {_turn(r)} asked") for r in self.llm.requests if r.task_id in self.accounts
                   and r.ts >= start]
        return ", ".join(f"{name} +{t - start:.1f}s" for t, name in sorted(events))

    def reply(self, request: RecordedRequest, turn: int) -> Reply | None:
        account = self.accounts.get(request.task_id or "")
        if account is None:
            return None
        latency = self.latency.get(turn, 0.0)
        if turn == 0:
            return tool_calls(call("lookup_account", {"account": account}), latency=latency)
        if turn == 1:  # a new call id each time (the API's own): a turn asked twice names a new key
            return tool_calls(call("charge", {"account": account, "amount": CHARGE}), latency=latency)
        return ok(f"Charged {account} {CHARGE:.2f}.", latency=latency)

    def asked(self, turn: int) -> set[str]:
        """Tasks whose ``turn`` the model has been asked for."""
        return {r.task_id for r in self.llm.requests if r.task_id in self.accounts and _turn(r) == turn}

    def charges(self) -> dict[str, list[str]]:
        """account → the keys under which the payment service charged it (took effect; replays excluded)."""
        effects = self.services.effects("payment.charge", "account")
        return {a: effects.get(a, []) for a in self.accounts.values()}

    async def send_tasks(self) -> None:
        payloads = []
        for task_id, account in self.accounts.items():
            t = task(self.agent, task_id, instruction=f"Charge account {account} for its order.")
            t["context_data"] = {"account": account}
            payloads.append(encode(t))
        await produce(topics.task_topic(self.agent), payloads)


def _turn(request: RecordedRequest) -> int:
    body = request.body or {}
    return sum(1 for m in body.get("messages", []) if isinstance(m, dict) and m.get("role") == "assistant")


def _toml(agent: str, llm_url: str) -> str:
    # Breakers are shared through agent.circuits by every app id on the broker: calls that hang in a cut would open
    # the charge tool's breaker for the next test, and another test's outage of a provider of the same name would
    # hold this one's. Its own provider name, and thresholds no run of these tests reaches, keep them apart.
    provider = unique("llm")
    return ('[breaker]\nfailure_threshold = 100000\nfailure_rate_threshold = 1.0\nminimum_calls = 100000\n\n'
            f'[providers.{provider}]\nkind = "openai"\nbase_url = "{llm_url}/v1"\nmodel = "fake-model"\n'
            # longer than any cut here: the answer W1 was waiting for reaches it when the link heals
            f'timeout_s = 45\n\n[agents.{agent}]\nproviders = ["{provider}"]\nagent = "{BILLING}"\n')


@contextlib.asynccontextmanager
async def scenario(cluster_factory: Callable[..., Cluster], latency: dict[int, float],
                   **settings: str) -> AsyncIterator[Scenario]:
    agent = unique("charge")
    accounts = {unique("task"): unique("acct") for _ in range(ACCOUNTS)}
    async with FakeServices() as services, FakeLLM(default=None) as llm:
        cluster = cluster_factory([agent], None, toml=_toml(agent, llm.url),
                                  AGENTS_STREAM_REFUND_SERVICES=services.url, **{**FAST_FAILOVER, **settings})
        s = Scenario(agent, llm, services, cluster, accounts, latency)
        llm.responder = s.reply
        yield s


async def w2_finishes_then_heal(s: Scenario, net: Netns) -> None:
    """W2 starts and finishes every task while W1 is cut off; only then does W1's link come back, and the run
    goes quiet."""
    await s.cluster.started("w2")
    await results_for(set(s.accounts), timeout=60)
    s.mark("w2 done")
    net.heal()
    s.mark("heal")
    await quiesce(s)


async def quiesce(s: Scenario, *, at_least: float = 12.0, quiet: float = 6.0, timeout: float = 45.0) -> None:
    """Give the worker that came back its chance to act: at least ``at_least`` seconds, ending with ``quiet`` seconds
    in which neither the model nor the services were asked anything."""
    started = time.monotonic()
    seen, changed = -1, started
    while (now := time.monotonic()) - started < timeout:
        activity = len(s.llm.requests) + len(s.services.calls)
        if activity != seen or s.llm.in_flight:
            seen, changed = activity, now
        if now - started >= at_least and now - changed >= quiet:
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"the workers were still calling the model or the services {timeout}s after the fault healed")


async def assert_once_each(s: Scenario, zombie: Worker) -> None:
    """Each account charged once, one distinct result per task (none lost), and the zombie said it was fenced."""
    results = await results_for(set(s.accounts), timeout=20)
    charges = s.charges()
    distinct = {tid: {m.value for m in results.get(tid, [])} for tid in s.accounts}
    print(f"\npartitions: charges per account {[len(k) for k in charges.values()]}, results per task "
          f"{[len(results.get(t, [])) for t in s.accounts]}, distinct {[len(d) for d in distinct.values()]}, statuses "
          f"{[[json.loads(m.value).get('status') for m in results.get(t, [])] for t in s.accounts]}\n"
          f"partitions: {s.timeline()}")
    assert all(len(keys) == 1 for keys in charges.values()), f"each account charged once: {charges}"
    # Once every task has its result, nobody asks the model about them: a worker that lost its tasks stops its runs
    # before their next call (execution/membership.py), it does not go on asking for tasks that are done.
    done = s.marks["w2 done"]
    late = [(r.task_id, _turn(r), f"+{r.ts - done:.1f}s") for r in s.llm.requests if r.task_id in s.accounts
            and r.ts > done]
    assert not late, f"the model was asked after every task had its result: {late}; {s.timeline()}"
    assert all(len(d) == 1 for d in distinct.values()), f"one distinct result per task: {distinct}"
    for tid, values in distinct.items():
        result = json.loads(next(iter(values)))
        assert result["status"] == "succeeded" and result["output"] == f"Charged {s.accounts[tid]} {CHARGE:.2f}."
    # "fenced" is the product's word (docs/security.md): the worker that lost its partitions says so in its log.
    log = zombie.log_path.read_text(errors="replace")
    assert "fenced" in log, f"{zombie.name} never logged that it was fenced:\n{zombie.tail(40)}"


@contextlib.asynccontextmanager
async def w1_cut_off(s: Scenario, ready: Callable[[], bool], what: str) -> AsyncIterator[tuple[Worker, Netns]]:
    """W1 alone in its own network namespace takes every task to ``ready``; then its link goes down. Yields W1 and
    its namespace (to heal); W1 is killed on the way out."""
    w1 = s.cluster.worker("w1")
    with Netns(expose=[BROKER_PORT, s.llm.port, s.services.port], publish=[w1.web_port]) as net:
        w1.prefix = net.exec_prefix()
        w1.start()
        await w1.wait_ready()
        await s.send_tasks()
        await eventually(ready, timeout=45, interval=0.1, what=what)
        net.cut()
        s.mark("fault")
        try:
            yield w1, net
        finally:
            w1.kill()  # before its namespace goes: the worker is the namespace's last process


async def cut_while(s: Scenario, ready: Callable[[], bool], what: str, before_heal: Callable[[], Any] | None = None,
                    ) -> Worker:
    """W1 is cut off at ``ready`` (``w1_cut_off``), W2 (on the host) takes the tasks over and finishes them; then
    the link comes back. Returns W1."""
    async with w1_cut_off(s, ready, what) as (w1, net):
        if before_heal is not None:
            before_heal()
        await w2_finishes_then_heal(s, net)
    return w1


async def paused_while_w2_finishes(s: Scenario, w1: Worker) -> None:
    """W1 is stopped (SIGSTOP); W2 starts, takes the tasks over and finishes them; then W1 continues (SIGCONT), is
    given its chance to act, and each account must have been charged once."""
    assert w1.proc is not None
    os.kill(w1.proc.pid, signal.SIGSTOP)
    s.mark("fault")
    try:
        await s.cluster.started("w2")
        await results_for(set(s.accounts), timeout=60)
        s.mark("w2 done")
    finally:
        os.kill(w1.proc.pid, signal.SIGCONT)
        s.mark("heal")
    await quiesce(s)
    await assert_once_each(s, w1)


async def test_a_worker_cut_off_while_the_model_decides_a_charge_never_charges(cluster_factory):
    """(a) W1's link goes down while the model decides the charge of every account, for longer than the session
    timeout and the lease; W2 takes the tasks over and charges each account; W1's link comes back."""
    async with scenario(cluster_factory, {1: CHARGE_DECISION_S}) as s:
        w1 = await cut_while(s, lambda: s.asked(1) == set(s.accounts), "every charge being decided on W1")
        await assert_once_each(s, w1)


async def test_a_worker_paused_while_the_model_decides_a_charge_never_charges(cluster_factory):
    """(b) A paused worker: W1 is stopped (SIGSTOP) while the model decides the charges, past the session
    timeout and the lease; W2 starts, takes the tasks over and finishes them; then W1 continues (SIGCONT)."""
    async with scenario(cluster_factory, {1: CHARGE_DECISION_S}) as s:
        w1 = await s.cluster.started("w1")
        assert w1.proc is not None
        await s.send_tasks()
        await eventually(lambda: s.asked(1) == set(s.accounts), timeout=45, interval=0.1,
                         what="every charge being decided on W1")
        await paused_while_w2_finishes(s, w1)


async def test_a_worker_cut_off_while_the_payment_service_answers_never_charges_again(cluster_factory):
    """(c) The charges took effect at the service, which holds its answers; W1 is cut off while it waits for them.
    W2 takes over; W1 comes back to the answers."""
    async with scenario(cluster_factory, {}) as s:
        s.services.delay("payment.charge", 30)

        def charged() -> bool:
            return all(len(keys) == 1 for keys in s.charges().values())

        # W2's own calls answer at once (and the held answers go into the cut)
        w1 = await cut_while(s, charged, "every charge taken effect, its answer held",
                             before_heal=lambda: s.services.delay("payment.charge", 0))
        await assert_once_each(s, w1)


async def test_a_worker_cut_off_while_its_final_answer_is_in_flight_sends_no_second_result(cluster_factory):
    """(d) The model has decided every task's final answer (turn 2) and is sending it when W1 is cut off: W1 would
    send the results after W2 sent its own."""
    async with scenario(cluster_factory, {2: 2.0}) as s:
        w1 = await cut_while(s, lambda: s.asked(2) == set(s.accounts), "every final answer being decided on W1")
        await assert_once_each(s, w1)


#: the charge decision of the journal tests: the broker is cut as the last charge is asked, and the answers must reach
#: W1 while it still counts itself a member (a commit accepted less than half the 6 s session timeout before, sent
#: every quarter of it), so that each charge call is journaled in the changelog (not sent on the outcomes topic)
JOURNAL_DECISION_S = 1.0
#: how long W1 is given to journal the answers it got, before it is paused (f)
JOURNAL_WRITE_S = 1.0
#: how long a healed link takes to carry the held writes to the broker and its answers back (tcpfwd: 1 s RTO max)
HEALED_S = 3.0


@contextlib.asynccontextmanager
async def journal_cut(s: Scenario, w1: Worker) -> AsyncIterator[Netns]:
    """W1 alone, in its own namespace, whose broker port crosses the side link; the fake LLM cuts that link as it is
    asked the last account's charge (before any charge is answered): the answers arrive, the journal writes of the
    charge calls cannot. Yields once every charge was answered."""
    with Netns(expose=[s.llm.port, s.services.port], side=[BROKER_PORT], publish=[w1.web_port]) as net:
        reply = s.reply

        def cut_at_the_last_charge(request: RecordedRequest, turn: int) -> Reply | None:
            if turn == 1 and "fault" not in s.marks and s.asked(1) == set(s.accounts):
                net.cut_side()  # blocks the fake LLM for the few ms `ip` takes: no answer goes out meanwhile
                s.mark("fault")
            return reply(request, turn)

        s.llm.responder = cut_at_the_last_charge
        w1.prefix = net.exec_prefix()
        w1.start()
        await w1.wait_ready()
        await s.send_tasks()

        def answered() -> bool:
            return {r.task_id for r in s.llm.requests if r.task_id in s.accounts and _turn(r) == 1
                    and r.status == 200} == set(s.accounts)

        await eventually(answered, timeout=45, interval=0.1, what="every charge decided and answered to W1")
        s.mark("answered")
        try:
            yield net
        finally:
            w1.kill()  # before its namespace goes: the worker is the namespace's last process


async def test_a_worker_cut_off_from_the_broker_while_journaling_a_charge_never_charges(cluster_factory):
    """(e) The model's charge decisions reach W1, but the journal entries naming the charge calls do not reach the
    broker: W1's way to the broker is cut, the model and the services still answer. W2 takes the tasks over (the
    charges are not in the changelog it recovers, so the model is asked them again, under new call ids) and finishes
    them; then W1's link heals and its journal writes are confirmed."""
    async with scenario(cluster_factory, {1: JOURNAL_DECISION_S}) as s:
        w1 = s.cluster.worker("w1")
        async with journal_cut(s, w1) as net:
            await w2_finishes_then_heal(s, net)
        await assert_once_each(s, w1)


async def test_a_worker_paused_while_its_charge_journal_write_is_held_never_charges(cluster_factory):
    """(f) As (e), but W1 is also stopped (SIGSTOP) once it got the answers; W2 takes over and finishes; the link
    heals while W1 is still stopped, so the broker confirms W1's journal writes — after W2's — and the confirmations
    wait in W1's sockets; then W1 continues (SIGCONT) to find its charge calls durable."""
    async with scenario(cluster_factory, {1: JOURNAL_DECISION_S}) as s:
        w1 = s.cluster.worker("w1")
        async with journal_cut(s, w1) as net:
            await asyncio.sleep(JOURNAL_WRITE_S)  # W1 journals the answers (into the cut) within milliseconds
            assert w1.proc is not None
            os.kill(w1.proc.pid, signal.SIGSTOP)
            s.mark("pause")
            try:
                await s.cluster.started("w2")
                await results_for(set(s.accounts), timeout=60)
                s.mark("w2 done")
                net.heal()
                s.mark("heal")
                await asyncio.sleep(HEALED_S)  # W1's held journal writes land; the broker's answers wait for W1
            finally:
                os.kill(w1.proc.pid, signal.SIGCONT)
                s.mark("continue")
            await quiesce(s)
        await assert_once_each(s, w1)


#: the first retry of a failed model call waits 4-8 s (full jitter over half the ceiling): it comes due while W1 is
#: stopped, so the retries fire as W1 wakes, before its next heartbeat can tell it that it was expelled
RETRY_DUE_WHILE_STOPPED = {"AGENTS_STREAM_BACKOFF_BASE_S": "8", "AGENTS_STREAM_BACKOFF_CAP_S": "8"}


async def test_a_worker_paused_while_its_model_calls_back_off_asks_the_model_nothing_when_it_wakes(cluster_factory):
    """(g) The model's first answer to each task is a 500; W1 is stopped (SIGSTOP) while its retries back off, W2
    takes the tasks over and finishes them, then W1 continues (SIGCONT): its retries come due at once. A run of a
    worker the group expelled calls nothing (execution/membership.py): W1 waits for the group's word, is refused,
    and stops its runs — the model is asked nothing after the results (assert_once_each)."""
    async with scenario(cluster_factory, {}, **RETRY_DUE_WHILE_STOPPED) as s:
        failed: set[str] = set()
        reply = s.reply

        def first_call_fails(request: RecordedRequest, turn: int) -> Reply | None:
            if request.task_id in s.accounts and request.task_id not in failed:
                failed.add(request.task_id)
                return status(500)
            return reply(request, turn)

        s.llm.responder = first_call_fails
        w1 = await s.cluster.started("w1")
        assert w1.proc is not None
        await s.send_tasks()
        await eventually(lambda: failed == set(s.accounts), timeout=45, interval=0.05,
                         what="every task's first model call failed on W1")
        await asyncio.sleep(0.3)  # the 500s reach W1, whose retries start backing off
        await paused_while_w2_finishes(s, w1)


#: how long the model holds W1's final answers in (h): longer than the whole test, so they arrive when the test
#: releases them (FakeLLM.release_held), never before
HELD_S = 300.0


async def test_a_worker_back_with_the_tasks_partitions_when_its_final_answer_arrives_sends_no_second_result(
        cluster_factory):
    """(h) As (d), but the final answers reach W1 only once it is back in the group and owns every partition again:
    W2 finished the tasks and left before the link healed. W1 holds the tasks' partitions, but not the dispatches
    its runs were given before the cut: each run must say it is fenced, and send no second result."""
    async with scenario(cluster_factory, {}) as s:
        reply = s.reply

        def hold_w1_final_answers(request: RecordedRequest, turn: int) -> Reply | None:
            answer = reply(request, turn)
            if answer is not None and turn == 2 and "fault" not in s.marks:  # asked by W1, before the cut
                answer = ok(answer.text or "", latency=HELD_S)
            return answer

        s.llm.responder = hold_w1_final_answers
        async with w1_cut_off(s, lambda: s.asked(2) == set(s.accounts), "every final answer being decided on W1",
                              ) as (w1, net):
            w2 = await s.cluster.started("w2")
            await results_for(set(s.accounts), timeout=60)
            s.mark("w2 done")
            code, _ = w2.terminate()  # W2 leaves the group: W1, back, is its only member and owns every partition
            assert code == 0, f"w2 exited with {code}:\n{w2.tail()}"
            readied = w1.log_path.read_text(errors="replace").count("Worker ready")
            net.heal()
            s.mark("heal")
            await eventually(lambda: w1.log_path.read_text(errors="replace").count("Worker ready") > readied,
                             timeout=60, interval=0.2, what="W1 back in the group, its partitions recovered")
            s.llm.release_held()
            s.mark("answers")
            await quiesce(s)
        await assert_once_each(s, w1)
        # W1 came back as the group's only member: it must not commit its offsets from before the cut over W2's
        # (kafka/consumer.py, in_a_generation), or it reads the finished tasks again and sends their results twice.
        sent = {t: len(records) for t, records in (await results_for(set(s.accounts), timeout=20)).items()}
        assert all(n == 1 for n in sent.values()), f"results sent per task, one each: {sent}"
        log = w1.log_path.read_text(errors="replace")
        unfenced = [t for t in s.accounts if f"Task {t} (dispatch 1) is fenced" not in log]
        assert not unfenced, f"W1 got the final answers of {unfenced} and never said their runs were fenced"

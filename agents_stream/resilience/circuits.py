"""Provider circuits shared by every worker: breakers, Retry-After, presence, spend and limits, folded from one log.

Every worker appends what it learns about a provider to the single-partition topic ``agent.circuits`` and folds
that whole log, in one order, through ``breaker`` and ``ratelimit`` (the decisions live there; waiting lives here).
Why: docs/decisions.md, "One circuits log, folded by every worker"; the calls a failing provider receives are bounded
by its "Two rules bound the calls a failing provider receives".
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any, Callable, Iterable

from agents_stream.config import AppConfig
from agents_stream.contract import events
from agents_stream.contract.errors import CircuitOpen
from agents_stream.resilience import breaker, breaker_events
from agents_stream.resilience.breaker import Transition
from agents_stream.resilience.circuit import Circuit, LogRecord, Permit, circuit_id
from agents_stream.resilience.presence import Cadence, Presence
from agents_stream.resilience.ratelimit import ramp, rebucket, share, take

__all__ = ["MAX_RETRY_AFTER_S", "Circuits", "LogRecord", "Permit", "Publish", "circuit_id"]

log = logging.getLogger(__name__)

#: appends one (key, value) to agent.circuits; may return a future (its failure is logged)
Publish = Callable[[bytes, bytes], Any]
OnTransition = Callable[[str, Transition, bool], None]

#: how long a worker waits for its own failure event to come back before calling anyway
_UNFOLDED_WAIT_S = 2.0
#: how long a probe request waits for the log's verdict
_PROBE_VERDICT_S = 3.0
#: Retry-After assumed for a 429 that did not say
_DEFAULT_RETRY_AFTER_S = 1.0
#: senders' report times kept per circuit before the ones older than the window are dropped
_REPORTERS_KEPT = 64
#: the longest a Retry-After (a provider's, or one read from the log) keeps a provider shut: after it, one call
#: asks again, and a provider still busy says so with a new Retry-After
MAX_RETRY_AFTER_S = 300.0


class Circuits:
    """One worker's view of the shared circuits log, and the gate its calls pass.

    Feed it the log's records, in order, with ``fold`` (``agents_stream.kafka.circuits_log``
    reads them from Kafka, ``agents_stream.testing.memory_circuits_log`` from memory).
    """

    def __init__(
        self,
        config: AppConfig,
        providers: list[str],
        worker_id: str,
        *,
        send: Publish,
        on_transition: OnTransition,
        on_change: Callable[[], None],
        spend_report: Callable[[], dict[str, Any]] = dict,
        app_id: str = "",
        cadence: Cadence = Cadence(),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.worker_id = worker_id
        #: provider name → its circuit; names that configure the same endpoint and model share one
        self._circuits: dict[str, Circuit] = {}
        self._by_id: dict[str, Circuit] = {}
        for name in dict.fromkeys(providers):
            pconf = config.provider(name)
            cid = circuit_id(pconf)
            if cid not in self._by_id:
                self._by_id[cid] = Circuit(cid, pconf, config.breaker_for(name))
            self._circuits[name] = self._by_id[cid]
        self._send = send
        self._on_transition = on_transition
        self._on_change = on_change
        self._spend_report = spend_report
        self.presence_s = presence_s = cadence.presence_s
        #: how often report_successes is due (the circuits log's service calls it)
        self.report_s = cadence.report_s
        self._clock = clock
        self.app_id = app_id
        self._changed = asyncio.Event()  # breaker state, Retry-After or probe places changed
        self._slot_freed = asyncio.Event()  # a call of this worker ended
        self._start_offset = 0
        #: workers' presence and spend reports, bounded (a presence counts for three intervals)
        self._presence = Presence(3 * presence_s)
        #: records folded so far
        self.folded = 0

    def providers(self) -> list[str]:
        """The provider names this worker calls (several may share one circuit)."""
        return list(self._circuits)

    def providers_down(self) -> list[str]:
        """The provider names that admit no call now (open, or told to wait by a Retry-After), sorted."""
        return sorted(p for p in self._circuits if not self.available(p)[0])

    def endpoints(self) -> list[str]:
        """The circuit ids (endpoint, model, account) this worker calls, as its presence reports them."""
        return sorted(self._by_id)

    def begin(self, offset: int) -> None:
        """The first offset this worker folds: transitions caused before it are adopted from the log."""
        self._start_offset = offset

    def hello(self) -> None:
        """Announce this worker's presence, endpoints and spend (shared limits are split among live workers)."""
        spend = self._spend_report()
        self._publish(events.CircuitHello, None, providers=self.endpoints(), app=self.app_id, spend=spend)

    # -- the fold ------------------------------------------------------------------------

    def fold(self, records: Iterable[LogRecord]) -> None:
        """Apply the log's next records, in offset order; callers waiting on a change are woken once."""
        changed = False
        for record in records:
            self.folded += 1
            try:
                changed |= self._fold(record)
            except Exception as exc:  # one bad record (another version's, a bug) must not stop the fold
                log.warning("Circuits: skipping unusable event at offset %d: %r", record.offset, exc)
        if changed:
            self._signal()

    def _fold(self, record: LogRecord) -> bool:
        """Apply one record; True when what callers wait on changed (state, Retry-After, probe places)."""
        ev = breaker_events.read(record.value)  # raises for a broken record: fold() logs and skips it
        if ev is None:
            return False  # a newer worker's event kind
        # The broker's append time when the topic keeps it (LogAppendTime): one clock for
        # every worker, so a worker with a skewed clock cannot move the window or the timeout.
        at = record.timestamp / 1000.0 if record.timestamp_type == 1 else ev.at
        if isinstance(ev, events.CircuitHello):  # absent (None) fields: no endpoints, app "", no spend
            self._presence.hello(ev.worker, at, ev.providers or (), ev.app or "", ev.spend or {}, self._clock())
            return False
        c = self._by_id.get(ev.provider or "")
        if c is None:
            return False  # an endpoint this worker does not call
        mine = ev.worker == self.worker_id
        # The gate waits for its own failure to come back.
        woke_gate = mine and c.unfolded.pop(ev.id, None) is not None
        if isinstance(ev, events.CircuitRateLimited):
            # Bounded: a forged (or absurd) Retry-After cannot shut a provider for every worker for long.
            until = min(at + ev.retry_after if ev.retry_after is not None else ev.until, at + MAX_RETRY_AFTER_S)
            if not mine:
                c.retry_after_propagation_s = max(0.0, self._clock() - at)
            if until > c.blocked_until:
                c.blocked_until = until
                return True
            return woke_gate
        if isinstance(ev, events.CircuitTransition):
            # For a worker that joined after the cause: take over the state the log recorded.
            if ev.cause >= self._start_offset or ev.to == c.breaker.state:
                return False
        changed = False
        for event in breaker_events.breaker_events(ev, at, c.reported_at.get(ev.worker)):
            changed |= self._step(c, event, ev, mine, record.offset)
        if breaker_events.resets_count(ev):
            _reported(c, ev.worker, at)
        return changed or woke_gate

    def _step(self, c: Circuit, event: breaker.Event, ev: events.CircuitsEvent, mine: bool, offset: int) -> bool:
        """Step the breaker; True when what callers wait on changed."""
        before = c.breaker
        c.breaker, transitions = breaker.step(c.breaker, event, c.breaker_config)
        if isinstance(ev, events.CircuitProbe):
            waiter = c.probe_waiters.pop(ev.probe_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(breaker.admitted(c.breaker, ev.probe_id))
        for t in transitions:
            self._transition(c, t, mine and not isinstance(ev, events.CircuitTransition), offset)
        after = c.breaker
        moved = (before.state, before.opened_at, before.successes, before.probes) != (
            after.state, after.opened_at, after.successes, after.probes
        )
        # A probe request only adds a place (or is refused): nobody waiting can go on because of it.
        return (moved and not isinstance(ev, events.CircuitProbe)) or bool(transitions)

    def _transition(self, c: Circuit, t: Transition, mine: bool, offset: int) -> None:
        name = c.config.name or c.id
        log_at = logging.WARNING if t.to == breaker.OPEN else logging.INFO
        log.log(
            log_at,
            "Breaker %s: %s → %s (%s)%s", name, t.frm, t.to, t.reason,
            "; calls to it fall back or hold until it half-opens" if t.to == breaker.OPEN else "",
        )
        if mine:
            # The worker whose event caused it reports it once, and records it for joiners.
            b = c.breaker
            self._publish(events.CircuitTransition, c.id, to=b.state, opened_at=b.opened_at, closed_at=b.closed_at,
                          cause=offset)
        try:
            self._on_transition(name, t, mine)
        except Exception as exc:  # a reporting bug must not stop the fold
            log.exception("Circuits: transition callback failed: %r", exc)

    def _signal(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
        try:
            self._on_change()
        except Exception as exc:
            log.exception("Circuits: change callback failed: %r", exc)

    async def wait_change(self, timeout: float) -> None:
        """Return when a breaker, a Retry-After or a probe place changes, or after ``timeout``."""
        await _wait(self._changed, timeout)

    async def _wait_slot(self, timeout: float) -> None:
        await _wait(self._slot_freed, timeout)

    def _publish(self, event_type: Callable[..., events.InternalEvent], provider: str | None, **fields: Any) -> str:
        """Append one event of the log (keyed by its circuit, or by this worker for presence); its id."""
        event_id = uuid.uuid4().hex
        event = event_type(id=event_id, provider=provider, worker=self.worker_id, at=self._clock(), **fields)
        fut = self._send((provider or self.worker_id).encode(), events.encode(event))
        if hasattr(fut, "add_done_callback"):
            fut.add_done_callback(_log_send_failure)
        return event_id

    # -- what executors ask --------------------------------------------------------------

    def state(self, provider: str) -> str:
        c = self._circuits[provider]
        return breaker.view(c.breaker, self._clock(), c.breaker_config)

    def available(self, provider: str) -> tuple[bool, float | None]:
        """Whether a call could be admitted now (closed, or half-open), and if not, from when."""
        c = self._circuits[provider]
        now = self._clock()
        if c.blocked_until > now:
            return False, c.blocked_until
        state = breaker.view(c.breaker, now, c.breaker_config)
        if state == breaker.OPEN:
            return False, breaker.reopens_at(c.breaker, c.breaker_config)
        return True, None

    def live_workers(self, provider: str) -> int:
        """Workers (this one included) that said within three presence intervals that they call this endpoint."""
        return self._presence.live(self._circuits[provider].id, self.worker_id, self._clock())

    def concurrency_limit(self, provider: str) -> float | None:
        """This worker's share of the provider's cluster-wide max_concurrency, ramped after a close."""
        c = self._circuits[provider]
        if c.config.max_concurrency is None:
            return None
        limit = share(c.config.max_concurrency, self.live_workers(provider))
        return ramp(limit, c.breaker.closed_at, self._clock(), c.config.ramp_s)

    def spend(self, agent: str, day: str) -> float:
        """Cluster-wide spend of this app's agent on a UTC day, as the workers last reported it."""
        return self._presence.spend(self.app_id, agent, day)

    async def acquire(self, provider: str) -> Permit:
        """Admit one call, waiting for a slot; CircuitOpen when the provider takes none now.

        In half-open, while a probe is out (this worker's or another's), the call waits for its verdict, at most the
        provider's ``timeout_s``: admitted once it closes, CircuitOpen if it reopens or no verdict came.
        """
        c = self._circuits[provider]
        verdict_by: float | None = None  # loop time: the wait is this worker's, not the log's
        while True:
            now = self._clock()
            if c.blocked_until > now:
                raise CircuitOpen(
                    f"{provider} asked to wait (Retry-After) until {c.blocked_until:.3f}",
                    provider=provider, retry_at=c.blocked_until,
                )
            state = breaker.view(c.breaker, now, c.breaker_config)
            if state == breaker.OPEN:
                reopens = breaker.reopens_at(c.breaker, c.breaker_config)
                raise CircuitOpen(f"{provider}: circuit open", provider=provider, retry_at=reopens)
            if state == breaker.HALF_OPEN:
                if not self._probe_out(c, now):
                    try:
                        return await self._probe(c)
                    except CircuitOpen:
                        pass  # another worker's probe took the place: wait for its verdict like the rest
                loop_now = asyncio.get_running_loop().time()
                verdict_by = loop_now + c.config.timeout_s if verdict_by is None else verdict_by
                if loop_now >= verdict_by:
                    msg = f"{provider}: half-open, its probe gave no verdict within {c.config.timeout_s:g}s"
                    raise CircuitOpen(msg, provider=provider)  # no time known: a held task looks again later
                await self.wait_change(min(0.25, verdict_by - loop_now))
                continue
            # Closed. Our own failure not yet folded back: wait to learn whether it opened the breaker.
            stale = [i for i, sent in c.unfolded.items() if now - sent > _UNFOLDED_WAIT_S]
            for i in stale:
                del c.unfolded[i]
            if c.unfolded:
                await self.wait_change(0.05)
                continue
            limit = self.concurrency_limit(provider)
            if limit is not None and c.in_flight >= limit:
                await self._wait_slot(0.5)
                continue
            if c.config.rps is not None:
                rate = share(c.config.rps, self.live_workers(provider), minimum=0.1)
                c.bucket, wait = take(rebucket(c.bucket, rate, now), now)
                if wait > 0:
                    await asyncio.sleep(min(wait, 0.5))
                    continue
            c.in_flight += 1
            return Permit(provider)

    async def _probe(self, c: Circuit) -> Permit:
        name = c.config.name
        if c.probing:
            raise CircuitOpen(f"{name}: half-open, a probe from this worker is under way", provider=name)
        c.probing = True
        probe_id = uuid.uuid4().hex
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        c.probe_waiters[probe_id] = waiter
        admitted = False
        try:
            self._publish(events.CircuitProbe, c.id, probe_id=probe_id)
            admitted = await asyncio.wait_for(waiter, _PROBE_VERDICT_S)
        except asyncio.TimeoutError:
            # The verdict may still come, admitting a probe nobody sends: give the place back.
            self._publish(events.CircuitProbeCancel, c.id, probe_id=probe_id)
        finally:
            c.probe_waiters.pop(probe_id, None)
            if not admitted:
                c.probing = False
        if not admitted:
            # Someone else probes: ask again only after a pause, not on every wake-up.
            c.next_probe_at = self._clock() + min(1.0, c.breaker_config.open_timeout_s / 4)
            raise CircuitOpen(f"{name}: half-open, no probe place free", provider=name, retry_at=c.next_probe_at)
        c.in_flight += 1
        log.info("Breaker %s: half-open, probing with one real call", name)
        return Permit(name, probe_id)

    def _probe_out(self, c: Circuit, now: float) -> bool:
        """Whether a probe of this circuit is under way (here, or admitted by the log and not yet timed out), or
        this worker was refused a place moments ago."""
        if c.probing or now < c.next_probe_at:
            return True
        limit = c.breaker_config.probe_timeout_s
        return c.breaker.state == breaker.HALF_OPEN and any(now - t <= limit for _, t in c.breaker.probes)

    def probes_due(self) -> list[str]:
        """One provider name per circuit whose open timeout elapsed with no probe out: the ones to probe now."""
        now = self._clock()
        due: dict[str, str] = {}
        for name, c in self._circuits.items():
            state = breaker.view(c.breaker, now, c.breaker_config)
            if state == breaker.HALF_OPEN and c.blocked_until <= now and not self._probe_out(c, now):
                due.setdefault(c.id, name)
        return list(due.values())

    async def acquire_probe(self, provider: str) -> Permit:
        """Admit a probe of a circuit whose breaker is half-open, as the log decides (at most ``half_open_probes``
        cluster-wide); CircuitOpen when it is not half-open, a probe is out or the log refused."""
        c = self._circuits[provider]
        now = self._clock()
        if breaker.view(c.breaker, now, c.breaker_config) != breaker.HALF_OPEN or self._probe_out(c, now):
            raise CircuitOpen(f"{provider}: nothing to probe now", provider=provider)
        return await self._probe(c)

    def report_successes(self) -> None:
        """Put this worker's closed-state successes on the log, one count per circuit (none if there were none)."""
        now = self._clock()
        for c in self._by_id.values():
            if c.unreported:
                count, c.unreported = c.unreported, 0
                self._publish(events.CircuitSuccess, c.id, count=count, age=max(0.0, now - c.last_success))

    def release(self, permit: Permit, result: str, *, retry_after: float | None = None) -> None:
        """``result``: "success" (the provider answered), "failure" (it did not), "rate_limited", or "neutral"."""
        if permit.released:
            return
        permit.released = True
        c = self._circuits[permit.provider]
        c.in_flight -= 1
        self._slot_freed.set()
        self._slot_freed = asyncio.Event()
        if permit.probe_id is not None:
            c.probing = False
        if result == "failure":
            # The successes before it travel with it, so the log sees them before the failure.
            count, c.unreported = c.unreported, 0
            age = max(0.0, self._clock() - c.last_success) if count else None
            event_id = self._publish(
                events.CircuitFailure, c.id, probe_id=permit.probe_id, successes=count or None, success_age=age,
            )
            c.unfolded[event_id] = self._clock()
        elif result == "rate_limited":
            wait = min(retry_after if retry_after is not None else _DEFAULT_RETRY_AFTER_S, MAX_RETRY_AFTER_S)
            until = self._clock() + wait
            c.blocked_until = max(c.blocked_until, until)  # this worker obeys at once; the others once folded
            event_id = self._publish(events.CircuitRateLimited, c.id, until=until, retry_after=until - self._clock())
            c.unfolded[event_id] = self._clock()
            if permit.probe_id is not None:  # the provider answered: it is up, only busy
                self._publish(events.CircuitSuccess, c.id, probe_id=permit.probe_id)
        elif result == "success" and permit.probe_id is not None:
            self._publish(events.CircuitSuccess, c.id, probe_id=permit.probe_id)
        elif result == "success":
            # Counted, not sent: report_successes (every few seconds) or the next failure carries the count.
            c.unreported += 1
            c.last_success = self._clock()
        elif permit.probe_id is not None:  # "neutral", a cancelled call: nothing is known about the provider
            self._publish(events.CircuitProbeCancel, c.id, probe_id=permit.probe_id)
        if result == "rate_limited":
            self._signal()  # this worker's own view changed at once

    # -- for operators -----------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        now = self._clock()
        out = {}
        for name, c in self._circuits.items():
            out[name] = {
                "endpoint": c.id,
                **breaker.as_dict(c.breaker, now, c.breaker_config),
                "retry_after_until": c.blocked_until if c.blocked_until > now else None,
                "retry_after_propagation_s": c.retry_after_propagation_s,
                "in_flight_here": c.in_flight,
                "concurrency_limit_here": self.concurrency_limit(name),
                "live_workers": self.live_workers(name),
                "config": c.breaker_config.model_dump(),
            }
        return out


def _reported(c: Circuit, worker: str, at: float) -> None:
    """Remember ``worker``'s latest report of ``c``; a floor older than the window dates nothing the breaker
    still counts, so those are dropped (workers come and go under new ids)."""
    c.reported_at[worker] = at
    if len(c.reported_at) > _REPORTERS_KEPT:
        horizon = at - c.breaker_config.window_s
        c.reported_at = {w: t for w, t in c.reported_at.items() if t > horizon}


async def _wait(event: asyncio.Event, timeout: float) -> None:
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except asyncio.TimeoutError:
        pass


def _log_send_failure(fut: Any) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.warning(
            "Circuits: an event was not delivered (%r); other workers learn it from the next one", fut.exception()
        )

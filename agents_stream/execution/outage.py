"""Human handoff on an outage: a conversation round held past its agent's ``handoff_after_s`` ends (pure).

A held round is silent for the customer (docs/guide/failures.md: a task holds until a breaker lets a call
through). With ``handoff_after_s`` set, once every provider of the round's ladder has been unavailable that long
the round *ends*: its outcome is an ordinary TaskSucceeded whose output is the agent's ``handoff_text`` and whose
source is ``OUTAGE_SOURCE``. The ledger applies it as any round's end (ledger/conversation_rounds.round_ended): the
customer gets that reply (marked ``handoff: "outage"``) and the conversation is handed to a person (source
"outage"), in the same change. So the handoff is exactly as durable as a round's end: a kill before the outcome is
applied re-dispatches the round (which holds, and waits again), a kill after finds the round ended.
"""

from __future__ import annotations

import logging
import time

from agents_stream.config import AgentConfig
from agents_stream.contract.events import TaskSucceeded
from agents_stream.execution.run import Run, common

__all__ = ["OUTAGE_SOURCE", "handed_over"]

log = logging.getLogger(__name__)

#: the source of a round's outcome that hands its conversation to a person (the ledger looks for it)
OUTAGE_SOURCE = "handoff:outage"
#: the shortest wait before looking again (seconds): a hold never spins
_MIN_WAIT_S = 0.05


def handed_over(run: Run, config: AgentConfig, now: float | None = None) -> TaskSucceeded | None:
    """The held ``run``'s outage handoff once it has been held ``config.handoff_after_s`` (a conversation's round
    only); None: it stays held, and ``run.wait`` is cut so that it looks again when the wait is over."""
    if config.handoff_after_s is None or run.task.conversation is None or run.held_since is None:
        return None
    left = run.held_since + config.handoff_after_s - (time.monotonic() if now is None else now)
    if left > 0:
        run.wait = min(run.wait, max(left, _MIN_WAIT_S)) if run.wait > 0 else max(left, _MIN_WAIT_S)
        return None
    log.warning("Task %s: no provider of agent %s has been available for %.0fs (handoff_after_s): the round ends "
                "with the handoff reply and its conversation waits for a person (GET /handoffs); nothing to do "
                "but answer it there", run.task.task_id, run.task.agent_name, config.handoff_after_s)
    return TaskSucceeded(**common(run), status="succeeded", output=config.handoff_text, confidence="low",
                         source=OUTAGE_SOURCE, partial=False)

"""A round's summary of its conversation's older history: asked once, before its first model turn, and journaled.

The ledger puts in a round's task the summary so far and the items that fell out of the window since
(``TaskPayload.conversation.summary``, tables/summaries.py). Before the round's first model turn its run asks the
agent's summary provider (``[agents.<name>.summary]``) to fold those items into the summary, through the
circuits like any call (its breaker, rate limits and retries), and journals what came of it as a ``summary``
entry (a JournalEntry, durable before the loop goes on). A run started again on that journal (after a crash, a
takeover, a hold, an interrupt) finds the entry and never asks again. A summariser that fails (its breaker open,
its retries spent, an empty answer) is journaled too, with its ``error``: the round goes on at once with the
summary it had and its window, and the next round tries again from there. The round's reply never waits for a
summary that cannot be had.

Entry: ``{"kind": "summary", "turn": -1, "text": "..." | None, "until": 12, "error": None | "...",
"source": "summary:<provider>:<model>", "provider_calls": 1, "usage": {...}}``.
"""

from __future__ import annotations

import logging
from typing import Any

from agents_stream.contract.events import JournalEntry
from agents_stream.contract.models import SummaryInput
from agents_stream.execution.call import Caller
from agents_stream.execution.history import journaled
from agents_stream.execution.plan import AgentPlan, Tier
from agents_stream.execution.run import Run, Unavailable
from agents_stream.execution.steps import SendOutcome
from agents_stream.ops import metrics
from agents_stream.providers.base import Completion, Prompt

__all__ = ["Summariser", "summary_prompt", "usage"]

log = logging.getLogger(__name__)

SYSTEM = (
    "You keep the running summary of a customer's conversation with an agent. Given the summary so far and the "
    "messages that came after it, write the new summary: the facts, requests, promises and decisions the agent "
    "must remember, in plain sentences, at most {max_chars} characters. Answer with the summary only."
)


def summary_prompt(task_id: str, given: SummaryInput, max_chars: int) -> Prompt:
    """The summariser's request: the summary so far and the items to fold into it (bounded by the ledger)."""
    lines = [f"{'Customer' if h.role == 'customer' else 'Agent'}: {h.text}" for h in given.items]
    before = given.text or "(none yet: this is the beginning of the conversation)"
    instruction = (f"[task_id={task_id}]\nThe summary so far:\n{before}\n\nThe messages after it:\n"
                   + "\n".join(lines) + "\n\nThe new summary:")
    return Prompt(instruction=instruction, system=SYSTEM.format(max_chars=max_chars),
                  max_tokens=max(64, max_chars // 3))


def usage(entries: list[Any]) -> tuple[int, int, int, float | None]:
    """The journaled summary's provider calls, input and output tokens and cost (zeros: none)."""
    entry = journaled(entries)
    if entry is None:
        return 0, 0, 0, None
    used = entry.get("usage") or {}
    return (int(entry.get("provider_calls") or 0), int(used.get("input_tokens") or 0),
            int(used.get("output_tokens") or 0), used.get("cost"))


class Summariser:
    """Asks an agent's summary provider for a round's summary, once per round, and journals what came of it."""

    def __init__(self, caller: Caller, send_outcome: SendOutcome) -> None:
        self.caller = caller
        self._send_outcome = send_outcome

    async def ensure(self, run: Run, plan: AgentPlan) -> None:
        """Before the round's first model turn: its summary journaled (nothing to do when it has no items to fold
        in, no summariser, or its journal holds the entry already)."""
        task = run.task
        given = task.conversation.summary if task.conversation is not None else None
        config = plan.config.summary
        if given is None or not given.items or config is None or journaled(run.steps_done) is not None:
            return
        if plan.summarizer is None:
            log.warning("Round %s: agent %s's summary provider %s is not usable (its API key is not set): the round "
                        "shows the summary it had and its window; set the key to have summaries", task.task_id,
                        task.agent_name, config.provider)
            return
        entry = await self._summarise(run, plan, given, config.max_chars)
        kept = JournalEntry(worker=run.worker, dispatch=run.dispatch, index=len(run.steps_done), output=entry)
        await self._send_outcome(task.task_id, kept)  # durable (or raises: the run stops, as for a turn)
        run.steps_done.append(entry)

    async def _summarise(self, run: Run, plan: AgentPlan, given: SummaryInput, max_chars: int) -> dict[str, Any]:
        assert plan.summarizer is not None
        provider = plan.summarizer
        tier = Tier("summary", provider, "low")
        calls, cost = run.calls, run.cost or 0.0
        answer = await self.caller.complete(run, tier, summary_prompt(run.task.task_id, given, max_chars))
        entry: dict[str, Any] = {"kind": "summary", "turn": -1, "text": None, "until": given.until, "error": None,
                                 "source": f"summary:{provider.name}", "provider_calls": run.calls - calls,
                                 "usage": {"input_tokens": 0, "output_tokens": 0, "cost": None}}
        if isinstance(answer, Completion) and answer.text.strip():
            text = answer.text.strip()
            if len(text) > max_chars:
                text = text[: max_chars - 1] + "…"
            entry.update(text=text, source=f"summary:{provider.name}:{answer.model}", usage={
                "input_tokens": answer.usage.input_tokens, "output_tokens": answer.usage.output_tokens,
                "cost": None if run.cost is None else run.cost - cost})
            metrics.summaries.labels(run.task.agent_name, "written").inc()
            log.info("Round %s: %d older item(s) folded into the conversation's summary by %s (%d characters)",
                     run.task.task_id, len(given.items), provider.name, len(text))
            return entry
        if isinstance(answer, Completion):
            why = "it answered with no text"
        else:
            why = answer.why if isinstance(answer, Unavailable) else answer.error
        metrics.summaries.labels(run.task.agent_name, "failed").inc()
        entry["error"] = f"the summary provider {provider.name} gave no summary: {why}"
        log.warning("Round %s: %s; the round goes on with the summary it had and its window (the next round tries "
                    "again with the items since the last summary). If this repeats, check provider %s (its breaker "
                    "on the console, its key, its model)", run.task.task_id, entry["error"], provider.name)
        return entry

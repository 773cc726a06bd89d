"""The built-in ``handoff`` tool: an agent hands its conversation to a person (docs/guide/handoff.md).

Add it to an agent's tools (``Agent(tools=[..., handoff])``) and say in its instructions when to call it — the
customer asks for a person, a refund past what it may decide. The call itself changes nothing: its result, in the
round's journal, says the conversation is handed over; the round's reply goes out as usual (the model is told to
say it connects the customer to a person), and when the ledger applies the round's end it finds the call in the
journal (tables/handoff.requested) and the conversation waits for an operator. So the handoff is exactly as
durable as the round: a kill before the round ends replays the journal, a kill after finds it ended.
"""

from __future__ import annotations

from agents_stream.execution.tools import Tool, tool
from agents_stream.tables.handoff import HANDED_OVER

__all__ = ["handoff"]


@tool(name="handoff", timeout_s=5, retries=0)
async def _handoff(reason: str) -> str:
    """Hand this conversation to a person of the support team: call it when the customer asks for a person, or
    when your instructions say a person must decide. Then tell the customer, in one short sentence, that you are
    connecting them to a person; do not call other tools after it."""
    return f"{HANDED_OVER} {reason.strip()[:500]}\nTell the customer you are connecting them to a person now."


handoff: Tool = _handoff

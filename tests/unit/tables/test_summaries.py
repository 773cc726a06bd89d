"""Summaries of a conversation's older history: what is summarised (pure, tables/summaries.py), the ledger storing
a round's journaled summary and the next round starting from it, the summary shown to the model, and the run that
asks the summariser once — a replay on its journal asks it never again (fake LLMs over real HTTP)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from agents_stream.tables import conversations as machine
from agents_stream.tables import summaries
from agents_stream.tables.conversation_events import round_events
from agents_stream.tables.leases import TaskRecord

from agents_stream.config import AgentConfig, AppConfig, SummaryConfig
from agents_stream.contract import topics
from agents_stream.contract.conversation_messages import round_task_id
from agents_stream.contract.events import JournalEntry, TaskSucceeded, Usage, encode
from agents_stream.contract.models import ConversationContext, HistoryItem, SummaryInput, TaskPayload
from agents_stream.execution.agent_definitions import Agent
from agents_stream.execution.history import HEADER, earlier_turns, shown, with_history
from agents_stream.execution.tools import ToolContext, tool
from agents_stream.ops import metrics
from agents_stream.providers.conversation import AssistantTurn, UserText
from agents_stream.settings import Settings
from agents_stream.testing.fakellm import FakeLLM, ok, status
from tests.unit.fake_worker import AGENT as WORKER_AGENT
from tests.unit.fake_worker import worker
from tests.unit.ledger_fakes import LedgerWorld

AGENT = "support"
TASKS = topics.task_topic(AGENT)
OUTCOMES = topics.outcomes_topic(Settings().app_id)
CID = "c-1"


def _items(store: dict[str, Any], texts: list[str]) -> None:
    for i, text in enumerate(texts):
        store[machine.item_key(CID, i)] = {"role": "customer" if i % 2 == 0 else "agent", "text": text, "i": i}


def _input(store: dict[str, Any], until: int, min_items: int = 1, input_chars: int = 16_000) -> dict[str, Any] | None:
    return summaries.summary_input(store.get, CID, until, min_items=min_items, input_chars=input_chars)


# -- what is summarised (pure) -----------------------------------------------------------------------------------

def test_nothing_before_the_window_is_nothing_to_summarise() -> None:
    store: dict[str, Any] = {}
    _items(store, ["a", "b", "c"])
    assert _input(store, 0) is None  # the window holds the whole history


def test_the_items_before_the_window_are_summarised_and_then_only_the_new_overflow() -> None:
    store: dict[str, Any] = {}
    _items(store, [f"item {i}" for i in range(10)])
    first = _input(store, 4)
    assert first == {"text": None, "upto": 0, "until": 4,
                     "items": [{"role": r, "text": f"item {i}"} for i, r in enumerate(["customer", "agent"] * 2)]}
    entry = {"kind": "summary", "text": "S1", "until": 4}
    stored = summaries.to_store(None, entry, round_number=3, now=5.0)
    assert stored == {"text": "S1", "upto": 4, "round": 3, "at": 5.0}
    store[machine.summary_key(CID)] = stored
    later = _input(store, 6)  # two more items fell out of the window: only they are sent, with the summary
    assert later is not None and later["text"] == "S1" and later["upto"] == 4 and later["until"] == 6
    assert [i["text"] for i in later["items"]] == ["item 4", "item 5"]
    same = _input(store, 4)  # nothing new fell out: the summary is shown as it is
    assert same == {"text": "S1", "upto": 4, "items": [], "until": 4}
    wider = _input(store, 2)  # a larger window reaches behind the summary: nothing to summarise
    assert wider == {"text": "S1", "upto": 4, "items": [], "until": 4}


def test_a_summary_waits_for_min_items_of_overflow() -> None:
    store: dict[str, Any] = {machine.summary_key(CID): {"text": "S", "upto": 4, "round": 2, "at": 1.0}}
    _items(store, [f"item {i}" for i in range(10)])
    assert _input(store, 6, min_items=3)["items"] == []  # type: ignore[index]  # two wait: not yet
    assert len(_input(store, 7, min_items=3)["items"]) == 3  # type: ignore[index]


def test_the_summarisers_input_is_bounded_newest_items_first_the_oldest_cut() -> None:
    store: dict[str, Any] = {machine.summary_key(CID): {"text": "P" * 1000, "upto": 0, "round": 1, "at": 1.0}}
    _items(store, ["x" * 3000 for _ in range(10)])
    given = _input(store, 10, input_chars=8_000)
    assert given is not None and given["until"] == 10
    sent = [i["text"] for i in given["items"]]
    assert sent[1:] == ["x" * 3000, "x" * 3000] and sent[0].endswith(summaries.CUT)
    assert len(given["text"]) + sum(len(t) for t in sent) <= 8_000
    many: dict[str, Any] = {}
    _items(many, ["y"] * (summaries.MAX_ITEMS + 50))
    bounded = _input(many, summaries.MAX_ITEMS + 50)
    assert bounded is not None and len(bounded["items"]) == summaries.MAX_ITEMS  # the reads are bounded too


def test_a_failed_or_older_summary_is_not_stored() -> None:
    stored = {"text": "S2", "upto": 8, "round": 4, "at": 1.0}
    assert summaries.to_store(stored, {"kind": "summary", "text": None, "until": 10, "error": "down"},
                              round_number=5, now=2.0) is None
    assert summaries.to_store(stored, {"kind": "summary", "text": "S1", "until": 8}, round_number=4, now=2.0) is None
    assert summaries.to_store(stored, {"kind": "summary", "text": "S3", "until": 10}, round_number=5,
                              now=2.0) == {"text": "S3", "upto": 10, "round": 5, "at": 2.0}


def test_the_window_says_where_it_begins() -> None:
    store: dict[str, Any] = {}
    _items(store, ["a" * 10] * 8)
    head = machine.ConversationRecord(agent=AGENT, items=8)
    assert machine.window(head, store.get, CID, 1, 3, 1_000) == ([{"role": r, "text": "a" * 10} for r in
                                                                  ("agent", "customer", "agent")], 5)
    assert machine.window(head, store.get, CID, 1, 8, 25)[1] == 6  # the characters cut it first
    assert machine.window(head, store.get, CID, 1, 0, 1_000) == ([], 8)


def test_the_summary_config_is_checked() -> None:
    with pytest.raises(ValueError, match="twice max_chars"):
        SummaryConfig(provider="cheap", max_chars=5_000, input_chars=8_000)
    providers = {"p": {"kind": "local", "model": "m"}}
    with pytest.raises(ValueError, match="unknown summary provider"):
        AppConfig.model_validate({"providers": providers, "agents": {
            AGENT: {"providers": ["p"], "summary": {"provider": "cheap"}}}})
    config = AppConfig.model_validate({"providers": providers, "agents": {
        AGENT: {"providers": ["p"], "summary": {"provider": "p", "min_items": 4}}}})
    assert config.agents[AGENT].summary == SummaryConfig(provider="p", min_items=4)


# -- the summary shown to the model ------------------------------------------------------------------------------

def _round(summary: SummaryInput | None, history: tuple[str, ...] = ("earlier question", "earlier answer")
           ) -> TaskPayload:
    items = [HistoryItem(role="customer" if i % 2 == 0 else "agent", text=t) for i, t in enumerate(history)]
    return TaskPayload(task_id="conv:c-1#3.0", agent_name=AGENT, instruction="and now?", conversation=(
        ConversationContext(conversation_id=CID, message_ids=["m3"], history=items, summary=summary)))


def test_the_summary_goes_ahead_of_the_window_the_journaled_one_first() -> None:
    given = SummaryInput(text="Old summary.", upto=2, items=[HistoryItem(role="customer", text="x")], until=4)
    task = _round(given)
    assert shown(task, []) == "Old summary."  # not summarised yet (or its summariser failed)
    journaled = [{"kind": "summary", "turn": -1, "text": "New summary.", "until": 4}]
    assert shown(task, journaled) == "New summary."
    assert shown(task, [{"kind": "summary", "turn": -1, "text": None, "until": 4, "error": "down"}]) == "Old summary."
    assert earlier_turns(task, "New summary.") == [
        UserText(f"{HEADER}\nNew summary."), UserText("earlier question"), AssistantTurn("earlier answer")]
    assert with_history(task, "and now?", "New summary.") == (
        f"{HEADER}\nNew summary.\n\nThe conversation so far:\nCustomer: earlier question\nYou: earlier answer\n\n"
        "The customer's new message:\nand now?")
    assert with_history(_round(given, ()), "and now?", "S.") == f"{HEADER}\nS.\n\nThe customer's new message:\nand now?"
    assert shown(_round(None), journaled) is None and earlier_turns(_round(None)) == [
        UserText("earlier question"), AssistantTurn("earlier answer")]


def test_a_journaled_summary_is_an_event_of_its_round() -> None:
    def task(steps: list[Any]) -> TaskRecord:
        return TaskRecord(state="running", agent=AGENT, dispatch=1, owner="w1", lease_until=0.0, payload="{}",
                          topic=TASKS, partition=0, offset=0, received_at=0.0, steps_done=json.dumps(steps))

    entry = {"kind": "summary", "turn": -1, "text": "S", "until": 4, "error": None}
    (event,) = round_events(3, task([]), task([entry]))
    assert (event["id"], event["kind"], event["data"]) == (
        "round:3:summary", "summary", {"until": 4, "error": None, "chars": 1})


# -- the ledger: a round's journaled summary is stored, the next round starts from it ------------------------

def _message(text: str, message_id: str) -> bytes:
    return json.dumps({"conversation_id": CID, "message_id": message_id, "agent_name": AGENT, "text": text}).encode()


def _succeeded(output: str) -> bytes:
    return encode(TaskSucceeded(worker="w1", dispatch=1, calls=1, usage=Usage(), route=None, status="succeeded",
                                output=output, confidence="high", source="primary:p:m", partial=False))


def _summary_step(text: str | None, until: int, index: int = 0) -> bytes:
    entry = {"kind": "summary", "turn": -1, "text": text, "until": until, "error": None if text else "down",
             "source": "summary:cheap", "provider_calls": 1, "usage": {}}
    return encode(JournalEntry(worker="w1", dispatch=1, index=index, output=entry))


async def _rounds(world: LedgerWorld, n: int) -> None:
    """Rounds 1..n, each one message and its reply."""
    for number in range(1, n + 1):
        await world.deliver(TASKS, CID.encode(), _message(f"question {number}", f"m{number}"))
        await world.deliver(OUTCOMES, round_task_id(CID, number, 1, 0).encode(), _succeeded(f"answer {number}"))


async def test_the_ledger_keeps_a_rounds_summary_and_the_next_round_folds_in_only_what_fell_out_since() -> None:
    config = AgentConfig(providers=["p"], history_messages=2, summary=SummaryConfig(provider="cheap"))
    world = LedgerWorld(Settings(partitions=1), configs={AGENT: config})
    await _rounds(world, 2)
    first = world.payloads[round_task_id(CID, 1, 1, 0)].conversation
    assert first is not None and first.summary is None  # nothing older than the window yet
    assert world.payloads[round_task_id(CID, 2, 1, 0)].conversation.summary is None  # type: ignore[union-attr]
    await world.deliver(TASKS, CID.encode(), _message("question 3", "m3"))
    round3 = round_task_id(CID, 3, 1, 0)
    given = world.payloads[round3].conversation.summary  # type: ignore[union-attr]
    assert given == SummaryInput(text=None, upto=0, until=2, items=[
        HistoryItem(role="customer", text="question 1"), HistoryItem(role="agent", text="answer 1")])
    await world.deliver(OUTCOMES, round3.encode(), _summary_step("Asked 1, answered 1.", 2))
    stored = dict(world.conversations[machine.summary_key(CID)])
    assert stored == {"text": "Asked 1, answered 1.", "upto": 2, "round": 3, "at": stored["at"]}
    await world.deliver(OUTCOMES, round3.encode(), _summary_step("Asked 1, answered 1.", 2))  # redelivered
    await world.deliver(OUTCOMES, round3.encode(), _summary_step("Another.", 2, index=1))  # covers no more
    assert world.conversations[machine.summary_key(CID)] == stored
    await world.deliver(OUTCOMES, round3.encode(), _succeeded("answer 3"))
    await world.deliver(TASKS, CID.encode(), _message("question 4", "m4"))
    given4 = world.payloads[round_task_id(CID, 4, 1, 0)].conversation.summary  # type: ignore[union-attr]
    assert given4 == SummaryInput(text="Asked 1, answered 1.", upto=2, until=4, items=[
        HistoryItem(role="customer", text="question 2"), HistoryItem(role="agent", text="answer 2")])


async def test_a_failed_summary_is_not_stored_and_a_delete_removes_the_summary() -> None:
    config = AgentConfig(providers=["p"], history_messages=2, summary=SummaryConfig(provider="cheap"))
    world = LedgerWorld(Settings(partitions=1), configs={AGENT: config})
    await _rounds(world, 2)
    await world.deliver(TASKS, CID.encode(), _message("question 3", "m3"))
    round3 = round_task_id(CID, 3, 1, 0)
    await world.deliver(OUTCOMES, round3.encode(), _summary_step(None, 2))
    assert machine.summary_key(CID) not in world.conversations
    await world.deliver(OUTCOMES, round3.encode(), _succeeded("answer 3"))
    await world.deliver(TASKS, CID.encode(), _message("question 4", "m4"))
    round4 = round_task_id(CID, 4, 1, 0)
    given = world.payloads[round4].conversation.summary  # type: ignore[union-attr]
    assert given is not None and given.text is None and given.until == 4 and len(given.items) == 4  # tried again
    await world.deliver(OUTCOMES, round4.encode(), _summary_step("S", 4))
    await world.deliver(OUTCOMES, round4.encode(), _succeeded("answer 4"))
    assert world.conversations[machine.summary_key(CID)]["upto"] == 4
    delete = {"conversation_id": CID, "agent_name": AGENT, "action": "delete", "by": "ops"}
    await world.deliver(TASKS, CID.encode(), json.dumps(delete).encode())
    assert not [k for k in world.conversations if k.startswith(CID)]


# -- the run: the summariser asked once, a replay never again (fake LLMs over HTTP) ------------------------------

@tool
def look_up(ctx: ToolContext, order_id: str) -> str:
    """Look an order up."""
    return f"order {order_id}: shipped"


#: a tool loop whose model answers at once in these tests
QUIET = Agent(WORKER_AGENT, "Answer the customer.", tools=[look_up])


def _summarised_round(upto: int = 2) -> TaskPayload:
    given = SummaryInput(text="The customer ordered o-7.", upto=upto, until=4, items=[
        HistoryItem(role="customer", text="it never came"), HistoryItem(role="agent", text="I refunded o-7")])
    history = [HistoryItem(role="customer", text="thanks"), HistoryItem(role="agent", text="you are welcome")]
    return TaskPayload(task_id="conv:c-1#3.0", agent_name=WORKER_AGENT, instruction="and my other order?",
                       conversation=ConversationContext(conversation_id=CID, message_ids=["m3"], history=history,
                                                        summary=given))


def _agent(**summary: Any) -> dict[str, Any]:
    return {"providers": ["p"], "agent": "tests.unit.tables.test_summaries:QUIET",
            "summary": {"provider": "cheap", **summary}}


def _counted(outcome: str) -> float:
    return metrics.REGISTRY.get_sample_value(
        "agents_stream_conversation_summaries_total", {"agent": WORKER_AGENT, "outcome": outcome}) or 0.0


async def test_a_round_summarises_once_and_a_replay_on_its_journal_never_asks_the_summariser_again() -> None:
    written = _counted("written")
    async with FakeLLM(default=ok("Ordered o-7, lost, refunded; thanked us.", input_tokens=50, output_tokens=9)
                       ) as cheap, FakeLLM(default=ok("It ships tomorrow.")) as p:
        async with worker({"p": p, "cheap": cheap}, _agent()) as w:
            task = _summarised_round()
            w.executor.dispatch(task, 1)
            first = await w.outcome(task.task_id)
            steps = [o["output"] for o in w.events(task.task_id, "step")]
            assert first["status"] == "succeeded" and first["output"] == "It ships tomorrow."
            assert len(cheap.requests) == 1 and len(p.requests) == 1
            asked = json.dumps(cheap.requests[0].body)
            assert "The customer ordered o-7." in asked and "it never came" in asked and "I refunded o-7" in asked
            assert "thanks" not in asked, "the window is not summarised"
            (entry, *turns) = steps
            assert entry["kind"] == "summary" and entry["text"] == "Ordered o-7, lost, refunded; thanked us."
            assert entry["until"] == 4 and entry["error"] is None and [t["kind"] for t in turns] == ["turn"]
            said = [m["content"] for m in p.requests[0].body["messages"] if m["role"] != "system"]
            assert said[0] == f"{HEADER}\nOrdered o-7, lost, refunded; thanked us." and said[1:3] == [
                "thanks", "you are welcome"]
            assert first["usage"]["input_tokens"] >= 50 and first["calls"] == 2  # the summary is counted
            w.outcomes.clear()
            w.executor.dispatch(task, 2, steps_done=[entry])  # a replay on the journal (a crash, a takeover)
            again = await w.outcome(task.task_id)
        assert again["status"] == "succeeded"
        assert len(cheap.requests) == 1, "a replay on the journal asks the summariser again"
        assert _counted("written") == written + 1
        assert w.events(task.task_id, "step")[0]["output"]["kind"] == "turn"  # no second summary entry
        said = [m["content"] for m in p.requests[1].body["messages"] if m["role"] != "system"]
        assert said[0] == f"{HEADER}\nOrdered o-7, lost, refunded; thanked us."


async def test_a_summariser_that_fails_is_journaled_and_the_round_answers_with_the_summary_it_had() -> None:
    failed = _counted("failed")
    async with FakeLLM(default=status(400)) as cheap, FakeLLM(default=ok("It ships tomorrow.")) as p:
        async with worker({"p": p, "cheap": cheap}, _agent()) as w:
            task = _summarised_round()
            w.executor.dispatch(task, 1)
            out = await w.outcome(task.task_id)
            entry = w.events(task.task_id, "step")[0]["output"]
            w.outcomes.clear()
            w.executor.dispatch(task, 2, steps_done=[entry])
            await w.outcome(task.task_id)
    assert out["status"] == "succeeded" and out["output"] == "It ships tomorrow."
    assert entry["kind"] == "summary" and entry["text"] is None and "cheap" in entry["error"]
    assert len(cheap.requests) == 1, "a failed summary is not asked again by a replay either"
    assert _counted("failed") == failed + 1
    said = [m["content"] for m in p.requests[0].body["messages"] if m["role"] != "system"]
    assert said[0] == f"{HEADER}\nThe customer ordered o-7."  # the summary it had, then its window


async def test_a_long_summary_is_cut_to_max_chars() -> None:
    async with FakeLLM(default=ok("s" * 500)) as cheap, FakeLLM(default=ok("fine")) as p:
        async with worker({"p": p, "cheap": cheap}, _agent(max_chars=100, input_chars=1_000)) as w:
            task = _summarised_round()
            w.executor.dispatch(task, 1)
            await w.outcome(task.task_id)
            entry = w.events(task.task_id, "step")[0]["output"]
    assert len(entry["text"]) == 100 and entry["text"].endswith("…")


async def test_an_agent_without_tools_reads_the_summary_in_its_prompt_and_a_replay_does_not_summarise() -> None:
    async with FakeLLM(default=ok("Ordered o-7; refunded.")) as cheap, FakeLLM(default=ok("Tomorrow.")) as p:
        async with worker({"p": p, "cheap": cheap}, {"providers": ["p"], "summary": {"provider": "cheap"}}) as w:
            task = _summarised_round()
            w.executor.dispatch(task, 1)
            out = await w.outcome(task.task_id)
            (entry,) = [o["output"] for o in w.events(task.task_id, "step")]
            w.outcomes.clear()
            w.executor.dispatch(task, 2, steps_done=[entry])
            await w.outcome(task.task_id)
    assert out["status"] == "succeeded" and out["output"] == "Tomorrow." and entry["text"] == "Ordered o-7; refunded."
    assert len(cheap.requests) == 1 and len(p.requests) == 2
    for request in p.requests:
        assert f"{HEADER}\nOrdered o-7; refunded.\n\nThe conversation so far:\nCustomer: thanks" in request.instruction


async def test_a_summary_provider_without_its_key_makes_no_summary_and_the_round_answers(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.delenv("CHEAP_KEY_FOR_TESTS", raising=False)
    async with FakeLLM(default=ok("never asked")) as cheap, FakeLLM(default=ok("fine")) as p:
        extra = {"cheap": {"api_key_env": "CHEAP_KEY_FOR_TESTS"}}
        async with worker({"p": p, "cheap": cheap}, _agent(), providers=extra) as w:
            task = _summarised_round()
            w.executor.dispatch(task, 1)
            out = await w.outcome(task.task_id)
    assert out["status"] == "succeeded" and cheap.requests == []
    assert [e["output"]["kind"] for e in w.events(task.task_id, "step")] == ["turn"]  # no summary entry
    assert "summary provider cheap is not usable" in caplog.text


def test_the_conversation_view_shows_the_summary_the_model_is_shown() -> None:
    from agents_stream.ops.web_conversations import describe

    store: dict[str, Any] = {}
    _items(store, ["where is my parcel?", "it left on monday", "and the refund?"])
    head = machine.ConversationRecord(agent=AGENT, since=0, rounds=2, items=3, messages=2).to_json()
    without = describe(CID, head, store.get, {}, 6, before=None, limit=50)
    assert without["summary"] is None and len(without["history"]) == 3
    store[machine.summary_key(CID)] = {"text": "the parcel left on monday", "upto": 2, "round": 2, "at": 1.0}
    shown_ = describe(CID, head, store.get, {}, 6, before=None, limit=50)["summary"]
    assert shown_ == {"text": "the parcel left on monday", "upto": 2, "round": 2, "at": 1.0}


def test_the_chat_says_when_earlier_messages_were_summarised_or_could_not_be() -> None:
    from agents_stream.client import Event
    from agents_stream.ops.cli_chat import _render

    done = Event(3, "summary", {"id": "round:3:summary", "kind": "summary", "round": 3,
                                "data": {"until": 4, "error": None, "chars": 120}})
    failed = Event(4, "summary", {"id": "round:4:summary", "kind": "summary", "round": 4,
                                  "data": {"until": 4, "error": "breaker open\x1b[2J", "chars": 0}})
    assert _render(done) == "  (earlier messages summarised: 120 characters, covering the first 4 history items)"
    assert "could not be summarised" in str(_render(failed)) and "\x1b" not in str(_render(failed))

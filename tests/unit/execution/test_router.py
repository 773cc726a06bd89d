"""router: the cheap-first heuristic and the classifier's prompt and answer parsing."""

from __future__ import annotations

import pytest

from agents_stream.config import AgentConfig
from agents_stream.contract.models import TaskPayload
from agents_stream.execution.router import (
    CLASSIFIER_INSTRUCTION,
    classifier_prompt,
    heuristic,
    parse_classification,
)

DEFAULTS = AgentConfig(name="a", providers=["p"])
FILLER = "The quarterly report covers revenue, costs, hiring, customer churn and the product roadmap in detail. "


def _task(instruction: str, **kwargs) -> TaskPayload:
    return TaskPayload(task_id="t", agent_name="a", instruction=instruction, **kwargs)


def _estimate(task: TaskPayload):
    return heuristic(task, threshold=DEFAULTS.hard_threshold, hard_words=list(DEFAULTS.hard_words))


EASY = [
    _task("What is the capital of France?"),
    _task("Translate 'good morning' into Spanish."),
    _task("Summarise this paragraph in one sentence.", context_data={"text": "Short text about cats. " * 10}),
    _task("Extract the email address.", context_data={"text": "Contact bob@example.com for details."}),
    _task("Explain why the sky is blue, in two sentences."),  # one hard phrase alone is not enough
    _task("Return the title as JSON.", output_schema={"type": "object"}, risk_level="low"),
    _task("Fix the spelling: 'recieve the pakage'", steps=["fix"]),  # a single step is not multi-step
    _task("List three colours of the rainbow on the planet Earth."),  # "planet" is not "plan"
]

HARD = [
    _task("Compare the two contracts and explain why the second is riskier."),  # two hard words
    _task("Analyze the logs step by step and find the root cause."),
    _task("Design a sharding plan for the orders table."),
    _task("Prove that the algorithm terminates. " + FILLER * 11),  # one hard word and ~170 words
    _task("Summarise the attached data. " + FILLER * 16, context_data={"rows": ["x" * 100] * 60}),  # long + big
    _task("Reply to the customer.", risk_level="critical"),
    _task("Do the job.", steps=["fetch", "transform", "load"]),
    _task("Evaluate the proposal " + FILLER * 3, context_data={"doc": "y" * 3000}, output_schema={"type": "object"}),
]


@pytest.mark.parametrize("task", EASY, ids=[t.instruction[:30] for t in EASY])
def test_easy_tasks_go_cheap(task: TaskPayload) -> None:
    """Short, plain tasks are easy with the default threshold and hard words, so the light tier may answer."""
    estimate = _estimate(task)
    assert not estimate.hard, estimate.why


@pytest.mark.parametrize("task", HARD, ids=[t.instruction[:30] for t in HARD])
def test_hard_tasks_go_to_the_full_chain(task: TaskPayload) -> None:
    """Long, analytical, multi-step or risky tasks are hard with the defaults, so the full chain answers."""
    estimate = _estimate(task)
    assert estimate.hard, estimate.why


def test_score_is_bounded_and_consistent_with_threshold() -> None:
    """The score stays in [0, 1] and hard means score >= threshold, whatever the task."""
    for task in EASY + HARD:
        for threshold in (0.0, 0.3, 0.5, 0.9, 1.0):
            estimate = heuristic(task, threshold=threshold, hard_words=list(DEFAULTS.hard_words))
            assert 0.0 <= estimate.score <= 1.0
            assert estimate.hard == (estimate.score >= threshold)


def test_why_explains_the_verdict() -> None:
    """The reason names the score, the threshold and the signals that counted."""
    why = _estimate(_task("Compare A and B step by step.", output_schema={"type": "object"})).why
    assert why.startswith("score 0.70 >= 0.5: ")
    assert "7 words" in why and "'compare'" in why and "'step by step'" in why and "output schema" in why


def test_forced_hard_says_why() -> None:
    """A forced verdict names the step count or risk level that forced it."""
    estimate = _estimate(_task("Go.", steps=[1, 2], risk_level="high"))
    assert estimate.score == 1.0
    assert "2 steps and risk_level high force hard" in estimate.why


def test_hard_words_are_case_insensitive_whole_phrases() -> None:
    """Hard words match in any case and across line breaks, but not inside other words."""
    words = ["plan", "step by step"]
    assert heuristic(_task("PLAN it, Step\nby  step."), threshold=0.5, hard_words=words).score == 0.6
    assert heuristic(_task("Planets, planning, stepwise."), threshold=0.5, hard_words=words).score == 0.0


def test_hard_words_and_threshold_tune_the_verdict() -> None:
    """An agent can make its own words hard or raise the bar."""
    task = _task("Triage this ticket and refactor the module.")
    assert heuristic(task, threshold=0.5, hard_words=["triage", "refactor"]).hard
    assert not heuristic(task, threshold=0.7, hard_words=["triage", "refactor"]).hard
    assert not heuristic(task, threshold=0.5, hard_words=[]).hard


def test_classifier_prompt_truncates_the_instruction() -> None:
    """The classifier sees its instruction and at most ~2000 chars of the task."""
    prompt = classifier_prompt(_task("z" * 10_000))
    assert prompt.startswith(CLASSIFIER_INSTRUCTION)
    assert len(prompt) <= len(CLASSIFIER_INSTRUCTION) + 2001
    assert "exactly one word" in CLASSIFIER_INSTRUCTION


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("hard", True),
        ("easy", False),
        ("Hard.", True),
        ("  EASY!\n", False),
        ('{"complexity": "hard"}', True),
        ('```json\n{"complexity": "Easy"}\n```', False),
        ('{"complexity": "hard", "reason": "not easy to verify"}', True),
        ('"easy"', False),
        ("The task is hard.", True),
        ("hard or easy, hard to say", None),
        ("It is not hard, it is easy.", None),
        ("medium", None),
        ("", None),
        ("hardly", None),
        ('{"complexity": 3}', None),
    ],
)
def test_parse_classification(answer: str, expected: bool | None) -> None:
    """The classifier's one word is read tolerantly; anything ambiguous is None so the heuristic decides."""
    assert parse_classification(answer) is expected

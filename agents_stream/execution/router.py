"""Cheap-first routing: is a task easy (the light tier may answer) or hard (the full chain)?

``heuristic`` is a guess from the task's shape, not a measurement: tune it per
agent with ``hard_threshold`` and ``hard_words``. Its score in [0, 1] is a sum
of the weights below, capped at 1:

    =====================  ======  ==============================================
    signal                 weight  how it grows
    =====================  ======  ==============================================
    instruction length     0.40    0 at <= 20 words, linear to full at >= 300
    context_data size      0.30    linear in its compact JSON, full at >= 8 KiB
    each hard word/phrase  0.30    distinct matches, whole words, any case; <= 0.60
    declared output_schema 0.10    structured answers are harder to get right
    steps (2 or more)      forced  hard, score 1.0
    risk_level high/crit.  forced  hard, score 1.0
    =====================  ======  ==============================================

With the default threshold 0.5: two hard words are hard; one hard word is hard
together with a longish instruction (>= ~160 words) or some context; a long
instruction with a large context is hard; a short plain question is easy.

The ``classifier`` router asks a small model instead (``classifier_prompt``,
``parse_classification``); when its answer is unreadable the caller falls back
to ``heuristic``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache

from agents_stream.contract.models import TaskPayload

__all__ = ["CLASSIFIER_INSTRUCTION", "Estimate", "classifier_prompt", "heuristic", "parse_classification"]

WEIGHT_LENGTH = 0.40
WEIGHT_CONTEXT = 0.30
WEIGHT_HARD_WORD = 0.30
MAX_HARD_WORDS = 0.60
WEIGHT_SCHEMA = 0.10
#: instruction length (words) below which length adds nothing, and at which it adds its full weight
LENGTH_FLOOR_WORDS = 20
LENGTH_FULL_WORDS = 300
#: context_data size (bytes of compact JSON) at which it adds its full weight
CONTEXT_FULL_BYTES = 8 * 1024
HARD_RISKS = frozenset({"high", "critical"})


@dataclass(frozen=True)
class Estimate:
    """The router's verdict: ``hard``, the score behind it, and why, for logs and results."""

    hard: bool
    score: float
    why: str


@lru_cache(maxsize=64)
def _hard_pattern(words: tuple[str, ...]) -> re.Pattern[str] | None:
    # whole words: "plan" must not match "planet"; a phrase matches across any whitespace
    phrases = [r"\s+".join(re.escape(part) for part in w.split()) for w in words if w.strip()]
    if not phrases:
        return None
    return re.compile(r"(?<!\w)(?:" + "|".join(phrases) + r")(?!\w)", re.IGNORECASE)


def _hard_words_in(text: str, hard_words: list[str]) -> list[str]:
    pattern = _hard_pattern(tuple(hard_words))
    if pattern is None:
        return []
    found: dict[str, None] = {}
    for match in pattern.finditer(text):
        found.setdefault(" ".join(match.group(0).lower().split()), None)
    return list(found)


def _ramp(value: float, low: float, high: float) -> float:
    return min(1.0, max(0.0, (value - low) / (high - low)))


def heuristic(task: TaskPayload, *, threshold: float, hard_words: list[str]) -> Estimate:
    """A guess at the task's difficulty from its shape; see the module docstring for the weights."""
    words = len(task.instruction.split())
    context_bytes = (
        len(json.dumps(task.context_data, ensure_ascii=False, separators=(",", ":"), default=str).encode("utf-8"))
        if task.context_data
        else 0
    )
    found = _hard_words_in(task.instruction, hard_words)

    score = WEIGHT_LENGTH * _ramp(words, LENGTH_FLOOR_WORDS, LENGTH_FULL_WORDS)
    score += WEIGHT_CONTEXT * _ramp(context_bytes, 0, CONTEXT_FULL_BYTES)
    score += min(MAX_HARD_WORDS, WEIGHT_HARD_WORD * len(found))
    reasons = [f"{words} words"]
    if context_bytes:
        reasons.append(f"context {context_bytes / 1024:.1f} KB")
    if found:
        reasons.append("words " + ", ".join(repr(w) for w in found))
    if task.output_schema is not None:
        score += WEIGHT_SCHEMA
        reasons.append("output schema")

    forced = []
    if task.steps is not None and len(task.steps) >= 2:
        forced.append(f"{len(task.steps)} steps")
    if task.risk_level in HARD_RISKS:
        forced.append(f"risk_level {task.risk_level}")
    if forced:
        # forcing the score too keeps "hard iff score >= threshold" true for any threshold
        score = 1.0
        reasons = [" and ".join(forced) + " force hard", *reasons]

    score = round(min(1.0, score), 4)
    hard = score >= threshold
    why = f"score {score:.2f} {'>=' if hard else '<'} {threshold:g}: " + ", ".join(reasons)
    return Estimate(hard=hard, score=score, why=why)


CLASSIFIER_INSTRUCTION = (
    "Classify how hard the task below is for a language model. "
    "Answer with exactly one word: easy or hard.\n"
    "easy: a short factual answer, a rewrite, a summary, an extraction or a simple format change.\n"
    "hard: multi-step reasoning, analysis, comparison, planning, proofs, or long and detailed output.\n\n"
    "Task:\n"
)
_CLASSIFIER_TASK_CHARS = 2000


def classifier_prompt(task: TaskPayload) -> str:
    """What the classifier model is asked: the instruction above, then the task's instruction (truncated)."""
    text = task.instruction
    if len(text) > _CLASSIFIER_TASK_CHARS:
        text = text[:_CLASSIFIER_TASK_CHARS] + "…"
    return CLASSIFIER_INSTRUCTION + text


_VERDICT = re.compile(r"\b(easy|hard)\b", re.IGNORECASE)
_VERDICT_KEYS = ("complexity", "difficulty", "classification", "label", "answer")


def parse_classification(text: str) -> bool | None:
    """True for hard, False for easy, None when the answer says neither or both (fall back to the heuristic)."""
    candidate = text
    try:
        data = json.loads(text.strip().strip("`").removeprefix("json").strip())
    except (ValueError, RecursionError):
        data = None
    if isinstance(data, str):
        candidate = data
    elif isinstance(data, dict):
        # {"complexity": "hard", "reason": "not easy to ..."}: the verdict key wins over prose beside it
        lowered = {str(k).lower(): v for k, v in data.items()}
        for key in _VERDICT_KEYS:
            if isinstance(lowered.get(key), str):
                candidate = lowered[key]
                break
    verdicts = {str(m).lower() for m in _VERDICT.findall(candidate)}
    if len(verdicts) != 1:
        return None
    return verdicts.pop() == "hard"

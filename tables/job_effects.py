"""What a job transition asks its caller to do (tables/jobs.py returns them; the orchestrator carries them out)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Control", "DispatchPlanner", "DispatchStep", "Effect", "EmitJobResult"]


@dataclass(frozen=True)
class DispatchStep:
    """Publish this task to the step's agent."""

    step_id: str
    task_id: str
    agent: str
    instruction: str
    context_data: dict[str, Any]


@dataclass(frozen=True)
class DispatchPlanner:
    """Publish the planning task; the caller attaches PLAN_SCHEMA as its output_schema."""

    task_id: str
    agent: str
    instruction: str
    context_data: dict[str, Any]


@dataclass(frozen=True)
class EmitJobResult:
    """Publish this exact job result JSON."""

    result: str


@dataclass(frozen=True)
class Control:
    """Publish a control event: job.started, job.planned, job.step_finished, job.cancelled, job.completed."""

    event: str
    details: dict[str, Any]


Effect = DispatchStep | DispatchPlanner | EmitJobResult | Control

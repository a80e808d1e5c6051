"""Grading a classify task: the agent's CWE id against the task's label, along the hierarchy.

No test runs: the answer is what the agent gave through the ``classify`` tool. ``resolved`` is
the exact match (what ``crl bench`` counts as accuracy); ``credit`` is the reward
(:func:`crl_worker.tasks.cwe.credit`). An episode that ended without an accepted ``classify``
call is graded too: no answer, ``resolved`` false, credit 0, never left out.
"""

from __future__ import annotations

from crl_worker.harness.result import EvalResult
from crl_worker.tasks.cwe import UnknownCweError, credit, normalise
from crl_worker.tasks.model import Task


def grade_answer(task: Task, answer: str | None, reasoning: str = "") -> EvalResult:
    """The verdict on ``answer`` (a CWE id, or ``None`` when the agent gave none)."""
    if task.classification is None:
        raise ValueError(f"task {task.instance_id} is not a classify task")
    label = task.classification.cwe
    key: str | None = None
    if answer is not None:
        try:
            key = normalise(answer)
        except UnknownCweError:
            key = None  # the tool refuses these; a hand-made trajectory may still hold one
    score = 0.0 if key is None else credit(label, key)
    return EvalResult(
        instance_id=task.instance_id,
        resolved=key == label,
        answer=key,
        reasoning=reasoning,
        credit=score,
        fail_to_pass_fraction=1.0 if key == label else 0.0,
        pass_to_pass_fraction=1.0,
        log=(
            f"label {label}; answer {key or '(none: the episode ended without classify)'}; "
            f"credit {score:g}"
        ),
    )

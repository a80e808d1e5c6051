"""Grading predictions files: other agents' patches, as SWE-bench's harness grades them.

A predictions file is JSONL (or a JSON list) of ``{"instance_id", "model_name_or_path",
"model_patch"}`` records. Each prediction is graded the way an episode's resolved verdict is
confirmed (:func:`crl_worker.harness.integrity.grade_candidate`): in a pristine sandbox of its
task, with only the patch's source changes (as git reads them), canary tests in the run. The
patch never runs anywhere else first, so nothing it could do to a sandbox it worked in counts.

This is what ``crl tasks grade`` runs (docs/cli.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from crl_worker.errors import CrlError
from crl_worker.harness.integrity import grade_candidate
from crl_worker.harness.result import EvalResult
from crl_worker.sandbox.registry import create_sandbox
from crl_worker.tasks.model import Task

logger = logging.getLogger(__name__)


class Prediction(BaseModel):
    """One record of a predictions file (SWE-bench's fields)."""

    model_config = ConfigDict(extra="ignore")

    instance_id: str
    """The task it answers."""
    model_name_or_path: str = ""
    """Who made it."""
    model_patch: str | None = None
    """The candidate's diff (``None`` or empty: no answer, unresolved)."""


class PredictionsError(CrlError):
    """A predictions file that cannot be read (the message says where)."""


def load_predictions(path: Path) -> list[Prediction]:
    """The predictions in ``path`` (JSONL, or one JSON list or object keyed by instance id)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PredictionsError(f"cannot read {path}: {exc}") from exc
    records: list[Any]
    stripped = text.lstrip()
    try:
        if stripped.startswith("["):
            records = json.loads(text)
        elif stripped.startswith("{") and "\n{" not in stripped.rstrip():
            single = json.loads(text)
            records = list(single.values()) if "instance_id" not in single else [single]
        else:
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
        predictions = [Prediction.model_validate(r) for r in records]
    except (ValueError, ValidationError) as exc:
        raise PredictionsError(f"{path}: not a predictions file: {exc}") from exc
    seen = Counter((p.instance_id, p.model_name_or_path) for p in predictions)
    repeated = sorted(f"{i} ({m or 'no model name'})" for (i, m), n in seen.items() if n > 1)
    if repeated:
        # One answer per instance and model, as SWE-bench's harness takes: a solved instance
        # repeated would count as several resolved predictions.
        raise PredictionsError(
            f"{path}: more than one prediction of one model for {', '.join(repeated[:5])}"
            f"{' and others' if len(repeated) > 5 else ''}: one per instance and model"
        )
    return predictions


class GradedPrediction(BaseModel):
    """What grading one prediction found."""

    instance_id: str
    """The task."""
    model_name_or_path: str
    """Who made the prediction."""
    result: EvalResult | None = None
    """The evaluation (``None``: the task is not in the task file, or has no tests to run)."""
    problem: str | None = None
    """Why it was not graded, when it was not."""

    @property
    def resolved(self) -> bool:
        """Graded resolved."""
        return self.result is not None and self.result.resolved

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (logs left out)."""
        out: dict[str, Any] = {
            "instance_id": self.instance_id,
            "model_name_or_path": self.model_name_or_path,
            "resolved": self.resolved,
            "problem": self.problem,
        }
        if self.result is not None:
            out.update(
                self.result.model_dump(
                    mode="json",
                    include={"tampered", "stripped", "patch_applied", "infrastructure_error"},
                )
            )
        return out


async def grade_prediction(
    task: Task,
    prediction: Prediction,
    *,
    sandbox_config: BaseModel | Mapping[str, Any] | None = None,
    timeout: float | None = None,
) -> GradedPrediction:
    """Grade one prediction in a pristine sandbox of ``task`` (made, then closed)."""
    graded = GradedPrediction(
        instance_id=prediction.instance_id, model_name_or_path=prediction.model_name_or_path
    )
    if task.task_type == "classify":
        graded.problem = "a classify task is graded from an answer, not a patch"
        return graded
    try:
        async with create_sandbox(sandbox_config, task) as sandbox:
            graded.result = await grade_candidate(
                sandbox, task, prediction.model_patch or "", timeout=timeout
            )
    except (CrlError, OSError) as exc:
        graded.result = EvalResult(
            instance_id=task.instance_id,
            resolved=False,
            infrastructure_error=f"the sandbox failed: {exc}",
        )
    return graded


async def grade_predictions(
    tasks: Sequence[Task],
    predictions: Sequence[Prediction],
    *,
    jobs: int = 1,
    sandbox_config: BaseModel | Mapping[str, Any] | None = None,
    timeout: float | None = None,
    progress: Callable[[GradedPrediction], None] | None = None,
) -> list[GradedPrediction]:
    """Grade every prediction, ``jobs`` at a time; results in the predictions' order. A
    prediction whose task is not among ``tasks`` is reported with a problem, not graded."""
    by_id = {t.instance_id: t for t in tasks}
    gate = asyncio.Semaphore(max(1, jobs))

    async def one(prediction: Prediction) -> GradedPrediction:
        task = by_id.get(prediction.instance_id)
        if task is None:
            found = GradedPrediction(
                instance_id=prediction.instance_id,
                model_name_or_path=prediction.model_name_or_path,
                problem="no such instance in the task file",
            )
        else:
            async with gate:
                found = await grade_prediction(
                    task, prediction, sandbox_config=sandbox_config, timeout=timeout
                )
        if progress is not None:
            progress(found)
        return found

    return list(await asyncio.gather(*(one(p) for p in predictions)))

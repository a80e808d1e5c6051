"""``crl train --validate``: validate a TrainingRun's tasks before it trains on them.

:func:`validate_run` loads the run's tasks as the trainer does, validates them in local sandboxes
(:func:`~crl_worker.harness.validate.validate_tasks`: gold resolves, no patch does not, flaky
tests, verdicts cached by content hash) and writes the quarantined ones to the run folder's
``quarantine.json``, which the trainer is then given (``--quarantine``): every training process
leaves out the same tasks, whatever a later run of a flaky test would say.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from crl_worker.harness.validate import ValidationReport, validate_tasks, write_quarantine
from crl_worker.tasks.model import Task
from crl_worker.train.errors import TrainConfigError
from crl_worker.train.settings import resolve_settings
from crl_worker.train.tasklist import load_tasks


def validate_run(
    config: Path, *, output: Path | None = None, runs: int = 2, jobs: int = 2
) -> tuple[ValidationReport, Path]:
    """Validate the tasks of the TrainingRun at ``config`` (``jobs`` at a time, ``runs`` runs of
    each patch); the report and the ``quarantine.json`` written in the run folder.

    Raises :class:`TrainConfigError` when the manifest or its tasks cannot be read, or when no
    task is valid."""
    settings = resolve_settings(config, output=output)
    tasks = load_tasks(settings)
    report = asyncio.run(validate_tasks(tasks, runs=runs, jobs=jobs))
    if not report.valid:
        raise TrainConfigError(
            "spec.tasks",
            f"every one of the {len(tasks)} tasks failed validation: "
            + "; ".join(f"{v.instance_id}: {v.problems[0]}" for v in report.quarantined[:5]),
        )
    return report, write_quarantine(settings.run_dir, report)


def drop_quarantined(tasks: list[Task], quarantine: Path) -> list[Task]:
    """``tasks`` without the ones a ``quarantine.json`` lists; a clear error for a file that is
    not one, or when it leaves no task."""
    try:
        data = json.loads(quarantine.read_text(encoding="utf-8"))
        excluded = {str(entry["instance_id"]) for entry in data["tasks"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TrainConfigError(
            "--quarantine", f"{quarantine} is not a quarantine.json of crl train --validate: {exc}"
        ) from None
    kept = [t for t in tasks if t.instance_id not in excluded]
    if not kept:
        raise TrainConfigError("--quarantine", f"{quarantine} leaves out every task")
    return kept


__all__ = ["drop_quarantined", "validate_run"]

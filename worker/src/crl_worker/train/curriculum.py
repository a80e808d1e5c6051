"""Curriculum: the order in which the trainer draws its tasks, easy before hard
(``spec.curriculum`` of a TrainingRun).

- ``none``: the tasks as the task source gave them.
- ``patch-size``: by the number of lines the gold patch changes (added plus removed), fewest
  first; ties by instance id. Tasks without a gold patch have no known size: they come last, in
  their original order.
- ``benchmark-results``: by the share of an earlier benchmark's attempts that resolved the
  instance, highest first (attempts without a verdict, infrastructure failures, do not count);
  ties by instance id. Instances the benchmark did not run, or only ever failed to grade, come
  last in their original order.

Torch-free: imported by the CLI and the operator side as well as the trainer.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Literal, Protocol

from crl_worker.api.trainingrun import CurriculumSpec
from crl_worker.rollout.results import ResultsError, read_results
from crl_worker.tasks.model import Task
from crl_worker.train.errors import TrainConfigError

logger = logging.getLogger(__name__)

#: The spec field named in errors about the results to order by.
RESULTS_FIELD = "spec.curriculum.results"

_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


class Curriculum(Protocol):
    """What :func:`order_tasks` reads of a curriculum spec
    (:class:`~crl_worker.api.trainingrun.CurriculumSpec`)."""

    @property
    def order(self) -> Literal["none", "patch-size", "benchmark-results"]:
        """The ordering."""
        ...

    @property
    def results(self) -> str | os.PathLike[str] | None:
        """The benchmark results folder or ``results.jsonl`` (``benchmark-results``)."""
        ...


def changed_lines(patch: str) -> int:
    """Lines a unified diff adds or removes, counted inside its hunks (so a removed line that
    itself starts with ``--`` is not mistaken for a file header)."""
    changed = 0
    old = new = 0  # lines of the current hunk still to come
    for line in patch.splitlines():
        if old > 0 or new > 0:
            kind = line[:1]
            if kind == "-":
                old -= 1
                changed += 1
            elif kind == "+":
                new -= 1
                changed += 1
            elif kind == "\\":
                pass  # "\ No newline at end of file"
            else:  # context (a blank line is an empty context line in some diffs)
                old -= 1
                new -= 1
            continue
        match = _HUNK.match(line)
        if match:
            old = int(match.group(1)) if match.group(1) is not None else 1
            new = int(match.group(2)) if match.group(2) is not None else 1
    return changed


def _by_patch_size(tasks: list[Task]) -> list[Task]:
    sized = [t for t in tasks if t.patch.strip()]
    unknown = [t for t in tasks if not t.patch.strip()]
    if unknown:
        logger.warning(
            "curriculum patch-size: %d of %d tasks have no gold patch; they come last",
            len(unknown),
            len(tasks),
        )
    sized.sort(key=lambda t: (changed_lines(t.patch), t.instance_id))
    return sized + unknown


def resolve_rates(path: Path) -> dict[str, float]:
    """Per-instance resolve rate from a ``crl bench`` results folder or ``results.jsonl``:
    resolved attempts over attempts with a verdict (instances without one are left out).
    Raises :class:`TrainConfigError` naming ``spec.curriculum.results`` when the results
    cannot be read."""
    if not path.exists():
        raise TrainConfigError(
            RESULTS_FIELD,
            f"{path} does not exist; give a crl bench results folder or its results.jsonl",
        )
    try:
        records = read_results(path)
    except ResultsError as exc:
        raise TrainConfigError(RESULTS_FIELD, f"cannot read the benchmark results: {exc}") from exc
    graded: dict[str, list[bool]] = {}
    for record in records:
        if record.resolved is not None:
            graded.setdefault(record.instance_id, []).append(record.resolved)
    return {instance: sum(verdicts) / len(verdicts) for instance, verdicts in graded.items()}


def _by_results(tasks: list[Task], rates: dict[str, float], source: Path) -> list[Task]:
    seen = [t for t in tasks if t.instance_id in rates]
    unseen = [t for t in tasks if t.instance_id not in rates]
    if not seen:
        logger.warning(
            "curriculum benchmark-results: %s grades none of the %d tasks; the order is "
            "unchanged (is it a benchmark of the same task source?)",
            source,
            len(tasks),
        )
    elif unseen:
        logger.info(
            "curriculum benchmark-results: %d of %d tasks have no graded attempt in %s; they "
            "come last",
            len(unseen),
            len(tasks),
            source,
        )
    seen.sort(key=lambda t: (-rates[t.instance_id], t.instance_id))
    return seen + unseen


def order_tasks(
    tasks: Iterable[Task], spec: CurriculumSpec | Curriculum | None, *, base_dir: Path
) -> list[Task]:
    """``tasks`` in the curriculum's order (a new list; see the module docs).

    ``base_dir`` resolves a relative ``spec.results`` (the manifest's folder on one machine,
    the checkpoint volume's mount in a cluster). Raises :class:`TrainConfigError` naming
    ``spec.curriculum.results`` when ``benchmark-results`` has no results or they cannot be
    read.
    """
    tasks = list(tasks)
    if spec is None or spec.order == "none":
        return tasks
    if spec.order == "patch-size":
        return _by_patch_size(tasks)
    if spec.order == "benchmark-results":
        if spec.results is None:
            raise TrainConfigError(
                RESULTS_FIELD,
                "order 'benchmark-results' needs results: a crl bench results folder or its "
                "results.jsonl",
            )
        path = base_dir / spec.results  # an absolute results path stays as it is
        return _by_results(tasks, resolve_rates(path), path)
    raise TrainConfigError(
        "spec.curriculum.order",
        f"unknown order {spec.order!r}; use none, patch-size or benchmark-results",
    )

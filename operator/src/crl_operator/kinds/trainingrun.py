"""TrainingRun: inference server, sandboxes, the trainer Job, checkpoints and the evaluation
Benchmarks that follow them (children: ``crl_operator.builders``, status:
:func:`~crl_operator.status.trainingrun_status`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from crl_operator.builders import RenderState
from crl_operator.builders.trainer import supervised
from crl_operator.kinds.base import Subject
from crl_operator.kinds.workload import WorkloadKind
from crl_operator.status import Observed, Problem, trainingrun_status
from crl_worker.api import TrainingRun
from crl_worker.api.common import PoolReference
from crl_worker.api.progress import TrainingProgress


def evaluation_steps(
    run: TrainingRun, previous: Mapping[str, Any], report: Mapping[str, Any] | None
) -> tuple[int, ...]:
    """The steps whose evaluation Benchmark should exist: every ``evaluation.everySteps`` up to
    the last checkpoint.

    The last checkpoint is the trainer's report's when it names one (so the Benchmark is
    created in the reconcile that reads it), else the status's.
    """
    if run.spec.evaluation is None:
        return ()
    reported = (report or {}).get("lastCheckpoint")
    last = (reported or previous.get("lastCheckpoint") or {}).get("step")
    every = run.spec.evaluation.every_steps
    if isinstance(last, int) and last >= every:
        return tuple(range(every, last + 1, every))
    return ()


class TrainingRunKind(WorkloadKind[TrainingRun]):
    """The TrainingRun's steps: its trainer reports training progress, and its render follows
    the checkpoints with evaluation Benchmarks."""

    kind = "TrainingRun"
    model = TrainingRun
    report_model = TrainingProgress

    def pool_ref(self, resource: TrainingRun) -> PoolReference | None:
        """``spec.rollout.poolRef``; none for supervised fine-tuning, which leases nothing."""
        return None if supervised(resource) else resource.spec.rollout.pool_ref

    def waits_for_inference(self, resource: TrainingRun) -> bool:
        """Whether the trainer waits for the vLLM server: not with in-process generation nor
        with supervised fine-tuning (neither has a server)."""
        return resource.spec.generation == "vllm" and not supervised(resource)

    def refine_state(
        self, s: Subject[TrainingRun], state: RenderState, problem: Problem | None
    ) -> tuple[RenderState, Problem | None]:
        """Add the evaluation steps (:func:`evaluation_steps`)."""
        steps = evaluation_steps(s.resource, s.previous, s.report)
        return replace(state, evaluation_steps=steps), problem

    def status(self, s: Subject[TrainingRun], seen: Observed, now: datetime) -> dict[str, Any]:
        """:func:`~crl_operator.status.trainingrun_status`."""
        return trainingrun_status(s.resource, seen, s.previous, now)

"""Benchmark: one model evaluated on one suite by the runner Job (children:
``crl_operator.builders``, status: :func:`~crl_operator.status.benchmark_status`).

Its own steps: the TrainingRun checkpoint it may serve and the baseline it may compare with are
resolved from the cache, and its runner Job goes once ``ttlSecondsAfterFinished`` has passed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from crl_operator import builders
from crl_operator.builders import BuildError, RenderState, ResolvedCheckpoint
from crl_operator.cache import Key
from crl_operator.kinds.base import Subject
from crl_operator.kinds.workload import WorkloadKind
from crl_operator.metrics import forget_benchmark, record_benchmark
from crl_operator.reports import awaiting_final_report
from crl_operator.status import Observed, Problem, benchmark_status, served_by_operator
from crl_worker.api import Benchmark, TrainingRun
from crl_worker.api.common import PoolReference
from crl_worker.api.contract import Env
from crl_worker.api.progress import ProgressReport

#: Ready's reason while a Benchmark waits for the TrainingRun checkpoint it serves.
CHECKPOINT_UNAVAILABLE = "CheckpointUnavailable"


class BenchmarkKind(WorkloadKind[Benchmark]):
    """The Benchmark's steps: checkpoint and baseline resolved for the render, the runner's
    TTL, the benchmark metrics."""

    kind = "Benchmark"
    model = Benchmark
    report_model = ProgressReport

    def pool_ref(self, resource: Benchmark) -> PoolReference | None:
        """``spec.poolRef``."""
        return resource.spec.pool_ref

    def waits_for_inference(self, resource: Benchmark) -> bool:
        """Only while the operator serves the model (not an endpoint, not the gold replay)."""
        return served_by_operator(resource)

    def refine_state(
        self, s: Subject[Benchmark], state: RenderState, problem: Problem | None
    ) -> tuple[RenderState, Problem | None]:
        """Add the checkpoint served (its problem replaces ``problem``) and the baseline's
        results directory."""
        if s.resource.spec.model.checkpoint is not None:
            checkpoint, problem = self.checkpoint(s.resource)
            state = replace(state, checkpoint=checkpoint)
        if s.resource.spec.baseline is not None:
            state = replace(state, baseline_results=self.baseline_results(s.resource, s.uid))
        return state, problem

    def checkpoint(self, bench: Benchmark) -> tuple[ResolvedCheckpoint | None, Problem | None]:
        """The checkpoint a Benchmark serves, resolved from its TrainingRun in the cache."""
        ref = bench.spec.model.checkpoint
        assert ref is not None
        ns = bench.metadata.namespace or "default"
        body = self.ctx.cache.get("TrainingRun", ns, ref.training_run)
        if body is None:
            return None, Problem(
                CHECKPOINT_UNAVAILABLE,
                f"TrainingRun {ref.training_run} does not exist in namespace {ns}",
            )
        try:
            run = TrainingRun.model_validate(body)
        except ValidationError:
            try:
                run = TrainingRun.model_validate({k: v for k, v in body.items() if k != "status"})
            except ValidationError:
                return None, Problem(
                    CHECKPOINT_UNAVAILABLE, f"TrainingRun {ref.training_run} has an invalid spec"
                )
        try:
            return builders.resolve_checkpoint(bench, run), None
        except BuildError as err:
            return None, Problem(CHECKPOINT_UNAVAILABLE, str(err))

    def baseline_results(self, bench: Benchmark, uid: str) -> str | None:
        """The baseline's results directory for the runner, when it can read it.

        A runner Job that exists keeps the value it was created with: its pod template is
        immutable, and a baseline created or edited later must not restart a running benchmark.
        """
        for child in self.ctx.cache.owned(uid):
            if child.get("kind") == "Job":
                containers = child["spec"]["template"]["spec"].get("containers") or [{}]
                for var in containers[0].get("env") or ():
                    if var.get("name") == Env.BASELINE_RESULTS:
                        return str(var.get("value") or "") or None
                return None
        ref = bench.spec.baseline
        assert ref is not None
        body = self.ctx.cache.get("Benchmark", bench.metadata.namespace or "default", ref.name)
        if body is None:
            return None
        try:
            baseline = self.parse(body)
        except ValidationError:
            return None
        return builders.baseline_results(bench, baseline)

    def retained(self, s: Subject[Benchmark], state: RenderState) -> set[Key]:
        """The finished runner Job, until ``ttlSecondsAfterFinished`` has passed; the
        Benchmark keeps its status and results."""
        remaining = self.ttl_remaining(s.resource, s.uid, s.previous)
        if remaining is not None and remaining <= 0:
            return set()
        return super().retained(s, state)

    def ttl_remaining(self, bench: Benchmark, uid: str, status: Mapping[str, Any]) -> float | None:
        """Seconds until the finished runner Job goes (None: no TTL, not finished, or still
        waiting for the runner's last report, which the Job's deletion would cut short)."""
        ttl = bench.spec.ttl_seconds_after_finished
        finished, when = self.finished(uid, status)
        if ttl is None or not finished:
            return None
        if awaiting_final_report(status):
            return None
        if not when:
            return float(ttl)
        done = datetime.fromisoformat(str(when).replace("Z", "+00:00"))
        return ttl - (self.ctx.now() - done).total_seconds()

    def status(self, s: Subject[Benchmark], seen: Observed, now: datetime) -> dict[str, Any]:
        """:func:`~crl_operator.status.benchmark_status`."""
        return benchmark_status(s.resource, seen, s.previous, now)

    def waits(self, problem: Problem) -> bool:
        """A checkpoint not resolvable yet: the TrainingRun's next event brings it back."""
        return problem.reason == CHECKPOINT_UNAVAILABLE

    def requeue_after(self, s: Subject[Benchmark], status: Mapping[str, Any]) -> float | None:
        """Just after the runner's TTL expires, to delete it; before, when the wait for the
        runner's last report ends."""
        remaining = self.ttl_remaining(s.resource, s.uid, status)
        if remaining is not None and remaining > 0:
            return remaining + 1.0
        return super().requeue_after(s, status)

    def record(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """The benchmark's progress and resolve rate as gauges."""
        record_benchmark(namespace, name, status)

    def forget(self, namespace: str, name: str) -> None:
        """Drop the benchmark's gauges."""
        forget_benchmark(namespace, name)

"""What the kinds that run one worker Job share: TrainingRun (the trainer) and Benchmark (the
runner). Each may be queued by Kueue, reports its progress through a ConfigMap, may serve its
model with an inference Deployment that gates the Job's first creation, and uses a RolloutPool
(inline or referenced)."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from crl_operator import conditions as c
from crl_operator.builders import RenderState
from crl_operator.cache import Key
from crl_operator.children import Obj, component_of, deployment_state, job_state
from crl_operator.kinds.base import KindHandler, Subject
from crl_operator.reports import final_report_requeue
from crl_operator.status import Observed, Problem
from crl_worker.api import Benchmark, TrainingRun
from crl_worker.api.common import PoolReference
from crl_worker.api.progress import WireReport

#: A kind that runs one worker Job.
W = TypeVar("W", TrainingRun, Benchmark)


class WorkloadKind(KindHandler[W]):
    """The steps TrainingRun and Benchmark share; each adds its own in :meth:`refine_state`."""

    report_model: ClassVar[type[WireReport]]
    """How the worker's progress report is validated."""

    @abstractmethod
    def pool_ref(self, resource: W) -> PoolReference | None:
        """The RolloutPool the resource names in its spec (None: its own, inline one)."""

    def waits_for_inference(self, resource: W) -> bool:
        """Whether the Job's first creation waits for the operator's inference Deployment."""
        return True

    @abstractmethod
    def refine_state(
        self, s: Subject[W], state: RenderState, problem: Problem | None
    ) -> tuple[RenderState, Problem | None]:
        """The kind's own part of :meth:`render_state` over the shared ``state`` and
        ``problem`` (the returned problem replaces ``problem``)."""

    def read(self, key: Key, resource: W, uid: str, previous: Mapping[str, Any]) -> Subject[W]:
        """The worker's progress report from its ConfigMap (:class:`ProgressReports`), then
        Kueue's admission when the resource names a queue."""
        report = self.ctx.reports.read(resource, uid, self.report_model)
        admission = self.ctx.kueue.admission(resource, uid)
        return Subject(key, resource, uid, previous, report, admission)

    def finished(self, uid: str, previous: Mapping[str, Any]) -> tuple[bool, str | None]:
        """Whether the resource's Job finished (live, or recorded before it was deleted), and
        when."""
        for child in self.ctx.cache.owned(uid):
            if child.get("kind") == "Job":
                js = job_state(child)
                if js.phase in ("succeeded", "failed"):
                    return True, js.completion_time or previous.get("completionTime")
        conds = previous.get("conditions")
        # completionTime is set once the Job was seen finished, before Succeeded may be (while
        # the resource waits for the worker's last report).
        if (
            c.is_true(conds, c.SUCCEEDED)
            or c.is_true(conds, c.FAILED)
            or previous.get("completionTime")
        ):
            return True, previous.get("completionTime")
        return False, None

    def requeue_after(self, s: Subject[W], status: Mapping[str, Any]) -> float | None:
        """While the resource waits for its worker's last report: when the wait ends
        (:func:`~crl_operator.reports.final_report_requeue`)."""
        return final_report_requeue(status, self.ctx.now())

    def render_state(self, s: Subject[W]) -> tuple[RenderState, Problem | None]:
        """Whether inference is ready and the Job finished, Kueue's queueing and the priority
        of the resource's WorkloadPriorityClass; then the kind's :meth:`refine_state`."""
        finished, _ = self.finished(s.uid, s.previous)
        inference_ready = False
        job_exists = False
        for child in self.ctx.cache.owned(s.uid):
            if child.get("kind") == "Deployment" and component_of(child) == "inference":
                inference_ready = deployment_state(child).ready
            if child.get("kind") == "Job":
                job_exists = True
        if not self.waits_for_inference(s.resource):
            inference_ready = True
        # A trainer or runner that exists keeps running through an inference restart: the
        # gate only holds back the *first* creation.
        inference_ready = inference_ready or job_exists
        problem = None
        admission = s.admission
        queued = admission is not None and admission.state != "Unqueued"
        priority = None
        klass = s.resource.spec.scheduling
        if queued and klass.workload_priority_class_name:
            priority = self.ctx.kueue.workload_priority(klass.workload_priority_class_name)
            if priority is None:
                problem = Problem(
                    c.APPLY_FAILED,
                    f"WorkloadPriorityClass {klass.workload_priority_class_name} does not exist"
                    " (scheduling.workloadPriorityClassName): create it or fix the name",
                )
        state = RenderState(
            inference_ready=inference_ready,
            suspended=False,
            finished=finished,
            queued=queued,
            admitted=admission is None or admission.admitted,
            workload_priority=priority,
        )
        return self.refine_state(s, state, problem)

    def settle_admission(self, s: Subject[W]) -> Problem | None:
        """Release an evicted Workload's quota once the children stopped; report PodsReady of
        an admitted one (Kueue's waitForPodsReady reads it, and only a job integration writes
        it)."""
        admission = s.admission
        if (
            admission is not None
            and admission.reserved
            and admission.state in ("Preempted", "Evicted")
        ):
            # Evicted (preempted, or its pods were not ready in time): the render stopped the
            # children; once they are gone, hand the quota back as Kueue's job integrations do.
            return self.ctx.kueue.release_quota(s.resource, s.uid)
        if admission is not None and admission.state == "Admitted":
            return self.ctx.kueue.report_pods_ready(s.resource, s.uid)
        return None

    def pool(self, s: Subject[W]) -> Obj | None:
        """The RolloutPool the resource uses: the one it names, else the one it owns."""
        ref = self.pool_ref(s.resource)
        if ref is not None:
            return self.ctx.cache.get("RolloutPool", s.namespace, ref.name)
        for child in self.ctx.cache.owned(s.uid):
            if child.get("kind") == "RolloutPool":
                return child
        return None

    def observe(self, s: Subject[W], problem: Problem | None) -> Observed:
        """The owned children, the pool, the worker's report and Kueue's admission."""
        return Observed(
            children=tuple(self.ctx.cache.owned(s.uid)),
            pool=self.pool(s),
            report=s.report,
            problem=problem,
            admission=s.admission,
        )

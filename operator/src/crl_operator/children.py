"""What the operator reads off the children it made (pure): the component a child serves, a
Deployment's replicas, a Job's phase."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Obj = Mapping[str, Any]


def component_of(obj: Obj) -> str:
    """The child's `app.kubernetes.io/component` label."""
    return str(
        ((obj.get("metadata") or {}).get("labels") or {}).get("app.kubernetes.io/component", "")
    )


def name_of(obj: Obj | None) -> str | None:
    """`metadata.name`, or None for a missing object."""
    if obj is None:
        return None
    return str((obj.get("metadata") or {}).get("name", "")) or None


@dataclass(frozen=True)
class DeploymentState:
    """Replica counts of a Deployment and whether it is fully available."""

    desired: int
    available: int
    current: bool
    """The Deployment controller has seen the latest spec (observedGeneration)."""

    @property
    def ready(self) -> bool:
        """All desired replicas are available for the current spec (and at least one is wanted)."""
        return self.current and self.desired > 0 and self.available >= self.desired


def deployment_state(dep: Obj) -> DeploymentState:
    """Read a Deployment's replica counts."""
    spec = dep.get("spec") or {}
    st = dep.get("status") or {}
    generation = int((dep.get("metadata") or {}).get("generation") or 0)
    desired = int(spec.get("replicas", 1) if spec.get("replicas") is not None else 1)
    available = int(st.get("availableReplicas") or 0)
    updated = int(st.get("updatedReplicas") or 0)
    current = int(st.get("observedGeneration") or 0) >= generation and updated >= desired
    return DeploymentState(desired, available, current)


@dataclass(frozen=True)
class JobState:
    """Phase of a Job, from its conditions and counts."""

    phase: str
    """`suspended`, `pending`, `running`, `succeeded` or `failed`."""
    message: str
    completion_time: str | None = None
    start_time: str | None = None


def _job_condition(job: Obj, type_: str) -> Obj | None:
    for jc in (job.get("status") or {}).get("conditions") or ():
        if jc.get("type") == type_ and jc.get("status") == "True":
            return dict(jc)
    return None


def job_state(job: Obj) -> JobState:
    """Classify a Job: finished (Complete/Failed), suspended (e.g. by Kueue), or how far its pods are."""
    spec = job.get("spec") or {}
    st = job.get("status") or {}
    done = _job_condition(job, "Complete") or _job_condition(job, "SuccessCriteriaMet")
    if done is not None:
        return JobState(
            "succeeded", "the Job completed", st.get("completionTime"), st.get("startTime")
        )
    failed = _job_condition(job, "Failed") or _job_condition(job, "FailureTarget")
    if failed is not None:
        why = failed.get("message") or failed.get("reason") or "the Job failed"
        return JobState("failed", str(why), failed.get("lastTransitionTime"), st.get("startTime"))
    if spec.get("suspend") or _job_condition(job, "Suspended") is not None:
        return JobState("suspended", "the Job is suspended (waiting for admission, e.g. by Kueue)")
    want = int(spec.get("parallelism") or 1)
    if spec.get("completions") is not None:
        want = min(want, int(spec["completions"]))
    ready = int(st.get("ready") or 0)
    if want > 0 and ready >= want:
        return JobState("running", f"{ready}/{want} pods ready", None, st.get("startTime"))
    return JobState("pending", f"{ready}/{want} pods ready", None, st.get("startTime"))


__all__ = [
    "DeploymentState",
    "JobState",
    "Obj",
    "component_of",
    "deployment_state",
    "job_state",
    "name_of",
]

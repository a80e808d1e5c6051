"""How Kueue sees a TrainingRun or Benchmark (pure): its Workload's admission as the resource's
`Admitted` condition and `status.queue`, and the `PodsReady` condition the operator writes on
the Workload for Kueue's `waitForPodsReady` (docs/scheduling.md)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from crl_operator import conditions as c
from crl_operator.children import Obj, component_of, deployment_state, job_state
from crl_operator.conditions import Cond, cond

#: Kueue's Workload condition types the operator reads.
WL_QUOTA_RESERVED = "QuotaReserved"
WL_ADMITTED = "Admitted"
WL_EVICTED = "Evicted"
WL_PODS_READY = "PodsReady"
#: The part of Kueue's flavor-assigner message that says a pod set can never fit.
_NEVER_FITS = "> maximum capacity"


@dataclass(frozen=True)
class Admission:
    """How Kueue sees a TrainingRun or Benchmark that names a queue (docs/scheduling.md)."""

    state: str
    """`Queued`, `Admitted`, `Preempted`, `Evicted` (another eviction reason) or `Unqueued`
    (Kueue is not installed): `status.queue.state`, a printer column."""
    reason: str
    """The Admitted condition's reason: Kueue's (`Pending`, `Inadmissible`, `Preempted`,
    `PodsReadyTimeout`, ...) or the operator's (`Admitted`, `ExceedsQuota`, `KueueAbsent`,
    `WorkloadMissing`)."""
    message: str
    queue: str
    """The LocalQueue (`scheduling.queueName`)."""
    cluster_queue: str | None = None
    """The ClusterQueue that reserved quota, while it holds it."""
    reserved: bool = False
    """Kueue has reserved quota for the Workload (`status.admission` is set)."""

    @property
    def admitted(self) -> bool:
        """The children may run: quota is reserved and the Workload was not evicted."""
        return self.state in ("Admitted", "Unqueued")

    def condition(self) -> Cond:
        """The resource's `Admitted` condition."""
        return cond(c.ADMITTED, self.admitted, self.reason, self.message)

    def status(self) -> dict[str, Any]:
        """`status.queue`."""
        out = {"name": self.queue, "state": self.state, "clusterQueue": self.cluster_queue}
        return {k: v for k, v in out.items() if v is not None}


def workload_admission(queue: str, workload: Obj | None, *, kueue: bool) -> Admission:
    """The admission of a resource queued in `queue`, from its Kueue Workload (or its absence).

    `kueue`: whether Kueue is installed; without it the resource runs unqueued and says so.
    """
    if not kueue:
        return Admission(
            "Unqueued",
            c.KUEUE_ABSENT,
            f"scheduling.queueName is {queue!r} but Kueue is not installed (no"
            " kueue.x-k8s.io/v1beta2 API): running without queueing or quota",
            queue,
        )
    if workload is None:
        return Admission("Queued", c.WORKLOAD_MISSING, "the Kueue Workload is being created", queue)
    status = workload.get("status") or {}
    conds = status.get("conditions")
    admission = status.get("admission") or {}
    cq = admission.get("clusterQueue") if admission else None
    reserved = bool(admission)
    evicted = c.find(conds, WL_EVICTED)
    if evicted is not None and evicted.get("status") == "True":
        reason = str(evicted.get("reason") or "Evicted")
        again = (
            "stopping its pods (the trainer checkpoints) before the quota is released"
            if reserved
            else "requeued; it resumes from its last checkpoint when admitted again"
        )
        return Admission(
            "Preempted" if reason == "Preempted" else "Evicted",
            reason,
            f"{evicted.get('message') or reason}; {again}",
            queue,
            cq,
            reserved,
        )
    if c.is_true(conds, WL_ADMITTED) and reserved:
        return Admission(
            "Admitted",
            c.KUEUE_ADMITTED,
            f"admitted by ClusterQueue {cq} (LocalQueue {queue})",
            queue,
            cq,
            True,
        )
    pending = c.find(conds, WL_QUOTA_RESERVED)
    if pending is None or pending.get("status") == "True":
        # Reserved but admission checks not ready, or Kueue has not looked at it yet.
        return Admission("Queued", c.QUEUED, f"waiting in LocalQueue {queue}", queue, cq, reserved)
    message = str(pending.get("message") or "")
    reason = str(pending.get("reason") or c.QUEUED)
    if _NEVER_FITS in message:
        reason = c.EXCEEDS_QUOTA
        message = f"larger than the quota it can ever get, it will not be admitted: {message}"
    return Admission("Queued", reason, f"queued in LocalQueue {queue}: {message}", queue, cq)


_PODS_NOT_READY = "Not all pods are ready or succeeded"
_PODS_RECOVERING = "At least one pod has failed, waiting for recovery"
_PODS_READY = "All pods reached readiness and the workload is running"


def _pod_set_ready(name: str, children: Iterable[Obj]) -> bool:
    """Whether the child that runs pod set `name` has all its pods ready (or succeeded)."""
    for child in children:
        if component_of(child) != name:
            continue
        if child.get("kind") == "Deployment":
            return deployment_state(child).ready
        if child.get("kind") == "Job":
            return job_state(child).phase in ("running", "succeeded")
    return False


def pods_ready_condition(workload: Obj, children: Iterable[Obj]) -> tuple[str, str, str]:
    """The `PodsReady` condition (status, reason, message) an admitted Workload should carry.

    What Kueue's job integrations write for the jobs they manage (Kueue computes it for no
    other Workload), so that its `waitForPodsReady` timeout measures this run's pods: every pod
    set's child (the vLLM Deployment, the trainer or runner Job) has all its pods ready:
    `Started` (or `Recovered` after a recovery); otherwise `WaitForStart`, or
    `WaitForRecovery` once they had all been ready.
    """
    status = workload.get("status") or {}
    conds = status.get("conditions")
    current = c.find(conds, WL_PODS_READY)
    admitted = c.is_true(conds, WL_ADMITTED) and bool(status.get("admission"))
    kids = list(children)
    names = [str(p.get("name")) for p in (workload.get("spec") or {}).get("podSets") or ()]
    if admitted and names and all(_pod_set_ready(n, kids) for n in names):
        recovering = current is not None and current.get("reason") in (
            "WaitForRecovery",
            "Recovered",
        )
        return "True", "Recovered" if recovering else "Started", _PODS_READY
    if not admitted or current is None:
        return "False", "WaitForStart", _PODS_NOT_READY
    if current.get("status") == "True" or current.get("reason") == "WaitForRecovery":
        return "False", "WaitForRecovery", _PODS_RECOVERING
    return "False", "WaitForStart", _PODS_NOT_READY


__all__ = [
    "WL_ADMITTED",
    "WL_EVICTED",
    "WL_PODS_READY",
    "WL_QUOTA_RESERVED",
    "Admission",
    "pods_ready_condition",
    "workload_admission",
]

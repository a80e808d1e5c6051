"""Condition types, reasons and the one rule for merging conditions (pure, no I/O).

Conditions follow the Kubernetes convention: a list keyed by ``type`` whose
``lastTransitionTime`` changes only when ``status`` flips, while ``reason``, ``message`` and
``observedGeneration`` follow every reconcile.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

Status = Literal["True", "False", "Unknown"]

# --- condition types ----------------------------------------------------------------------
READY = "Ready"
INFERENCE_READY = "InferenceReady"
SANDBOXES_READY = "SandboxesReady"
TRAINING = "Training"
SUSPENDED = "Suspended"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
RUNNING = "Running"
GATEWAY_READY = "GatewayReady"
ADMITTED = "Admitted"
WEIGHT_SYNC = "WeightSync"
TASKS_VALIDATED = "TasksValidated"

# --- reasons (CamelCase, as the API requires) ---------------------------------------------
INVALID_SPEC = "InvalidSpec"
APPLY_FAILED = "ApplyFailed"
PRUNE_FAILED = "PruneFailed"
RECONCILED = "Reconciled"
DEPLOYMENT_AVAILABLE = "DeploymentAvailable"
DEPLOYMENT_PROGRESSING = "DeploymentProgressing"
DEPLOYMENT_MISSING = "DeploymentMissing"
SCALED_TO_ZERO = "ScaledToZero"
NOT_SERVED = "NotServed"
NO_ROLLOUTS = "NoRollouts"
WAITING_FOR_INFERENCE = "WaitingForInference"
WAITING_FOR_SANDBOXES = "WaitingForSandboxes"
WAITING_FOR_PODS = "WaitingForPods"
JOB_CREATED = "JobCreated"
JOB_RUNNING = "JobRunning"
JOB_SUSPENDED = "JobSuspended"
JOB_SUCCEEDED = "JobSucceeded"
JOB_FAILED = "JobFailed"
JOB_MISSING = "JobMissing"
AWAITING_REPORT = "AwaitingReport"
POOL_READY = "PoolReady"
POOL_NOT_READY = "PoolNotReady"
POOL_MISSING = "PoolMissing"
SUSPENDED_BY_USER = "SuspendedByUser"
NOT_SUSPENDED = "NotSuspended"
WORKLOADS_DELETED = "WorkloadsDeleted"
IN_PROGRESS = "InProgress"
FINISHED = "Finished"
SANDBOXES_WARM = "SandboxesWarm"
SANDBOXES_STARTING = "SandboxesStarting"
VALIDATING = "Validating"
VALIDATED = "Validated"
NO_VALID_TASKS = "NoValidTasks"
# Admission by Kueue (docs/scheduling.md): Kueue's own reasons (Pending, Inadmissible,
# Preempted, PodsReadyTimeout, ...) are carried as they are; these are the operator's.
KUEUE_ADMITTED = "Admitted"
KUEUE_ABSENT = "KueueAbsent"
WORKLOAD_MISSING = "WorkloadMissing"
EXCEEDS_QUOTA = "ExceedsQuota"
QUEUED = "Queued"


@dataclass(frozen=True)
class Cond:
    """One condition as a reconcile computes it, before timestamps are attached."""

    type: str
    status: Status
    reason: str
    message: str = ""

    @property
    def true(self) -> bool:
        """Whether the condition holds."""
        return self.status == "True"

    @classmethod
    def stored(cls, entry: Mapping[str, Any]) -> Cond:
        """A condition as a status stores it, to carry it over unchanged into a new list."""
        return cls(
            str(entry["type"]), entry["status"], str(entry["reason"]), str(entry.get("message", ""))
        )


def cond(type_: str, ok: bool | None, reason: str, message: str = "") -> Cond:
    """A condition from a tri-state: True, False, or None for Unknown."""
    status: Status = "Unknown" if ok is None else ("True" if ok else "False")
    return Cond(type_, status, reason, message)


def timestamp(now: datetime) -> str:
    """RFC 3339 with second precision in UTC, as the API server writes times."""
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_conditions(
    previous: Iterable[Mapping[str, Any]] | None,
    computed: Iterable[Cond],
    *,
    generation: int | None,
    now: datetime,
) -> list[dict[str, Any]]:
    """The new condition list: `computed`, keeping each type's transition time unless it flipped.

    Types present before but no longer computed are dropped: the reconcile owns the whole list.
    """
    before = {str(c.get("type")): c for c in previous or ()}
    merged: list[dict[str, Any]] = []
    for c in computed:
        old = before.get(c.type)
        transition = None
        if old is not None and old.get("status") == c.status:
            transition = old.get("lastTransitionTime")
        entry: dict[str, Any] = {
            "type": c.type,
            "status": c.status,
            "reason": c.reason,
            "message": c.message,
            "lastTransitionTime": transition or timestamp(now),
        }
        if generation is not None:
            entry["observedGeneration"] = generation
        merged.append(entry)
    return merged


def find(conditions: Iterable[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    """The condition of `type_` in a status's list, or None."""
    for c in conditions or ():
        if c.get("type") == type_:
            return c
    return None


def is_true(conditions: Iterable[Mapping[str, Any]] | None, type_: str) -> bool:
    """Whether the condition of `type_` exists and is True."""
    c = find(conditions, type_)
    return c is not None and c.get("status") == "True"

"""Status pieces shared by the three custom resources."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from crl_worker.api.base import ApiModel, Condition, ObjectName, Short

#: Conditions are a map keyed by `type` so server-side apply merges them per type.
CONDITIONS_LIST: dict[str, Any] = {
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["type"],
}


class CommonStatus(ApiModel):
    """Fields every status carries."""

    observed_generation: int | None = Field(default=None, ge=0)
    """The `metadata.generation` the operator last reconciled."""
    conditions: list[Condition] | None = Field(
        default=None, max_length=32, json_schema_extra=CONDITIONS_LIST
    )
    """Current state in the Kubernetes convention; `Ready` summarizes the others."""


class QueueStatus(ApiModel):
    """Where the resource stands with Kueue, when `scheduling.queueName` is set
    (docs/scheduling.md). The `Admitted` condition carries Kueue's reason and message."""

    name: ObjectName | None = None
    """The LocalQueue (`scheduling.queueName`)."""
    state: Literal["Queued", "Admitted", "Preempted", "Evicted", "Unqueued"] | None = None
    """`Queued`: waiting for quota (no pod runs); `Admitted`: quota reserved for every pod
    set at once; `Preempted` / `Evicted`: Kueue took the quota back (the pods stop, the
    trainer checkpoints, the run waits to be admitted again); `Unqueued`: Kueue is not
    installed, the resource runs without quota."""
    cluster_queue: ObjectName | None = None
    """The ClusterQueue whose quota the resource holds, while admitted."""


class ReasonCount(ApiModel):
    """How many quarantined tasks one reason accounts for."""

    reason: Short
    """The kind of problem (e.g. `gold patch does not resolve`, `flaky tests`)."""
    count: int = Field(ge=0)
    """Tasks quarantined for it."""


class ValidationStatus(ApiModel):
    """Where the pool's task validation stands (`spec.validation`)."""

    state: Literal["Validating", "Done"]
    """`Validating`: the gateway checks tasks and leases nothing yet; `Done`: it serves the
    valid tasks."""
    total: int = Field(ge=0)
    """Tasks to validate."""
    validated: int = Field(ge=0)
    """Tasks with a verdict (cached ones included)."""
    quarantined: int = Field(ge=0)
    """Tasks found broken: never leased. The pool's progress ConfigMap lists them."""
    cached: int | None = Field(default=None, ge=0)
    """Verdicts taken from the validation cache."""
    reasons: list[ReasonCount] | None = Field(default=None, max_length=8)
    """The most common reasons, most common first."""

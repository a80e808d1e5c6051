"""Status pieces shared by the three custom resources."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from crl_worker.api.base import ApiModel, Condition, ObjectName

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

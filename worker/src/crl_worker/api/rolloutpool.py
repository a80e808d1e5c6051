"""The RolloutPool custom resource: warm sandboxes for one task source, leased to rollouts."""

from __future__ import annotations

from pydantic import Field

from crl_worker.api.base import ApiModel, Short, Text
from crl_worker.api.common import PoolSettings, SchedulingSpec, TaskSource
from crl_worker.api.status import CommonStatus, ValidationStatus


class RolloutPoolSpec(PoolSettings):
    """Desired state of a RolloutPool."""

    tasks: TaskSource
    """Task instances whose sandboxes this pool serves."""
    scheduling: SchedulingSpec | None = None
    """Kueue settings of the sandbox pods. They stay out of Kueue (not counted against any
    quota) unless `sandboxesUseQuota` is on with a `queueName`; the gateway itself is never
    queued."""


class LatencySummary(ApiModel):
    """Quantiles of a latency, in seconds."""

    p50: float | None = Field(default=None, ge=0.0)
    """Median."""
    p95: float | None = Field(default=None, ge=0.0)
    """95th percentile."""


class RolloutPoolStatus(CommonStatus):
    """Observed state of a RolloutPool. Condition types: `Ready`, `GatewayReady`,
    `TasksValidated` (with `spec.validation.enabled`)."""

    replicas: int | None = Field(default=None, ge=0)
    """Sandboxes that exist and are not leased (warm or starting); the scale subresource reads it."""
    desired: int | None = Field(default=None, ge=0)
    """Warm sandboxes wanted (`spec.replicas`)."""
    ready: int | None = Field(default=None, ge=0)
    """Sandboxes ready to be leased."""
    leased: int | None = Field(default=None, ge=0)
    """Sandboxes leased to a rollout right now."""
    cold_starting: int | None = Field(default=None, ge=0)
    """Sandboxes still starting (image pull, repository setup)."""
    selector: Short | None = None
    """Label selector of the sandbox pods, as a string (for the scale subresource)."""
    acquire_latency_seconds: LatencySummary | None = None
    """Time from a lease request to a ready sandbox."""
    hit_ratio: float | None = Field(default=None, ge=0.0, le=1.0)
    """Share of leases served by an already warm sandbox."""
    gateway_url: Text | None = None
    """In-cluster URL of the pool gateway."""
    validation: ValidationStatus | None = None
    """Task validation, when `spec.validation.enabled`: counts and the most common reasons."""

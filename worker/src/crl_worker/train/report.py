"""The trainer's progress report, and how it reaches the TrainingRun's status in a cluster.

The trainer (its rank 0) publishes a small JSON report after each optimizer step, after each
checkpoint and once at the end (:class:`TrainingProgress`: step, policy version, last
checkpoint, a few metrics). In a cluster the operator gives the trainer pods a ConfigMap of their
own (`CRL_PROGRESS_CONFIGMAP`, `<run>-progress`) and a ServiceAccount allowed to `get` and
`patch` that one ConfigMap; the reporter from :func:`training_reporter_from_env` merge-patches the
report into its key `progress.json`, and the operator copies it into the TrainingRun's
`status.step`, `totalSteps`, `policyVersion`, `lastCheckpoint` and `metrics`. On one machine
there is no reporter (None); the trainer's logs and metrics say the same.

The transport is the benchmark runner's (crl_worker.bench.report.ConfigMapReporter): coalesced
publishes, failures logged and never raised, the final report retried.
"""

from __future__ import annotations

import logging
import math
import posixpath
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from crl_worker.api.trainingrun import TrainingMetrics
from crl_worker.bench.report import MAX_COUNT, WireReport, reporter_from_env

log = logging.getLogger(__name__)

#: The trainer's field manager on its progress ConfigMap (the operator's own never sends `data`).
FIELD_MANAGER = "crl-trainer"
#: The longest free-form text (phase, message) a report may carry into the status.
MAX_MESSAGE_CHARS = 1024


class ReportedMetrics(TrainingMetrics):
    """`metrics` of a report: the fields (names and bounds) of the status's `TrainingMetrics`.

    Unknown keys are ignored (a newer trainer may report more), and a value that is not a
    finite number (NaN: the spread of a single reward; infinity) is dropped as unknown: JSON
    cannot carry it and the API server would refuse it in the status.
    """

    model_config = ConfigDict(extra="ignore")

    infrastructure_failures: int | None = Field(default=None, ge=0, le=MAX_COUNT)
    """Rollouts dropped because of infrastructure failures, in total (bounded so that the
    status's int64 holds it)."""

    @model_validator(mode="before")
    @classmethod
    def _finite_or_unknown(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        return {
            key: None if isinstance(value, float) and not math.isfinite(value) else value
            for key, value in data.items()
        }


class CheckpointReport(BaseModel):
    """`lastCheckpoint` of a report: the newest checkpoint the trainer finished writing."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="ignore",
        use_attribute_docstrings=True,
    )

    step: int = Field(ge=0, le=MAX_COUNT)
    """Optimizer step of the checkpoint."""
    path: str = Field(min_length=1, max_length=4096)
    """Its folder relative to the checkpoint directory (`CRL_CHECKPOINT_DIR`), e.g. `step-50`:
    the status names it inside the checkpoint volume, where a Benchmark serving the checkpoint
    mounts it."""
    time: datetime | None = None
    """When it was written."""

    @field_validator("path")
    @classmethod
    def _relative(cls, value: str) -> str:
        normal = posixpath.normpath(value)
        if value.startswith("/") or normal in (".", "..") or normal.startswith("../"):
            raise ValueError(
                f"{value!r} must be relative to the checkpoint directory (e.g. step-50), not"
                " absolute and not outside it"
            )
        return normal

    @field_validator("time")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        # A time without a zone is the trainer's UTC clock; the status needs RFC 3339.
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


class TrainingProgress(WireReport):
    """What the trainer publishes: `progress.json`, camelCase on the wire.

    Unknown keys are ignored, and so is a malformed `metrics` block (logged: the step still
    counts); a step beyond the total, a negative or oversized count, or a checkpoint path
    outside the checkpoint directory refuses the whole report.
    """

    step: int = Field(ge=0, le=MAX_COUNT)
    """Optimizer steps finished (0 before the first)."""
    total_steps: int = Field(ge=0, le=MAX_COUNT)
    """Optimizer steps of the whole run."""
    policy_version: int | None = Field(default=None, ge=0, le=MAX_COUNT)
    """Version of the weights the inference server holds (0: the base weights); None with
    in-process generation, where there is no server."""
    last_checkpoint: CheckpointReport | None = None
    """The newest checkpoint; None before the first (a resumed run names the one it resumed)."""
    metrics: ReportedMetrics | None = None
    """A summary of the last step (full metrics are in Prometheus)."""
    finished: bool = False
    """The trainer is done (the last report)."""
    phase: str | None = Field(default=None, max_length=64)
    """What the trainer is doing, in a word or two (e.g. `loading`, `training`,
    `checkpointing`)."""
    message: str | None = Field(default=None, max_length=MAX_MESSAGE_CHARS)
    """A line for humans, e.g. why the trainer is waiting."""
    updated_at: datetime | None = None
    """When the trainer wrote this report (the reporter fills it in)."""

    @field_validator("metrics", mode="wrap")
    @classmethod
    def _metrics_or_none(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        # The metrics are a summary: a malformed block is dropped, the step still counts.
        try:
            return handler(value)
        except ValidationError as err:
            log.warning("ignoring malformed metrics in a training progress report: %s", err)
            return None

    @model_validator(mode="after")
    def _step_within_total(self) -> TrainingProgress:
        if self.step > self.total_steps:
            raise ValueError(f"step ({self.step}) exceeds totalSteps ({self.total_steps})")
        return self


class TrainingReporter(Protocol):
    """Where the trainer's progress goes (a ConfigMap reporter in a cluster)."""

    async def publish(self, report: Mapping[str, Any]) -> None:
        """Make `report` (a :class:`TrainingProgress` as JSON) the current progress; never
        raises (an invalid report is logged and not sent)."""
        ...

    async def aclose(self) -> None:
        """Wait for a publish in flight and release the connection."""
        ...


def training_reporter_from_env(env: Mapping[str, str] | None = None) -> TrainingReporter | None:
    """The trainer's ConfigMap reporter as the operator configured it (`CRL_PROGRESS_CONFIGMAP`,
    `POD_NAMESPACE`; `KUBECONFIG` instead of the pod's ServiceAccount when set); None outside a
    cluster, where nothing reads progress."""
    return reporter_from_env(env, field_manager=FIELD_MANAGER, model=TrainingProgress)

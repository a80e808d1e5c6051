"""The progress reports the workers publish and the operator reads (part of the contract).

A worker (the benchmark runner, the trainer's rank 0) merge-patches a small JSON report into key
:data:`crl_worker.api.contract.PROGRESS_KEY` of its progress ConfigMap
(:attr:`crl_worker.api.contract.Env.PROGRESS_CONFIGMAP`); the operator reads it at each
reconcile and copies it into the resource's status. Both ends validate with these models:
:class:`ProgressReport` (a Benchmark's `status.progress`, `resolveRate`, `passAtK`) and
:class:`TrainingProgress` (a TrainingRun's `status.step`, `totalSteps`, `policyVersion`,
`lastCheckpoint`, `metrics`, and the `WeightSync` condition from `weightSync`).
:class:`WireReport` gives every report the same size limit and
error messages on both ends. How a worker sends them is crl_worker.rollout.report.
"""

from __future__ import annotations

import logging
import math
import posixpath
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Self

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

from crl_worker.api.benchmark import BaselineComparison, PassAtK
from crl_worker.api.trainingrun import TrainingMetrics

log = logging.getLogger(__name__)

#: How every report model reads and writes JSON: camelCase keys, unknown keys ignored (a newer
#: worker may say more than this operator reads).
_WIRE = ConfigDict(
    alias_generator=to_camel,
    validate_by_name=True,
    validate_by_alias=True,
    serialize_by_alias=True,
    extra="ignore",
    use_attribute_docstrings=True,
)

#: The largest count a report may hold: JSON's safe integers, which every client reads exactly
#: and which fit the status schema's int64. A larger one would make the operator's status patch
#: fail (the API server refuses it), so it is refused with the report instead.
MAX_COUNT = 2**53 - 1
#: The longest `progress.json` read: a real report is well under a kilobyte (at most 16 pass@k
#: values); anything bigger is refused unread rather than parsed at every reconcile.
MAX_REPORT_CHARS = 64 * 1024


#: The longest free-form text (phase, message) a training report may carry into the status.
MAX_MESSAGE_CHARS = 1024


class WireReport(BaseModel):
    """Base of a report a worker publishes into a ConfigMap key for the operator to read:
    camelCase JSON, unknown keys ignored (a newer worker may say more than this operator
    reads), at most :data:`MAX_REPORT_CHARS` characters. Subclasses have a `finished` field
    (the last report, which the reporter retries) and may have `updated_at`, which the
    reporter fills in."""

    model_config = _WIRE

    @classmethod
    def parse(cls, text: str) -> Self:
        """Read a report's JSON; ValueError (with what is wrong) for anything malformed."""
        if len(text) > MAX_REPORT_CHARS:
            raise ValueError(
                f"malformed progress report: {len(text)} characters, more than the"
                f" {MAX_REPORT_CHARS} a report may have"
            )
        try:
            return cls.model_validate_json(text)
        except ValidationError as err:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'report'}: {e['msg']}"
                for e in err.errors()[:5]
            )
            raise ValueError(f"malformed progress report: {problems}") from None

    def to_wire(self) -> dict[str, Any]:
        """The JSON object as written to the ConfigMap (camelCase, nulls left out)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class ProgressReport(WireReport):
    """What the runner publishes: `progress.json`, camelCase on the wire.

    Unknown keys are ignored (a newer runner may say more than this operator reads), and so is
    a malformed `comparison` (logged); the counts must add up, or the whole report is refused.
    """

    total: int = Field(ge=0, le=MAX_COUNT)
    """Attempts to run (instances x attempts)."""
    done: int = Field(ge=0, le=MAX_COUNT)
    """Attempts finished: resolved, unresolved or errored."""
    resolved: int = Field(ge=0, le=MAX_COUNT)
    """Attempts that resolved their instance."""
    errored: int = Field(default=0, ge=0, le=MAX_COUNT)
    """Attempts lost to infrastructure failures (not counted as unresolved)."""
    resolve_rate: float | None = Field(default=None, ge=0.0, le=1.0)
    """resolved / (done - errored); None before any attempt finished without an error."""
    pass_at_k: list[PassAtK] = Field(default_factory=list, max_length=16)
    """Unbiased pass@k for each requested k, over the instances finished so far."""
    finished: bool = False
    """The runner is done (the last report)."""
    updated_at: datetime | None = None
    """When the runner wrote this report."""
    comparison: BaselineComparison | None = None
    """The paired comparison with the baseline, when the runner computed one."""

    @field_validator("comparison", mode="wrap")
    @classmethod
    def _comparison_or_none(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        # The comparison is an extra: a malformed one is dropped, the progress still counts.
        try:
            comparison = handler(value)
        except ValidationError as err:
            log.warning("ignoring a malformed baseline comparison in a progress report: %s", err)
            return None
        if comparison is not None and comparison.shared_instances > MAX_COUNT:
            log.warning(
                "ignoring a baseline comparison over %d shared instances in a progress report",
                comparison.shared_instances,
            )
            return None
        return comparison

    @model_validator(mode="after")
    def _counts_add_up(self) -> ProgressReport:
        if self.resolved + self.errored > self.done:
            raise ValueError(
                f"resolved ({self.resolved}) + errored ({self.errored}) exceed done ({self.done})"
            )
        if self.done > self.total:
            raise ValueError(f"done ({self.done}) exceeds total ({self.total})")
        if any(p.k > MAX_COUNT for p in self.pass_at_k):
            raise ValueError(f"passAtK: k above {MAX_COUNT}")
        return self

    @field_validator("pass_at_k", mode="after")
    @classmethod
    def _each_k_once(cls, values: list[PassAtK]) -> list[PassAtK]:
        # One value per k in the status. A k listed twice (a one-machine spec may say
        # `passAtK: [1, 1]`; the API server refuses that) is dropped after its first value
        # rather than losing the whole report.
        seen: set[int] = set()
        out = []
        for value in values:
            if value.k not in seen:
                seen.add(value.k)
                out.append(value)
        return out


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

    model_config = _WIRE

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


class WeightSyncReport(BaseModel):
    """`weightSync` of a training report: what the trainer's weight-sync watchdog found last
    (the TrainingRun's `WeightSync` condition)."""

    model_config = _WIRE

    ok: bool
    """Whether the inference server serves the trainer's current weights, as far as the
    checks tell (the push finished in time, the served version is the pushed one, the
    logprob gap is under its threshold)."""
    reason: str = Field(min_length=1, max_length=64, pattern=r"^[A-Z][A-Za-z0-9]*$")
    """CamelCase: `InSync`, `Recovered`, `PushTimedOut`, `PushFailed`, `WrongVersion`,
    `LogprobGap`."""
    message: str = Field(default="", max_length=MAX_MESSAGE_CHARS)
    """What happened, for people."""


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
    weight_sync: WeightSyncReport | None = None
    """The weight-sync watchdog's last finding; None with in-process generation."""
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


#: Most quarantined tasks a pool's report lists by name (the counts cover them all; the full
#: list is `quarantine.json` in the validation cache).
MAX_LISTED_QUARANTINED = 200
#: Most reason kinds a pool's report counts (the most common ones).
MAX_REASONS = 8


class QuarantinedTask(BaseModel):
    """One task a pool's validation quarantined."""

    model_config = _WIRE

    instance_id: str = Field(min_length=1, max_length=256)
    """The task instance."""
    reason: str = Field(min_length=1, max_length=128)
    """The kind of its first problem (e.g. `gold patch does not resolve`)."""


class PoolProgress(WireReport):
    """What a pool gateway publishes while it validates its tasks: `progress.json` of the
    pool's progress ConfigMap, camelCase on the wire. The operator copies the counts into the
    RolloutPool's `status.validation`; the ConfigMap itself lists the quarantined tasks."""

    total: int = Field(ge=0, le=MAX_COUNT)
    """Tasks to validate."""
    validated: int = Field(ge=0, le=MAX_COUNT)
    """Tasks with a verdict so far (cached ones included)."""
    quarantined: int = Field(ge=0, le=MAX_COUNT)
    """Tasks found broken so far: never leased."""
    cached: int = Field(default=0, ge=0, le=MAX_COUNT)
    """Verdicts taken from the cache (no run paid for them)."""
    reasons: dict[str, int] = Field(default_factory=dict, max_length=MAX_REASONS)
    """Quarantined tasks per reason kind, the most common ones."""
    tasks: list[QuarantinedTask] = Field(default_factory=list, max_length=MAX_LISTED_QUARANTINED)
    """The quarantined tasks, the first :data:`MAX_LISTED_QUARANTINED`."""
    finished: bool = False
    """Validation is over: the pool serves the valid tasks (the last report)."""
    updated_at: datetime | None = None
    """When the gateway wrote this report."""

    @field_validator("reasons", mode="after")
    @classmethod
    def _reason_counts(cls, values: dict[str, int]) -> dict[str, int]:
        for reason, count in values.items():
            if not reason or len(reason) > 128 or not 0 <= count <= MAX_COUNT:
                raise ValueError(f"reasons: {reason[:40]!r}: {count} is not a reason and a count")
        return values

    @model_validator(mode="after")
    def _counts_add_up(self) -> PoolProgress:
        if self.quarantined > self.validated:
            raise ValueError(
                f"quarantined ({self.quarantined}) exceeds validated ({self.validated})"
            )
        if self.validated > self.total:
            raise ValueError(f"validated ({self.validated}) exceeds total ({self.total})")
        if sum(self.reasons.values()) > self.quarantined:
            raise ValueError("the reasons count more tasks than were quarantined")
        return self

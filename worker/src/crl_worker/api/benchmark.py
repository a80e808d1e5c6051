"""The Benchmark custom resource: evaluate one model on one suite."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import ConfigDict, Field, StringConstraints

from crl_worker.api.base import ApiModel, ObjectName, Path, Short, cel, with_rules
from crl_worker.api.common import (
    AgentSpec,
    EndpointSpec,
    InferenceSpec,
    ModelSpec,
    PoolReference,
    PoolSettings,
    ResultsLocation,
    SchedulingSpec,
    TaskSource,
)
from crl_worker.api.status import CommonStatus, QueueStatus, ValidationStatus


class SuiteSpec(ApiModel):
    """The benchmark suite."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    """Suite name shown in results and comparisons, e.g. `swe-bench-verified`."""
    tasks: TaskSource
    """Where its instances come from (with ids or a limit in `tasks.filter`)."""


class ServeSpec(ModelSpec):
    """A model the operator serves with vLLM for this benchmark."""

    inference: InferenceSpec = Field(default_factory=InferenceSpec)
    """The vLLM server."""


class TrainingRunCheckpoint(ApiModel):
    """A checkpoint of a TrainingRun, served with vLLM."""

    training_run: ObjectName
    """The TrainingRun whose checkpoint volume holds the weights."""
    step: Annotated[str, StringConstraints(max_length=64, pattern=r"^(latest|step-[0-9]+)$")] = (
        "latest"
    )
    """`latest` or `step-N`."""
    inference: InferenceSpec = Field(default_factory=InferenceSpec)
    """The vLLM server."""


class GoldReplay(ApiModel):
    """No model: each instance's gold patch, replayed through the agent's own tools."""


class BenchmarkModel(ApiModel):
    """The model under evaluation. Exactly one of the four is set."""

    model_config = ConfigDict(
        json_schema_extra=with_rules(
            cel(
                "[has(self.endpoint), has(self.serve), has(self.checkpoint), has(self.gold)]"
                ".filter(x, x).size() == 1",
                "exactly one of model.endpoint, model.serve, model.checkpoint or model.gold"
                " must be set",
            ),
        )
    )

    endpoint: EndpointSpec | None = None
    """An external OpenAI-compatible endpoint; nothing is served."""
    serve: ServeSpec | None = None
    """A model served with vLLM for the benchmark."""
    checkpoint: TrainingRunCheckpoint | None = None
    """A TrainingRun checkpoint served with vLLM."""
    gold: GoldReplay | None = None
    """Replay each instance's gold patch instead of asking a model (`gold: {}`): a check of
    the suite, its images and the harness, in the cluster as `crl bench --agent gold` does on
    one machine; every valid instance resolves. Nothing is served."""


class BaselineSpec(ApiModel):
    """A paired comparison with another Benchmark over their shared instances."""

    name: ObjectName
    """The baseline Benchmark in the same namespace."""
    confidence_level: float = Field(default=0.95, gt=0.5, lt=1.0)
    """Level of the bootstrap confidence interval of the difference."""
    minimum_improvement: float | None = Field(default=None, ge=-1.0, le=1.0)
    """Absolute resolve-rate improvement that counts as success (e.g. 0.05 for 5 points);
    the comparison then reports whether the interval's lower end clears it."""


class BenchmarkTemplate(ApiModel):
    """A Benchmark without its model: what a TrainingRun's periodic evaluation runs."""

    model_config = ConfigDict(
        json_schema_extra=with_rules(
            cel(
                "self.passAtK.all(k, k <= self.attempts)",
                "every passAtK value must be at most attempts (pass@k needs k attempts)",
                field_path=".passAtK",
            ),
            cel(
                "!(has(self.pool) && has(self.poolRef))",
                "set either pool (an inline pool the benchmark owns) or poolRef (an existing"
                " RolloutPool), not both",
            ),
        )
    )

    suite: SuiteSpec
    """What to evaluate on. Immutable once the benchmark has started."""
    agent: AgentSpec = Field(default_factory=AgentSpec)
    """The agent."""
    attempts: int = Field(default=1, ge=1, le=100)
    """Attempts per instance, for pass@k."""
    pass_at_k: list[Annotated[int, Field(ge=1, le=100)]] = Field(
        default_factory=lambda: [1],
        min_length=1,
        max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    """Values of k to report pass@k for (unbiased estimator over `attempts`)."""
    parallelism: int = Field(default=8, ge=1, le=1024)
    """Instances evaluated at once."""
    pool: PoolSettings | None = None
    """An inline pool the benchmark owns; used, with defaults, when neither pool nor poolRef
    is set."""
    pool_ref: PoolReference | None = None
    """Lease sandboxes from an existing RolloutPool (of the same task source) instead."""
    baseline: BaselineSpec | None = None
    """Compare with another Benchmark."""
    results: ResultsLocation = Field(default_factory=ResultsLocation)
    """Where per-instance results and trajectories go."""
    ttl_seconds_after_finished: int | None = Field(default=None, ge=0)
    """Delete the runner and inference server this long after the benchmark finishes
    (the Benchmark and its results stay)."""
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)
    """Queue, priority and maximum run time."""


class BenchmarkSpec(BenchmarkTemplate):
    """Desired state of a Benchmark."""

    model: BenchmarkModel
    """The model under evaluation. Immutable once the benchmark has started."""


class BenchmarkProgress(ApiModel):
    """How far the benchmark is."""

    total: int = Field(default=0, ge=0)
    """Instance attempts to run."""
    done: int = Field(default=0, ge=0)
    """Attempts finished (resolved, unresolved or errored)."""
    resolved: int = Field(default=0, ge=0)
    """Attempts that resolved their instance."""
    errored: int = Field(default=0, ge=0)
    """Attempts lost to infrastructure failures (not counted as unresolved)."""
    summary: Short | None = None
    """`done/total`, for `kubectl get`."""


class PassAtK(ApiModel):
    """One pass@k value."""

    k: int = Field(ge=1)
    """k."""
    value: float = Field(ge=0.0, le=1.0)
    """Unbiased pass@k estimate."""


class BaselineComparison(ApiModel):
    """Paired comparison with the baseline over the shared instances."""

    baseline: ObjectName
    """The baseline Benchmark."""
    shared_instances: int = Field(ge=0)
    """Instances both benchmarks evaluated."""
    difference: float = Field(ge=-1.0, le=1.0)
    """Resolve rate minus the baseline's, on the shared instances."""
    ci_low: float = Field(ge=-1.0, le=1.0)
    """Lower end of the bootstrap confidence interval of the difference."""
    ci_high: float = Field(ge=-1.0, le=1.0)
    """Upper end of that interval."""
    confidence_level: float = Field(gt=0.0, lt=1.0)
    """Level of the interval."""
    mcnemar_p_value: float | None = Field(default=None, ge=0.0, le=1.0)
    """McNemar's exact test over the discordant pairs."""
    meets_minimum_improvement: bool | None = None
    """Whether the interval's lower end clears `spec.baseline.minimumImprovement`."""


class BenchmarkChildren(ApiModel):
    """Names of the objects the operator created for the benchmark."""

    config_map: ObjectName | None = None
    """ConfigMap with the resolved worker config."""
    runner_job: ObjectName | None = None
    """The runner Job."""
    inference_deployment: ObjectName | None = None
    """vLLM Deployment, when the model is served."""
    inference_service: ObjectName | None = None
    """vLLM Service, when the model is served."""
    rollout_pool: ObjectName | None = None
    """RolloutPool whose sandboxes are used."""


class BenchmarkStatus(CommonStatus):
    """Observed state of a Benchmark.

    Condition types: `Ready`, `InferenceReady`, `Running`, `Succeeded`, `Failed`.
    """

    start_time: datetime | None = None
    """When the runner started; from then on the suite and the model cannot change."""
    completion_time: datetime | None = None
    """When the runner Job finished (the verdict follows with the runner's last report)."""
    progress: BenchmarkProgress | None = None
    """How far it is."""
    resolve_rate: float | None = Field(default=None, ge=0.0, le=1.0)
    """Resolved attempts over finished attempts (errored ones excluded)."""
    pass_at_k: list[PassAtK] | None = Field(default=None, max_length=16)
    """pass@k for each requested k."""
    comparison: BaselineComparison | None = None
    """Comparison with the baseline."""
    results_path: Path | None = None
    """Where the per-instance results (JSONL) and the summary are."""
    children: BenchmarkChildren | None = None
    """Objects created for the benchmark."""
    queue: QueueStatus | None = None
    """Kueue's admission of the whole run (with `scheduling.queueName`)."""
    validation: ValidationStatus | None = None
    """The task validation of the benchmark's RolloutPool (its `status.validation`), when the
    pool validates: quarantined tasks are left out of the run and of `progress.total`, and
    listed in the results folder's `quarantine.json`."""

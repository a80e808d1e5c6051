"""The three custom resources as whole objects, and the registry of kinds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import ConfigDict

from crl_worker.api.base import ApiModel, ObjectMeta, cel, with_rules
from crl_worker.api.benchmark import BenchmarkSpec, BenchmarkStatus
from crl_worker.api.rolloutpool import RolloutPoolSpec, RolloutPoolStatus
from crl_worker.api.trainingrun import TrainingRunSpec, TrainingRunStatus


def _immutable_once_started(fields: tuple[str, ...], what: str) -> dict[str, str]:
    """A transition rule: `fields` of the spec may not change after `status.startTime` is set."""
    same = " && ".join(f"self.spec.{f} == oldSelf.spec.{f}" for f in fields)
    names = " and ".join(f"spec.{f}" for f in fields)
    return cel(
        f"!has(oldSelf.status) || !has(oldSelf.status.startTime) || ({same})",
        f"{names} cannot change once the {what} has started; create a new {what} instead",
        reason="FieldValueForbidden",
    )


# Child Services and label values are derived from the name: a DNS-1035 label fits both.
NAME_RULE = cel(
    "!has(self.metadata.name) || (self.metadata.name.size() <= 63"
    " && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$'))",
    "metadata.name must start with a lowercase letter, contain only a-z, 0-9 and '-', and be"
    " at most 63 characters (it names Services and label values)",
    field_path=".metadata",
)


class Resource(ApiModel):
    """Fields every custom resource of the group has."""

    api_version: Literal["coderepair.io/v1alpha1"]
    """`coderepair.io/v1alpha1`."""
    metadata: ObjectMeta
    """Standard object metadata."""


class TrainingRun(Resource):
    """One RL post-training run: inference server, sandboxes, trainer, checkpoints."""

    model_config = ConfigDict(
        json_schema_extra=with_rules(
            NAME_RULE, _immutable_once_started(("model", "tasks"), "TrainingRun")
        )
    )

    kind: Literal["TrainingRun"]
    """`TrainingRun`."""
    spec: TrainingRunSpec
    """Desired state."""
    status: TrainingRunStatus | None = None
    """Observed state, written by the operator."""


class RolloutPool(Resource):
    """Sandboxes for one task source, kept warm and leased to rollouts."""

    model_config = ConfigDict(json_schema_extra=with_rules(NAME_RULE))

    kind: Literal["RolloutPool"]
    """`RolloutPool`."""
    spec: RolloutPoolSpec
    """Desired state."""
    status: RolloutPoolStatus | None = None
    """Observed state, written by the operator and the pool gateway."""


class Benchmark(Resource):
    """Evaluate one model on one suite: resolve rate, pass@k, comparison with a baseline."""

    model_config = ConfigDict(
        json_schema_extra=with_rules(
            NAME_RULE, _immutable_once_started(("suite", "model"), "Benchmark")
        )
    )

    kind: Literal["Benchmark"]
    """`Benchmark`."""
    spec: BenchmarkSpec
    """Desired state."""
    status: BenchmarkStatus | None = None
    """Observed state, written by the operator."""


AnyResource = TrainingRun | RolloutPool | Benchmark


@dataclass(frozen=True)
class Kind:
    """What the tools need to know about one kind besides its model."""

    kind: str
    """The kind, e.g. ``TrainingRun``."""
    plural: str
    singular: str
    short_names: tuple[str, ...]
    model: type[TrainingRun] | type[RolloutPool] | type[Benchmark]
    spec: type[ApiModel]
    status: type[ApiModel]


KINDS: dict[str, Kind] = {
    k.kind: k
    for k in (
        Kind(
            "TrainingRun",
            "trainingruns",
            "trainingrun",
            ("trun",),
            TrainingRun,
            TrainingRunSpec,
            TrainingRunStatus,
        ),
        Kind(
            "RolloutPool",
            "rolloutpools",
            "rolloutpool",
            ("rpool",),
            RolloutPool,
            RolloutPoolSpec,
            RolloutPoolStatus,
        ),
        Kind(
            "Benchmark",
            "benchmarks",
            "benchmark",
            ("bench",),
            Benchmark,
            BenchmarkSpec,
            BenchmarkStatus,
        ),
    )
}

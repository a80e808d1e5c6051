"""The `coderepair.io/v1alpha1` API: typed models of TrainingRun, RolloutPool and Benchmark.

The models are the single source of the wire format. The CRDs in `crds/` are generated from
them (`crl crds`), the API reference in `docs/` too, and `crl validate` checks manifests
against them offline, CEL rules included.
"""

from crl_worker.api.base import API_VERSION, GROUP, VERSION, ApiModel, Condition, ObjectMeta
from crl_worker.api.benchmark import BenchmarkSpec, BenchmarkStatus
from crl_worker.api.resources import (
    KINDS,
    AnyResource,
    Benchmark,
    Kind,
    RolloutPool,
    TrainingRun,
)
from crl_worker.api.rolloutpool import RolloutPoolSpec, RolloutPoolStatus
from crl_worker.api.trainingrun import CurriculumSpec, TrainingRunSpec, TrainingRunStatus

__all__ = [
    "API_VERSION",
    "GROUP",
    "KINDS",
    "VERSION",
    "AnyResource",
    "ApiModel",
    "Benchmark",
    "BenchmarkSpec",
    "BenchmarkStatus",
    "Condition",
    "CurriculumSpec",
    "Kind",
    "ObjectMeta",
    "RolloutPool",
    "RolloutPoolSpec",
    "RolloutPoolStatus",
    "TrainingRun",
    "TrainingRunSpec",
    "TrainingRunStatus",
]

"""Compare two benchmark results folders over their shared instances (``crl compare``).

The statistics are in :mod:`crl_worker.bench.stats`; this module reads the folders and turns
their attempts into per-instance outcomes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from crl_worker.bench.stats import (
    DEFAULT_RESAMPLES,
    DEFAULT_SEED,
    Comparison,
    InstanceAttempts,
    compare,
)
from crl_worker.rollout.results import AttemptResult, read_results


def instance_attempts(records: Iterable[AttemptResult]) -> dict[str, InstanceAttempts]:
    """Each instance's valid attempts; instances whose every attempt failed are left out."""
    found: dict[str, list[tuple[int, bool]]] = defaultdict(list)
    for r in records:
        if r.resolved is not None:
            found[r.instance_id].append((r.attempt, r.resolved))
    return {i: InstanceAttempts.of(a) for i, a in found.items()}


def compare_results(
    results: Path,
    baseline: Path,
    *,
    confidence: float = 0.95,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    minimum_improvement: float | None = None,
) -> Comparison:
    """Paired comparison of the results folder ``results`` with ``baseline`` (folders or
    ``results.jsonl`` files)."""
    return compare(
        instance_attempts(read_results(results)),
        instance_attempts(read_results(baseline)),
        confidence=confidence,
        resamples=resamples,
        seed=seed,
        minimum_improvement=minimum_improvement,
    )

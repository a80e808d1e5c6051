"""The statistics of a benchmark run: resolve rate, unbiased pass@k, and the paired comparison
of two runs (difference in resolve rate, bootstrap confidence interval, McNemar's exact test).

Everything here is pure: plain numbers and mappings in, numbers out, no I/O and no third-party
library (no numpy or scipy in the worker image's base). The rules, in one place (see also
docs/benchmarks.md):

- An attempt that ended in an infrastructure failure is not an attempt at all: it is left out of
  every count below (``n`` is the number of *valid* attempts of an instance).
- pass@k of one instance is Chen et al. (2021)'s unbiased estimator ``1 - C(n-c, k) / C(n, k)``
  with ``c`` resolved attempts among ``n``; the suite's pass@k is its mean over the instances.
  An instance with fewer than ``k`` valid attempts has no unbiased estimate and is left out of
  that k's mean (the result says how many instances each value covers).
- The paired comparison uses the instances with at least one valid attempt in both runs. Each
  instance's score is the share of its valid attempts that resolved it; the difference is the
  mean over instances of (score in the results - score in the baseline).
- The bootstrap resamples instances (with replacement, seeded), 10,000 times by default, and
  takes the percentile interval (linear interpolation between order statistics).
- McNemar's exact test pairs each shared instance's *first valid attempt* in the two runs (the
  lowest attempt index without an infrastructure failure), so it does not depend on how many
  attempts each run made; with one attempt per instance it is the textbook test.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

#: Resamples of the bootstrap unless the caller asks for another number.
DEFAULT_RESAMPLES = 10_000
#: Seed of the bootstrap unless the caller gives one: the same inputs give the same interval.
DEFAULT_SEED = 0


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one instance with ``c`` resolved among ``n`` valid attempts.

    ``1 - C(n-c, k) / C(n, k)``, computed as ``1 - prod_{i=n-c+1}^{n} (1 - k/i)`` so that large
    ``n`` neither overflows nor loses precision. Raises ``ValueError`` when ``k > n`` (no
    unbiased estimate) or the counts are inconsistent.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, not {k}")
    if not 0 <= c <= n:
        raise ValueError(f"resolved attempts ({c}) must be between 0 and the attempts ({n})")
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} attempts; this instance has {n}")
    if n - c < k:
        # Every choice of k attempts holds a resolved one.
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


@dataclass(frozen=True)
class PassAtKValue:
    """pass@k of a suite: the mean over the instances that had at least ``k`` valid attempts."""

    k: int
    value: float | None
    """None when no instance had ``k`` valid attempts."""
    instances: int
    """Instances the mean covers."""
    excluded: int
    """Instances left out because they had fewer than ``k`` valid attempts."""


def suite_pass_at_k(outcomes: Mapping[str, Sequence[bool]], k: int) -> PassAtKValue:
    """pass@k over a suite; ``outcomes`` maps each instance to its valid attempts' verdicts."""
    values = [pass_at_k(len(v), sum(v), k) for v in outcomes.values() if len(v) >= k]
    excluded = sum(1 for v in outcomes.values() if len(v) < k)
    value = math.fsum(values) / len(values) if values else None
    return PassAtKValue(k=k, value=value, instances=len(values), excluded=excluded)


def resolve_rate(resolved: int, valid: int) -> float | None:
    """Resolved attempts over valid attempts (``None`` when there is none)."""
    return resolved / valid if valid else None


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value for ``b`` and ``c`` discordant pairs.

    Under the null hypothesis each discordant pair goes either way with probability 1/2, so the
    smaller count is binomial(b + c, 1/2): ``p = min(1, 2 * P(X <= min(b, c)))``. Computed with
    exact integers; 1.0 when there is no discordant pair.
    """
    if b < 0 or c < 0:
        raise ValueError("discordant counts cannot be negative")
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1))
    return float(min(Fraction(1), Fraction(2 * tail, 2**n)))


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of already sorted values, interpolating linearly between order
    statistics (numpy's default, "type 7")."""
    if not sorted_values:
        raise ValueError("no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is outside [0, 1]")
    position = q * (len(sorted_values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    fraction = position - low
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * fraction


def bootstrap_interval(
    differences: Sequence[float],
    *,
    confidence: float = 0.95,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of per-instance ``differences``.

    Instances are resampled with replacement ``resamples`` times with a generator seeded by
    ``seed`` (the same inputs always give the same interval).
    """
    if not differences:
        raise ValueError("the bootstrap needs at least one instance")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"the confidence level must be between 0 and 1, not {confidence}")
    if resamples < 1:
        raise ValueError("the bootstrap needs at least one resample")
    rng = random.Random(seed)
    n = len(differences)
    values = list(differences)
    means = sorted(math.fsum(rng.choices(values, k=n)) / n for _ in range(resamples))
    alpha = 1.0 - confidence
    return percentile(means, alpha / 2), percentile(means, 1.0 - alpha / 2)


@dataclass(frozen=True)
class Comparison:
    """A paired comparison of a run with a baseline over their shared instances."""

    shared_instances: int
    """Instances with at least one valid attempt in both runs."""
    only_in_results: int
    """Instances with valid attempts only in the results being compared."""
    only_in_baseline: int
    """Instances with valid attempts only in the baseline."""
    rate: float
    """Mean per-instance resolve rate of the results, on the shared instances."""
    baseline_rate: float
    """The same for the baseline."""
    difference: float
    """``rate - baseline_rate``."""
    ci_low: float
    """Lower end of the bootstrap interval of the difference."""
    ci_high: float
    """Upper end of that interval."""
    confidence_level: float
    """Level of the interval."""
    resamples: int
    """Bootstrap resamples."""
    seed: int
    """Seed of the bootstrap."""
    discordant_results: int
    """Shared instances whose first valid attempt the results resolved and the baseline did not."""
    discordant_baseline: int
    """Shared instances whose first valid attempt the baseline resolved and the results did not."""
    mcnemar_p_value: float
    """McNemar's exact two-sided p-value over those discordant pairs."""
    minimum_improvement: float | None
    """The improvement asked for, when one was."""
    meets_minimum_improvement: bool | None
    """Whether ``ci_low >= minimum_improvement`` (None when no minimum was asked for)."""

    def to_dict(self) -> dict[str, Any]:
        """The comparison as a JSON-ready mapping (snake_case keys, as in summary.json)."""
        return asdict(self)


@dataclass(frozen=True)
class InstanceAttempts:
    """The valid attempts of one instance: ``(attempt index, resolved)`` pairs."""

    attempts: tuple[tuple[int, bool], ...]

    @property
    def rate(self) -> float:
        """Share of the valid attempts that resolved the instance."""
        return sum(r for _, r in self.attempts) / len(self.attempts)

    @property
    def first(self) -> bool:
        """Whether the first valid attempt (lowest index) resolved it."""
        return min(self.attempts)[1]

    @classmethod
    def of(cls, attempts: Iterable[tuple[int, bool]]) -> InstanceAttempts:
        """From ``(attempt, resolved)`` pairs in any order."""
        return cls(tuple(sorted(attempts)))


class ComparisonError(ValueError):
    """The two runs cannot be compared (no shared instance, bad parameters)."""


def compare(
    results: Mapping[str, InstanceAttempts],
    baseline: Mapping[str, InstanceAttempts],
    *,
    confidence: float = 0.95,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    minimum_improvement: float | None = None,
) -> Comparison:
    """Paired comparison of ``results`` with ``baseline`` over the instances both have.

    Instances without a valid attempt must not be in the mappings (see
    :func:`crl_worker.bench.compare.instance_attempts`).
    """
    shared = sorted(set(results) & set(baseline))
    if not shared:
        raise ComparisonError(
            "the two runs share no instance with a valid attempt; compare runs of the same suite"
        )
    differences = [results[i].rate - baseline[i].rate for i in shared]
    ci_low, ci_high = bootstrap_interval(
        differences, confidence=confidence, resamples=resamples, seed=seed
    )
    b = sum(1 for i in shared if results[i].first and not baseline[i].first)
    c = sum(1 for i in shared if baseline[i].first and not results[i].first)
    rate = math.fsum(results[i].rate for i in shared) / len(shared)
    baseline_rate = math.fsum(baseline[i].rate for i in shared) / len(shared)
    return Comparison(
        shared_instances=len(shared),
        only_in_results=len(set(results) - set(baseline)),
        only_in_baseline=len(set(baseline) - set(results)),
        rate=rate,
        baseline_rate=baseline_rate,
        difference=math.fsum(differences) / len(shared),
        ci_low=ci_low,
        ci_high=ci_high,
        confidence_level=confidence,
        resamples=resamples,
        seed=seed,
        discordant_results=b,
        discordant_baseline=c,
        mcnemar_p_value=mcnemar_exact(b, c),
        minimum_improvement=minimum_improvement,
        meets_minimum_improvement=(
            None if minimum_improvement is None else ci_low >= minimum_improvement
        ),
    )

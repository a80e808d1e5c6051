"""The benchmark statistics against known values: pass@k by hand and by brute force, McNemar's
exact test by exact fractions, the bootstrap on synthetic data with a known difference."""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction

import pytest

from crl_worker.bench.stats import (
    ComparisonError,
    InstanceAttempts,
    bootstrap_interval,
    compare,
    mcnemar_exact,
    pass_at_k,
    percentile,
    suite_pass_at_k,
)

# --- pass@k ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (1, 1, 1, Fraction(1)),
        (1, 0, 1, Fraction(0)),
        (10, 3, 1, Fraction(3, 10)),  # pass@1 is the plain rate
        # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (5, 2, 2, Fraction(7, 10)),
        # 1 - C(7,3)/C(10,3) = 1 - 35/120
        (10, 3, 3, Fraction(17, 24)),
        (4, 2, 3, Fraction(1)),  # n - c < k: every choice holds a resolved attempt
        (4, 0, 4, Fraction(0)),
    ],
)
def test_pass_at_k_hand_computed(n: int, c: int, k: int, expected: Fraction) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(float(expected), abs=1e-12)


def _brute_force(outcomes: tuple[bool, ...], k: int) -> Fraction:
    """Share of the k-subsets of the attempts that hold at least one resolved attempt."""
    subsets = list(itertools.combinations(outcomes, k))
    return Fraction(sum(any(s) for s in subsets), len(subsets))


def test_pass_at_k_matches_enumeration_of_subsets() -> None:
    checked = 0
    for n in range(1, 9):
        for outcomes in itertools.product([False, True], repeat=n):
            for k in range(1, n + 1):
                expected = _brute_force(outcomes, k)
                assert pass_at_k(n, sum(outcomes), k) == pytest.approx(float(expected), abs=1e-12)
                checked += 1
    assert checked > 1000


def test_pass_at_k_is_stable_for_many_attempts() -> None:
    # C(200, 100) overflows a float; the product form does not.
    exact = 1 - Fraction(math.comb(150, 10), math.comb(200, 10))
    assert pass_at_k(200, 50, 10) == pytest.approx(float(exact), rel=1e-12)


def test_pass_at_k_refuses_too_few_attempts_and_bad_counts() -> None:
    with pytest.raises(ValueError, match="at least 3 attempts"):
        pass_at_k(2, 1, 3)
    with pytest.raises(ValueError):
        pass_at_k(2, 3, 1)
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 0)


def test_suite_pass_at_k_averages_and_leaves_out_instances_with_fewer_attempts() -> None:
    outcomes = {
        "a": [True, False, False, False],  # pass@2 = 1 - C(3,2)/C(4,2) = 1/2
        "b": [False, False, False, False],  # 0
        "c": [True],  # one valid attempt (three were infrastructure failures): left out
    }
    value = suite_pass_at_k(outcomes, 2)
    assert value.value == pytest.approx(0.25)
    assert (value.instances, value.excluded) == (2, 1)
    one = suite_pass_at_k(outcomes, 1)
    assert one.value == pytest.approx((1 / 4 + 0 + 1) / 3)
    assert suite_pass_at_k({"c": [True]}, 2).value is None


# --- McNemar -----------------------------------------------------------------------------------


def _exact_two_sided(b: int, c: int) -> Fraction:
    n = b + c
    tail = sum((Fraction(math.comb(n, i), 2**n) for i in range(min(b, c) + 1)), Fraction(0))
    return min(Fraction(1), 2 * tail)


@pytest.mark.parametrize(("b", "c"), [(10, 2), (2, 10), (5, 5), (0, 6), (1, 0), (25, 11), (0, 0)])
def test_mcnemar_exact_against_exact_fractions(b: int, c: int) -> None:
    assert mcnemar_exact(b, c) == pytest.approx(float(_exact_two_sided(b, c)), rel=1e-12)


def test_mcnemar_known_values() -> None:
    # b=10, c=2: 2 * (1 + 12 + 66) / 4096
    assert mcnemar_exact(10, 2) == pytest.approx(0.0386, abs=5e-5)
    assert mcnemar_exact(0, 6) == pytest.approx(2 / 64)
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(5, 5) == 1.0


# --- bootstrap and the paired comparison ---------------------------------------------------------


def test_percentile_interpolates_like_numpy_default() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 0.0) == 1.0
    assert percentile(values, 1.0) == 4.0
    assert percentile(values, 0.5) == 2.5
    assert percentile(values, 0.25) == pytest.approx(1.75)


def _synthetic(
    n: int, p_results: float, p_baseline: float, seed: int
) -> tuple[dict[str, InstanceAttempts], dict[str, InstanceAttempts]]:
    rng = random.Random(seed)
    results, baseline = {}, {}
    for i in range(n):
        results[f"i{i}"] = InstanceAttempts.of([(0, rng.random() < p_results)])
        baseline[f"i{i}"] = InstanceAttempts.of([(0, rng.random() < p_baseline)])
    return results, baseline


def test_bootstrap_interval_covers_the_true_difference_and_shrinks_with_n() -> None:
    widths = []
    for n in (100, 400, 1600):
        results, baseline = _synthetic(n, 0.55, 0.40, seed=n)
        found = compare(results, baseline, resamples=2000, seed=1)
        assert found.ci_low <= 0.15 <= found.ci_high
        assert found.ci_low <= found.difference <= found.ci_high
        widths.append(found.ci_high - found.ci_low)
    assert widths[0] > widths[1] > widths[2]
    # The width goes as 1/sqrt(n): four times the instances, about half the width.
    assert widths[1] / widths[0] == pytest.approx(0.5, abs=0.15)


def test_bootstrap_is_deterministic_under_its_seed() -> None:
    differences = [1.0, 0.0, 0.0, -1.0, 1.0, 1.0, 0.0, 0.5]
    first = bootstrap_interval(differences, seed=7, resamples=3000)
    assert bootstrap_interval(differences, seed=7, resamples=3000) == first
    assert bootstrap_interval(differences, seed=8, resamples=3000) != first


def test_bootstrap_of_a_constant_difference_is_that_constant() -> None:
    assert bootstrap_interval([0.25] * 30, resamples=500) == (0.25, 0.25)


def test_compare_counts_discordant_first_attempts_and_per_instance_rates() -> None:
    results = {
        "a": InstanceAttempts.of([(1, False), (0, True)]),  # first attempt resolved, rate 1/2
        "b": InstanceAttempts.of([(0, True), (1, True)]),
        "c": InstanceAttempts.of([(0, False), (1, False)]),
        "only-here": InstanceAttempts.of([(0, True)]),
    }
    baseline = {
        "a": InstanceAttempts.of([(0, False)]),
        "b": InstanceAttempts.of([(0, True)]),
        "c": InstanceAttempts.of([(0, True)]),
        "only-there": InstanceAttempts.of([(0, False)]),
    }
    found = compare(results, baseline, minimum_improvement=0.05, resamples=1000)
    assert found.shared_instances == 3
    assert (found.only_in_results, found.only_in_baseline) == (1, 1)
    assert found.rate == pytest.approx((0.5 + 1 + 0) / 3)
    assert found.baseline_rate == pytest.approx(2 / 3)
    assert found.difference == pytest.approx((0.5 + 0 - 1) / 3)
    assert (found.discordant_results, found.discordant_baseline) == (1, 1)
    assert found.mcnemar_p_value == 1.0
    assert found.meets_minimum_improvement is False


def test_meets_minimum_improvement_follows_the_interval_lower_end() -> None:
    results, baseline = _synthetic(800, 0.60, 0.30, seed=3)
    found = compare(results, baseline, minimum_improvement=0.05, resamples=2000)
    assert found.ci_low >= 0.05
    assert found.meets_minimum_improvement is True
    assert compare(results, baseline, resamples=100).meets_minimum_improvement is None
    too_much = compare(results, baseline, minimum_improvement=0.5, resamples=2000)
    assert too_much.meets_minimum_improvement is False


def test_compare_without_shared_instances_is_an_error() -> None:
    with pytest.raises(ComparisonError, match="share no instance"):
        compare({"a": InstanceAttempts.of([(0, True)])}, {"b": InstanceAttempts.of([(0, True)])})


def test_bootstrap_interval_against_the_exact_resampling_distribution() -> None:
    # Two instances with differences 0 and 1: a resample's mean is 0, 0.5 or 1 with
    # probabilities 1/4, 1/2, 1/4. The 95% interval spans both ends; the 40% interval (the 30th
    # to 70th percentiles) lies inside the middle half: exactly 0.5 at both ends.
    assert bootstrap_interval([0.0, 1.0], resamples=20_000) == (0.0, 1.0)
    assert bootstrap_interval([0.0, 1.0], confidence=0.4, resamples=20_000) == (0.5, 0.5)
    # One instance: every resample is that instance.
    assert bootstrap_interval([0.3], resamples=100) == (0.3, 0.3)

"""How a TrainingRun scores a finished trajectory (``spec.rollout.reward``)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from crl_worker.api.base import ApiModel, cel, with_rules


class RewardWeights(ApiModel):
    """Weights of the reward components in a mix."""

    tests: float = Field(default=1.0, ge=0.0, le=100.0)
    """Weight of the test reward."""
    diff_similarity: float = Field(default=0.0, ge=0.0, le=100.0)
    """Weight of the similarity between the agent's diff and the gold patch."""


class RewardSpec(ApiModel):
    """How a finished trajectory is scored. An infrastructure failure is never scored."""

    model_config = ConfigDict(
        json_schema_extra=with_rules(
            cel(
                "self.type != 'mix' || has(self.weights)",
                "reward type 'mix' needs weights (tests, diffSimilarity)",
                field_path=".type",
            ),
            cel(
                "!has(self.weights) || self.weights.tests + self.weights.diffSimilarity > 0.0",
                "reward weights must not all be zero",
                field_path=".weights",
            ),
        )
    )

    type: Literal["tests", "diff-similarity", "mix"] = "tests"
    """`tests` (the instance's FAIL_TO_PASS and PASS_TO_PASS tests), `diff-similarity`
    (similarity to the gold patch) or `mix` (weighted sum of both)."""
    tests_mode: Literal["binary", "fraction"] = "binary"
    """`binary`: 1 when resolved, else 0; `fraction`: the share of the tests that pass."""
    weights: RewardWeights | None = None
    """Weights for `mix`."""
    evaluation_timeout_seconds: int = Field(default=1800, ge=10, le=86400)
    """Wall time of the final test run; exceeding it is an infrastructure failure, not a 0."""
    tampered: float = Field(default=-1.0, ge=-10.0, le=0.0)
    """The test reward of a run graded tampered with (a canary test passed, or code under test
    read the hidden tests or rewrote their results; docs/security.md). Below 0 by default: a
    forgery that cannot tell a real test from its canaries can only guess, and with one
    FAIL_TO_PASS test it guesses right 1 time in 5 (reward 1) and is caught 4 times (this
    value), so it earns less than an honest wrong answer (0). `0` scores it as a wrong answer."""


__all__ = ["RewardSpec", "RewardWeights"]

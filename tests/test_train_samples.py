"""From trajectories to GRPO samples: exact ids, environment tokens masked, turns whose prompt
does not extend the earlier ones left out, truncation, and the placeholder of an empty rollout."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from crl_worker.agent.trajectory import Trajectory, Turn
from crl_worker.train.samples import trajectory_sample


def turn(index: int, prompt: list[int], completion: list[int], **extra: Any) -> Turn:
    return Turn(
        index=index,
        started=0.0,
        latency=0.1,
        max_tokens=16,
        message_index=2 * index + 2,
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        completion_logprobs=[-0.5] * len(completion),
        **extra,
    )


def trajectory(*turns: Turn) -> Trajectory:
    return Trajectory(
        instance_id="x__y-1",
        repo="x/y",
        model="m",
        started_at=datetime.now(UTC),
        turns=list(turns),
        exit_reason="submitted",
    )


def test_a_conversation_becomes_one_sequence_with_environment_tokens_masked() -> None:
    # Turn 1's prompt is turn 0's prompt + completion + environment tokens 20, 21.
    t = trajectory(turn(0, [1, 2, 3], [10, 11]), turn(1, [1, 2, 3, 10, 11, 20, 21], [12]))
    sample = trajectory_sample(t, pad_id=0, max_length=100)
    assert sample.prompt_ids == [1, 2, 3]
    assert sample.completion_ids == [10, 11, 20, 21, 12]
    assert sample.env_mask == [1, 1, 0, 0, 1]
    assert sample.logprobs == [-0.5, -0.5, 0.0, 0.0, -0.5]
    assert (sample.turns_used, sample.turns_left_out, sample.trained_tokens) == (2, 0, 3)


def test_a_re_rendered_turn_and_those_after_it_are_left_out() -> None:
    # Turn 1's prompt rewrote turn 0's completion (10 -> 99): the model never saw that sequence.
    t = trajectory(
        turn(0, [1, 2], [10, 11]),
        turn(1, [1, 2, 99, 11, 20], [12]),
        turn(2, [1, 2, 99, 11, 20, 12, 21], [13]),
    )
    sample = trajectory_sample(t, pad_id=0, max_length=100)
    assert sample.completion_ids == [10, 11]
    assert sample.env_mask == [1, 1]
    assert (sample.turns_used, sample.turns_left_out) == (1, 2)


def test_the_tail_beyond_max_length_is_cut() -> None:
    t = trajectory(turn(0, [1, 2, 3], [10, 11]), turn(1, [1, 2, 3, 10, 11, 20, 21], [12, 13]))
    sample = trajectory_sample(t, pad_id=0, max_length=6)
    assert sample.prompt_ids + sample.completion_ids == [1, 2, 3, 10, 11, 20]
    assert sample.env_mask == [1, 1, 0]
    assert sample.truncated


def test_a_rollout_without_a_turn_is_one_masked_placeholder_token() -> None:
    empty = Trajectory(
        instance_id="x__y-1",
        repo="x/y",
        model="m",
        started_at=datetime.now(UTC),
        exit_reason="infrastructure_error",
        error="the sandbox did not start",
    )
    sample = trajectory_sample(empty, pad_id=7, max_length=10)
    assert (sample.prompt_ids, sample.completion_ids, sample.env_mask) == ([7], [7], [0])
    assert sample.trained_tokens == 0

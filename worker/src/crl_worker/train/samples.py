"""From a trajectory to the one training sample GRPO takes per rollout.

A rollout is one sequence: the first turn's prompt, then every completion (mask 1: trained)
with the environment's tokens between them (tool results, the next turn's template tokens:
mask 0, never trained), exactly the ids the server sampled and returned — nothing is
re-tokenized. When a chat template re-renders earlier turns differently (so a later prompt does
not extend the earlier prompt + completion), the sample keeps the turns up to that point and the
rest are left out (counted in ``turns_left_out``): training on a sequence the model never saw
would be wrong, and one sequence per rollout is what GRPO's group baseline needs.

A rollout with no usable turn (an infrastructure failure before the first answer) still yields
a placeholder — one masked token — so every prompt of the batch has its completion; its reward
is ``None``, so it carries no advantage and no loss.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

from crl_worker.agent.trajectory import Trajectory


@dataclass
class Sample:
    """One rollout as TRL's ``rollout_func`` returns it."""

    prompt_ids: list[int]
    """The first turn's prompt."""
    completion_ids: list[int]
    """Everything after it: completions and the environment tokens between them."""
    env_mask: list[int]
    """1 for tokens the model sampled, 0 for environment tokens (aligned with completion_ids)."""
    logprobs: list[float]
    """The sampling logprob of each model token, 0.0 for environment tokens."""
    turns_used: int
    """Turns in the sample."""
    turns_left_out: int
    """Turns dropped because their prompt did not extend the earlier ones (or lacked ids)."""
    truncated: bool = False
    """Cut at ``max_length``."""

    @property
    def trained_tokens(self) -> int:
        """Tokens that carry loss."""
        return sum(self.env_mask)


def placeholder(pad_id: int, prompt_ids: list[int] | None = None) -> Sample:
    """The sample of a rollout with nothing to train on: one masked token."""
    return Sample(
        prompt_ids=prompt_ids or [pad_id],
        completion_ids=[pad_id],
        env_mask=[0],
        logprobs=[0.0],
        turns_used=0,
        turns_left_out=0,
    )


def trajectory_sample(trajectory: Trajectory, *, pad_id: int, max_length: int) -> Sample:
    """The trajectory's training sample (see the module docstring); at most ``max_length``
    tokens, prompt included (the tail is cut, its tokens never trained)."""
    prompts = trajectory.full_prompt_ids()
    ids = array("i")
    mask = array("i")
    logprobs: list[float] = []
    first_prompt = 0
    used = 0
    for turn, prompt in zip(trajectory.turns, prompts, strict=True):
        completion = turn.completion_token_ids
        if prompt is None or completion is None:
            break
        if used and prompt[: len(ids)] != ids:
            break
        new = prompt[len(ids) :] if used else prompt
        if not used:
            first_prompt = len(prompt)
        ids.extend(new)
        mask.extend([0] * len(new))
        logprobs.extend([0.0] * len(new))
        ids.extend(completion)
        mask.extend([1] * len(completion))
        sampled = turn.completion_logprobs
        if sampled is not None and len(sampled) == len(completion):
            logprobs.extend(sampled)
        else:
            logprobs.extend([0.0] * len(completion))
        used += 1
    left_out = len(trajectory.turns) - used
    if not used:
        first = prompts[0] if prompts else None
        sample = placeholder(pad_id, list(first[:max_length]) if first else None)
        sample.turns_left_out = left_out
        return sample
    truncated = len(ids) > max_length
    if truncated:
        del ids[max_length:]
        del mask[max_length:]
        del logprobs[max_length:]
    if first_prompt >= len(ids):
        # Even the first prompt does not fit: nothing of the model's is left to train.
        sample = placeholder(pad_id, list(ids[: max(1, max_length - 1)]))
        sample.turns_left_out = len(trajectory.turns)
        sample.truncated = True
        return sample
    return Sample(
        prompt_ids=ids[:first_prompt].tolist(),
        completion_ids=ids[first_prompt:].tolist(),
        env_mask=mask[first_prompt:].tolist(),
        logprobs=logprobs[first_prompt:],
        turns_used=used,
        turns_left_out=left_out,
        truncated=truncated,
    )

"""The trainer's rollouts: each one a whole episode (sandbox, agent, evaluation in the same
sandbox) scored with the run's reward.

The policy is whatever answers chat turns: the vLLM server through the OpenAI API, or the model
being trained, in-process. Sandboxes come from a pool gateway (the run's, in a cluster; one
started in-process on one machine), so sandboxes are reset and reused between rollouts.

A rollout whose infrastructure failed — the sandbox did not start, the model server or the
sandbox broke mid-way, the harness could not run the tests or they outlived their time — gets
reward ``None``: it is left out of the update, never scored 0.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from crl_worker.agent.client import Policy
from crl_worker.agent.episode import run_episode
from crl_worker.agent.trajectory import Trajectory
from crl_worker.api.common import AgentSpec
from crl_worker.api.reward import RewardSpec
from crl_worker.rewards import RewardFunc, make_reward
from crl_worker.sandbox.base import Sandbox
from crl_worker.tasks.model import Task

logger = logging.getLogger(__name__)


@dataclass
class Rollout:
    """One finished episode and its reward."""

    task: Task
    trajectory: Trajectory
    reward: float | None
    """``None``: an infrastructure failure (excluded from the update)."""
    policy_version: int
    """The weights version that generated it."""
    seconds: float
    """Wall time from the sandbox lease to the verdict."""

    @property
    def resolved(self) -> bool | None:
        """Whether the evaluation resolved the task (``None`` without a verdict)."""
        if self.reward is None or self.trajectory.evaluation is None:
            return None
        return self.trajectory.evaluation.resolved


def score(trajectory: Trajectory, task: Task, reward: RewardFunc) -> float | None:
    """The reward of a finished episode; ``None`` when its infrastructure failed."""
    if trajectory.exit_reason in ("infrastructure_error", "cancelled"):
        return None
    evaluation = trajectory.evaluation
    if evaluation is None or evaluation.infrastructure_error is not None:
        # Training leaves out a test run that outlived its time (a benchmark counts it as
        # unresolved): the verdict is unknown, and a 0 would teach the wrong lesson.
        return None
    values = reward(
        prompts=[None],
        completions=[""],
        eval_result=[evaluation],
        patch=[task.patch],
        model_patch=[trajectory.diff],
    )
    return values[0] if values else None


@dataclass
class RolloutRunner:
    """Runs a batch of episodes, at most ``concurrency`` at once."""

    agent: AgentSpec
    reward_spec: RewardSpec
    sandbox_factory: Callable[[Task], Sandbox]
    concurrency: int = 8
    cancelled: list[Trajectory] = field(default_factory=list)
    """Trajectories of episodes cancelled by a stop (kept for the logs)."""
    in_flight: int = 0
    """Episodes running now."""
    finished: int = 0
    """Episodes finished since the runner was made (scored, failed or cancelled)."""

    def __post_init__(self) -> None:
        self._reward = make_reward(self.reward_spec)
        self._limit: asyncio.Semaphore | None = None

    async def run(
        self,
        tasks: Sequence[Task],
        policy: Policy | Callable[[int], Policy],
        *,
        version: int,
        first_attempt: int = 0,
    ) -> list[Rollout]:
        """One rollout per entry of ``tasks`` (repeat a task for a group), in that order.

        ``policy`` answers every rollout, or makes the policy of rollout ``i`` (a sampler of
        its own per rollout keeps sampling reproducible however the episodes interleave).
        Batches running at once (rollouts overlapped with training) share the ``concurrency``
        limit: the pool's capacity does not grow with the batches in flight.
        """
        if self._limit is None:
            self._limit = asyncio.Semaphore(max(1, self.concurrency))
        limit = self._limit

        async def one(index: int, task: Task) -> Rollout:
            answering = policy(index) if callable(policy) else policy
            async with limit:
                return await self.one(
                    task, answering, version=version, attempt=first_attempt + index
                )

        # A task group: an unexpected error in one episode cancels its siblings (their
        # sandboxes are closed) instead of leaving them running.
        async with asyncio.TaskGroup() as group:
            running = [group.create_task(one(i, t)) for i, t in enumerate(tasks)]
        return [task.result() for task in running]

    async def one(self, task: Task, policy: Policy, *, version: int, attempt: int) -> Rollout:
        """Lease (or start) a sandbox, run the episode in it, score it, release it."""
        t0 = time.monotonic()

        async def keep(trajectory: Trajectory) -> None:
            self.cancelled.append(trajectory)

        self.in_flight += 1
        try:
            trajectory, _ = await run_episode(
                task,
                attempt,
                self.sandbox_factory,
                policy,
                self.agent,
                keep_cancelled=keep,
                # A share of passing tests is paid: it is checked as a resolved verdict is.
                confirm_partial=self.reward_spec.type != "diff-similarity"
                and self.reward_spec.tests_mode == "fraction",
            )
        finally:
            self.in_flight -= 1
            self.finished += 1
        reward = score(trajectory, task, self._reward)
        trajectory.reward = reward
        return Rollout(
            task=task,
            trajectory=trajectory,
            reward=reward,
            policy_version=version,
            seconds=time.monotonic() - t0,
        )

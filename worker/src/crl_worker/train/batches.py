"""Each step's batch: this rank's rollouts (whole episodes through the rollout runner, on the
inference server or with the model being trained), run again when every one failed for
infrastructure reasons, and turned into the samples TRL trains on, with the step's statistics
and its trajectory log.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from crl_worker.tasks.model import Task
from crl_worker.train.events import PROGRESS_INTERVAL, PROGRESS_INTERVAL_ENV, ROLLOUTS_EVENT
from crl_worker.train.monitor import RolloutStats
from crl_worker.train.rollouts import Rollout
from crl_worker.train.samples import trajectory_sample

if TYPE_CHECKING:
    from crl_worker.agent.client import Policy
    from crl_worker.train.runtime import Job

logger = logging.getLogger(__name__)

#: Tries of a batch whose every rollout failed for infrastructure reasons.
BATCH_ATTEMPTS = 3
#: Name of the extra column carrying each rollout's reward to the reward function.
REWARD_COLUMN = "crl_reward"


class Preempted(Exception):
    """Every rank agreed to stop (SIGTERM or SIGINT)."""


class Batches:
    """The batches of one trainer process (every rank has one and runs its share)."""

    def __init__(self, job: Job, ensure_current: Callable[[int], None]) -> None:
        """``job``: the trainer process whose runner, server client and settings are used;
        ``ensure_current(step)``: brings the server to the step's weights before a batch."""
        self.job = job
        self._ensure_current = ensure_current
        self._attempts = 0
        """Episodes started so far (each gets the next attempt number)."""
        self._rollouts_ended: float | None = None
        """When this rank's last batch of rollouts finished."""
        self._idle: float | None = None
        """Seconds between that and the start of this step's rollouts."""
        self._discarded_failures = 0
        """Rollouts of batches run again because all of them failed (this step)."""
        self.step_stats: RolloutStats | None = None
        """The statistics of the step in training (read when TRL logs it)."""
        self.off_policy = False
        """This rank's batch of the step in training came from older weights."""

    def _start(
        self, tasks: list[Task], policy: Policy | Callable[[int], Policy], version: int
    ) -> concurrent.futures.Future[list[Rollout]]:
        """Start a batch's episodes on the engine's loop (they run while the caller goes on)."""
        assert self.job.runner is not None
        first = self._attempts
        self._attempts += len(tasks)
        return asyncio.run_coroutine_threadsafe(
            self.job.runner.run(tasks, policy, version=version, first_attempt=first),
            self.job.engine.loop,
        )

    def _seed_base(self, step: int) -> int:
        """The first sampling seed of step ``step``'s rollouts on this rank (rollout ``i``
        starts at ``base + i``): one per spec seed, step, rank and rollout."""
        return ((self.job.spec.algorithm.seed * 1_000_003 + step) * 1_009 + self.job.rank) * 65_537

    def _served(self, model: str, step: int) -> Callable[[int], Policy]:
        """The policy of each rollout of step ``step``'s batch on the server: ``model`` on every
        turn, and seeds of its own (turn ``k`` of rollout ``i`` carries ``base + 4099 i + k``),
        so a run is the same however the server interleaves its episodes."""
        assert self.job.client is not None
        client, base = self.job.client, self._seed_base(step)
        return lambda index: client.pinned(model, seed=base + index * 4_099)

    def start_ahead(
        self, prompts: list[str], version: int, step: int
    ) -> concurrent.futures.Future[list[Rollout]]:
        """Step ``step``'s batch, started ahead on the weights the server holds now
        (``version``): every turn of its episodes names that version's model, so they finish
        on the weights they began."""
        assert self.job.client is not None and self.job.sync is not None
        tasks = [self.job.tasks[p] for p in prompts]
        return self._start(tasks, self._served(self.job.sync.model_name(), step), version)

    async def _until_stopped(
        self, batch: concurrent.futures.Future[list[Rollout]], total: int
    ) -> list[Rollout] | None:
        """The batch's rollouts, or ``None`` when a stop came first (they are cancelled)."""
        assert self.job.runner is not None
        work = asyncio.wrap_future(batch)
        started = self.job.runner.finished
        interval = _progress_interval()
        said = time.monotonic()
        while not work.done():
            await asyncio.wait({work}, timeout=min(0.5, interval))
            if self.job.rank == 0 and not work.done() and time.monotonic() - said >= interval:
                said = time.monotonic()
                # Overlapped batches finish episodes too: the count is capped at the batch.
                done = min(total, self.job.runner.finished - started)
                current = self._current_step()
                logger.info(
                    "step %d: %d of %d rollouts done, %d running",
                    current,
                    done,
                    total,
                    self.job.runner.in_flight,
                    extra={
                        "event": ROLLOUTS_EVENT,
                        "step": current,
                        "done": done,
                        "total": total,
                        "in_flight": self.job.runner.in_flight,
                    },
                )
            if self.job.stop.set and not work.done():
                batch.cancel()
                with contextlib.suppress(asyncio.CancelledError, concurrent.futures.CancelledError):
                    await work
                return None
        return work.result()

    def _current_step(self) -> int:
        """The step being rolled out (1-based)."""
        return int(self.job.trainer.state.global_step) + 1 if self.job.trainer is not None else 0

    def collect(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        """TRL's rollout function: one whole episode per prompt (an instance id).

        A batch in which no rollout of any rank got a reward (the infrastructure is down) is
        run again, up to :data:`BATCH_ATTEMPTS` times, then the run fails: handing TRL a batch
        with nothing to learn would still move the weights (the optimizer's momentum) and
        advance the schedule.
        """
        self.job.trainer = trainer
        step = int(trainer.state.global_step)
        tasks = [self.job.tasks[str(p)] for p in prompts]
        for attempt in range(BATCH_ATTEMPTS):
            if self.job.any_rank(self.job.stop.set):
                self.job.stopping = True
                raise Preempted
            self.job.step_started = time.monotonic()
            self._ensure_current(step)
            if self.job.client is not None:
                assert self.job.sync is not None  # a policy client comes with its server's sync
                self.job.client.model = self.job.sync.model_name()
                ahead = None
                if self.job.producer is not None and attempt == 0:
                    ahead = self.job.producer.take([str(p) for p in prompts], step)
                if ahead is None:
                    started = time.monotonic()
                    batch = self._start(
                        tasks, self._served(self.job.client.model, step), self.job.policy_version
                    )
                else:
                    started, batch = ahead.started, ahead.future
                if self.job.producer is not None and not self.job.stop.set:
                    # The next steps' episodes run while this step waits, trains and pushes.
                    self.job.producer.fill(
                        step, self.job.policy_version, self.job.settings.total_steps
                    )
                if attempt == 0 and self._rollouts_ended is not None:
                    self._idle = max(0.0, started - self._rollouts_ended)
                rollouts = self.job.engine.call(self._until_stopped(batch, len(tasks)))
            else:
                if attempt == 0 and self._rollouts_ended is not None:
                    self._idle = time.monotonic() - self._rollouts_ended
                rollouts = self._in_process(tasks, step)
            self._rollouts_ended = time.monotonic()
            if rollouts is None and self.job.producer is not None:
                self.job.producer.cancel_all()
            self._write_cancelled()
            if self.job.any_rank(rollouts is None):
                self.job.stopping = True
                if self.job.producer is not None:
                    self.job.producer.cancel_all()
                raise Preempted
            assert rollouts is not None
            if self.job.any_rank(any(r.reward is not None for r in rollouts)):
                return self._samples(rollouts, step)
            self._write_trajectories(step + 1, rollouts, attempt=attempt)
            # Counted with the step that finally trains (metrics, status), not lost with it.
            self._discarded_failures += len(rollouts)
            logger.warning(
                "step %d: every rollout failed for infrastructure reasons (try %d of %d)",
                step + 1,
                attempt + 1,
                BATCH_ATTEMPTS,
            )
        from crl_worker.errors import InfrastructureError

        raise InfrastructureError(
            f"step {step + 1}: every rollout failed for infrastructure reasons "
            f"{BATCH_ATTEMPTS} times in a row (see the trajectories' errors)"
        )

    def _in_process(self, tasks: list[Task], step: int) -> list[Rollout] | None:
        """Generate with the model being trained (gathered whole for the batch)."""
        from trl.models.utils import unwrap_model_for_generation

        from crl_worker.train.local_policy import TransformersPolicy

        trainer = self.job.trainer
        with unwrap_model_for_generation(
            trainer.model_wrapped, trainer.accelerator, gather_deepspeed3_params=True
        ) as model:
            was_training = model.training
            model.eval()
            lock = asyncio.Lock()  # one generation at a time on the shared model
            policies: list[TransformersPolicy] = []
            base = self._seed_base(step)

            def policy_of(index: int) -> TransformersPolicy:
                # A sampler per rollout: the same seed gives the same rollouts, however the
                # episodes interleave.
                made = TransformersPolicy(
                    model,
                    self.job.tokenizer,
                    name=self.job.settings.name,
                    seed=base + index,
                    lock=lock,
                )
                policies.append(made)
                return made

            try:
                return self.job.engine.call(
                    self._until_stopped(self._start(tasks, policy_of, step), len(tasks))
                )
            finally:
                # A cancelled generation finishes its current token on its thread: wait for it
                # before the ZeRO-3 shards are taken back.
                for made in policies:
                    made.wait_idle()
                model.train(was_training)

    def _samples(self, rollouts: list[Rollout], step: int) -> dict[str, list[Any]]:
        """The samples TRL trains on, and this step's statistics and trajectory log."""
        pad_id = self.job.tokenizer.pad_token_id
        if pad_id is None:
            pad_id = self.job.tokenizer.eos_token_id
        max_length = self.job.spec.rollout.agent.max_total_tokens
        stats = RolloutStats(
            rollouts=self._discarded_failures,
            infrastructure_failures=self._discarded_failures,
            idle_seconds=[self._idle] if self._idle is not None else [],
        )
        self._idle = None
        self._discarded_failures = 0
        if self.job.producer is not None:
            stats.dropped_stale, self.job.producer.dropped_stale = (
                self.job.producer.dropped_stale,
                0,
            )
            stats.dropped_unplanned = self.job.producer.dropped_unplanned
            self.job.producer.dropped_unplanned = 0
        self.off_policy = any(step != r.policy_version for r in rollouts)
        out: dict[str, list[Any]] = {
            "prompt_ids": [],
            "completion_ids": [],
            "logprobs": [],
            "env_mask": [],
            REWARD_COLUMN: [],
        }
        for rollout in rollouts:
            sample = trajectory_sample(rollout.trajectory, pad_id=pad_id, max_length=max_length)
            reward = rollout.reward
            stats.rollouts += 1
            stats.rollout_seconds.append(rollout.seconds)
            stats.staleness.append(step - rollout.policy_version)
            stats.turns_left_out += sample.turns_left_out
            if reward is None:
                stats.infrastructure_failures += 1
            else:
                stats.scored += 1
                stats.reward_sum += reward
                stats.reward_sq_sum += reward * reward
                stats.resolved += bool(rollout.resolved)
            stats.tokens += len(sample.prompt_ids) + len(sample.completion_ids)
            stats.trained_tokens += sample.trained_tokens
            out["prompt_ids"].append(sample.prompt_ids)
            out["completion_ids"].append(sample.completion_ids)
            out["logprobs"].append(sample.logprobs)
            # A rollout left out of the update contributes no token either (its tokens would
            # still count in the loss's normalization and in a KL or entropy term).
            out["env_mask"].append(
                sample.env_mask if reward is not None else [0] * len(sample.env_mask)
            )
            out[REWARD_COLUMN].append(reward)
        self.step_stats = stats
        self._write_trajectories(step + 1, rollouts)
        return out

    def _write_trajectories(
        self, step: int, rollouts: Sequence[Rollout], *, attempt: int | None = None
    ) -> None:
        """``trajectories/step-NNNNNN.rankR.jsonl``: every rollout of the step, whole (a batch
        run again because all of it failed: ``step-NNNNNN.failedK.rankR.jsonl``)."""
        directory = self.job.settings.trajectories_dir
        directory.mkdir(parents=True, exist_ok=True)
        tag = "" if attempt is None else f".failed{attempt}"
        path = directory / f"step-{step:06d}{tag}.rank{self.job.rank}.jsonl"
        with path.open("w") as out:
            for rollout in rollouts:
                head = json.dumps(
                    {
                        "step": step,
                        "rank": self.job.rank,
                        "policy_version": rollout.policy_version,
                        "instance_id": rollout.task.instance_id,
                        "task_type": rollout.task.task_type,
                        "reward": rollout.reward,
                        "seconds": round(rollout.seconds, 3),
                    }
                )
                out.write(f'{head[:-1]}, "trajectory": {rollout.trajectory.model_dump_json()}}}\n')

    def _write_cancelled(self) -> None:
        """Append the trajectories of episodes a stop cancelled to ``cancelled.rankR.jsonl``."""
        if self.job.runner is None or not self.job.runner.cancelled:
            return
        directory = self.job.settings.trajectories_dir
        directory.mkdir(parents=True, exist_ok=True)
        with (directory / f"cancelled.rank{self.job.rank}.jsonl").open("a") as out:
            for trajectory in self.job.runner.cancelled:
                out.write(trajectory.model_dump_json() + "\n")
        self.job.runner.cancelled.clear()


def _progress_interval() -> float:
    """Seconds between two rollout progress events (``$CRL_PROGRESS_INTERVAL_SECONDS``)."""
    try:
        value = float(os.environ.get(PROGRESS_INTERVAL_ENV, PROGRESS_INTERVAL))
    except ValueError:
        return PROGRESS_INTERVAL
    return value if value > 0 else PROGRESS_INTERVAL


__all__ = ["BATCH_ATTEMPTS", "REWARD_COLUMN", "Batches", "Preempted"]

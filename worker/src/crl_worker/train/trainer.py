"""The training job: TRL's ``GRPOTrainer`` with our agent as its rollout function.

Why this hook: TRL 1.16 offers two. The asynchronous GRPO trainer (``RolloutWorkerProtocol`` +
``WeightTransferProtocol``) is FSDP2-only and packs sequences with a tree attention that needs
flash-attn's varlen kernel, so it runs neither under DeepSpeed ZeRO-3 nor on a CPU. The plain
``GRPOTrainer`` takes a ``rollout_func`` returning prompt ids, completion ids, logprobs and an
``env_mask``; it runs under accelerate + DeepSpeed (ZeRO-3 included, on GPUs or on CPUs with
gloo), and it leaves a sample whose every reward is ``None`` out of the group baseline with a
zero advantage — which is exactly how an infrastructure failure must count. Our rollout function
runs whole episodes (sandbox, agent, evaluation in the same sandbox) and returns their
token-exact sequences with the environment's tokens masked out of the loss.

One step, on every rank at once::

    push weights (if the server lags) -> rollouts of this rank's share of the batch
    -> samples (+ rewards) -> TRL: advantages per group, loss, optimizer step
    -> metrics, status, trajectories -> checkpoint every N steps

Generation: through the vLLM server (``CRL_INFERENCE_URL`` / ``--url``), weights pushed into it
before each batch (LoRA adapters over HTTP or full weights over NCCL), or in-process with
transformers (the trained model itself, gathered from its ZeRO-3 shards for the batch).

Preemption: SIGTERM (and SIGINT) stop the run at the next safe point — in-flight rollouts are
cancelled (their trajectories kept) or, between rollouts, the step finishes — and a checkpoint
of the last finished step is written before the process exits with 143 (130 for SIGINT). Every
rank agrees on stopping through an all-reduce, so the collective save never deadlocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Coroutine, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from crl_worker.tasks.model import Task
from crl_worker.train.errors import TrainConfigError
from crl_worker.train.monitor import Monitor, RolloutStats, merge_stats, read_status
from crl_worker.train.rollouts import Rollout, RolloutRunner
from crl_worker.train.samples import trajectory_sample
from crl_worker.train.settings import TrainSettings

if TYPE_CHECKING:
    from crl_worker.agent.client import ChatClient, Policy
    from crl_worker.bench.config import Sandboxes
    from crl_worker.pool.gateway import Gateway

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Exit status after a stop by SIGTERM / SIGINT (128 + the signal's number).
PREEMPTED_EXIT = {signal.SIGTERM: 143, signal.SIGINT: 130}
#: The headless Service listing every inference replica (set by the operator).
PEERS_ENV = "CRL_INFERENCE_PEERS"
#: Name of the extra column carrying each rollout's reward to the reward function.
REWARD_COLUMN = "crl_reward"


class Preempted(Exception):
    """Every rank agreed to stop (SIGTERM or SIGINT)."""


class StopFlag:
    """Set by SIGTERM/SIGINT; polled by the rollouts and at each step's end."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self.event = threading.Event()

    def install(self) -> None:
        """Catch SIGTERM and SIGINT in this (main) thread."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, number: int, _frame: Any) -> None:
        if self.signal is None:
            logger.warning(
                "%s: stopping at the next safe point (a checkpoint is written first)",
                signal.Signals(number).name,
            )
        self.signal = number
        self.event.set()

    @property
    def set(self) -> bool:
        """Whether a stop was asked for."""
        return self.event.is_set()


class Engine:
    """An asyncio loop on its own thread: the pool, the policy client, the weight sync and the
    rollouts live there across steps while TRL drives the main thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="crl-rollouts")
        self._thread.daemon = True
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the engine's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        """Stop the loop and its thread."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)


def _dist() -> tuple[int, int]:
    """(rank, world size) of this process."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


class TrainingJob:
    """One trainer process of a TrainingRun (every rank builds one)."""

    def __init__(self, settings: TrainSettings, tasks: list[Task]) -> None:
        self.settings = settings
        self.spec = settings.spec
        self.tasks = {t.instance_id: t for t in tasks}
        self.task_order = [t.instance_id for t in tasks]
        self.rank, self.world = _dist()
        self.stop = StopFlag()
        self.engine = Engine()
        self.monitor = Monitor(
            settings.run_dir,
            run_name=settings.name,
            total_steps=settings.total_steps,
            metrics_port=settings.metrics_port,
            enabled=self.rank == 0,
        )
        self.monitor.restore(read_status(settings.run_dir))
        self.reporter: Any = None
        self.gateway: Gateway | None = None
        self.sandboxes: Sandboxes | None = None
        self.client: ChatClient | None = None
        self.sync: Any = None
        self.runner: RolloutRunner | None = None
        self.trainer: Any = None
        self.tokenizer: Any = None
        self.policy_version = 0
        self._step_stats: RolloutStats | None = None
        self._step_started = time.monotonic()
        self._attempts = 0

    # --- setup ------------------------------------------------------------------------------

    async def _start_services(self) -> None:
        from crl_worker.bench.config import Sandboxes

        s = self.settings
        pool_url = s.pool_url
        if pool_url is None:
            from crl_worker.api.common import PoolSettings
            from crl_worker.pool.config import GatewayConfig
            from crl_worker.pool.gateway import Gateway

            settings = self.spec.rollout.pool or PoolSettings()
            config = GatewayConfig(
                pool=f"{s.name}-rank{self.rank}",
                backend="local",
                port=0,
                settings=settings,
            )
            self.gateway = Gateway(config, list(self.tasks.values()))
            await self.gateway.start()
            pool_url = f"http://127.0.0.1:{self.gateway.port}"
        self.sandboxes = Sandboxes.make(pool_url)
        pool = self.spec.rollout.pool
        self.runner = RolloutRunner(
            agent=self.spec.rollout.agent,
            reward_spec=self.spec.rollout.reward,
            sandbox_factory=self.sandboxes.factory,
            concurrency=pool.max_sandboxes if pool is not None else 8,
        )
        if s.inference_url is not None:
            from crl_worker.agent.client import ChatClient

            self.client = ChatClient(s.inference_url, s.served_model, api_key=s.api_key)
        if self.rank == 0:
            from crl_worker.train.report import training_reporter_from_env

            self.reporter = training_reporter_from_env()

    def _make_sync(self) -> None:
        """The weight sync, once the model exists (full weights need its tensor manifest)."""
        s = self.settings
        if s.inference_url is None:
            return
        from crl_worker.train.weights import TensorSpec, make_weight_sync, peers_url

        peers_host = os.environ.get(PEERS_ENV)
        manifest = None
        if s.weight_sync == "nccl":
            model = self.trainer.accelerator.unwrap_model(self.trainer.model_wrapped)
            manifest = [
                TensorSpec(
                    name,
                    str(p.dtype).removeprefix("torch."),
                    tuple(getattr(p, "ds_shape", None) or p.shape),
                )
                for name, p in model.named_parameters()
            ]
        self.sync = make_weight_sync(
            s.weight_sync,
            s.inference_url,
            s.served_model,
            s.name,
            keep=self.spec.algorithm.max_staleness + 1,
            api_key=s.api_key,
            peers=[peers_url(s.inference_url, peers_host)] if peers_host else None,
            manifest=manifest,
        )

    async def _stop_services(self) -> None:
        for closer in (
            self.client.aclose() if self.client is not None else None,
            self.sync.aclose() if self.sync is not None else None,
            self.sandboxes.aclose() if self.sandboxes is not None else None,
            self.gateway.stop() if self.gateway is not None else None,
            self.reporter.aclose() if self.reporter is not None else None,
        ):
            if closer is None:
                continue
            try:
                await closer
            except Exception as exc:
                logger.warning("shutting down: %s", exc)

    # --- distributed agreement ----------------------------------------------------------------

    def _any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` holds on any rank (an all-reduce; every rank must call it)."""
        if self.world == 1 or self.trainer is None:
            return flag
        import torch

        accelerator = self.trainer.accelerator
        value = torch.tensor([1.0 if flag else 0.0], device=accelerator.device)
        return bool(accelerator.reduce(value, reduction="sum").item() > 0)

    def _gather(self, value: T) -> list[T]:
        """``value`` of every rank, in rank order (every rank must call it)."""
        if self.world == 1:
            return [value]
        from accelerate.utils import gather_object

        return list(gather_object([value]))

    def _broadcast(self, value: T) -> T:
        """Rank 0's ``value`` on every rank."""
        if self.world == 1:
            return value
        from accelerate.utils import broadcast_object_list

        return broadcast_object_list([value], from_process=0)[0]  # type: ignore[no-any-return]

    # --- weights --------------------------------------------------------------------------------

    def _push_weights(self, version: int) -> None:
        """Bring the inference server to ``version`` (every rank takes part in the gathering)."""
        trainer = self.trainer
        error: str | None = None
        if self.settings.weight_sync == "lora-adapter":
            directory = self.settings.adapters_dir / f"v{version}"
            state = trainer.accelerator.get_state_dict(trainer.model_wrapped)
            if self.rank == 0:
                model = trainer.accelerator.unwrap_model(trainer.model_wrapped)
                model.save_pretrained(str(directory), state_dict=state)
                try:
                    self.engine.call(self.sync.push(version, adapter_dir=directory))
                except Exception as exc:
                    error = str(exc)
        else:
            named = self._named_full_weights()
            if self.rank == 0:
                try:
                    self.engine.call(self.sync.push(version, named_tensors=named))
                except Exception as exc:
                    error = str(exc)
            else:
                for _ in named:
                    pass
        error = self._broadcast(error)
        if error is not None:
            logger.warning("pushing weights version %d failed: %s", version, error)
            return
        self.policy_version = version
        if self.sync is not None:
            self.sync.version = version

    def _named_full_weights(self) -> Iterator[tuple[str, Any]]:
        """Each parameter whole, one at a time (ZeRO-3 shards gathered on every rank)."""
        model = self.trainer.accelerator.unwrap_model(self.trainer.model_wrapped)
        zero3 = self.trainer.is_deepspeed_enabled and any(
            hasattr(p, "ds_id") for p in model.parameters()
        )
        for name, param in model.named_parameters():
            if zero3:
                import deepspeed

                with deepspeed.zero.GatheredParameters([param]):
                    # A copy: the transport reads it after the gathered storage is freed.
                    yield name, param.data.clone()
            else:
                yield name, param.data

    def _ensure_server_weights(self, step: int) -> None:
        """Before a batch: the server must hold the current weights (reloaded after a restart)."""
        if self.sync is None:
            self.policy_version = step
            return
        lost = False
        if self.rank == 0:
            try:
                lost = bool(self.engine.call(self.sync.ensure_loaded()))
            except Exception as exc:
                logger.warning("checking the server's weights failed: %s", exc)
        lost = self._broadcast(lost)
        if lost:
            logger.warning("the inference server lost its weights (restarted?); pushing again")
        if step > 0 and (self.policy_version != step or lost):
            self._push_weights(step)
        lag = step - self.policy_version
        if lag > self.spec.algorithm.max_staleness:
            from crl_worker.errors import InfrastructureError

            raise InfrastructureError(
                f"the inference server holds weights version {self.policy_version}, {lag} behind "
                f"step {step} (spec.algorithm.maxStaleness is {self.spec.algorithm.max_staleness})"
                "; pushing them failed"
            )

    # --- rollouts -------------------------------------------------------------------------------

    async def _rollouts_until_stopped(
        self, tasks: list[Task], policy: Policy, version: int
    ) -> list[Rollout] | None:
        """The batch's rollouts, or ``None`` when a stop came first (they are cancelled)."""
        assert self.runner is not None
        first = self._attempts
        self._attempts += len(tasks)
        work = asyncio.ensure_future(
            self.runner.run(tasks, policy, version=version, first_attempt=first)
        )
        while not work.done():
            await asyncio.wait({work}, timeout=0.5)
            if self.stop.set and not work.done():
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await work
                return None
        return work.result()

    def rollout_func(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        """TRL's rollout function: one whole episode per prompt (an instance id)."""
        self.trainer = trainer
        step = int(trainer.state.global_step)
        if self._any_rank(self.stop.set):
            raise Preempted
        self._step_started = time.monotonic()
        self._ensure_server_weights(step)
        tasks = [self.tasks[str(p)] for p in prompts]
        if self.client is not None:
            self.client.model = self.sync.model_name()
            rollouts = self.engine.call(
                self._rollouts_until_stopped(tasks, self.client, self.policy_version)
            )
        else:
            rollouts = self._rollouts_in_process(tasks, step)
        self._write_cancelled(step + 1)
        if self._any_rank(rollouts is None):
            raise Preempted
        assert rollouts is not None
        return self._batch(rollouts, step)

    def _rollouts_in_process(self, tasks: list[Task], step: int) -> list[Rollout] | None:
        """Generate with the model being trained (gathered whole for the batch)."""
        from trl.models.utils import unwrap_model_for_generation

        from crl_worker.train.local_policy import TransformersPolicy

        trainer = self.trainer
        with unwrap_model_for_generation(
            trainer.model_wrapped, trainer.accelerator, gather_deepspeed3_params=True
        ) as model:
            was_training = model.training
            model.eval()
            try:
                policy = TransformersPolicy(model, self.tokenizer, name=self.settings.name)
                return self.engine.call(self._rollouts_until_stopped(tasks, policy, step))
            finally:
                model.train(was_training)

    def _batch(self, rollouts: list[Rollout], step: int) -> dict[str, list[Any]]:
        """The samples TRL trains on, and this step's statistics and trajectory log."""
        pad_id = self.tokenizer.pad_token_id
        if pad_id is None:
            pad_id = self.tokenizer.eos_token_id
        max_length = self.spec.rollout.agent.max_total_tokens
        stats = RolloutStats()
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
            out["env_mask"].append(sample.env_mask)
            out[REWARD_COLUMN].append(reward)
        self._step_stats = stats
        self._write_trajectories(step + 1, rollouts)
        return out

    def _write_trajectories(self, step: int, rollouts: Sequence[Rollout]) -> None:
        """``trajectories/step-NNNNNN.rankR.jsonl``: every rollout of the step, whole."""
        directory = self.settings.trajectories_dir
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"step-{step:06d}.rank{self.rank}.jsonl"
        with path.open("w") as out:
            for rollout in rollouts:
                head = json.dumps(
                    {
                        "step": step,
                        "rank": self.rank,
                        "policy_version": rollout.policy_version,
                        "instance_id": rollout.task.instance_id,
                        "reward": rollout.reward,
                        "seconds": round(rollout.seconds, 3),
                    }
                )
                out.write(f'{head[:-1]}, "trajectory": {rollout.trajectory.model_dump_json()}}}\n')

    def _write_cancelled(self, step: int) -> None:
        if self.runner is None or not self.runner.cancelled:
            return
        directory = self.settings.trajectories_dir
        directory.mkdir(parents=True, exist_ok=True)
        with (directory / f"cancelled.rank{self.rank}.jsonl").open("a") as out:
            for trajectory in self.runner.cancelled:
                out.write(trajectory.model_dump_json() + "\n")
        self.runner.cancelled.clear()

    # --- step end, logs, checkpoints ------------------------------------------------------------

    def on_log(self, step: int, logs: dict[str, Any]) -> None:
        """TRL's per-step log (loss, kl, entropy, grad_norm) closes the step's record: metrics,
        the metrics log, the status. Called on every rank (the statistics are gathered)."""
        if "loss" not in logs:
            return  # the end-of-training summary, not a step
        stats = merge_stats(self._gather(self._step_stats or RolloutStats()))
        self._step_stats = None
        record = self.monitor.record_step(
            step,
            stats,
            logs,
            policy_version=self.policy_version if self.sync is not None else step,
            step_seconds=time.monotonic() - self._step_started,
        )
        if self.rank == 0:
            logger.info(
                "step %d/%d: reward %s, resolved %s, %d rollouts (%d infrastructure failures), "
                "loss %s, %.1f s",
                step,
                self.settings.total_steps,
                _fmt(record.reward_mean),
                _fmt(record.resolve_rate),
                record.rollouts,
                record.infrastructure_failures,
                _fmt(record.loss),
                record.step_seconds,
            )
            self.publish(step, phase="Training")

    def on_step_end(self, step: int) -> bool:
        """Whether to stop after this step (every rank agrees)."""
        return self._any_rank(self.stop.set)

    def on_save(self, step: int) -> None:
        """A checkpoint of ``step`` was written: name it ``step-N`` and point ``latest`` at it
        (the names Benchmarks and ``resumeFrom`` use), then report it."""
        if self.rank == 0:
            link_checkpoint(self.settings.checkpoint_dir, step)
            self.monitor.checkpoint_saved(step, Path(f"step-{step}"))
            self.publish(step, phase="Training")

    def publish(
        self,
        step: int,
        *,
        finished: bool = False,
        phase: str | None = None,
        message: str | None = None,
    ) -> None:
        """Write the summary (``status.json``; the TrainingRun's status in a cluster)."""
        if self.rank != 0:
            return
        summary = self.monitor.summary(
            step,
            # In-process generation uses the trained weights themselves: always current.
            policy_version=self.policy_version if self.sync is not None else step,
            finished=finished,
            phase=phase,
            message=message,
        )
        self.monitor.write_status(summary)
        if self.reporter is not None:
            try:
                self.engine.call(self.reporter.publish(summary))
            except Exception as exc:  # reporting never stops training
                logger.warning("publishing the status failed: %s", exc)

    # --- the run --------------------------------------------------------------------------------

    def run(self) -> int:
        """Train to the end (or to a stop); the process's exit status."""
        from crl_worker.train.build import build_trainer, resume_checkpoint

        self.stop.install()
        try:
            self.engine.call(self._start_services())
            self.trainer, self.tokenizer = build_trainer(self)
            self._log_sharding()
            self._make_sync()
            resume = resume_checkpoint(self.settings)
            if resume is not None:
                logger.info("resuming from %s", resume)
            self.publish(_step_of(resume), phase="Training")
            try:
                self.trainer.train(resume_from_checkpoint=str(resume) if resume else None)
            except Preempted:
                self._save_after_stop()
                return self._stopped()
            step = int(self.trainer.state.global_step)
            if self.stop.set and step < self.settings.total_steps:
                return self._stopped()
            self.trainer.save_model(str(self.settings.run_dir / "final"))
            self.publish(step, finished=True, phase="Succeeded")
            logger.info("training finished at step %d", step)
            return 0
        finally:
            self.engine.call(self._stop_services())
            self.engine.close()

    def _log_sharding(self) -> None:
        """Say how much of the model this rank holds (a ZeRO-3 shard, or all of it)."""
        model = self.trainer.accelerator.unwrap_model(self.trainer.model_wrapped)
        held = total = 0
        for param in model.parameters():
            full = int(getattr(param, "ds_numel", 0) or param.numel())
            total += full
            shard = getattr(param, "ds_tensor", None)
            held += int(shard.numel()) if shard is not None else full
        logger.info(
            "rank %d of %d holds %d of %d parameter values (%.1f%%)",
            self.rank,
            self.world,
            held,
            total,
            100.0 * held / max(total, 1),
        )

    def _save_after_stop(self) -> None:
        """After a stop inside a step: checkpoint the last finished step unless it has one."""
        trainer = self.trainer
        step = int(trainer.state.global_step)
        if step == 0 or (self.settings.checkpoint_dir / f"checkpoint-{step}").exists():
            return
        logger.info("writing a checkpoint of step %d before stopping", step)
        trainer._save_checkpoint(trainer.model_wrapped, trial=None)
        self.on_save(step)

    def _stopped(self) -> int:
        step = int(self.trainer.state.global_step)
        self.publish(step, phase="Stopped", message="stopped by a signal; resume continues")
        number = self.stop.signal or signal.SIGTERM
        logger.warning("stopped at step %d; run the same command to resume", step)
        return PREEMPTED_EXIT.get(signal.Signals(number), 128 + int(number))


def link_checkpoint(directory: Path, step: int) -> None:
    """``step-N`` and ``latest`` as links to TRL's ``checkpoint-N``; links whose checkpoint was
    rotated away are removed."""
    target = f"checkpoint-{step}"
    for name in (f"step-{step}", "latest"):
        link = directory / name
        partial = directory / f".{name}.partial"
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
        partial.symlink_to(target)
        partial.replace(link)  # atomic: a reader sees the old link or the new one
    for link in directory.glob("step-*"):
        if link.is_symlink() and not link.exists():
            link.unlink()


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _step_of(checkpoint: Path | None) -> int:
    if checkpoint is None:
        return 0
    try:
        return int(checkpoint.name.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return 0


__all__ = ["PREEMPTED_EXIT", "Preempted", "TrainConfigError", "TrainingJob"]

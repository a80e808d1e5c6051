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

import contextlib
import json
import logging
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from crl_worker.api.contract import Env
from crl_worker.tasks.model import Task
from crl_worker.train.batches import BATCH_ATTEMPTS, Batches, Preempted
from crl_worker.train.errors import TrainConfigError
from crl_worker.train.events import (
    RESUME_EVENT,
    STEP_EVENT,
)
from crl_worker.train.monitor import Monitor, RolloutStats, merge_stats, read_status
from crl_worker.train.overlap import Producer, install_plan
from crl_worker.train.pushes import WeightPushes
from crl_worker.train.rollouts import RolloutRunner
from crl_worker.train.runtime import Engine, StopFlag
from crl_worker.train.settings import TrainSettings
from crl_worker.train.watchdog import (
    Watchdog,
    WeightSyncStopped,
)

if TYPE_CHECKING:
    from crl_worker.agent.client import ChatClient
    from crl_worker.pool.gateway import Gateway
    from crl_worker.rollout.setup import Sandboxes
    from crl_worker.train.weights import AnyWeightSync

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Exit status after a stop by SIGTERM / SIGINT (128 + the signal's number).
PREEMPTED_EXIT = {signal.SIGTERM: 143, signal.SIGINT: 130}


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
        self.reporter: Any = None
        self.gateway: Gateway | None = None
        self.sandboxes: Sandboxes | None = None
        self.client: ChatClient | None = None
        self.sync: AnyWeightSync | None = None
        self.runner: RolloutRunner | None = None
        self.trainer: Any = None
        self.tokenizer: Any = None
        self.policy_version = 0
        self.watchdog = Watchdog(speaks=self.rank == 0)
        """The weight-sync watchdog (deadlines, version checks, the logprob gap)."""
        self.step_started = time.monotonic()
        self.stopping = False
        """Every rank agreed to stop (a signal reached at least one of them)."""
        self.producer: Producer | None = None
        """Starts the next steps' batches while this one trains (``maxStaleness`` > 0 with an
        inference server; :mod:`crl_worker.train.overlap`)."""
        self.pushes = WeightPushes(self)
        """Keeps the inference server on the trained weights (:mod:`crl_worker.train.pushes`)."""
        self.batches = Batches(self, self.pushes.ensure_current)
        """Runs each step's rollouts into samples (:mod:`crl_worker.train.batches`)."""

    # --- setup ------------------------------------------------------------------------------

    async def _start_services(self) -> None:
        from crl_worker.rollout.setup import Sandboxes

        s = self.settings
        pool_url, token = s.pool_url, None
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
            token = self.gateway.token  # made in memory: only this process holds it
        self.sandboxes = Sandboxes.make(pool_url, token=token)
        if not await self._keep_served_tasks():
            return  # a stop came while the pool validated its tasks
        pool = self.spec.rollout.pool
        self.runner = RolloutRunner(
            agent=self.spec.rollout.agent,
            reward_spec=self.spec.rollout.reward,
            sandbox_factory=self.sandboxes.factory,
            # The pool's capacity is shared by every rank.
            concurrency=max(1, (pool.max_sandboxes if pool is not None else 8) // self.world),
        )
        runner = self.runner
        self.monitor.g_in_flight.set_function(lambda: runner.in_flight)
        if s.inference_url is not None:
            from crl_worker.agent.client import ChatClient

            self.client = ChatClient(s.inference_url, s.served_model, api_key=s.api_key)
        if self.rank == 0:
            from crl_worker.train.report import training_reporter_from_env

            self.reporter = training_reporter_from_env()

    async def _keep_served_tasks(self) -> bool:
        """Leave out of the run's tasks the ones its pool quarantined (waiting for the pool's
        verdicts while it validates), so that none is drawn; False when a stop came first."""
        from crl_worker.rollout.served import NothingServed, served_tasks
        from crl_worker.train.preflight import check_tasks

        assert self.sandboxes is not None and self.sandboxes.gateway is not None
        try:
            served = await served_tasks(
                self.sandboxes.gateway, list(self.tasks.values()), stopped=lambda: self.stop.set
            )
        except NothingServed as exc:
            raise TrainConfigError("spec.tasks", str(exc)) from None
        if served is None:
            return False
        if not served.quarantined:
            return True
        kept = {t.instance_id for t in served.tasks}
        self.tasks = {i: t for i, t in self.tasks.items() if i in kept}
        self.task_order = [i for i in self.task_order if i in kept]
        self.monitor.tasks_quarantined(Counter(entry.reason for entry in served.quarantined))
        if self.rank == 0:
            logger.warning(
                "the pool quarantined %d of the run's %d tasks when it validated them (%s): they"
                " are left out, the run draws from the other %d",
                len(served.quarantined),
                len(served.quarantined) + len(kept),
                served.reasons(),
                len(kept),
            )
        check_tasks(self.settings, served.tasks)
        return True

    def _make_sync(self) -> None:
        """The weight sync, once the model exists (full weights need its tensor manifest)."""
        s = self.settings
        if s.inference_url is None:
            return
        from crl_worker.train.weights import TensorSpec, make_weight_sync, peers_url

        peers_host = os.environ.get(Env.INFERENCE_PEERS)
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
            verify_every=self.watchdog.check_every,
            transport="gloo" if os.environ.get(Env.WEIGHT_TRANSPORT) == "gloo" else "vllm",
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

    def any_rank(self, flag: bool) -> bool:
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

    def broadcast(self, value: T) -> T:
        """Rank 0's ``value`` on every rank."""
        if self.world == 1:
            return value
        from accelerate.utils import broadcast_object_list

        return broadcast_object_list([value], from_process=0)[0]  # type: ignore[no-any-return]

    # --- TRL's hooks ----------------------------------------------------------------------------

    def rollout_func(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        """TRL's rollout function: one whole episode per prompt (an instance id); see
        :meth:`crl_worker.train.batches.Batches.collect`."""
        return self.batches.collect(prompts, trainer)

    # --- step end, logs, checkpoints ------------------------------------------------------------

    def on_log(self, step: int, logs: dict[str, Any]) -> None:
        """TRL's per-step log (loss, kl, entropy, grad_norm) closes the step's record: metrics,
        the metrics log, the status. Called on every rank (the statistics are gathered)."""
        if "loss" not in logs:
            return  # the end-of-training summary, not a step
        self.pushes.watch_gap(step, logs, off_policy=self.batches.off_policy)
        stats = merge_stats(self._gather(self.batches.step_stats or RolloutStats()))
        self.batches.step_stats = None
        record = self.monitor.record_step(
            step,
            stats,
            logs,
            policy_version=self.policy_version if self.sync is not None else step,
            step_seconds=time.monotonic() - self.step_started,
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
                extra={
                    # For `crl train`'s display (it reads the JSON lines); pods keep them too.
                    "event": STEP_EVENT,
                    "step": step,
                    "total_steps": self.settings.total_steps,
                    "reward_mean": record.reward_mean,
                    "resolve_rate": record.resolve_rate,
                    "loss": record.loss,
                    "rollouts": record.rollouts,
                    "infrastructure_failures": record.infrastructure_failures,
                    "rollouts_per_second": (
                        record.rollouts_per_minute / 60.0
                        if record.rollouts_per_minute is not None
                        else None
                    ),
                    "staleness_max": record.staleness_max,
                    "step_seconds": record.step_seconds,
                    "weight_pushes": record.weight_pushes,
                    "push_seconds": record.push_seconds,
                },
            )
            self.publish(step, phase="Training")

    def on_step_end(self, step: int) -> bool:
        """Whether to stop after this step (every rank agrees)."""
        self.stopping = self.any_rank(self.stop.set)
        return self.stopping

    def on_save(self, step: int) -> None:
        """A checkpoint of ``step`` was written: name it ``step-N`` and point ``latest`` at it
        (the names Benchmarks and ``resumeFrom`` use), then report it."""
        if self.rank == 0:
            name = f"checkpoint-{step}"
            try:
                link_checkpoint(self.settings.checkpoint_dir, step)
                name = f"step-{step}"
            except OSError as exc:  # a volume without symbolic links
                logger.warning("cannot link step-%d to its checkpoint: %s", step, exc)
            self.monitor.checkpoint_saved(step, Path(name))
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
        if self.watchdog.state is not None:
            summary["weightSync"] = self.watchdog.state.wire()
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

        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        self.stop.install()
        step = 0
        try:
            self.engine.call(self._start_services())
            if self.stop.set:
                return self._stopped()  # while the pool validated: nothing to save yet
            self.trainer, self.tokenizer = build_trainer(self)
            self._log_sharding()
            self._make_sync()
            self._start_overlap()
            resume = resume_checkpoint(self.settings)
            step = _step_of(resume)
            self._resume_records(step if resume is not None else None)
            if resume is not None:
                logger.info("resuming from %s", resume, extra={"event": RESUME_EVENT, "step": step})
            self.publish(step, phase="Training")
            try:
                self.trainer.train(resume_from_checkpoint=str(resume) if resume else None)
            except Preempted:
                self._save_after_stop()
                return self._stopped()
            except WeightSyncStopped as exc:
                # Never train on weights the server does not serve: stop, clearly.
                step = int(self.trainer.state.global_step)
                message = f"weight sync: {exc}; resume from the last checkpoint once fixed"
                logger.error("%s", message)
                self.publish(step, phase="Failed", message=message)
                return 1
            step = int(self.trainer.state.global_step)
            if self.stopping:
                return self._stopped()
            if step < self.settings.total_steps:
                message = (
                    f"training ended at step {step} of {self.settings.total_steps}: the data ran "
                    "out (fewer tasks than spec.algorithm.tasksPerStep?)"
                )
                logger.error("%s", message)
                self.publish(step, phase="Failed", message=message)
                return 1
            self.trainer.save_model(str(self.settings.run_dir / "final"))
            self.publish(step, finished=True, phase="Succeeded")
            logger.info("training finished at step %d", step)
            return 0
        except Exception as exc:
            if self.trainer is not None:
                step = int(self.trainer.state.global_step)
            self.publish(step, phase="Failed", message=f"{type(exc).__name__}: {exc}"[:500])
            raise
        finally:
            if self.producer is not None:
                self.producer.cancel_all()
            self.engine.call(self._stop_services())
            self.engine.close()
            for sig, handler in handlers.items():
                signal.signal(sig, handler)

    def _start_overlap(self) -> None:
        """With ``maxStaleness`` > 0 and an inference server, start the next steps' batches
        while one trains (:mod:`crl_worker.train.overlap`)."""
        bound = self.spec.algorithm.max_staleness
        if bound == 0:
            return
        if self.client is None:
            logger.info(
                "maxStaleness %d: in-process generation does not overlap rollouts with training"
                " (it needs the model gathered on the training thread)",
                bound,
            )
            return
        plan = install_plan(self.trainer, self.task_order, self.rank)
        self.producer = Producer(plan, bound, start=self.batches.start_ahead)
        self.monitor.g_ahead.set_function(self.producer.in_flight)
        logger.info("rollouts overlap training: up to %d batches ahead", bound)

    def _resume_records(self, step: int | None) -> None:
        """Keep the metrics log and the failure count consistent with the checkpoint resumed
        from: steps after it (run again now) are dropped; nothing is carried over on a fresh
        start."""
        if self.rank != 0:
            return
        if step is None:
            return
        self.monitor.restore(read_status(self.settings.run_dir))
        path = self.settings.run_dir / "metrics.jsonl"
        kept: list[str] = []
        failures = 0
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict) and int(record.get("step", 0)) <= step:
                    kept.append(line)
                    failures += int(record.get("infrastructure_failures") or 0)
            partial = path.with_name(path.name + ".partial")
            partial.write_text("".join(f"{line}\n" for line in kept))
            partial.replace(path)
        self.monitor.infrastructure_failures_total = failures

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
        # Rank 0 decides (ranks on other nodes may not see the same folder): the save is a
        # collective, every rank must take the same branch.
        exists = (self.settings.checkpoint_dir / f"checkpoint-{step}").exists()
        if step == 0 or self.broadcast(exists):
            return
        logger.info("writing a checkpoint of step %d before stopping", step)
        trainer._save_checkpoint(trainer.model_wrapped, trial=None)
        self.on_save(step)

    def _stopped(self) -> int:
        step = int(self.trainer.state.global_step) if self.trainer is not None else 0
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


__all__ = ["BATCH_ATTEMPTS", "PREEMPTED_EXIT", "Preempted", "TrainConfigError", "TrainingJob"]

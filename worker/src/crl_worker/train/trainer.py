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
import concurrent.futures
import contextlib
import json
import logging
import os
import queue
import shutil
import signal
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from crl_worker.api.contract import Env
from crl_worker.tasks.model import Task
from crl_worker.train.errors import TrainConfigError
from crl_worker.train.events import (
    PROGRESS_INTERVAL,
    PROGRESS_INTERVAL_ENV,
    RESUME_EVENT,
    ROLLOUTS_EVENT,
    STEP_EVENT,
)
from crl_worker.train.monitor import Monitor, RolloutStats, merge_stats, read_status
from crl_worker.train.overlap import Producer, install_plan
from crl_worker.train.rollouts import Rollout, RolloutRunner
from crl_worker.train.samples import trajectory_sample
from crl_worker.train.settings import TrainSettings
from crl_worker.train.watchdog import (
    LOGPROB_GAP,
    PUSH_FAILED,
    PUSH_TIMED_OUT,
    WRONG_VERSION,
    Watchdog,
    WeightSyncStopped,
)

if TYPE_CHECKING:
    from crl_worker.agent.client import ChatClient, Policy
    from crl_worker.pool.gateway import Gateway
    from crl_worker.rollout.setup import Sandboxes
    from crl_worker.train.weights import AnyWeightSync

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Exit status after a stop by SIGTERM / SIGINT (128 + the signal's number).
PREEMPTED_EXIT = {signal.SIGTERM: 143, signal.SIGINT: 130}
#: Tries of a weight push before the run gives up (the Job restarts it from a checkpoint).
PUSH_ATTEMPTS = 3
#: Tries of a batch whose every rollout failed for infrastructure reasons.
BATCH_ATTEMPTS = 3
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
        self._push_timed_out = False
        self._rollouts_ended: float | None = None
        """When this rank's last batch of rollouts finished."""
        self._idle: float | None = None
        """Seconds between that and the start of this step's rollouts."""
        self._step_stats: RolloutStats | None = None
        self._step_started = time.monotonic()
        self._attempts = 0
        self._stopping = False
        """Every rank agreed to stop (a signal reached at least one of them)."""
        self._discarded_failures = 0
        """Rollouts of batches run again because all of them failed (this step)."""
        self.producer: Producer | None = None
        """Starts the next steps' batches while this one trains (``maxStaleness`` > 0 with an
        inference server; :mod:`crl_worker.train.overlap`)."""
        self._off_policy = False
        """This rank's batch of the step in training came from older weights."""

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

    async def _within_deadline(self, push: Coroutine[Any, Any, None]) -> None:
        """``push``, cancelled once the watchdog's deadline passes (then a TimeoutError that
        says so)."""
        self._push_timed_out = False
        deadline = self.watchdog.push_deadline
        try:
            await asyncio.wait_for(push, deadline)
        except TimeoutError:
            self._push_timed_out = True
            raise TimeoutError(f"the push did not finish within {deadline:g} s") from None

    def _push_weights(self, version: int) -> bool:
        """Bring the inference server to ``version`` and check that it serves it; whether it
        worked (every rank takes part in the gathering and learns the outcome)."""
        error: str | None
        started = time.monotonic()
        if self.settings.weight_sync == "lora-adapter":
            error = self._push_adapter(version)
        else:
            error = self._push_full(version)
        if error is None and self.rank == 0:
            error = self._check_served(version)
        elif error is not None:
            reason = PUSH_TIMED_OUT if self._push_timed_out else PUSH_FAILED
            error = f"{reason}|pushing version {version} failed: {error}"
        error = self._broadcast(error)
        self.monitor.weight_push(time.monotonic() - started, ok=error is None)
        if error is not None:
            reason, _, message = error.partition("|")
            self._weight_sync_problem(reason, message)
            return False
        self.policy_version = version
        if self.sync is not None:
            self.sync.version = version
        self.watchdog.in_sync(version)
        return True

    def _check_served(self, version: int) -> str | None:
        """Rank 0, right after a push: does the server serve ``version``? A server that lost
        it is refilled by the sync where it can be (an adapter) and checked again; ``None``
        when it serves it, else ``"Reason|message"``."""
        assert self.sync is not None  # pushes happen only with a server to push to
        try:
            lost = bool(self.engine.call(self.sync.ensure_loaded()))
        except Exception as exc:
            return f"{PUSH_FAILED}|checking the server after pushing version {version}: {exc}"
        if not lost:
            return None
        self._weight_sync_problem(
            WRONG_VERSION,
            f"the server did not serve version {version} right after its push; loading it again",
        )
        try:
            lost = bool(self.engine.call(self.sync.ensure_loaded()))
        except Exception as exc:
            return f"{WRONG_VERSION}|checking the server again: {exc}"
        if lost or self.sync.version != version:
            return f"{WRONG_VERSION}|the server still does not serve version {version}"
        return None

    def _weight_sync_problem(self, reason: str, message: str) -> None:
        """Record a watchdog finding (the WeightSync condition, a metric) and publish it."""
        self.watchdog.problem(reason, message)
        self.monitor.weight_sync_problem(reason)
        if self.trainer is not None:
            self.publish(int(self.trainer.state.global_step), phase="Training", message=message)

    def _push_adapter(self, version: int) -> str | None:
        """Save the adapter (only its own weights gathered) and load it into the server."""
        trainer = self.trainer
        model = trainer.accelerator.unwrap_model(trainer.model_wrapped)
        trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        state: dict[str, Any] = {}
        if self._zero3(model):
            import deepspeed

            with deepspeed.zero.GatheredParameters([p for _, p in trained]):
                if self.rank == 0:
                    state = {n: p.data.detach().cpu().clone() for n, p in trained}
        elif self.rank == 0:
            state = {n: p.data.detach().cpu().clone() for n, p in trained}
        if self.rank != 0:
            return None
        from crl_worker.train.weights import AdapterUpdate, push_update

        directory = self.settings.adapters_dir / f"v{version}"
        try:
            assert self.sync is not None  # pushes happen only with a server to push to
            model.save_pretrained(str(directory), state_dict=state)
            self.engine.call(
                self._within_deadline(push_update(self.sync, AdapterUpdate(version, directory)))
            )
        except Exception as exc:
            return str(exc)
        self._prune_adapters(version)
        return None

    def _prune_adapters(self, version: int) -> None:
        """Delete adapter folders the server no longer holds (it keeps the newest ``keep``)."""
        keep = self.spec.algorithm.max_staleness + 1
        for path in self.settings.adapters_dir.glob("v*"):
            try:
                old = int(path.name[1:])
            except ValueError:
                continue
            if old <= version - keep:
                shutil.rmtree(path, ignore_errors=True)

    def _push_full(self, version: int) -> str | None:
        """Stream every parameter to the server. All ranks gather in lockstep in this thread;
        rank 0 hands copies to the transport through a small queue and, if the transport fails,
        keeps gathering (and discarding) to the end so no rank is left in a collective."""
        model = self.trainer.accelerator.unwrap_model(self.trainer.model_wrapped)
        zero3 = self._zero3(model)
        if self.rank != 0:
            for _ in self._gathered(model, zero3):
                pass
            return None
        handoff: queue.Queue[tuple[str, Any] | None] = queue.Queue(maxsize=2)

        def stream() -> Iterator[tuple[str, Any]]:
            while (item := handoff.get()) is not None:
                yield item

        from crl_worker.train.weights import TensorUpdate, push_update

        assert self.sync is not None  # pushes happen only with a server to push to
        future = asyncio.run_coroutine_threadsafe(
            self._within_deadline(push_update(self.sync, TensorUpdate(version, stream()))),
            self.engine.loop,
        )
        for item in self._gathered(model, zero3):
            while not future.done():
                try:
                    handoff.put(item, timeout=0.5)
                    break
                except queue.Full:
                    continue
        while not future.done():
            try:
                handoff.put(None, timeout=0.5)
                break
            except queue.Full:
                continue
        try:
            future.result()
        except Exception as exc:
            return str(exc)
        return None

    def _zero3(self, model: Any) -> bool:
        return bool(self.trainer.is_deepspeed_enabled) and any(
            hasattr(p, "ds_id") for p in model.parameters()
        )

    def _gathered(self, model: Any, zero3: bool) -> Iterator[tuple[str, Any]]:
        """Each parameter whole, one at a time (ZeRO-3 shards gathered on every rank); copies,
        because the transport reads them after the gathered storage is freed."""
        for name, param in model.named_parameters():
            if zero3:
                import deepspeed

                with deepspeed.zero.GatheredParameters([param]):
                    yield name, param.data.detach().clone()
            else:
                yield name, param.data

    def _ensure_server_weights(self, step: int) -> None:
        """Before a batch: the server must hold the current weights (pushed again after a
        restart). A push that keeps failing ends the run (the Job restarts from the last
        checkpoint): rolling out from weights older than ``maxStaleness`` versions, or from a
        server a failed full-weight transfer left paused, would train on the wrong policy."""
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
        full_weights = self.settings.weight_sync == "nccl"
        if lost:
            logger.warning("the inference server had lost its weights (restarted?)")
        repush = self.watchdog.repush and step > 0
        if step == 0 or (
            self.policy_version == step and not (lost and full_weights) and not repush
        ):
            # Up to date; a lost adapter was loaded again by ensure_loaded itself (full
            # weights cannot be: every rank has to gather them, so they are pushed here).
            return
        self.watchdog.repush = False
        for attempt in range(PUSH_ATTEMPTS):
            if self._push_weights(step):
                return
            if self.watchdog.exhausted():
                raise WeightSyncStopped(
                    f"weight sync failed {self.watchdog.problems} times in a row, last: "
                    f"{self.watchdog.state.message if self.watchdog.state else '?'}"
                )
            lag = step - self.policy_version
            if not full_weights and lag <= self.spec.algorithm.max_staleness and not repush:
                return  # the adapter of an earlier version is still served: use it
            time.sleep(min(30.0, 2.0 * 2**attempt))
        from crl_worker.errors import InfrastructureError

        raise InfrastructureError(
            f"pushing weights version {step} to the inference server failed {PUSH_ATTEMPTS} "
            f"times; it holds version {self.policy_version} (spec.algorithm.maxStaleness is "
            f"{self.spec.algorithm.max_staleness})"
        )

    # --- rollouts -------------------------------------------------------------------------------

    def _start_batch(
        self, tasks: list[Task], policy: Policy | Callable[[int], Policy], version: int
    ) -> concurrent.futures.Future[list[Rollout]]:
        """Start a batch's episodes on the engine's loop (they run while the caller goes on)."""
        assert self.runner is not None
        first = self._attempts
        self._attempts += len(tasks)
        return asyncio.run_coroutine_threadsafe(
            self.runner.run(tasks, policy, version=version, first_attempt=first),
            self.engine.loop,
        )

    def _seed_base(self, step: int) -> int:
        """The first sampling seed of step ``step``'s rollouts on this rank (rollout ``i``
        starts at ``base + i``): one per spec seed, step, rank and rollout."""
        return ((self.spec.algorithm.seed * 1_000_003 + step) * 1_009 + self.rank) * 65_537

    def _served(self, model: str, step: int) -> Callable[[int], Policy]:
        """The policy of each rollout of step ``step``'s batch on the server: ``model`` on every
        turn, and seeds of its own (turn ``k`` of rollout ``i`` carries ``base + 4099 i + k``),
        so a run is the same however the server interleaves its episodes."""
        assert self.client is not None
        client, base = self.client, self._seed_base(step)
        return lambda index: client.pinned(model, seed=base + index * 4_099)

    def _start_ahead(
        self, prompts: list[str], version: int, step: int
    ) -> concurrent.futures.Future[list[Rollout]]:
        """Step ``step``'s batch, started ahead on the weights the server holds now
        (``version``): every turn of its episodes names that version's model, so they finish
        on the weights they began."""
        assert self.client is not None and self.sync is not None
        tasks = [self.tasks[p] for p in prompts]
        return self._start_batch(tasks, self._served(self.sync.model_name(), step), version)

    async def _rollouts_until_stopped(
        self, batch: concurrent.futures.Future[list[Rollout]], total: int
    ) -> list[Rollout] | None:
        """The batch's rollouts, or ``None`` when a stop came first (they are cancelled)."""
        assert self.runner is not None
        work = asyncio.wrap_future(batch)
        started = self.runner.finished
        interval = _progress_interval()
        said = time.monotonic()
        while not work.done():
            await asyncio.wait({work}, timeout=min(0.5, interval))
            if self.rank == 0 and not work.done() and time.monotonic() - said >= interval:
                said = time.monotonic()
                # Overlapped batches finish episodes too: the count is capped at the batch.
                done = min(total, self.runner.finished - started)
                current = self._current_step()
                logger.info(
                    "step %d: %d of %d rollouts done, %d running",
                    current,
                    done,
                    total,
                    self.runner.in_flight,
                    extra={
                        "event": ROLLOUTS_EVENT,
                        "step": current,
                        "done": done,
                        "total": total,
                        "in_flight": self.runner.in_flight,
                    },
                )
            if self.stop.set and not work.done():
                batch.cancel()
                with contextlib.suppress(asyncio.CancelledError, concurrent.futures.CancelledError):
                    await work
                return None
        return work.result()

    def _current_step(self) -> int:
        """The step being rolled out (1-based)."""
        return int(self.trainer.state.global_step) + 1 if self.trainer is not None else 0

    def rollout_func(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        """TRL's rollout function: one whole episode per prompt (an instance id).

        A batch in which no rollout of any rank got a reward (the infrastructure is down) is
        run again, up to :data:`BATCH_ATTEMPTS` times, then the run fails: handing TRL a batch
        with nothing to learn would still move the weights (the optimizer's momentum) and
        advance the schedule.
        """
        self.trainer = trainer
        step = int(trainer.state.global_step)
        tasks = [self.tasks[str(p)] for p in prompts]
        for attempt in range(BATCH_ATTEMPTS):
            if self._any_rank(self.stop.set):
                self._stopping = True
                raise Preempted
            self._step_started = time.monotonic()
            self._ensure_server_weights(step)
            if self.client is not None:
                assert self.sync is not None  # a policy client comes with its server's sync
                self.client.model = self.sync.model_name()
                ahead = None
                if self.producer is not None and attempt == 0:
                    ahead = self.producer.take([str(p) for p in prompts], step)
                if ahead is None:
                    started = time.monotonic()
                    batch = self._start_batch(
                        tasks, self._served(self.client.model, step), self.policy_version
                    )
                else:
                    started, batch = ahead.started, ahead.future
                if self.producer is not None and not self.stop.set:
                    # The next steps' episodes run while this step waits, trains and pushes.
                    self.producer.fill(step, self.policy_version, self.settings.total_steps)
                if attempt == 0 and self._rollouts_ended is not None:
                    self._idle = max(0.0, started - self._rollouts_ended)
                rollouts = self.engine.call(self._rollouts_until_stopped(batch, len(tasks)))
            else:
                if attempt == 0 and self._rollouts_ended is not None:
                    self._idle = time.monotonic() - self._rollouts_ended
                rollouts = self._rollouts_in_process(tasks, step)
            self._rollouts_ended = time.monotonic()
            if rollouts is None and self.producer is not None:
                self.producer.cancel_all()
            self._write_cancelled()
            if self._any_rank(rollouts is None):
                self._stopping = True
                if self.producer is not None:
                    self.producer.cancel_all()
                raise Preempted
            assert rollouts is not None
            if self._any_rank(any(r.reward is not None for r in rollouts)):
                return self._batch(rollouts, step)
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
            lock = asyncio.Lock()  # one generation at a time on the shared model
            policies: list[TransformersPolicy] = []
            base = self._seed_base(step)

            def policy_of(index: int) -> TransformersPolicy:
                # A sampler per rollout: the same seed gives the same rollouts, however the
                # episodes interleave.
                made = TransformersPolicy(
                    model, self.tokenizer, name=self.settings.name, seed=base + index, lock=lock
                )
                policies.append(made)
                return made

            try:
                return self.engine.call(
                    self._rollouts_until_stopped(
                        self._start_batch(tasks, policy_of, step), len(tasks)
                    )
                )
            finally:
                # A cancelled generation finishes its current token on its thread: wait for it
                # before the ZeRO-3 shards are taken back.
                for made in policies:
                    made.wait_idle()
                model.train(was_training)

    def _batch(self, rollouts: list[Rollout], step: int) -> dict[str, list[Any]]:
        """The samples TRL trains on, and this step's statistics and trajectory log."""
        pad_id = self.tokenizer.pad_token_id
        if pad_id is None:
            pad_id = self.tokenizer.eos_token_id
        max_length = self.spec.rollout.agent.max_total_tokens
        stats = RolloutStats(
            rollouts=self._discarded_failures,
            infrastructure_failures=self._discarded_failures,
            idle_seconds=[self._idle] if self._idle is not None else [],
        )
        self._idle = None
        self._discarded_failures = 0
        if self.producer is not None:
            stats.dropped_stale, self.producer.dropped_stale = self.producer.dropped_stale, 0
            stats.dropped_unplanned = self.producer.dropped_unplanned
            self.producer.dropped_unplanned = 0
        self._off_policy = any(step != r.policy_version for r in rollouts)
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
        self._step_stats = stats
        self._write_trajectories(step + 1, rollouts)
        return out

    def _write_trajectories(
        self, step: int, rollouts: Sequence[Rollout], *, attempt: int | None = None
    ) -> None:
        """``trajectories/step-NNNNNN.rankR.jsonl``: every rollout of the step, whole (a batch
        run again because all of it failed: ``step-NNNNNN.failedK.rankR.jsonl``)."""
        directory = self.settings.trajectories_dir
        directory.mkdir(parents=True, exist_ok=True)
        tag = "" if attempt is None else f".failed{attempt}"
        path = directory / f"step-{step:06d}{tag}.rank{self.rank}.jsonl"
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

    def _write_cancelled(self) -> None:
        """Append the trajectories of episodes a stop cancelled to ``cancelled.rankR.jsonl``."""
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
        self._watch_gap(step, logs)
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

    def _watch_gap(self, step: int, logs: dict[str, Any]) -> None:
        """The watchdog's third check: the step's trainer-vs-server logprob gap. Above the
        threshold the weights are pushed again before the next batch; a gap that outlasts
        :data:`~crl_worker.train.watchdog.MAX_RECOVERIES` pushes stops the run."""
        if self.sync is None:
            return  # in-process generation: the trainer sampled its own logprobs
        if self._any_rank(self._off_policy):
            # Rollouts from older weights (overlap, or a lagging push) differ from the trainer
            # by the updates since, not only by the sync: the gap says nothing about the sync.
            return
        gap = self.watchdog.gap(logs)
        # Every rank must take the same branch (the next push is a collective).
        bad = self._broadcast(gap is not None and gap > self.watchdog.max_gap)
        if not bad:
            self.watchdog.step_done()
            return
        self._weight_sync_problem(
            LOGPROB_GAP,
            f"step {step}: the mean logprob gap between trainer and server is {gap:.4g}, above "
            f"{self.watchdog.max_gap:g}: the server's weights are not the trainer's; pushing "
            "them again",
        )
        if self.watchdog.exhausted():
            raise WeightSyncStopped(
                f"the logprob gap stayed above {self.watchdog.max_gap:g} after "
                f"{self.watchdog.problems - 1} pushes (last {gap:.4g}): the inference server "
                "does not serve the trained weights"
            )
        self.watchdog.repush = True

    def on_step_end(self, step: int) -> bool:
        """Whether to stop after this step (every rank agrees)."""
        self._stopping = self._any_rank(self.stop.set)
        return self._stopping

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
            if self._stopping:
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
        self.producer = Producer(plan, bound, start=self._start_ahead)
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
        if step == 0 or self._broadcast(exists):
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


def _progress_interval() -> float:
    """Seconds between two rollout progress events (``$CRL_PROGRESS_INTERVAL_SECONDS``)."""
    try:
        value = float(os.environ.get(PROGRESS_INTERVAL_ENV, PROGRESS_INTERVAL))
    except ValueError:
        return PROGRESS_INTERVAL
    return value if value > 0 else PROGRESS_INTERVAL


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

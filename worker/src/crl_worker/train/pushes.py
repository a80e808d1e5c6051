"""Keeping the inference server on the trained weights: before each batch the server must serve
the current version (pushed again after a restart, or when the watchdog asks), pushes are
bounded by the watchdog's deadline and checked after they land, and each step's logprob gap
between trainer and server is watched (:mod:`crl_worker.train.watchdog`).

Two kinds of push: a LoRA adapter (only its own weights gathered, saved, loaded over HTTP) or
every parameter streamed to the server (full weights; ZeRO-3 shards gathered on every rank in
lockstep while rank 0 hands copies to the transport).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import shutil
import time
from collections.abc import Coroutine, Iterator
from typing import TYPE_CHECKING, Any

from crl_worker.train.watchdog import (
    LOGPROB_GAP,
    PUSH_FAILED,
    PUSH_TIMED_OUT,
    WEIGHTS_MISMATCH,
    WRONG_VERSION,
    WeightSyncStopped,
)

if TYPE_CHECKING:
    from crl_worker.train.runtime import Job

logger = logging.getLogger(__name__)

#: Tries of a weight push before the run gives up (the Job restarts it from a checkpoint).
PUSH_ATTEMPTS = 3


class WeightPushes:
    """The weight pushes of one trainer process (every rank has one: gathers are collective)."""

    def __init__(self, job: Job) -> None:
        """``job``: the trainer process whose model, sync, watchdog and monitor are used."""
        self.job = job
        self._timed_out = False
        """The last push ran past the watchdog's deadline."""
        self._mismatch = False
        """The last push landed, but the served weights are not what was sent."""

    async def _within_deadline(self, push: Coroutine[Any, Any, None]) -> None:
        """``push``, cancelled once the watchdog's deadline passes (then a TimeoutError that
        says so)."""
        self._timed_out = False
        deadline = self.job.watchdog.push_deadline
        try:
            await asyncio.wait_for(push, deadline)
        except TimeoutError:
            self._timed_out = True
            raise TimeoutError(f"the push did not finish within {deadline:g} s") from None

    def _push(self, version: int) -> bool:
        """Bring the inference server to ``version`` and check that it serves it; whether it
        worked (every rank takes part in the gathering and learns the outcome)."""
        error: str | None
        started = time.monotonic()
        if self.job.settings.weight_sync == "lora-adapter":
            error = self._push_adapter(version)
        else:
            error = self._push_full(version)
        if error is None and self.job.rank == 0:
            error = self._check_served(version)
        elif error is not None:
            reason = (
                PUSH_TIMED_OUT
                if self._timed_out
                else WEIGHTS_MISMATCH
                if self._mismatch
                else PUSH_FAILED
            )
            error = f"{reason}|pushing version {version} failed: {error}"
        error = self.job.broadcast(error)
        self.job.monitor.weight_push(time.monotonic() - started, ok=error is None)
        if error is not None:
            reason, _, message = error.partition("|")
            self.problem(reason, message)
            return False
        self.job.policy_version = version
        if self.job.sync is not None:
            self.job.sync.version = version
        self.job.watchdog.in_sync(version)
        return True

    def _check_served(self, version: int) -> str | None:
        """Rank 0, right after a push: does the server serve ``version``? A server that lost
        it is refilled by the sync where it can be (an adapter) and checked again; ``None``
        when it serves it, else ``"Reason|message"``."""
        assert self.job.sync is not None  # pushes happen only with a server to push to
        try:
            lost = bool(self.job.engine.call(self.job.sync.ensure_loaded()))
        except Exception as exc:
            return f"{PUSH_FAILED}|checking the server after pushing version {version}: {exc}"
        if not lost:
            return None
        self.problem(
            WRONG_VERSION,
            f"the server did not serve version {version} right after its push; loading it again",
        )
        try:
            lost = bool(self.job.engine.call(self.job.sync.ensure_loaded()))
        except Exception as exc:
            return f"{WRONG_VERSION}|checking the server again: {exc}"
        if lost or self.job.sync.version != version:
            return f"{WRONG_VERSION}|the server still does not serve version {version}"
        return None

    def problem(self, reason: str, message: str) -> None:
        """Record a watchdog finding (the WeightSync condition, a metric) and publish it."""
        self.job.watchdog.problem(reason, message)
        self.job.monitor.weight_sync_problem(reason)
        if self.job.trainer is not None:
            self.job.publish(
                int(self.job.trainer.state.global_step), phase="Training", message=message
            )

    def _push_adapter(self, version: int) -> str | None:
        """Save the adapter (only its own weights gathered) and load it into the server."""
        trainer = self.job.trainer
        model = trainer.accelerator.unwrap_model(trainer.model_wrapped)
        trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        state: dict[str, Any] = {}
        if is_zero3(self.job.trainer, model):
            import deepspeed

            with deepspeed.zero.GatheredParameters([p for _, p in trained]):
                if self.job.rank == 0:
                    state = {n: p.data.detach().cpu().clone() for n, p in trained}
        elif self.job.rank == 0:
            state = {n: p.data.detach().cpu().clone() for n, p in trained}
        if self.job.rank != 0:
            return None
        from crl_worker.train.weights import AdapterUpdate, push_update

        directory = self.job.settings.adapters_dir / f"v{version}"
        try:
            assert self.job.sync is not None  # pushes happen only with a server to push to
            model.save_pretrained(str(directory), state_dict=state)
            self.job.engine.call(
                self._within_deadline(push_update(self.job.sync, AdapterUpdate(version, directory)))
            )
        except Exception as exc:
            return str(exc)
        self._prune_adapters(version)
        return None

    def _prune_adapters(self, version: int) -> None:
        """Delete adapter folders the server no longer holds (it keeps the newest ``keep``)."""
        keep = self.job.spec.algorithm.max_staleness + 1
        for path in self.job.settings.adapters_dir.glob("v*"):
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
        model = self.job.trainer.accelerator.unwrap_model(self.job.trainer.model_wrapped)
        zero3 = is_zero3(self.job.trainer, model)
        if self.job.rank != 0:
            for _ in gathered(model, zero3):
                pass
            return None
        handoff: queue.Queue[tuple[str, Any] | None] = queue.Queue(maxsize=2)

        def stream() -> Iterator[tuple[str, Any]]:
            while (item := handoff.get()) is not None:
                yield item

        from crl_worker.train.weights import TensorUpdate, push_update

        assert self.job.sync is not None  # pushes happen only with a server to push to
        future = asyncio.run_coroutine_threadsafe(
            self._within_deadline(push_update(self.job.sync, TensorUpdate(version, stream()))),
            self.job.engine.loop,
        )

        def hand(item: tuple[str, Any] | None) -> None:
            # Waits for room, unless the transport has ended (failed): then it is dropped.
            while not future.done():
                try:
                    handoff.put(item, timeout=0.5)
                    return
                except queue.Full:
                    continue

        for item in gathered(model, zero3):
            hand(item)
        hand(None)
        from crl_worker.train.weights import WeightsMismatch

        self._mismatch = False
        try:
            future.result()
        except Exception as exc:
            self._mismatch = isinstance(exc, WeightsMismatch)
            return str(exc)
        return None

    def ensure_current(self, step: int) -> None:
        """Before a batch: the server must hold the current weights (pushed again after a
        restart). A push that keeps failing ends the run (the Job restarts from the last
        checkpoint): rolling out from weights older than ``maxStaleness`` versions, or from a
        server a failed full-weight transfer left paused, would train on the wrong policy."""
        if self.job.sync is None:
            self.job.policy_version = step
            return
        lost = False
        if self.job.rank == 0:
            try:
                lost = bool(self.job.engine.call(self.job.sync.ensure_loaded()))
            except Exception as exc:
                logger.warning("checking the server's weights failed: %s", exc)
        lost = self.job.broadcast(lost)
        full_weights = self.job.settings.weight_sync == "nccl"
        if lost:
            logger.warning("the inference server had lost its weights (restarted?)")
        repush = self.job.watchdog.repush and step > 0
        if step == 0 or (
            self.job.policy_version == step and not (lost and full_weights) and not repush
        ):
            # Up to date; a lost adapter was loaded again by ensure_loaded itself (full
            # weights cannot be: every rank has to gather them, so they are pushed here).
            return
        self.job.watchdog.repush = False
        for attempt in range(PUSH_ATTEMPTS):
            if self._push(step):
                return
            if self.job.watchdog.exhausted():
                raise WeightSyncStopped(
                    f"weight sync failed {self.job.watchdog.problems} times in a row, last: "
                    f"{self.job.watchdog.state.message if self.job.watchdog.state else '?'}"
                )
            lag = step - self.job.policy_version
            if not full_weights and lag <= self.job.spec.algorithm.max_staleness and not repush:
                return  # the adapter of an earlier version is still served: use it
            time.sleep(min(30.0, 2.0 * 2**attempt))
        from crl_worker.errors import InfrastructureError

        raise InfrastructureError(
            f"pushing weights version {step} to the inference server failed {PUSH_ATTEMPTS} "
            f"times; it holds version {self.job.policy_version} (spec.algorithm.maxStaleness is "
            f"{self.job.spec.algorithm.max_staleness})"
        )

    def watch_gap(self, step: int, logs: dict[str, Any], *, off_policy: bool) -> None:
        """The watchdog's third check: the step's trainer-vs-server logprob gap. Above the
        threshold the weights are pushed again before the next batch; a gap that outlasts
        :data:`~crl_worker.train.watchdog.MAX_RECOVERIES` pushes stops the run. ``off_policy``:
        this rank's batch came from older weights (then the gap says nothing of the sync)."""
        if self.job.sync is None:
            return  # in-process generation: the trainer sampled its own logprobs
        if self.job.any_rank(off_policy):
            # Rollouts from older weights (overlap, or a lagging push) differ from the trainer
            # by the updates since, not only by the sync: the gap says nothing about the sync.
            return
        gap = self.job.watchdog.gap(logs)
        # Every rank must take the same branch (the next push is a collective).
        bad = self.job.broadcast(gap is not None and gap > self.job.watchdog.max_gap)
        if not bad:
            self.job.watchdog.step_done()
            return
        self.problem(
            LOGPROB_GAP,
            f"step {step}: the mean logprob gap between trainer and server is {gap:.4g}, above "
            f"{self.job.watchdog.max_gap:g}: the server's weights are not the trainer's; pushing "
            "them again",
        )
        if self.job.watchdog.exhausted():
            raise WeightSyncStopped(
                f"the logprob gap stayed above {self.job.watchdog.max_gap:g} after "
                f"{self.job.watchdog.problems - 1} pushes (last {gap:.4g}): the inference server "
                "does not serve the trained weights"
            )
        self.job.watchdog.repush = True


def is_zero3(trainer: Any, model: Any) -> bool:
    """Whether ``model``'s parameters are ZeRO-3 shards (DeepSpeed stage 3 under ``trainer``)."""
    return bool(trainer.is_deepspeed_enabled) and any(
        hasattr(p, "ds_id") for p in model.parameters()
    )


def gathered(model: Any, zero3: bool) -> Iterator[tuple[str, Any]]:
    """Each parameter whole, one at a time (ZeRO-3 shards gathered on every rank; every rank
    must iterate to the end); copies, because the transport reads them after the gathered
    storage is freed."""
    for name, param in model.named_parameters():
        if zero3:
            import deepspeed

            with deepspeed.zero.GatheredParameters([param]):
                yield name, param.data.detach().clone()
        else:
            yield name, param.data


__all__ = ["PUSH_ATTEMPTS", "WeightPushes", "gathered", "is_zero3"]

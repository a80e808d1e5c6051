"""The trainer's structured log events: log records whose ``event`` extra names what happened
and whose other extras carry the figures (the JSON formatter writes them as keys of the line).

Pods keep them as ordinary JSON log lines; ``crl train`` reads them from the trainer's standard
error to draw its progress display. Torch-free, so the command line can import the names.
"""

from __future__ import annotations

from crl_worker.api.contract import Env

#: Opens the run: ``run`` (its name), ``total_steps``, ``run_dir``.
START_EVENT = "train.start"
#: A resumed run continues after ``step``.
RESUME_EVENT = "train.resume"
#: Closes one optimizer step: ``step``, ``total_steps``, ``reward_mean``, ``resolve_rate``,
#: ``loss``, ``rollouts``, ``infrastructure_failures``, ``rollouts_per_second``,
#: ``staleness_max``, ``step_seconds``, ``weight_pushes``, ``push_seconds``.
STEP_EVENT = "train.step"
#: While a batch runs, at most every :data:`PROGRESS_INTERVAL` seconds (rank 0): ``step`` (the
#: step being rolled out), ``done``, ``total`` (this rank's episodes), ``in_flight``.
ROLLOUTS_EVENT = "train.rollouts"
#: Environment variable: seconds between two rollout progress events.
PROGRESS_INTERVAL_ENV = Env.PROGRESS_INTERVAL
#: Default seconds between two rollout progress events (a heartbeat in a pod's log too).
PROGRESS_INTERVAL = 15.0
#: The weight-sync watchdog found a problem (``reason``, ``message``) or recovered from one.
WEIGHT_SYNC_EVENT = "train.weight_sync"

__all__ = [
    "PROGRESS_INTERVAL",
    "PROGRESS_INTERVAL_ENV",
    "RESUME_EVENT",
    "ROLLOUTS_EVENT",
    "START_EVENT",
    "STEP_EVENT",
    "WEIGHT_SYNC_EVENT",
]

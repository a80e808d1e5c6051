"""What users watch: Prometheus metrics, the status summary and the per-step metrics log.

Rank 0 serves ``/metrics`` on ``CRL_METRICS_PORT`` (the trainer pod's `metrics` port) and, in a
cluster, publishes the small summary the operator copies into the TrainingRun's status
(:mod:`crl_worker.train.report`); on one machine the summary is ``<run dir>/status.json``. Every
step's figures are also appended to ``<run dir>/metrics.jsonl``.

Names (all prefixed ``crl_train_``): ``step``, ``total_steps``, ``policy_version``,
``reward_mean``, ``reward_std``, ``resolve_rate``, ``kl``, ``loss``, ``entropy``,
``tokens_per_second``, ``rollout_seconds`` (histogram), ``staleness`` (histogram, in policy
versions), ``rollouts_total{outcome="resolved|unresolved|infrastructure_failure"}``,
``infrastructure_failures_total``, ``turns_left_out_total``, ``step_seconds``,
``weight_pushes_total{outcome="ok|failed"}``, ``weight_push_seconds`` (histogram),
``weight_sync_problems_total{reason}`` (the watchdog's findings), ``rollouts_in_flight``,
``rollouts_ahead`` and ``rollouts_dropped_total{reason="stale|unplanned"}`` (overlap of
rollouts with training), ``rollout_idle_seconds`` (histogram: sandboxes and inference waiting
between batches).
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

logger = logging.getLogger(__name__)


@dataclass
class RolloutStats:
    """Sums over one step's rollouts on one rank (added across ranks)."""

    rollouts: int = 0
    scored: int = 0
    resolved: int = 0
    infrastructure_failures: int = 0
    reward_sum: float = 0.0
    reward_sq_sum: float = 0.0
    tokens: int = 0
    trained_tokens: int = 0
    turns_left_out: int = 0
    rollout_seconds: list[float] = field(default_factory=list)
    staleness: list[int] = field(default_factory=list)
    dropped_stale: int = 0
    """Rollouts run ahead (overlap) but never trained on: their weights lagged more than
    ``maxStaleness`` versions when their step came (run again instead)."""
    dropped_unplanned: int = 0
    """Rollouts run ahead for a batch TRL did not ask for next (a resume, a misprediction)."""
    idle_seconds: list[float] = field(default_factory=list)
    """Seconds the sandboxes and the server waited between the previous batch's rollouts and
    this one's (the update, the push, a checkpoint), one value per rank."""

    def add(self, other: RolloutStats) -> None:
        """Add another rank's sums to these."""
        for name in (
            "rollouts",
            "scored",
            "resolved",
            "infrastructure_failures",
            "tokens",
            "trained_tokens",
            "turns_left_out",
            "dropped_stale",
            "dropped_unplanned",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.reward_sum += other.reward_sum
        self.reward_sq_sum += other.reward_sq_sum
        self.rollout_seconds.extend(other.rollout_seconds)
        self.staleness.extend(other.staleness)
        self.idle_seconds.extend(other.idle_seconds)

    @property
    def reward_mean(self) -> float | None:
        """Mean reward of the scored rollouts."""
        return self.reward_sum / self.scored if self.scored else None

    @property
    def reward_std(self) -> float | None:
        """Population standard deviation of those rewards."""
        if not self.scored:
            return None
        mean = self.reward_sum / self.scored
        return math.sqrt(max(0.0, self.reward_sq_sum / self.scored - mean * mean))

    @property
    def resolve_rate(self) -> float | None:
        """Resolved share of the scored rollouts."""
        return self.resolved / self.scored if self.scored else None


@dataclass
class StepRecord:
    """One optimizer step's figures (a line of ``metrics.jsonl``)."""

    step: int
    time: str
    policy_version: int | None
    reward_mean: float | None
    reward_std: float | None
    resolve_rate: float | None
    rollouts: int
    infrastructure_failures: int
    kl: float | None
    loss: float | None
    entropy: float | None
    grad_norm: float | None
    tokens_per_second: float | None
    rollouts_per_minute: float | None
    step_seconds: float
    rollout_seconds_mean: float | None
    staleness_max: int | None
    turns_left_out: int
    idle_seconds: float | None = None
    """Seconds rollouts waited for the trainer before this step's batch (mean over ranks;
    None for a process's first step): what overlapping rollouts with training would save."""
    rollouts_dropped: int = 0
    """Rollouts run ahead but not trained on (too stale, or not the batch TRL asked for)."""
    weight_pushes: int = 0
    """Weight pushes since the previous step (retries included)."""
    push_seconds: float = 0.0
    """Their wall time."""
    trl: dict[str, float] = field(default_factory=dict)
    """Everything TRL logged for the step (completion lengths, clip ratios, ...)."""


def _finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


#: The values whose NaN or infinity crl_train_nonfinite_values_total counts (reward first).
NONFINITE_CHECKED = ("reward_mean", "loss", "kl", "grad_norm")


def _is_number(value: Any) -> bool:
    """Whether float() takes the value (NaN and infinities included)."""
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


class Monitor:
    """Metrics, status and the metrics log of one run (rank 0 only does anything visible)."""

    def __init__(
        self,
        run_dir: Path,
        *,
        run_name: str,
        total_steps: int,
        metrics_port: int | None = None,
        enabled: bool = True,
    ) -> None:
        self.run_dir = run_dir
        self.run_name = run_name
        self.total_steps = total_steps
        self.enabled = enabled
        self.infrastructure_failures_total = 0
        self.last_checkpoint: dict[str, Any] | None = None
        self.last: StepRecord | None = None
        self.registry = CollectorRegistry()
        r = self.registry
        self.g_step = Gauge("crl_train_step", "Last finished optimizer step", registry=r)
        self.g_total = Gauge("crl_train_total_steps", "Optimizer steps of the run", registry=r)
        self.g_version = Gauge(
            "crl_train_policy_version", "Weights version the inference server holds", registry=r
        )
        self.g_reward = Gauge("crl_train_reward_mean", "Mean reward of the last step", registry=r)
        self.g_reward_std = Gauge(
            "crl_train_reward_std", "Reward standard deviation of the last step", registry=r
        )
        self.g_resolve = Gauge(
            "crl_train_resolve_rate", "Resolved share of the last step's rollouts", registry=r
        )
        self.g_kl = Gauge("crl_train_kl", "Mean KL to the reference policy", registry=r)
        self.g_loss = Gauge("crl_train_loss", "Loss of the last step", registry=r)
        self.g_entropy = Gauge("crl_train_entropy", "Mean token entropy", registry=r)
        self.g_tps = Gauge(
            "crl_train_tokens_per_second", "Tokens trained on per second of step time", registry=r
        )
        self.g_step_seconds = Gauge(
            "crl_train_step_seconds", "Wall time of the last step (rollouts included)", registry=r
        )
        self.h_rollout = Histogram(
            "crl_train_rollout_seconds",
            "Wall time of one rollout (sandbox lease to verdict)",
            buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600),
            registry=r,
        )
        self.h_staleness = Histogram(
            "crl_train_staleness",
            "Policy versions a rollout's weights lag behind the trainer",
            buckets=(0, 1, 2, 4, 8, 16),
            registry=r,
        )
        self.c_rollouts = Counter(
            "crl_train_rollouts", "Finished rollouts by outcome", ["outcome"], registry=r
        )
        self.c_infra = Counter(
            "crl_train_infrastructure_failures",
            "Rollouts left out because their infrastructure failed",
            registry=r,
        )
        self.c_left_out = Counter(
            "crl_train_turns_left_out",
            "Turns left out of training samples (chat template re-rendered earlier turns)",
            registry=r,
        )
        self.c_nonfinite = Counter(
            "crl_train_nonfinite_values",
            "Steps whose reward, loss, KL or gradient norm was NaN or infinite (left out of the"
            " gauges above, which keep their last finite value), by metric",
            ["metric"],
            registry=r,
        )
        for metric in NONFINITE_CHECKED:
            # Exported at 0 from the start, so a first NaN shows as an increase.
            self.c_nonfinite.labels(metric)
        self.c_pushes = Counter(
            "crl_train_weight_pushes",
            "Weight pushes to the inference server by outcome",
            ["outcome"],
            registry=r,
        )
        self.h_push = Histogram(
            "crl_train_weight_push_seconds",
            "Wall time of one weight push (gathering, transfer and the served-version check)",
            buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600),
            registry=r,
        )
        self.c_sync_problems = Counter(
            "crl_train_weight_sync_problems",
            "Weight-sync watchdog findings by reason",
            ["reason"],
            registry=r,
        )
        self.h_idle = Histogram(
            "crl_train_rollout_idle_seconds",
            "Seconds sandboxes and inference waited between two batches' rollouts",
            buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600),
            registry=r,
        )
        self.g_in_flight = Gauge(
            "crl_train_rollouts_in_flight", "Rollouts running on this rank now", registry=r
        )
        self.g_ahead = Gauge(
            "crl_train_rollouts_ahead",
            "Rollouts of later steps' batches started on this rank and not finished (overlap)",
            registry=r,
        )
        self.c_dropped = Counter(
            "crl_train_rollouts_dropped",
            "Rollouts run ahead but not trained on, by reason (stale: older than maxStaleness;"
            " unplanned: not the batch asked for next)",
            ["reason"],
            registry=r,
        )
        for reason in ("stale", "unplanned"):
            self.c_dropped.labels(reason)
        self.g_quarantined = Gauge(
            "crl_train_tasks_quarantined",
            "Tasks of the run its pool quarantined when it validated them (never drawn), by reason",
            ["reason"],
            registry=r,
        )
        self.quarantined: dict[str, int] | None = None
        """Tasks left out because the pool quarantined them, per reason (``None``: the pool
        does not validate, or the run has not asked it yet)."""
        self.pushes = 0
        """Weight pushes since the last step record."""
        self.push_seconds = 0.0
        """Their wall time."""
        self.g_total.set(total_steps)
        if enabled and metrics_port is not None:
            start_http_server(metrics_port, registry=r)
            logger.info("Prometheus metrics on :%d/metrics", metrics_port)

    def restore(self, status: Mapping[str, Any] | None) -> None:
        """Carry the last checkpoint over from the status a previous process wrote (resume;
        the failure total is recounted from the metrics log the resume keeps)."""
        if status:
            self.last_checkpoint = status.get("lastCheckpoint")

    def record_step(
        self,
        step: int,
        stats: RolloutStats,
        logs: Mapping[str, Any],
        *,
        policy_version: int | None,
        step_seconds: float,
    ) -> StepRecord:
        """Record a finished step: metrics, the metrics log line, the summary."""
        self.infrastructure_failures_total += stats.infrastructure_failures
        tps = stats.tokens / step_seconds if step_seconds > 0 else None
        rpm = stats.rollouts * 60.0 / step_seconds if step_seconds > 0 else None
        record = StepRecord(
            step=step,
            time=datetime.now(UTC).isoformat(),
            policy_version=policy_version,
            reward_mean=stats.reward_mean,
            reward_std=stats.reward_std,
            resolve_rate=stats.resolve_rate,
            rollouts=stats.rollouts,
            infrastructure_failures=stats.infrastructure_failures,
            kl=_finite(logs.get("kl")),
            loss=_finite(logs.get("loss")),
            entropy=_finite(logs.get("entropy")),
            grad_norm=_finite(logs.get("grad_norm")),
            tokens_per_second=tps,
            rollouts_per_minute=rpm,
            step_seconds=step_seconds,
            rollout_seconds_mean=(
                sum(stats.rollout_seconds) / len(stats.rollout_seconds)
                if stats.rollout_seconds
                else None
            ),
            staleness_max=max(stats.staleness) if stats.staleness else None,
            turns_left_out=stats.turns_left_out,
            idle_seconds=(
                sum(stats.idle_seconds) / len(stats.idle_seconds) if stats.idle_seconds else None
            ),
            rollouts_dropped=stats.dropped_stale + stats.dropped_unplanned,
            weight_pushes=self.pushes,
            push_seconds=self.push_seconds,
            trl={k: v for k, v in ((k, _finite(v)) for k, v in logs.items()) if v is not None},
        )
        self.last = record
        self.pushes, self.push_seconds = 0, 0.0
        if not self.enabled:
            return record
        self.g_step.set(step)
        raws = {"reward_mean": stats.reward_mean, **{k: logs.get(k) for k in NONFINITE_CHECKED[1:]}}
        for metric, raw in raws.items():
            if raw is not None and _finite(raw) is None and _is_number(raw):
                self.c_nonfinite.labels(metric).inc()
        if policy_version is not None:
            self.g_version.set(policy_version)
        for gauge, value in (
            (self.g_reward, record.reward_mean),
            (self.g_reward_std, record.reward_std),
            (self.g_resolve, record.resolve_rate),
            (self.g_kl, record.kl),
            (self.g_loss, record.loss),
            (self.g_entropy, record.entropy),
            (self.g_tps, record.tokens_per_second),
        ):
            if value is not None:
                gauge.set(value)
        self.g_step_seconds.set(step_seconds)
        for seconds in stats.rollout_seconds:
            self.h_rollout.observe(seconds)
        for lag in stats.staleness:
            self.h_staleness.observe(lag)
        if record.idle_seconds is not None:
            self.h_idle.observe(record.idle_seconds)
        unresolved = stats.scored - stats.resolved
        self.c_rollouts.labels("resolved").inc(stats.resolved)
        self.c_rollouts.labels("unresolved").inc(unresolved)
        self.c_rollouts.labels("infrastructure_failure").inc(stats.infrastructure_failures)
        self.c_infra.inc(stats.infrastructure_failures)
        self.c_left_out.inc(stats.turns_left_out)
        self.c_dropped.labels("stale").inc(stats.dropped_stale)
        self.c_dropped.labels("unplanned").inc(stats.dropped_unplanned)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with (self.run_dir / "metrics.jsonl").open("a") as out:
            out.write(json.dumps(asdict(record)) + "\n")
        return record

    def weight_push(self, seconds: float, *, ok: bool) -> None:
        """Count one weight push and its duration."""
        self.pushes += 1
        self.push_seconds += seconds
        if self.enabled:
            self.c_pushes.labels("ok" if ok else "failed").inc()
            self.h_push.observe(seconds)

    def weight_sync_problem(self, reason: str) -> None:
        """Count one watchdog finding."""
        if self.enabled:
            self.c_sync_problems.labels(reason).inc()

    def tasks_quarantined(self, reasons: Mapping[str, int]) -> None:
        """Note the tasks the pool quarantined (per reason) for the gauge and the summary."""
        self.quarantined = dict(reasons)
        if self.enabled:
            for reason, count in reasons.items():
                self.g_quarantined.labels(reason).set(count)

    def checkpoint_saved(self, step: int, path: Path) -> None:
        """Note a checkpoint for the summary."""
        self.last_checkpoint = {
            "step": step,
            "path": str(path),
            "time": datetime.now(UTC).isoformat(),
        }

    def summary(
        self,
        step: int,
        *,
        policy_version: int | None,
        finished: bool = False,
        phase: str | None = None,
        message: str | None = None,
    ) -> dict[str, Any]:
        """The status summary (camelCase, the shape of ``TrainingProgress``)."""
        last = self.last
        metrics: dict[str, Any] = {"infrastructureFailures": self.infrastructure_failures_total}
        if last is not None:
            for key, value in (
                ("rewardMean", last.reward_mean),
                ("rewardStd", last.reward_std),
                ("resolveRate", last.resolve_rate),
                ("kl", last.kl),
                ("rolloutsPerMinute", last.rollouts_per_minute),
                ("tokensPerSecond", last.tokens_per_second),
            ):
                if value is not None:
                    metrics[key] = value
        summary: dict[str, Any] = {
            "step": step,
            "totalSteps": self.total_steps,
            "policyVersion": policy_version,
            "lastCheckpoint": self.last_checkpoint,
            "metrics": metrics,
            "finished": finished,
            "phase": phase,
            "message": message,
        }
        if self.quarantined is not None:
            summary["quarantined"] = {
                "tasks": sum(self.quarantined.values()),
                "reasons": self.quarantined,
            }
        return summary

    def write_status(self, summary: Mapping[str, Any]) -> None:
        """Write ``status.json`` atomically (the local view of the summary)."""
        if not self.enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.run_dir, prefix=".status.", suffix=".json")
        with os.fdopen(fd, "w") as out:
            json.dump(summary, out, indent=2)
            out.write("\n")
        os.replace(tmp, self.run_dir / "status.json")


def read_status(run_dir: Path) -> dict[str, Any] | None:
    """The ``status.json`` a previous process left (``None`` when absent or unreadable)."""
    try:
        data = json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def merge_stats(parts: Sequence[RolloutStats]) -> RolloutStats:
    """The sums of every rank's stats."""
    total = RolloutStats()
    for part in parts:
        total.add(part)
    return total

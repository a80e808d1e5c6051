"""Status fields read off the workers' progress reports (pure): a TrainingRun's step, policy
version, checkpoint, metrics and weight-sync finding from its trainer's report, a Benchmark's
progress and results from its runner's. A report that is missing or malformed changes nothing:
what was recorded stays."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from crl_operator import conditions as c
from crl_operator.children import Obj
from crl_operator.conditions import Cond, cond, timestamp

# --- both kinds -----------------------------------------------------------------------------

#: Seconds a TrainingRun or Benchmark whose worker Job succeeded waits for the worker's last
#: report (``finished: true``) before it says Succeeded without it.
FINAL_REPORT_GRACE = 30.0


def final_report_wait(
    report: Obj | None, succeeded: bool, completion: str | None, now: datetime
) -> float:
    """Seconds the resource still waits for its worker's last report before it says Succeeded
    (0: it does not wait).

    The Job's completion and the worker's last write to its progress ConfigMap reach the
    operator as two watch events, in either order: a resource that said Succeeded at the Job's
    would show, to whoever reads it then, the progress of the report before the last. So it
    waits while the report it read is not the last (``succeeded``: the Job succeeded), for at
    most :data:`FINAL_REPORT_GRACE` from the Job's ``completion`` (a worker whose last publish
    failed). A worker of which no report was read is not waited for.
    """
    if not succeeded or report is None or report.get("finished"):
        return 0.0
    return _grace_left(completion, now)


def _grace_left(completion: str | None, now: datetime) -> float:
    if not completion:
        return FINAL_REPORT_GRACE
    done = datetime.fromisoformat(completion.replace("Z", "+00:00"))
    return max(0.0, FINAL_REPORT_GRACE - (now - done).total_seconds())


def awaiting_final_report(status: Mapping[str, Any]) -> bool:
    """Whether ``status`` says its resource waits for the worker's last report."""
    succeeded = c.find(status.get("conditions"), c.SUCCEEDED)
    return succeeded is not None and succeeded.get("reason") == c.AWAITING_REPORT


def final_report_requeue(status: Mapping[str, Any], now: datetime) -> float | None:
    """When a resource whose computed ``status`` waits for the worker's last report should be
    reconciled again, if no event comes first (None: it does not wait)."""
    if not awaiting_final_report(status):
        return None
    completion = status.get("completionTime")
    return _grace_left(str(completion) if completion else None, now) + 1.0


# --- TrainingRun ----------------------------------------------------------------------------


def weight_sync_condition(report: Obj | None, previous: Mapping[str, Any]) -> Cond | None:
    """The `WeightSync` condition from the trainer's report (its watchdog's last finding); the
    recorded one while no report says anything of it; none before the first."""
    found = (report or {}).get("weightSync")
    if isinstance(found, Mapping):
        return cond(
            c.WEIGHT_SYNC, bool(found["ok"]), str(found["reason"]), str(found.get("message", ""))
        )
    for entry in previous.get("conditions") or ():
        if entry.get("type") == c.WEIGHT_SYNC:
            return Cond.stored(entry)
    return None


def trainer_says(report: Obj | None) -> str:
    """The trainer's report in a few words for the Training condition: `step 12/200,
    checkpointing: <message>` ("" without a report)."""
    if report is None:
        return ""
    out = f"step {report['step']}/{report['totalSteps']}"
    if report.get("phase"):
        out += f", {report['phase']}"
    if report.get("message"):
        out += f": {report['message']}"
    return out


def significant(value: float, digits: int = 6) -> float:
    """`value` rounded to `digits` significant digits (a reward of 0.123456789 reads 0.123457,
    a KL of 1.23456789e-05 keeps its magnitude)."""
    return float(f"{value:.{digits}g}")


def training_progress(report: Obj | None, previous: Mapping[str, Any]) -> dict[str, Any]:
    """`step`, `policyVersion`, `lastCheckpoint` and `metrics` from the trainer's report.

    Without a report (not written yet, malformed, or gone) what was recorded stays; a report
    that says nothing of a checkpoint, a policy version or metrics (none yet) keeps the recorded
    ones too, so a restarted trainer's first report does not blank them.
    """
    keys = ("step", "policyVersion", "lastCheckpoint", "metrics")
    out = {k: previous[k] for k in keys if previous.get(k) is not None}
    if report is None:
        return out
    out["step"] = int(report["step"])
    if report.get("policyVersion") is not None:
        out["policyVersion"] = int(report["policyVersion"])
    checkpoint = report.get("lastCheckpoint")
    if checkpoint:
        ref: dict[str, Any] = {"step": int(checkpoint["step"]), "path": str(checkpoint["path"])}
        if checkpoint.get("time"):
            when = datetime.fromisoformat(str(checkpoint["time"]).replace("Z", "+00:00"))
            ref["time"] = timestamp(when)
        out["lastCheckpoint"] = ref
    metrics = report.get("metrics")
    if metrics:
        out["metrics"] = {
            k: significant(v) if isinstance(v, float) else v
            for k, v in metrics.items()
            if v is not None
        }
    return out


# --- Benchmark ------------------------------------------------------------------------------


def benchmark_results(report: Obj | None, progress: Obj | None, prev: Obj) -> dict[str, Any]:
    """`resolveRate`, `passAtK` and `comparison`: the runner's report says them exactly; without
    one (not written yet, malformed, or gone) what was recorded stays."""
    if report is None:
        return {k: prev[k] for k in ("resolveRate", "passAtK", "comparison") if k in prev}
    out: dict[str, Any] = {}
    rate = report.get("resolveRate")
    if rate is None and progress is not None:
        # Resolved over finished attempts; an infrastructure failure is not a wrong answer.
        finished = progress["done"] - progress["errored"]
        if finished > 0:
            rate = progress["resolved"] / finished
    if rate is not None:
        out["resolveRate"] = round(float(rate), 6)
    if report.get("passAtK"):
        out["passAtK"] = [
            {"k": int(p["k"]), "value": round(float(p["value"]), 6)}
            for p in sorted(report["passAtK"], key=lambda p: int(p["k"]))
        ]
    if report.get("comparison"):
        out["comparison"] = dict(report["comparison"])
    return out


def benchmark_progress(
    report: Obj | None, previous: Obj | None, total: int | None
) -> dict[str, Any] | None:
    """Progress from the runner's report, else what was recorded, else the known total."""
    if report is not None:
        done = int(report.get("done", 0))
        tot = int(report.get("total", total or 0))
        return {
            "total": tot,
            "done": done,
            "resolved": int(report.get("resolved", 0)),
            "errored": int(report.get("errored", 0)),
            "summary": f"{done}/{tot}",
        }
    if previous is not None:
        return dict(previous)
    if total is not None:
        return {"total": total, "done": 0, "resolved": 0, "errored": 0, "summary": f"0/{total}"}
    return None


# --- RolloutPool ----------------------------------------------------------------------------


def pool_validation(report: Obj | None, previous: Mapping[str, Any]) -> dict[str, Any]:
    """`status.validation` of a pool that validates its tasks, from its gateway's report; the
    recorded one without a report; `Validating` with nothing counted before the first."""
    if report is None:
        recorded = previous.get("validation")
        if isinstance(recorded, Mapping):
            return dict(recorded)
        return {"state": "Validating", "total": 0, "validated": 0, "quarantined": 0}
    reasons = sorted(
        ((str(k), int(v)) for k, v in (report.get("reasons") or {}).items()),
        key=lambda kv: (-kv[1], kv[0]),
    )
    out: dict[str, Any] = {
        "state": "Done" if report.get("finished") else "Validating",
        "total": int(report["total"]),
        "validated": int(report["validated"]),
        "quarantined": int(report["quarantined"]),
        "cached": int(report.get("cached", 0)),
    }
    if reasons:
        out["reasons"] = [{"reason": k[:128], "count": v} for k, v in reasons]
    return out


def reasons_in_words(validation: Mapping[str, Any]) -> str:
    """`gold patch does not resolve (3), flaky tests (1)`: the most common reasons first."""
    return ", ".join(f"{r['reason']} ({r['count']})" for r in validation.get("reasons") or ())


def validation_condition(validation: Mapping[str, Any]) -> Cond:
    """`TasksValidated`: False (`Validating`) until the gateway's last report, then True; False
    (`NoValidTasks`) when it quarantined every task."""
    counts = (
        f"{validation['validated']}/{validation['total']} tasks validated,"
        f" {validation['quarantined']} quarantined"
    )
    if validation.get("reasons"):
        counts += f": {reasons_in_words(validation)}"
    if validation.get("state") != "Done":
        return cond(c.TASKS_VALIDATED, False, c.VALIDATING, f"validating before serving; {counts}")
    if validation["total"] and validation["quarantined"] >= validation["total"]:
        # Nothing to serve: a pool of broken tasks is not ready to train or benchmark on.
        return cond(c.TASKS_VALIDATED, False, c.NO_VALID_TASKS, f"no task to serve; {counts}")
    return cond(c.TASKS_VALIDATED, True, c.VALIDATED, counts)


__all__ = [
    "FINAL_REPORT_GRACE",
    "awaiting_final_report",
    "benchmark_progress",
    "benchmark_results",
    "final_report_requeue",
    "final_report_wait",
    "pool_validation",
    "reasons_in_words",
    "significant",
    "trainer_says",
    "training_progress",
    "validation_condition",
    "weight_sync_condition",
]

"""The Kubernetes Events a person wants in `kubectl describe`, from one status transition.

Pure: the previous status and the newly computed one in, the events to post out. The reconcile
posts them when it writes the status (a transition happens at most once per write; an event
posted twice is merged by its name). Failures are posted by the reconcile's warning on Ready
(`InvalidSpec`, `ApplyFailed`, `JobFailed`, `PruneFailed`) with their reason and message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from crl_operator import conditions as c

#: Event reasons (the REASON column of `kubectl get events`).
CHILDREN_CREATED = "ChildrenCreated"
INFERENCE_READY = "InferenceReady"
ADMITTED = "Admitted"
PREEMPTED = "Preempted"
TRAINER_STARTED = "TrainerStarted"
RUNNER_STARTED = "RunnerStarted"
CHECKPOINT_WRITTEN = "CheckpointWritten"
SUCCEEDED = "Succeeded"
TASKS_VALIDATED = "TasksValidated"
TASKS_QUARANTINED = "TasksQuarantined"

#: status.children keys in words.
_CHILD_WORDS = {
    "configMap": "ConfigMap",
    "inferenceDeployment": "inference Deployment",
    "inferenceService": "inference Service",
    "trainerJob": "trainer Job",
    "trainerService": "trainer Service",
    "rolloutPool": "RolloutPool",
    "runnerJob": "runner Job",
    "gatewayDeployment": "gateway Deployment",
}


@dataclass(frozen=True)
class Event:
    """One event to post: its type (Normal or Warning), reason and message."""

    type: str
    reason: str
    message: str


def _status_of(status: Mapping[str, Any] | None, type_: str) -> str | None:
    found = c.find((status or {}).get("conditions"), type_)
    return None if found is None else str(found.get("status"))


def _message_of(status: Mapping[str, Any], type_: str) -> str:
    found = c.find(status.get("conditions"), type_)
    return "" if found is None else str(found.get("message") or "")


def _turned_true(prev: Mapping[str, Any] | None, new: Mapping[str, Any], type_: str) -> bool:
    return _status_of(new, type_) == "True" and _status_of(prev, type_) != "True"


def _queue_state(status: Mapping[str, Any]) -> str | None:
    queue = status.get("queue")
    return str(queue.get("state")) if isinstance(queue, Mapping) else None


def _evicted(prev: Mapping[str, Any], computed: Mapping[str, Any]) -> bool:
    """Kueue took an admitted run's quota back (preemption, pods not ready in time, ...)."""
    return _queue_state(prev) == "Admitted" and _queue_state(computed) in ("Preempted", "Evicted")


def transition_events(
    kind: str, previous: Mapping[str, Any] | None, computed: Mapping[str, Any]
) -> list[Event]:
    """The events of going from `previous` to `computed` status (both may lack any field)."""
    prev = previous or {}
    out: list[Event] = []
    old_children = prev.get("children") or {}
    new_children = computed.get("children") or {}
    created = [
        f"{_CHILD_WORDS.get(key, key)} {name}"
        for key, name in sorted(new_children.items())
        if isinstance(name, str) and old_children.get(key) != name
    ]
    if created:
        out.append(Event("Normal", CHILDREN_CREATED, "created " + ", ".join(created)))
    if _turned_true(prev, computed, c.INFERENCE_READY):
        found = c.find(computed.get("conditions"), c.INFERENCE_READY) or {}
        if found.get("reason") != c.NOT_SERVED:  # an external endpoint: nothing became ready
            message = _message_of(computed, c.INFERENCE_READY)
            out.append(Event("Normal", INFERENCE_READY, f"inference is ready ({message})"))
    if kind == "TrainingRun":
        if _turned_true(prev, computed, c.ADMITTED):
            out.append(Event("Normal", ADMITTED, _message_of(computed, c.ADMITTED)))
        admitted = c.find(computed.get("conditions"), c.ADMITTED) or {}
        if (
            _status_of(prev, c.ADMITTED) == "True"
            and admitted.get("status") == "False"
            and admitted.get("reason") == c.JOB_SUSPENDED
        ):
            message = "the trainer Job was suspended (preempted, e.g. by Kueue); it resumes from"
            out.append(Event("Warning", PREEMPTED, f"{message} its last checkpoint"))
        if _evicted(prev, computed):
            message = _message_of(computed, c.ADMITTED)
            out.append(Event("Warning", PREEMPTED, f"evicted by Kueue: {message}"))
        if _turned_true(prev, computed, c.TRAINING):
            out.append(Event("Normal", TRAINER_STARTED, _message_of(computed, c.TRAINING)))
        checkpoint = computed.get("lastCheckpoint")
        if isinstance(checkpoint, Mapping) and checkpoint != prev.get("lastCheckpoint"):
            where = f"step {checkpoint.get('step')} at {checkpoint.get('path')}"
            out.append(Event("Normal", CHECKPOINT_WRITTEN, f"checkpoint written: {where}"))
    if kind == "Benchmark" and _turned_true(prev, computed, c.RUNNING):
        out.append(Event("Normal", RUNNER_STARTED, _message_of(computed, c.RUNNING)))
    if kind == "RolloutPool":
        out += _validation_events(prev, computed)
    if _turned_true(prev, computed, c.SUCCEEDED):
        out.append(Event("Normal", SUCCEEDED, _message_of(computed, c.SUCCEEDED)))
    return out


def _validation_events(prev: Mapping[str, Any], computed: Mapping[str, Any]) -> list[Event]:
    """A pool's validation finishing: a warning naming the most common reasons when it
    quarantined tasks, else a normal event."""
    new = computed.get("validation")
    old = prev.get("validation")
    if not isinstance(new, Mapping) or new.get("state") != "Done":
        return []
    if isinstance(old, Mapping) and old.get("state") == "Done":
        return []
    counts = f"validated {new.get('validated')} tasks"
    if not new.get("quarantined"):
        return [Event("Normal", TASKS_VALIDATED, f"{counts}, none quarantined")]
    reasons = ", ".join(f"{r['reason']} ({r['count']})" for r in new.get("reasons") or ())
    message = f"{counts}, quarantined {new.get('quarantined')} (never leased): {reasons}"
    return [Event("Warning", TASKS_QUARANTINED, message)]

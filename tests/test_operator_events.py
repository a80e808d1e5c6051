"""The Events the operator posts on status transitions (crl_operator.events, pure), fed with
status objects the operator really wrote (the Argo CD health fixtures, captured by
tests/test_gitops_e2e.py); tests/test_gitops_e2e.py checks the posted events on a live cluster."""

from __future__ import annotations

from typing import Any

import yaml

from crl_operator.events import (
    ADMITTED,
    CHECKPOINT_WRITTEN,
    CHILDREN_CREATED,
    INFERENCE_READY,
    PREEMPTED,
    RUNNER_STARTED,
    SUCCEEDED,
    TRAINER_STARTED,
    transition_events,
)

from .fixtures.argocd_health import GROUP_DIR


def status(kind: str, fixture: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((GROUP_DIR / kind / "testdata" / fixture).read_text())
    return dict(doc["status"])


def reasons(kind: str, prev: dict[str, Any] | None, new: dict[str, Any]) -> list[str]:
    return [e.reason for e in transition_events(kind, prev, new)]


def test_a_new_run_reports_its_children_and_inference() -> None:
    pending = status("TrainingRun", "progressing_trainer_pending.yaml")
    events = transition_events("TrainingRun", None, pending)
    assert [e.reason for e in events] == [CHILDREN_CREATED, INFERENCE_READY, ADMITTED]
    assert "trainer Job" in events[0].message and "inference Deployment" in events[0].message
    assert all(e.type == "Normal" for e in events)


def test_nothing_changed_posts_nothing() -> None:
    pending = status("TrainingRun", "progressing_trainer_pending.yaml")
    assert transition_events("TrainingRun", pending, pending) == []


def test_kueue_preempting_the_trainer_is_a_warning() -> None:
    pending = status("TrainingRun", "progressing_trainer_pending.yaml")
    queued = status("TrainingRun", "suspended_queued_by_kueue.yaml")
    [event] = transition_events("TrainingRun", pending, queued)
    assert (event.type, event.reason) == ("Warning", PREEMPTED)
    # Admitted again: a Normal event, no Preempted.
    assert reasons("TrainingRun", queued, pending) == [ADMITTED]


def test_training_starts_checkpoints_and_succeeds() -> None:
    pending = status("TrainingRun", "progressing_trainer_pending.yaml")
    training = status("TrainingRun", "progressing_training.yaml")
    assert reasons("TrainingRun", pending, training) == [TRAINER_STARTED]
    saved = {**training, "lastCheckpoint": {"step": 10, "path": "step-10", "time": "t"}}
    [event] = transition_events("TrainingRun", training, saved)
    assert event.reason == CHECKPOINT_WRITTEN and "step 10 at step-10" in event.message
    done = status("TrainingRun", "healthy_succeeded.yaml")
    assert SUCCEEDED in reasons("TrainingRun", pending, done)


def test_a_benchmark_s_runner_and_an_external_endpoint() -> None:
    pending = status("Benchmark", "progressing_runner_pending.yaml")
    running = status("Benchmark", "progressing_running.yaml")
    assert reasons("Benchmark", pending, running) == [RUNNER_STARTED]
    # The hosted-endpoint example serves nothing itself: no InferenceReady event.
    assert INFERENCE_READY not in reasons("Benchmark", None, pending)
    assert SUCCEEDED in reasons("Benchmark", running, status("Benchmark", "healthy_succeeded.yaml"))

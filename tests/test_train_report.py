"""The trainer's progress report: what it may say, and how it reaches the API server.

The reporter tests run against a real API server (the `cluster` fixture): the progress ConfigMap
and the trainer's ServiceAccount, Role and RoleBinding are the builders' own children, applied as
the operator applies them, and the reporter acts with a TokenRequest token of that
ServiceAccount, as a trainer pod would.
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from crl_operator.builders import RenderState, progress_name, render
from crl_operator.builders.trainer import job_name
from crl_worker.api import TrainingRun
from crl_worker.api.contract import PROGRESS_KEY
from crl_worker.api.contract import TRAINER_FIELD_MANAGER as FIELD_MANAGER
from crl_worker.api.progress import MAX_REPORT_CHARS, TrainingProgress
from crl_worker.api.validation import load_resources
from crl_worker.rollout.report import ConfigMapReporter
from crl_worker.train.report import training_reporter_from_env

from .fixtures.cluster import Cluster
from .fixtures.paths import ROOT

REPORT: dict[str, Any] = {
    "step": 12,
    "totalSteps": 200,
    "policyVersion": 12,
    "lastCheckpoint": {"step": 10, "path": "step-10", "time": "2026-01-01T12:00:00Z"},
    "metrics": {
        "rewardMean": 0.25,
        "rewardStd": 0.4,
        "resolveRate": 0.125,
        "kl": 0.0012,
        "rolloutsPerMinute": 42.0,
        "tokensPerSecond": 1800.5,
        "infrastructureFailures": 3,
    },
    "phase": "training",
}


def run() -> TrainingRun:
    [resource] = load_resources(str(ROOT / "examples" / "trainingrun-qwen3-8b-swe-gym.yaml"))
    assert isinstance(resource, TrainingRun)
    return resource


def trainer_children(namespace: str) -> list[dict[str, Any]]:
    """The progress ConfigMap and the trainer's ServiceAccount, Role and RoleBinding."""
    wanted = {"ConfigMap", "ServiceAccount", "Role", "RoleBinding"}
    return [
        c
        for c in render(run(), namespace, RenderState(inference_ready=True))
        if c["kind"] in wanted and not c["metadata"]["name"].endswith("-config")
    ]


def operator_apply(cluster: Cluster, objects: list[dict[str, Any]]) -> None:
    """Server-side apply as the operator does (its field manager, forced)."""
    for obj in objects:
        cluster.kubectl(
            "apply", "--server-side", "--force-conflicts",
            "--field-manager=coderepairrl-operator", "-f", "-", input=json.dumps(obj),
        )  # fmt: skip


def config_map(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    out = cluster.kubectl(
        "get", "configmap", name, "-n", namespace, "-o", "json", "--show-managed-fields"
    )
    return dict(json.loads(out.stdout))


@pytest.fixture
def trainer(cluster: Cluster, namespace: str) -> Path:
    """The trainer's identity in `namespace`; returns a kubeconfig acting as it."""
    operator_apply(cluster, trainer_children(namespace))
    return cluster.service_account_kubeconfig(job_name(run()), namespace)


# --- against the API server -------------------------------------------------------------------


async def test_the_trainer_patches_its_progress_and_nothing_else(
    cluster: Cluster, namespace: str, trainer: Path, caplog: pytest.LogCaptureFixture
) -> None:
    name = progress_name(run())
    env = {"CRL_PROGRESS_CONFIGMAP": name, "POD_NAMESPACE": namespace, "KUBECONFIG": str(trainer)}
    reporter = training_reporter_from_env(env)
    assert isinstance(reporter, ConfigMapReporter)
    await reporter.publish(REPORT)
    assert (reporter.sent, reporter.failures) == (1, 0)
    live = config_map(cluster, namespace, name)
    written = TrainingProgress.parse(live["data"][PROGRESS_KEY])
    assert (written.step, written.total_steps, written.policy_version) == (12, 200, 12)
    assert written.last_checkpoint is not None and written.last_checkpoint.path == "step-10"
    assert written.metrics is not None and written.metrics.infrastructure_failures == 3
    assert written.updated_at is not None  # filled in when the trainer did not say
    # The key is the trainer's (its own field manager); the labels stay the operator's.
    managers = {m["manager"]: json.dumps(m["fieldsV1"]) for m in live["metadata"]["managedFields"]}
    assert f"f:{PROGRESS_KEY}" in managers[FIELD_MANAGER]
    assert "f:data" not in managers["coderepairrl-operator"]

    # The operator applying its children again (forced) leaves the trainer's key alone.
    operator_apply(cluster, trainer_children(namespace))
    assert config_map(cluster, namespace, name)["data"] == live["data"]

    # Closing waits for nothing in flight and frees the client; a later publish reconnects.
    await reporter.aclose()
    await reporter.publish({**REPORT, "step": 200, "finished": True, "phase": "done"})
    assert (reporter.sent, reporter.failures) == (2, 0)
    final = TrainingProgress.parse(config_map(cluster, namespace, name)["data"][PROGRESS_KEY])
    assert (final.step, final.finished) == (200, True)
    await reporter.aclose()

    # Another ConfigMap is refused (403), logged, and never raises into the training.
    cluster.kubectl("create", "configmap", "other", "-n", namespace, "--from-literal=a=b")
    elsewhere = training_reporter_from_env({**env, "CRL_PROGRESS_CONFIGMAP": "other"})
    assert isinstance(elsewhere, ConfigMapReporter)
    with caplog.at_level(logging.WARNING, logger="crl_worker.rollout.report"):
        await elsewhere.publish(REPORT)
    assert (elsewhere.sent, elsewhere.failures) == (0, 1)
    assert "403" in caplog.text and "other" in caplog.text
    assert config_map(cluster, namespace, "other")["data"] == {"a": "b"}
    for verb, what in (("delete", f"configmap/{name}"), ("get", "secrets"), ("list", "pods")):
        can = cluster.kubectl(
            "auth", "can-i", verb, what, "-n", namespace, kubeconfig=trainer, check=False
        )
        assert can.stdout.strip() == "no", (verb, what)


# --- one machine, no API server ---------------------------------------------------------------


def test_no_reporter_outside_a_cluster() -> None:
    assert training_reporter_from_env({}) is None
    reporter = training_reporter_from_env(
        {"CRL_PROGRESS_CONFIGMAP": "r-progress", "POD_NAMESPACE": "ns"}
    )
    assert isinstance(reporter, ConfigMapReporter)
    assert (reporter.namespace, reporter.name) == ("ns", "r-progress")
    assert (reporter.field_manager, reporter.key, reporter.model) == (
        FIELD_MANAGER,
        PROGRESS_KEY,
        TrainingProgress,
    )
    assert reporter.kubeconfig is None  # in a pod: the ServiceAccount's token


async def test_an_invalid_report_is_logged_not_sent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    reporter = ConfigMapReporter(
        "ns", "p", kubeconfig=str(tmp_path / "unused"), model=TrainingProgress
    )
    with caplog.at_level(logging.ERROR, logger="crl_worker.rollout.report"):
        await reporter.publish({"step": 201, "totalSteps": 200})
    assert (reporter.sent, reporter.failures) == (0, 0)
    assert "exceeds totalSteps" in caplog.text


def test_a_number_json_cannot_carry_is_an_unknown_metric() -> None:
    report = TrainingProgress.model_validate(
        {**REPORT, "metrics": {"rewardMean": 0.5, "rewardStd": math.nan, "kl": math.inf}}
    ).to_wire()
    assert report["metrics"] == {"rewardMean": 0.5}
    # What the reporter sends is strict JSON, which the operator reads back.
    text = json.dumps(report, allow_nan=False)
    assert TrainingProgress.parse(text).to_wire()["metrics"] == {"rewardMean": 0.5}


def test_a_malformed_metrics_block_is_dropped_but_the_step_counts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    text = json.dumps({**REPORT, "metrics": {"resolveRate": 1.5, "kl": 0.1}})
    with caplog.at_level(logging.WARNING, logger="crl_worker.api.progress"):
        report = TrainingProgress.parse(text).to_wire()
    assert "metrics" not in report and report["step"] == 12
    assert "resolveRate" in caplog.text


def test_unknown_keys_are_ignored_and_times_get_a_zone() -> None:
    text = json.dumps(
        {
            **REPORT,
            "futureKey": {"x": 1},
            "metrics": {**REPORT["metrics"], "entropy": 1.2},
            "lastCheckpoint": {"step": 10, "path": "./step-10", "time": "2026-01-01T12:00:00"},
        }
    )
    report = TrainingProgress.parse(text).to_wire()
    assert "futureKey" not in report and "entropy" not in report["metrics"]
    assert report["lastCheckpoint"] == {
        "step": 10,
        "path": "step-10",
        "time": "2026-01-01T12:00:00Z",
    }


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"step": 201}, "exceeds totalSteps"),
        ({"step": -1}, "step"),
        ({"step": 2**53, "totalSteps": 2**53}, "less than or equal to 9007199254740991"),
        ({"policyVersion": -1}, "policyVersion"),
        ({"lastCheckpoint": {"step": 10, "path": "/checkpoints/step-10"}}, "relative"),
        ({"lastCheckpoint": {"step": 10, "path": "../other-run/step-10"}}, "relative"),
        ({"lastCheckpoint": {"step": 10, "path": "."}}, "relative"),
        ({"lastCheckpoint": {"step": 10}}, "lastCheckpoint.path"),
        ({"message": "x" * 2000}, "message"),
        ({"pad": "x" * MAX_REPORT_CHARS}, "characters"),
    ],
)
def test_a_malformed_report_is_refused_with_the_reason(
    change: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ValueError, match="malformed progress report") as err:
        TrainingProgress.parse(json.dumps({**REPORT, **change}))
    assert problem in str(err.value)


def test_the_torch_free_modules_import_without_torch() -> None:
    """The operator imports launch and report; it never installs torch or the trainer."""
    code = (
        "import sys, crl_worker.api.launch, crl_worker.train.report, crl_operator.builders;"
        " heavy = {'torch', 'transformers', 'trl', 'deepspeed', 'kubernetes'} & set(sys.modules);"
        " assert not heavy, heavy"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr

"""A TrainingRun's status follows its trainer's progress report.

The pure part: the status computed from a report (crl_operator.status). The end-to-end part:
`python -m crl_operator` against the real control plane, with the test playing the trainer: it
publishes reports into the run's progress ConfigMap with the trainer's own ServiceAccount (a
TokenRequest token, as a trainer pod would mount) and watches the TrainingRun's status. The
trainer pod itself stays Pending (a node selector no node matches), so its Job never finishes.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from crl_operator.apply import Kube
from crl_operator.patches import status_patch
from crl_operator.status import Observed, trainingrun_status
from crl_worker.api import TrainingRun
from crl_worker.api.progress import TrainingProgress
from crl_worker.train.report import training_reporter_from_env
from crl_worker.train.settings import resolve_settings
from crl_worker.train.sft import Records

from .fixtures.cluster import Cluster
from .fixtures.operator_process import Operator
from .fixtures.paths import ROOT
from .fixtures.resources import (
    PENDING_TRAINER,
    apply,
    condition,
    owned,
    small_run,
    wait_for,
)
from .fixtures.status_objects import T0, T1, children, job_with, load, ready_pool, run_model

REPORT: dict[str, Any] = {
    "step": 12,
    "totalSteps": 200,
    "policyVersion": 12,
    "lastCheckpoint": {"step": 10, "path": "step-10", "time": "2026-01-01T12:00:00Z"},
    "metrics": {
        "rewardMean": 0.123456789,
        "rewardStd": 0.4,
        "resolveRate": 0.125,
        "kl": 1.23456789e-05,
        "rolloutsPerMinute": 42.0,
        "tokensPerSecond": 1800.5,
        "infrastructureFailures": 3,
    },
    "phase": "training",
    "message": "waiting for rollouts",
}


def wire(report: dict[str, Any]) -> dict[str, Any]:
    """A report as the reconcile hands it to the status: parsed and validated."""
    return TrainingProgress.parse(json.dumps(report)).to_wire()


# --- the status computed from a report (pure) -------------------------------------------------


def running(run: TrainingRun) -> tuple[dict[str, Any], ...]:
    """The run's children with its trainer Job running (both pods ready)."""
    kids = children(run, inference_ready=True)
    return tuple(
        job_with(k, ready=2, startTime="2026-01-01T11:00:00Z") if k["kind"] == "Job" else k
        for k in kids
    )


def test_status_follows_the_trainers_report() -> None:
    run = run_model()
    kids = running(run)
    before = trainingrun_status(run, Observed(children=kids, pool=ready_pool()), None, T0)
    # Before any report: the spec's total, nothing the trainer would say.
    assert before["totalSteps"] == run.spec.algorithm.steps == 400
    assert not {"step", "policyVersion", "lastCheckpoint", "metrics"} & set(before)
    assert before["children"]["configMap"] == "qwen3-8b-swe-gym-config"  # not the progress one

    seen = Observed(children=kids, pool=ready_pool(), report=wire(REPORT))
    st = trainingrun_status(run, seen, before, T1)
    # The trainer's own total wins over the spec's: it is what really runs.
    assert (st["step"], st["totalSteps"], st["policyVersion"]) == (12, 200, 12)
    assert st["lastCheckpoint"] == {"step": 10, "path": "step-10", "time": "2026-01-01T12:00:00Z"}
    assert st["metrics"] == {
        "rewardMean": 0.123457,  # six significant digits
        "rewardStd": 0.4,
        "resolveRate": 0.125,
        "kl": 1.23457e-05,  # small values keep their magnitude
        "rolloutsPerMinute": 42.0,
        "tokensPerSecond": 1800.5,
        "infrastructureFailures": 3,
    }
    # The status schema accepts exactly this.
    TrainingRun.model_validate({**run.model_dump(by_alias=True), "status": st})
    training = next(x for x in st["conditions"] if x["type"] == "Training")
    assert training["status"] == "True"
    assert training["message"] == "2/2 pods ready; step 12/200, training: waiting for rollouts"

    # No readable report (malformed, or gone): everything recorded stays; only the Training
    # condition no longer repeats what the trainer is doing.
    kept = trainingrun_status(run, Observed(children=kids, pool=ready_pool()), st, T1)
    assert set(status_patch("TrainingRun", st, kept)) == {"conditions"}
    assert kept["totalSteps"] == 200
    training = next(x for x in kept["conditions"] if x["type"] == "Training")
    assert (training["status"], training["message"]) == ("True", "2/2 pods ready")

    # A restarted trainer's first report says no checkpoint or metrics yet: those stay too.
    restarted = wire({"step": 10, "totalSteps": 200, "phase": "loading"})
    later = trainingrun_status(
        run, Observed(children=kids, pool=ready_pool(), report=restarted), st, T1
    )
    patch = status_patch("TrainingRun", st, later)
    assert patch["step"] == 10
    assert not {"lastCheckpoint", "metrics", "policyVersion"} & set(patch)


def test_an_sft_trainers_reports_become_the_status(tmp_path: Path) -> None:
    """What the supervised trainer's records publish (crl_worker.train.sft) is what the
    operator reads: its steps, checkpoints and throughput reach the TrainingRun's status."""
    example = ROOT / "examples" / "local-trainingrun-toy-sft.yaml"
    settings = resolve_settings(example, output=tmp_path)
    sent: list[dict[str, Any]] = []
    records = Records(settings, 0, sent.append)
    records.status(0, "Training")
    records.on_log(1, {"loss": 2.5, "num_tokens": 640.0, "learning_rate": 0.01})
    (tmp_path / "checkpoint-4").mkdir()
    records.on_save(4)
    records.status(8, "Succeeded")
    assert [r["step"] for r in sent] == [0, 1, 4, 8]
    assert sent[-1]["finished"] and not sent[-2]["finished"]
    # Another rank writes nothing and publishes nothing.
    Records(settings, 1, sent.append).status(3, "Training")
    assert len(sent) == 4

    run = TrainingRun.model_validate(load("local-trainingrun-toy-sft.yaml"))
    kids = tuple(job_with(k, ready=1, active=1) if k["kind"] == "Job" else k for k in children(run))
    st = trainingrun_status(run, Observed(children=kids, pool=None, report=wire(sent[2])), None, T0)
    assert (st["step"], st["totalSteps"], st["policyVersion"]) == (4, 200, 4)
    assert st["lastCheckpoint"]["path"] == "step-4"
    assert (tmp_path / "step-4").resolve() == (tmp_path / "checkpoint-4").resolve()
    assert st["metrics"]["tokensPerSecond"] > 0
    training = next(x for x in st["conditions"] if x["type"] == "Training")
    assert training["status"] == "True"
    assert "step 4/200" in training["message"]
    TrainingRun.model_validate({**run.model_dump(by_alias=True), "status": st})
    assert json.loads((tmp_path / "status.json").read_text())["step"] == 8


# --- end to end ---------------------------------------------------------------------------------


def evaluation_template() -> dict[str, Any]:
    """The example run's evaluation Benchmark template."""
    doc = yaml.safe_load((ROOT / "examples" / "trainingrun-qwen3-8b-swe-gym.yaml").read_text())
    return dict(doc["spec"]["evaluation"]["benchmark"])


def test_training_run_status_follows_the_trainers_reports(
    cluster: Cluster, kube: Kube, operator: Operator, namespace: str
) -> None:
    name = "trained"
    doc = small_run(
        name,
        trainer=PENDING_TRAINER,
        evaluation={"everySteps": 10, "benchmark": evaluation_template()},
    )
    apply(cluster, namespace, copy.deepcopy(doc))
    trainer, progress = f"{name}-trainer", f"{name}-progress"

    def run() -> dict[str, Any]:
        return kube.get("TrainingRun", namespace, name) or {}

    def trainer_children() -> dict[tuple[str, str], dict[str, Any]] | None:
        if not run():
            return None
        kids = owned(kube, namespace, run()["metadata"]["uid"])
        wanted = {("Job", trainer), ("ServiceAccount", trainer), ("Role", trainer),
                  ("RoleBinding", trainer), ("ConfigMap", progress)}  # fmt: skip
        return kids if wanted <= set(kids) else None

    kids = wait_for(
        "the trainer Job, its identity and its progress ConfigMap", trainer_children, op=operator
    )
    pod = kids[("Job", trainer)]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == trainer and pod["automountServiceAccountToken"] is True
    [container] = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert (env["CRL_PROGRESS_CONFIGMAP"], env["CRL_METRICS_PORT"]) == (progress, "9400")
    assert {"name": "metrics", "containerPort": 9400, "protocol": "TCP"} in container["ports"]
    assert "data" not in kids[("ConfigMap", progress)]
    assert run()["status"]["totalSteps"] == 200 and "step" not in run()["status"]

    kubeconfig = cluster.service_account_kubeconfig(trainer, namespace)
    reporter = training_reporter_from_env(
        {"CRL_PROGRESS_CONFIGMAP": progress, "POD_NAMESPACE": namespace,
         "KUBECONFIG": str(kubeconfig)}
    )  # fmt: skip
    assert reporter is not None

    async def publish(report: dict[str, Any]) -> None:
        await reporter.publish(report)
        await reporter.aclose()

    asyncio.run(publish(REPORT))
    st = wait_for(
        "status.step from the first report",
        lambda: (s := run().get("status") or {}).get("step") == 12 and s,
        op=operator,
    )
    assert (st["totalSteps"], st["policyVersion"]) == (200, 12)
    assert st["lastCheckpoint"] == {"step": 10, "path": "step-10", "time": "2026-01-01T12:00:00Z"}
    assert st["metrics"]["rewardMean"] == 0.123457
    assert st["metrics"]["infrastructureFailures"] == 3
    # The reported checkpoint is the run's evaluation point: its Benchmark follows.
    wait_for(
        "the evaluation Benchmark of step 10",
        lambda: (
            ("Benchmark", f"{name}-eval-10") in owned(kube, namespace, run()["metadata"]["uid"])
        ),
        op=operator,
    )

    # Reports the operator cannot use are logged and ignored; the status keeps the last good
    # one, and the reconcile does not fail (a report never blocks the run's conditions).
    errors = operator.reconciles("TrainingRun", "error")
    bad = [
        ({"step": 5}, "totalSteps: Field required"),
        ({"step": 1, "totalSteps": 2, "pad": "x" * 70_000}, "characters, more than the"),
        ({"step": 2**64, "totalSteps": 2**64}, "less than or equal to 9007199254740991"),
        ({"step": 1, "totalSteps": 2, "lastCheckpoint": {"step": 1, "path": "/x"}}, "relative"),
    ]
    for report, logged in bad:
        cluster.kubectl("patch", "configmap", progress, "-n", namespace, "--type", "merge",
                        "-p", json.dumps({"data": {"progress.json": json.dumps(report)}}))  # fmt: skip
        wait_for(
            f"the operator to log the report it cannot use ({logged})",
            lambda logged=logged: logged in operator.proc.log_tail(400),
            op=operator,
        )
        assert "ignoring the progress report of TrainingRun" in operator.proc.log_tail(400)
        assert run()["status"]["step"] == 12
    assert operator.reconciles("TrainingRun", "error") == errors
    assert condition(run(), "Ready").get("reason") not in ("ApplyFailed", "InvalidSpec")

    # The next good report counts; what it does not say (no new checkpoint) stays.
    asyncio.run(publish({"step": 13, "totalSteps": 200, "policyVersion": 13,
                         "metrics": {"rewardMean": 0.5}}))  # fmt: skip
    st = wait_for(
        "status.step from the second report",
        lambda: (s := run().get("status") or {}).get("step") == 13 and s,
        op=operator,
    )
    assert st["policyVersion"] == 13
    assert st["lastCheckpoint"]["step"] == 10
    assert st["metrics"] == {"rewardMean": 0.5}

    # The trainer's report is not the operator's business: its applies leave the key alone.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        cm = kube.get("ConfigMap", namespace, progress) or {}
        assert json.loads(cm["data"]["progress.json"])["step"] == 13
        time.sleep(1)


def test_the_watchdogs_finding_is_the_weight_sync_condition() -> None:
    run = run_model()
    kids = running(run)
    before = trainingrun_status(run, Observed(children=kids, pool=ready_pool()), None, T0)
    assert not [x for x in before["conditions"] if x["type"] == "WeightSync"]

    hung = wire(
        {
            **REPORT,
            "weightSync": {
                "ok": False,
                "reason": "PushTimedOut",
                "message": "pushing version 12 failed: the push did not finish within 600 s",
            },
        }
    )
    st = trainingrun_status(
        run, Observed(children=kids, pool=ready_pool(), report=hung), before, T0
    )
    found = next(x for x in st["conditions"] if x["type"] == "WeightSync")
    assert (found["status"], found["reason"]) == ("False", "PushTimedOut")
    assert "did not finish within 600 s" in found["message"]
    TrainingRun.model_validate({**run.model_dump(by_alias=True), "status": st})

    # A report without it (a restarted trainer's first) keeps what was recorded; the recovery
    # flips it back, with a new transition time.
    quiet = trainingrun_status(
        run, Observed(children=kids, pool=ready_pool(), report=wire(REPORT)), st, T1
    )
    kept = next(x for x in quiet["conditions"] if x["type"] == "WeightSync")
    assert kept == {**found, "lastTransitionTime": found["lastTransitionTime"]}
    healed = wire(
        {**REPORT, "weightSync": {"ok": True, "reason": "Recovered", "message": "serving v12"}}
    )
    after = trainingrun_status(
        run, Observed(children=kids, pool=ready_pool(), report=healed), quiet, T1
    )
    flipped = next(x for x in after["conditions"] if x["type"] == "WeightSync")
    assert (flipped["status"], flipped["reason"]) == ("True", "Recovered")
    assert flipped["lastTransitionTime"] != found["lastTransitionTime"]

    # A reason that is not CamelCase is refused with the report (the API would refuse it).
    with pytest.raises(ValueError, match=r"weightSync\.reason"):
        wire({**REPORT, "weightSync": {"ok": False, "reason": "push timed out"}})

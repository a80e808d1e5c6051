"""The pure side of Kueue admission: the Workload a run renders and the admission read from a
Workload's status (crl_operator.builders.workload, crl_operator.status.workload_admission).

The Workload statuses below are Kueue v0.17's own, as tests/test_kueue.py saw them."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from crl_operator.builders import RenderState, render, resolve_checkpoint
from crl_operator.builders.meta import KUEUE_QUEUE_LABEL
from crl_operator.status import workload_admission
from crl_worker.api import Benchmark, TrainingRun
from crl_worker.api.validation import load_resources

from .paths import ROOT
from .test_operator_e2e import PENDING_TRAINER, small_run


def run(**scheduling: Any) -> TrainingRun:
    doc = small_run("r", trainer={**PENDING_TRAINER, "nodes": 2, "gpusPerNode": 4})
    doc["metadata"].update(namespace="ns", uid="u-1")
    doc["spec"]["scheduling"] = {"queueName": "team-a", **scheduling}
    return TrainingRun.model_validate(doc)


def kinds(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["kind"]: o for o in objs if o["kind"] in ("Workload", "Deployment", "Job")}


def test_a_queued_run_renders_its_workload_and_no_gpu_pod() -> None:
    objs = render(run(), "ns", RenderState(inference_ready=True, queued=True, admitted=False))
    got = kinds(objs)
    assert set(got) == {"Workload"}
    assert {o["kind"] for o in objs} == {"Workload", "ConfigMap"}  # config and last report
    wl = got["Workload"]
    assert objs[0] is wl  # applied first
    assert wl["spec"]["queueName"] == "team-a"
    sets = {p["name"]: p for p in wl["spec"]["podSets"]}
    assert {n: p["count"] for n, p in sets.items()} == {"inference": 1, "trainer": 2}
    [trainer] = sets["trainer"]["template"]["spec"]["containers"]
    assert trainer["resources"]["requests"]["nvidia.com/gpu"] == 4
    assert sets["trainer"]["template"]["spec"]["nodeSelector"] == {"crl-test/never": "true"}
    assert set(trainer) == {"name", "image", "resources"}  # nothing Kueue does not read
    for obj in objs:
        assert KUEUE_QUEUE_LABEL not in obj["metadata"]["labels"]


def test_an_admitted_run_renders_its_children_without_kueue_labels() -> None:
    objs = render(run(), "ns", RenderState(inference_ready=True, queued=True, admitted=True))
    got = kinds(objs)
    assert set(got) == {"Workload", "Deployment", "Job"}
    assert got["Deployment"]["spec"]["replicas"] == 1
    for obj in (got["Deployment"], got["Job"]):
        assert KUEUE_QUEUE_LABEL not in obj["spec"]["template"]["metadata"]["labels"]


def test_priority_class_and_value_go_together() -> None:
    objs = render(
        run(workloadPriorityClassName="high"),
        "ns",
        RenderState(queued=True, admitted=False, workload_priority=1000),
    )
    spec = kinds(objs)["Workload"]["spec"]
    assert spec["priorityClassRef"] == {
        "group": "kueue.x-k8s.io",
        "kind": "WorkloadPriorityClass",
        "name": "high",
    }
    assert spec["priority"] == 1000


def test_without_kueue_or_when_finished_there_is_no_workload() -> None:
    assert "Workload" not in kinds(render(run(), "ns", RenderState(inference_ready=True)))
    done = RenderState(queued=True, admitted=True, finished=True)
    assert "Workload" not in kinds(render(run(), "ns", done))


def cond(type_: str, status: str, reason: str, message: str = "") -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message}


ADMISSION = {"clusterQueue": "cq-a", "podSetAssignments": []}
PENDING = "couldn't assign flavors to pod set trainer: insufficient unused quota for nvidia.com/gpu in flavor gpu, 2 more needed"
TOO_BIG = (
    "couldn't assign flavors to pod set trainer: insufficient quota for nvidia.com/gpu in flavor"
    " gpu, previously considered podsets requests (1) + current podset request (8) > maximum"
    " capacity (4)"
)


@pytest.mark.parametrize(
    ("status", "state", "reason", "admitted", "reserved"),
    [
        ({}, "Queued", "Queued", False, False),
        ({"conditions": [cond("QuotaReserved", "False", "Pending", PENDING)]}, "Queued", "Pending", False, False),
        ({"conditions": [cond("QuotaReserved", "False", "Pending", TOO_BIG)]}, "Queued", "ExceedsQuota", False, False),
        ({"conditions": [cond("QuotaReserved", "False", "Inadmissible", "LocalQueue team-a doesn't exist")]}, "Queued", "Inadmissible", False, False),
        ({"admission": ADMISSION, "conditions": [cond("QuotaReserved", "True", "QuotaReserved"), cond("Admitted", "True", "Admitted")]}, "Admitted", "Admitted", True, True),
        ({"admission": ADMISSION, "conditions": [cond("Admitted", "True", "Admitted"), cond("Evicted", "True", "Preempted", "Preempted to accommodate a workload")]}, "Preempted", "Preempted", False, True),
        ({"conditions": [cond("QuotaReserved", "False", "Pending"), cond("Evicted", "True", "Preempted")]}, "Preempted", "Preempted", False, False),
        ({"admission": ADMISSION, "conditions": [cond("Evicted", "True", "PodsReadyTimeout", "Exceeded the PodsReady timeout")]}, "Evicted", "PodsReadyTimeout", False, True),
    ],
)  # fmt: skip
def test_admission_from_the_workload_status(
    status: dict[str, Any], state: str, reason: str, admitted: bool, reserved: bool
) -> None:
    got = workload_admission("team-a", {"status": status}, kueue=True)
    assert (got.state, got.reason, got.admitted, got.reserved) == (
        state,
        reason,
        admitted,
        reserved,
    )
    assert got.condition().status == ("True" if admitted else "False")
    assert got.status()["name"] == "team-a"


def test_admission_without_kueue_and_before_the_workload() -> None:
    absent = workload_admission("team-a", None, kueue=False)
    assert (absent.state, absent.reason, absent.admitted) == ("Unqueued", "KueueAbsent", True)
    assert "not installed" in absent.message
    missing = workload_admission("team-a", None, kueue=True)
    assert (missing.state, missing.reason, missing.admitted) == ("Queued", "WorkloadMissing", False)


def test_a_benchmark_serving_a_checkpoint_queues_server_and_runner_together() -> None:
    """examples/benchmark-swe-bench-verified.yaml serves a TrainingRun's checkpoint: its
    Workload holds the vLLM replicas and the runner; neither exists before admission."""
    [trainer] = load_resources(str(ROOT / "examples" / "trainingrun-qwen3-8b-swe-gym.yaml"))
    [bench] = load_resources(str(ROOT / "examples" / "benchmark-swe-bench-verified.yaml"))
    assert isinstance(trainer, TrainingRun) and isinstance(bench, Benchmark)
    bench.metadata.uid = "u-2"
    state = RenderState(inference_ready=True, checkpoint=resolve_checkpoint(bench, trainer))
    got = kinds(render(bench, "ns", replace(state, queued=True, admitted=False)))
    assert set(got) == {"Workload"}
    sets = {p["name"]: p["count"] for p in got["Workload"]["spec"]["podSets"]}
    assert sets == {"inference": 2, "runner": 1}
    admitted = kinds(render(bench, "ns", replace(state, queued=True, admitted=True)))
    assert set(admitted) == {"Workload", "Deployment", "Job"}

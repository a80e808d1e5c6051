"""The pure side of Kueue admission: the Workload a run renders and the admission read from a
Workload's status (crl_operator.builders.workload, crl_operator.status.workload_admission).

The Workload statuses below are Kueue v0.17's own, as tests/test_kueue.py saw them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest

from crl_operator.admission import pods_ready_condition, workload_admission
from crl_operator.apply import Kube, fingerprint
from crl_operator.builders import RenderState, render, resolve_checkpoint
from crl_operator.builders.meta import KUEUE_QUEUE_LABEL
from crl_operator.cache import Cache
from crl_operator.reconcile import Reconciler
from crl_operator.writes import with_fingerprint
from crl_worker.api import Benchmark, TrainingRun
from crl_worker.api.validation import load_resources

from .fixtures.paths import ROOT
from .fixtures.resources import PENDING_TRAINER, small_run


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
        # After the operator released the quota: Kueue's backoff holds Requeued=False until it ends.
        ({"conditions": [cond("QuotaReserved", "False", "Pending"), cond("Requeued", "False", "PodsReadyTimeout"), cond("Evicted", "True", "PodsReadyTimeout", "Exceeded the PodsReady timeout")]}, "Evicted", "PodsReadyTimeout", False, False),
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


class FakeKube(Kube):
    """No API server: records every request and answers as the server would, keeping the
    status of what is in `cache` (a server-side apply returns the live object)."""

    def __init__(self, cache: Cache) -> None:
        super().__init__(None)  # type: ignore[arg-type]
        self.cache = cache
        self.calls: list[tuple[str, str, Any]] = []

    def request(
        self,
        method: str,
        kind: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """Record the request; echo an applied or patched object with a new resourceVersion."""
        self.calls.append((method, kind, body))
        if method == "PATCH" and content_type == "application/apply-patch+yaml":
            obj = json.loads(body)
            live = self.cache.get(
                obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"]
            )
            status = (live or {}).get("status")
            obj["metadata"]["resourceVersion"] = str(len(self.calls))
            return {**obj, **({"status": status} if status else {})}
        if method == "PATCH" and kind.endswith("/status"):  # a merge patch of the status
            parts = path.split("/")
            live = self.cache.get(kind.removesuffix("/status"), parts[-4], parts[-2]) or {}
            status = {**(live.get("status") or {}), **body["status"]}
            meta = {**(live.get("metadata") or {}), "resourceVersion": str(len(self.calls))}
            return {
                **live,
                "metadata": meta,
                "status": {k: v for k, v in status.items() if v is not None},
            }
        return {}


def _evicted_run(reason: str | None, message: str = "") -> tuple[Cache, FakeKube, str]:
    """An admitted run (its Workload, ConfigMaps, vLLM Deployment, trainer Job and pool in the
    cache) whose Workload Kueue has just evicted with `reason` (None: still admitted)."""
    doc = small_run("r", trainer=dict(PENDING_TRAINER))
    doc["metadata"].update(namespace="ns", uid="u-1", resourceVersion="1", generation=1)
    doc["spec"]["scheduling"] = {"queueName": "team-a"}
    doc["status"] = {"queue": {"name": "team-a", "state": "Admitted", "clusterQueue": "cq-a"}}
    cache = Cache()
    cache.upsert(doc)
    state = RenderState(inference_ready=True, queued=True, admitted=True)
    for child in render(TrainingRun.model_validate(doc), "ns", state):
        child = with_fingerprint(child, fingerprint(child))
        child["metadata"].update(uid=f"uid-{child['metadata']['name']}", resourceVersion="1")
        if child["kind"] == "Workload":
            child["status"] = {
                "admission": ADMISSION,
                "conditions": [
                    cond("QuotaReserved", "True", "QuotaReserved"),
                    cond("Admitted", "True", "Admitted"),
                    *([cond("Evicted", "True", reason, message)] if reason else []),
                ],
            }
        cache.upsert(child)
    assert {"Deployment", "Job", "RolloutPool"} <= {c["kind"] for c in cache.owned("u-1")}
    return cache, FakeKube(cache), "u-1"


def test_a_pods_ready_timeout_eviction_stops_the_run_like_a_preemption() -> None:
    """Kueue's waitForPodsReady evicted the run: one reconcile deletes the trainer Job, the vLLM
    Deployment and the inline pool (the trainer gets SIGTERM and checkpoints), the status says
    why (state Evicted, reason PodsReadyTimeout, a Warning event), and once nothing runs the
    Workload's quota is released as Kueue's job integrations do it for this reason: Requeued
    stays False until Kueue's backoff ends (Kueue then sets it True and readmits)."""
    message = "Exceeded the PodsReady timeout ns/r-workload"
    cache, kube, uid = _evicted_run("PodsReadyTimeout", message)
    outcome = Reconciler(kube, cache).reconcile(("TrainingRun", "ns", "r"))
    assert outcome.result == "ok", outcome

    deleted = {kind for method, kind, _ in kube.calls if method == "DELETE"}
    assert {"Deployment", "Job", "RolloutPool"} <= deleted, kube.calls
    # What a queued run keeps: its Workload and the ConfigMaps (the trainer's last report).
    assert {c["kind"] for c in cache.owned(uid)} == {"Workload", "ConfigMap"}

    [release] = [body for method, kind, body in kube.calls if kind == "Workload/status"]
    assert release["status"]["admission"] is None
    assert release["metadata"]["resourceVersion"] == "1"  # a precondition: Kueue's changes win
    conds = {x["type"]: x for x in release["status"]["conditions"]}
    assert (conds["Requeued"]["status"], conds["Requeued"]["reason"]) == (
        "False",
        "PodsReadyTimeout",
    )
    assert (conds["QuotaReserved"]["status"], conds["QuotaReserved"]["reason"]) == (
        "False",
        "Pending",
    )
    assert conds["Admitted"]["status"] == "False"
    assert conds["Evicted"]["status"] == "True"  # Kueue's own condition is kept
    # The next admission's pods start over: Kueue's timeout must count again.
    assert (conds["PodsReady"]["status"], conds["PodsReady"]["reason"]) == ("False", "WaitForStart")

    [status] = [body["status"] for method, kind, body in kube.calls if kind == "TrainingRun/status"]
    assert status["queue"]["state"] == "Evicted"
    got = {x["type"]: x for x in status["conditions"]}
    assert (got["Admitted"]["status"], got["Admitted"]["reason"]) == ("False", "PodsReadyTimeout")
    assert got["Ready"]["reason"] == "PodsReadyTimeout"
    assert message in got["Admitted"]["message"]
    events = [body for method, kind, body in kube.calls if kind == "Event"]
    warnings = [(e["type"], e["reason"]) for e in events if e["type"] == "Warning"]
    assert ("Warning", "Preempted") in warnings, events


def test_a_preemption_takes_the_same_path_and_is_requeued_at_once() -> None:
    """The same run preempted: the same children stop; Requeued is True (Kueue queues it again
    at once, no backoff), as Kueue's job integrations write it."""
    cache, kube, _ = _evicted_run("Preempted", "Preempted to accommodate a workload")
    assert Reconciler(kube, cache).reconcile(("TrainingRun", "ns", "r")).result == "ok"
    deleted = {kind for method, kind, _ in kube.calls if method == "DELETE"}
    assert {"Deployment", "Job", "RolloutPool"} <= deleted, kube.calls
    [release] = [body for method, kind, body in kube.calls if kind == "Workload/status"]
    conds = {x["type"]: x for x in release["status"]["conditions"]}
    assert (conds["Requeued"]["status"], conds["Requeued"]["reason"]) == ("True", "Preempted")


def _ready(cache: Cache, uid: str) -> None:
    """Mark the run's vLLM Deployment available and its trainer Job's pods ready."""
    for child in cache.owned(uid):
        if child["kind"] == "Deployment":
            child["status"] = {
                "observedGeneration": 1,
                "updatedReplicas": 1,
                "availableReplicas": 1,
            }
        if child["kind"] == "Job":
            child["status"] = {"ready": child["spec"].get("parallelism") or 1}
        child["metadata"]["generation"] = 1
        cache.upsert(child)


def _pods_ready_patches(kube: FakeKube) -> list[tuple[str, str]]:
    out = []
    for _, kind, body in kube.calls:
        if kind == "Workload/status":
            found = {x["type"]: x for x in body["status"]["conditions"]}["PodsReady"]
            out.append((found["status"], found["reason"]))
    return out


def test_the_operator_reports_pods_ready_for_kueue_s_wait_for_pods_ready() -> None:
    """Kueue writes PodsReady only for its own integrations' jobs (a Workload the operator owns
    would be evicted by waitForPodsReady however healthy its pods): the operator writes it,
    as those integrations do. WaitForStart until every pod set's pods are ready, then Started,
    once; no write while nothing changes."""
    cache, kube, uid = _evicted_run(None)
    reconciler = Reconciler(kube, cache)
    assert reconciler.reconcile(("TrainingRun", "ns", "r")).result == "ok"
    assert _pods_ready_patches(kube) == [("False", "WaitForStart")]
    assert reconciler.reconcile(("TrainingRun", "ns", "r")).result == "ok"
    assert _pods_ready_patches(kube) == [("False", "WaitForStart")]  # unchanged: no write
    _ready(cache, uid)
    assert reconciler.reconcile(("TrainingRun", "ns", "r")).result == "ok"
    assert _pods_ready_patches(kube) == [("False", "WaitForStart"), ("True", "Started")]
    [_, patch] = [b for _, kind, b in kube.calls if kind == "Workload/status"]
    assert patch["metadata"]["resourceVersion"]  # a precondition: Kueue's changes win


def test_pods_ready_follows_kueue_s_job_integrations() -> None:
    """Kueue's generatePodsReadyCondition, for the pod sets of the operator's Workload."""
    workload = {
        "spec": {"podSets": [{"name": "inference"}, {"name": "trainer"}]},
        "status": {"admission": ADMISSION, "conditions": [cond("Admitted", "True", "Admitted")]},
    }
    labels = {"app.kubernetes.io/component": "inference"}
    serving = {"kind": "Deployment", "metadata": {"labels": labels, "generation": 1},
               "spec": {"replicas": 1},
               "status": {"observedGeneration": 1, "updatedReplicas": 1, "availableReplicas": 1}}  # fmt: skip
    trainer = {"kind": "Job", "metadata": {"labels": {"app.kubernetes.io/component": "trainer"}},
               "spec": {"parallelism": 2}, "status": {"ready": 2}}  # fmt: skip
    assert pods_ready_condition(workload, [serving])[:2] == ("False", "WaitForStart")
    assert pods_ready_condition(workload, [serving, trainer])[:2] == ("True", "Started")
    was_ready = {**workload, "status": {**workload["status"], "conditions": [
        cond("Admitted", "True", "Admitted"), cond("PodsReady", "True", "Started")]}}  # fmt: skip
    failing = {**trainer, "status": {"ready": 1}}
    assert pods_ready_condition(was_ready, [serving, failing])[:2] == ("False", "WaitForRecovery")
    recovering = {**workload, "status": {**workload["status"], "conditions": [
        cond("Admitted", "True", "Admitted"), cond("PodsReady", "False", "WaitForRecovery")]}}  # fmt: skip
    assert pods_ready_condition(recovering, [serving, trainer])[:2] == ("True", "Recovered")
    not_admitted = {**workload, "status": {"conditions": [cond("PodsReady", "True", "Started")]}}
    assert pods_ready_condition(not_admitted, [serving, trainer])[:2] == ("False", "WaitForStart")

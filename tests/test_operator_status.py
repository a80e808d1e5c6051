"""Pure parts of the operator runtime: status from observed children, conditions, patches,
apply decisions, the cache, the work queue, logging and flags. No cluster: the children are the
builders' real manifests, and each test sets their status as the controllers would."""

from __future__ import annotations

import copy
import json
from datetime import timedelta
from typing import Any

import pytest

from crl_operator import conditions as c
from crl_operator.children import deployment_state, job_state
from crl_operator.patches import status_patch
from crl_operator.status import (
    Observed,
    Problem,
    benchmark_status,
    rolloutpool_status,
    sandbox_state,
    trainingrun_status,
)
from crl_worker.api import Benchmark, TrainingRun
from crl_worker.api.contract import SandboxState
from crl_worker.api.progress import ProgressReport

from .fixtures.status_objects import (
    T0,
    T1,
    children,
    job_with,
    load,
    pod,
    pool_model,
    ready_pool,
    run_model,
)


def by_kind(objs: list[dict[str, Any]], kind: str, component: str | None = None) -> dict[str, Any]:
    for o in objs:
        comp = o["metadata"]["labels"].get("app.kubernetes.io/component")
        if o["kind"] == kind and (component is None or comp == component):
            return o
    raise AssertionError(f"no {kind} {component}")


def deployment_with(
    dep: dict[str, Any], available: int, *, gen_seen: bool = True
) -> dict[str, Any]:
    dep = copy.deepcopy(dep)
    dep["metadata"]["generation"] = 2
    replicas = dep["spec"].get("replicas", 1)
    dep["status"] = {
        "observedGeneration": 2 if gen_seen else 1,
        "replicas": replicas,
        "updatedReplicas": replicas,
        "availableReplicas": available,
    }
    return dep


def conds(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {x["type"]: (x["status"], x["reason"]) for x in status["conditions"]}


# --- children's state ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "status", "generation", "ready"),
    [
        (
            {"replicas": 2},
            {"observedGeneration": 1, "updatedReplicas": 2, "availableReplicas": 2},
            1,
            True,
        ),
        (
            {"replicas": 2},
            {"observedGeneration": 1, "updatedReplicas": 2, "availableReplicas": 1},
            1,
            False,
        ),
        # The controller has not seen the newest spec yet: not ready, whatever the counts say.
        (
            {"replicas": 2},
            {"observedGeneration": 1, "updatedReplicas": 2, "availableReplicas": 2},
            2,
            False,
        ),
        # A rollout in progress: old pods available, new ones not yet.
        (
            {"replicas": 2},
            {"observedGeneration": 2, "updatedReplicas": 1, "availableReplicas": 2},
            2,
            False,
        ),
        ({"replicas": 0}, {"observedGeneration": 1}, 1, False),
        ({}, {"observedGeneration": 1, "updatedReplicas": 1, "availableReplicas": 1}, 1, True),
        ({"replicas": 1}, {}, 1, False),
    ],
)
def test_deployment_ready(
    spec: dict[str, Any], status: dict[str, Any], generation: int, ready: bool
) -> None:
    dep = {"metadata": {"generation": generation}, "spec": spec, "status": status}
    assert deployment_state(dep).ready is ready


@pytest.mark.parametrize(
    ("spec", "status", "phase"),
    [
        ({"parallelism": 2, "completions": 2}, {}, "pending"),
        ({"parallelism": 2, "completions": 2}, {"active": 2, "ready": 1}, "pending"),
        ({"parallelism": 2, "completions": 2}, {"active": 2, "ready": 2}, "running"),
        ({"parallelism": 4, "completions": 2}, {"active": 2, "ready": 2}, "running"),
        ({"suspend": True}, {}, "suspended"),
        ({}, {"conditions": [{"type": "Suspended", "status": "True"}]}, "suspended"),
        (
            {},
            {"conditions": [{"type": "Complete", "status": "True"}], "completionTime": "t"},
            "succeeded",
        ),
        ({}, {"conditions": [{"type": "SuccessCriteriaMet", "status": "True"}]}, "succeeded"),
        (
            {},
            {
                "conditions": [
                    {"type": "Failed", "status": "True", "message": "BackoffLimitExceeded"}
                ]
            },
            "failed",
        ),
        (
            {},
            {"conditions": [{"type": "Complete", "status": "False"}], "active": 1, "ready": 1},
            "running",
        ),
    ],
)
def test_job_phase(spec: dict[str, Any], status: dict[str, Any], phase: str) -> None:
    assert job_state({"spec": spec, "status": status}).phase == phase


def test_failed_job_message_is_carried() -> None:
    js = job_state(
        {
            "status": {
                "conditions": [
                    {
                        "type": "Failed",
                        "status": "True",
                        "message": "Job has reached the specified backoff limit",
                    }
                ]
            }
        }
    )
    assert "backoff limit" in js.message


@pytest.mark.parametrize(
    ("p", "state"),
    [
        (pod(), "ready"),
        (pod(state=SandboxState.READY), "ready"),
        (pod(state=SandboxState.STARTING), "starting"),
        (pod(state="leased"), "leased"),
        (pod(phase="Pending", ready=False), "starting"),
        (pod(ready=False), "starting"),
        (pod(state="resetting"), "starting"),
        (pod(phase="Failed"), "gone"),
        (pod(deleting=True), "gone"),
    ],
)
def test_sandbox_state(p: dict[str, Any], state: str) -> None:
    assert sandbox_state(p) == state


# --- conditions -----------------------------------------------------------------------------


def test_transition_time_changes_only_when_status_flips() -> None:
    first = c.merge_conditions(None, [c.cond("Ready", False, "A", "m1")], generation=1, now=T0)
    same = c.merge_conditions(first, [c.cond("Ready", False, "B", "m2")], generation=2, now=T1)
    assert same[0]["lastTransitionTime"] == "2026-01-01T12:00:00Z"
    assert (same[0]["reason"], same[0]["message"], same[0]["observedGeneration"]) == ("B", "m2", 2)
    flipped = c.merge_conditions(same, [c.cond("Ready", True, "C")], generation=2, now=T1)
    assert flipped[0]["lastTransitionTime"] == "2026-01-01T12:05:00Z"
    unknown = c.merge_conditions(flipped, [c.cond("Ready", None, "D")], generation=2, now=T1)
    assert unknown[0]["status"] == "Unknown"


def test_conditions_not_computed_any_more_are_dropped() -> None:
    before = c.merge_conditions(
        None, [c.cond("Ready", True, "A"), c.cond("Old", True, "A")], generation=1, now=T0
    )
    after = c.merge_conditions(before, [c.cond("Ready", True, "A")], generation=1, now=T1)
    assert [x["type"] for x in after] == ["Ready"]


# --- TrainingRun ------------------------------------------------------------------------------


def test_trainingrun_waits_for_inference() -> None:
    run = run_model()
    kids = children(run)
    dep = deployment_with(by_kind(kids, "Deployment"), available=1)  # of 2
    seen = Observed(children=(*kids, dep), pool=ready_pool())
    st = trainingrun_status(
        run,
        Observed(
            children=tuple([dep, *[k for k in kids if k["kind"] != "Deployment"]]),
            pool=ready_pool(),
        ),
        None,
        T0,
    )
    assert "Job" not in [k["kind"] for k in kids]  # the trainer waits for inference
    got = conds(st)
    assert got["InferenceReady"] == ("False", "DeploymentProgressing")
    assert got["Training"] == ("False", "WaitingForInference")
    assert got["Ready"] == ("False", "DeploymentProgressing")
    assert st["startTime"] == "2026-01-01T12:00:00Z"
    assert st["observedGeneration"] == 3
    assert st["totalSteps"] == run.spec.algorithm.steps
    assert seen.of_kind("Job") is None


def test_an_in_process_trainingrun_serves_nothing_and_starts_at_once() -> None:
    run = run_model(generation="in-process", trainer={"nodes": 1, "gpusPerNode": 0})
    kids = children(run)  # nothing observed yet: no inference to wait for
    assert "Deployment" not in [k["kind"] for k in kids]
    assert not [k for k in kids if k["metadata"]["labels"].get("app.kubernetes.io/component")
                in ("inference", "inference-peers")]  # fmt: skip
    job = by_kind(kids, "Job")
    env = {e["name"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert not {"CRL_INFERENCE_URL", "CRL_WEIGHT_SYNC", "CRL_INFERENCE_PEERS"} & env
    want = job["spec"]["parallelism"]
    running = job_with(job, active=want, ready=want)
    rest = [k for k in kids if k["kind"] != "Job"]
    st = trainingrun_status(run, Observed(children=(running, *rest), pool=ready_pool()), None, T0)
    got = conds(st)
    assert got["InferenceReady"] == ("True", "NotServed")
    assert got["Training"] == ("True", "JobRunning")
    assert got["Ready"] == ("True", "Reconciled")


def test_in_process_generation_needs_one_trainer_pod() -> None:
    rule = TrainingRun.model_json_schema()["$defs"]["TrainingRunSpec"]["x-kubernetes-validations"]
    assert any("self.trainer.nodes == 1" in r["rule"] for r in rule)


def test_trainingrun_ready_when_inference_sandboxes_and_trainer_are_up() -> None:
    run = run_model()
    kids = children(run, inference_ready=True)
    dep = deployment_with(by_kind(kids, "Deployment"), available=2)
    job = by_kind(kids, "Job")
    want = job["spec"]["parallelism"]
    running = job_with(job, active=want, ready=want)
    rest = [k for k in kids if k["kind"] not in ("Deployment", "Job")]
    st = trainingrun_status(
        run, Observed(children=(dep, running, *rest), pool=ready_pool()), None, T0
    )
    got = conds(st)
    assert got["Ready"] == ("True", "Reconciled")
    assert got["Training"] == ("True", "JobRunning")
    assert got["Admitted"] == ("True", "JobCreated")
    assert got["Suspended"] == ("False", "NotSuspended")
    assert st["children"]["trainerJob"] == job["metadata"]["name"]
    assert (
        st["children"]["inferenceService"]
        == by_kind(kids, "Service", "inference")["metadata"]["name"]
    )
    assert (
        st["children"]["trainerService"] == by_kind(kids, "Service", "trainer")["metadata"]["name"]
    )
    assert st["children"]["rolloutPool"] == by_kind(kids, "RolloutPool")["metadata"]["name"]


def test_kueue_suspended_trainer_is_not_admitted() -> None:
    run = run_model()
    kids = children(run, inference_ready=True)
    job = job_with(by_kind(kids, "Job"))
    job["spec"]["suspend"] = True  # as Kueue sets it while the workload waits in the queue
    dep = deployment_with(by_kind(kids, "Deployment"), available=2)
    st = trainingrun_status(run, Observed(children=(dep, job), pool=ready_pool()), None, T0)
    got = conds(st)
    assert got["Admitted"] == ("False", "JobSuspended")
    assert got["Training"] == ("False", "JobSuspended")
    assert got["Ready"][0] == "False"


@pytest.mark.parametrize(
    ("job_status", "ready", "succeeded", "failed"),
    [
        (
            {
                "conditions": [{"type": "Complete", "status": "True"}],
                "completionTime": "2026-01-01T13:00:00Z",
            },
            ("True", "Reconciled"),
            "True",
            "False",
        ),
        (
            {
                "conditions": [
                    {"type": "Failed", "status": "True", "message": "BackoffLimitExceeded"}
                ]
            },
            ("False", "JobFailed"),
            "False",
            "True",
        ),
    ],
)
def test_trainingrun_finishes(
    job_status: dict[str, Any], ready: tuple[str, str], succeeded: str, failed: str
) -> None:
    run = run_model()
    kids = children(run, inference_ready=True)
    job = job_with(by_kind(kids, "Job"), **job_status)
    st = trainingrun_status(run, Observed(children=(job,), pool=None), None, T0)
    got = conds(st)
    assert got["Ready"] == ready
    assert got["Succeeded"][0] == succeeded
    assert got["Failed"][0] == failed
    # Both give the Job's outcome: a failed run's Succeeded is not "InProgress".
    outcome = "JobSucceeded" if succeeded == "True" else "JobFailed"
    assert got["Succeeded"][1] == got["Failed"][1] == outcome, got
    assert st["completionTime"]


def test_suspended_run() -> None:
    run = run_model(suspend=True)
    kids = children(run, inference_ready=True)
    assert "Job" not in [k["kind"] for k in kids]  # the trainer goes away while suspended
    assert by_kind(kids, "Deployment")["spec"]["replicas"] == 0
    dep = deployment_with(by_kind(kids, "Deployment"), available=0)
    st = trainingrun_status(run, Observed(children=(dep,), pool=ready_pool()), None, T0)
    got = conds(st)
    assert got["Suspended"] == ("True", "SuspendedByUser")
    assert got["InferenceReady"] == ("False", "ScaledToZero")
    assert got["Ready"] == ("False", "SuspendedByUser")


def test_problem_wins_over_progress() -> None:
    run = run_model()
    st = trainingrun_status(run, Observed(problem=Problem("ApplyFailed", "Job x: boom")), None, T0)
    assert conds(st)["Ready"] == ("False", "ApplyFailed")


def test_start_time_is_set_once() -> None:
    run = run_model()
    first = trainingrun_status(run, Observed(), None, T0)
    second = trainingrun_status(run, Observed(), first, T1)
    assert second["startTime"] == first["startTime"]


def test_referenced_pool_is_named_in_children() -> None:
    run = run_model(rollout={"poolRef": {"name": "swe-gym"}})
    kids = children(run)
    assert "RolloutPool" not in [k["kind"] for k in kids]
    st = trainingrun_status(
        run, Observed(children=tuple(kids), pool=ready_pool("swe-gym")), None, T0
    )
    assert st["children"]["rolloutPool"] == "swe-gym"
    assert conds(st)["SandboxesReady"] == ("True", "PoolReady")


# --- RolloutPool ------------------------------------------------------------------------------


def test_rolloutpool_counts_and_readiness() -> None:
    pool = pool_model(replicas=2)
    kids = children(pool)
    gw = deployment_with(by_kind(kids, "Deployment"), available=1)
    pods = (pod(), pod(state="leased"), pod(phase="Pending", ready=False))
    st = rolloutpool_status(
        pool,
        Observed(children=(gw, *[k for k in kids if k["kind"] != "Deployment"]), pods=pods),
        None,
        T0,
    )
    assert (st["ready"], st["leased"], st["coldStarting"], st["replicas"], st["desired"]) == (
        1,
        1,
        1,
        2,
        2,
    )
    assert st["selector"] == "coderepair.io/pool=swe-gym"
    assert st["gatewayUrl"].startswith("http://swe-gym-gateway.team-repair.svc:")
    got = conds(st)
    # Ready means leases can be served (the gateway is up); warmth is in the counts.
    assert got["GatewayReady"][0] == "True"
    assert got["Ready"] == ("True", "Reconciled")
    assert "1/2 warm sandboxes ready, 1 leased, 1 starting" in st["conditions"][0]["message"]
    down = deployment_with(by_kind(kids, "Deployment"), available=0)
    st2 = rolloutpool_status(pool, Observed(children=(down,), pods=pods), st, T1)
    assert conds(st2)["Ready"] == ("False", "DeploymentProgressing")
    assert st2["conditions"][0]["lastTransitionTime"] == "2026-01-01T12:05:00Z"


def test_rolloutpool_without_gateway() -> None:
    st = rolloutpool_status(pool_model(0), Observed(), None, T0)
    assert conds(st)["Ready"] == ("False", "DeploymentMissing")


# --- Benchmark --------------------------------------------------------------------------------


def bench_model(name: str = "benchmark-swe-bench-verified-baseline.yaml") -> Benchmark:
    return Benchmark.model_validate(load(name))


def test_benchmark_runs_then_keeps_verdict_after_cleanup() -> None:
    bench = bench_model()
    kids = children(bench, inference_ready=True)
    dep = deployment_with(by_kind(kids, "Deployment"), available=2)
    job = by_kind(kids, "Job")
    running = job_with(job, active=1, ready=1)
    st = benchmark_status(bench, Observed(children=(dep, running), pool=ready_pool()), None, T0)
    assert conds(st)["Running"] == ("True", "JobRunning")
    assert st["resultsPath"] == bench.spec.results.path
    done = job_with(
        job,
        conditions=[{"type": "Complete", "status": "True"}],
        completionTime="2026-01-01T12:30:00Z",
    )
    st2 = benchmark_status(bench, Observed(children=(done,), pool=None), st, T1)
    assert conds(st2)["Succeeded"] == ("True", "JobSucceeded")
    assert st2["completionTime"] == "2026-01-01T12:30:00Z"
    # After ttlSecondsAfterFinished the workloads are gone; the verdict stays.
    st3 = benchmark_status(bench, Observed(children=(), pool=None), st2, T1 + timedelta(hours=2))
    got = conds(st3)
    assert got["Succeeded"] == ("True", "JobSucceeded")
    assert got["InferenceReady"] == ("False", "WorkloadsDeleted")
    assert st3["children"]["runnerJob"] == job["metadata"]["name"]
    assert st3["completionTime"] == st2["completionTime"]


def test_benchmark_progress_from_report() -> None:
    bench = bench_model()
    report = {"total": 200, "done": 50, "resolved": 20, "errored": 10}
    st = benchmark_status(bench, Observed(report=report), None, T0)
    assert st["progress"]["summary"] == "50/200"
    assert st["resolveRate"] == 0.5  # errored attempts are not counted as unresolved


def test_benchmark_results_follow_the_report_exactly() -> None:
    bench = bench_model()
    kids = children(bench, inference_ready=True)
    report = ProgressReport.parse(
        json.dumps(
            {
                "total": 2000,
                "done": 40,
                "resolved": 12,
                "errored": 4,
                "resolveRate": 0.333333,
                "passAtK": [{"k": 4, "value": 0.5}, {"k": 1, "value": 0.3}],
                "finished": False,
                "updatedAt": "2026-01-01T12:00:00Z",
                "futureKey": 1,
                "comparison": {
                    "baseline": "zero-shot",
                    "sharedInstances": 10,
                    "difference": 0.1,
                    "ciLow": -0.05,
                    "ciHigh": 0.25,
                    "confidenceLevel": 0.95,
                },
            }
        )
    ).to_wire()
    st = benchmark_status(bench, Observed(children=tuple(kids), report=report), None, T0)
    assert st["progress"] == {
        "total": 2000, "done": 40, "resolved": 12, "errored": 4, "summary": "40/2000"
    }  # fmt: skip
    assert st["resolveRate"] == 0.333333
    assert st["passAtK"] == [{"k": 1, "value": 0.3}, {"k": 4, "value": 0.5}]
    assert st["comparison"]["ciLow"] == -0.05
    # The config map is named even though the benchmark owns two.
    assert st["children"]["configMap"] == "qwen3-8b-zero-shot-swe-bench-verified-config"
    # Without a report (not readable now) the recorded results stay.
    kept = benchmark_status(bench, Observed(children=tuple(kids)), st, T1)
    assert status_patch("Benchmark", st, kept) == {}
    # A new report without pass@k or comparison removes them: the report is the truth.
    later = benchmark_status(
        bench,
        Observed(children=tuple(kids), report={"total": 2000, "done": 41, "resolved": 13}),
        st,
        T1,
    )
    patch = status_patch("Benchmark", st, later)
    assert patch["passAtK"] is None and patch["comparison"] is None
    assert patch["resolveRate"] == round(13 / 41, 6)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("not json", "Invalid JSON"),
        ('{"total": 10, "done": 5}', "resolved"),
        ('{"total": 10, "done": 11, "resolved": 1}', "exceeds total"),
        ('{"total": 10, "done": 5, "resolved": 4, "errored": 2}', "exceed done"),
        ('{"total": 10, "done": 5, "resolved": 1, "resolveRate": 2}', "resolveRate"),
        ('{"total": 10, "done": 5, "resolved": 1, "passAtK": [{"k": 0, "value": 1}]}', "passAtK"),
        ("[]", "report"),
        # Padding a runner could add is not parsed at every reconcile.
        ('{"total": 1, "done": 0, "resolved": 0, "pad": "' + "x" * 70_000 + '"}', "characters"),
        # Counts the status schema (int64) cannot hold would fail the operator's status patch.
        ('{"total": 100000000000000000000, "done": 1, "resolved": 1}', "total"),
        ('{"total": 9007199254740992, "done": 9007199254740992, "resolved": 0}', "done"),
        (
            '{"total": 10, "done": 5, "resolved": 1,'
            ' "passAtK": [{"k": 100000000000000000000, "value": 0.5}]}',
            "passAtK: k above",
        ),
    ],
)
def test_a_malformed_report_is_refused_with_the_reason(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match="malformed progress report") as err:
        ProgressReport.parse(text)
    assert problem in str(err.value)


def test_a_malformed_comparison_is_dropped_but_the_progress_counts() -> None:
    text = json.dumps(
        {"total": 3, "done": 1, "resolved": 1, "comparison": {"baseline": "Not A Name"}}
    )
    report = ProgressReport.parse(text).to_wire()
    assert "comparison" not in report and report["done"] == 1


def test_a_k_named_twice_keeps_its_first_value() -> None:
    text = '{"total": 3, "done": 1, "resolved": 1, "passAtK": [{"k": 1, "value": 0.5},'
    text += ' {"k": 2, "value": 0.7}, {"k": 1, "value": 0.6}]}'
    assert ProgressReport.parse(text).to_wire()["passAtK"] == [
        {"k": 1, "value": 0.5},
        {"k": 2, "value": 0.7},
    ]


def test_a_comparison_over_more_instances_than_json_holds_is_dropped() -> None:
    comparison = {"baseline": "zero-shot", "sharedInstances": 2**53, "difference": 0.1,
                  "ciLow": 0.0, "ciHigh": 0.2, "confidenceLevel": 0.95}  # fmt: skip
    text = json.dumps({"total": 3, "done": 1, "resolved": 1, "comparison": comparison})
    assert "comparison" not in ProgressReport.parse(text).to_wire()
    comparison["sharedInstances"] = 2**53 - 1
    text = json.dumps({"total": 3, "done": 1, "resolved": 1, "comparison": comparison})
    assert ProgressReport.parse(text).to_wire()["comparison"]["sharedInstances"] == 2**53 - 1


def test_hosted_endpoint_needs_no_inference() -> None:
    bench = bench_model("benchmark-hosted-endpoint.yaml")
    kids = children(bench)
    assert "Deployment" not in [k["kind"] for k in kids]
    st = benchmark_status(bench, Observed(children=tuple(kids)), None, T0)
    assert conds(st)["InferenceReady"] == ("True", "NotServed")


def test_an_sft_trainingrun_waits_for_no_server_and_no_pool() -> None:
    algorithm = {"type": "sft", "sft": {"dataset": {"path": "datasets/sft"}}, "steps": 50}
    # A poolRef is refused with sft by the CRD now; one stored before that rule is ignored.
    run = run_model(algorithm=algorithm, rollout={"poolRef": {"name": "shared"}})
    kids = children(run)  # nothing observed yet: no server to wait for
    job = by_kind(kids, "Job")
    pending = trainingrun_status(run, Observed(children=tuple(kids), pool=None), None, T0)
    got = conds(pending)
    assert got["InferenceReady"] == ("True", "NotServed")
    assert got["SandboxesReady"] == ("True", "NoRollouts")
    assert got["Training"] == ("False", "WaitingForPods")
    assert got["Ready"] == ("False", "WaitingForPods")
    assert "rolloutPool" not in pending["children"]
    want = job["spec"]["parallelism"]
    running = job_with(job, active=want, ready=want)
    rest = [k for k in kids if k["kind"] != "Job"]
    st = trainingrun_status(run, Observed(children=(running, *rest), pool=None), None, T0)
    assert conds(st)["Ready"] == ("True", "Reconciled")
    done = job_with(job, conditions=[{"type": "Complete", "status": "True"}])
    st = trainingrun_status(run, Observed(children=(done,), pool=None), st, T1)
    assert conds(st)["Succeeded"] == ("True", "JobSucceeded")
    assert conds(st)["InferenceReady"] == ("True", "NotServed")

"""A RolloutPool that validates its tasks (`spec.validation`), on the operator's side, pure: the
gateway's children (progress ConfigMap, env, cache volume, RBAC), the status read off the
gateway's report (counts, reasons, Ready waiting with `Validating`), the TrainingRun that
follows its pool, the Event naming the most common reasons and the quarantine gauge."""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY

from crl_operator import conditions as c
from crl_operator.builders import progress_name
from crl_operator.crds import PRINTER_COLUMNS
from crl_operator.events import TASKS_QUARANTINED, TASKS_VALIDATED, transition_events
from crl_operator.metrics import forget_quarantined, record_quarantined
from crl_operator.patches import status_patch
from crl_operator.status import (
    Observed,
    benchmark_status,
    rolloutpool_status,
    trainingrun_status,
)
from crl_worker.api import Benchmark, RolloutPool
from crl_worker.api.contract import Env
from crl_worker.api.progress import PoolProgress

from .fixtures.status_objects import T0, T1, children, load, run_model

EXAMPLE = "rolloutpool-swe-gym-validated.yaml"


def _pool() -> RolloutPool:
    return RolloutPool.model_validate(load(EXAMPLE))


def _live(pool: RolloutPool) -> tuple[dict[str, Any], ...]:
    """The pool's children, its gateway Deployment available."""
    kids = children(pool)
    for kid in kids:
        if kid["kind"] == "Deployment":
            kid["metadata"]["generation"] = 1
            kid["status"] = {
                "observedGeneration": 1,
                "replicas": 1,
                "updatedReplicas": 1,
                "availableReplicas": 1,
            }
    return tuple(kids)


def _conds(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {x["type"]: (x["status"], x["reason"]) for x in status["conditions"]}


def _report(**fields: Any) -> dict[str, Any]:
    return PoolProgress.model_validate(fields).to_wire()


def test_the_gateway_of_a_validating_pool_reports_and_keeps_its_verdicts_on_the_claim() -> None:
    pool = _pool()
    kids = children(pool)
    [progress] = [k for k in kids if k["metadata"]["name"] == progress_name(pool)]
    assert progress["kind"] == "ConfigMap" and "data" not in progress
    [gateway] = [k for k in kids if k["kind"] == "Deployment"]
    pod = gateway["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env[Env.PROGRESS_CONFIGMAP] == "swe-gym-validated-progress"
    assert env[Env.CACHE_DIR] == "/var/cache/crl"
    [cache] = [v for v in pod["volumes"] if v["name"] == "validation-cache"]
    assert cache["persistentVolumeClaim"] == {"claimName": "validation-cache"}
    assert {"name": "validation-cache", "mountPath": "/var/cache/crl"} in pod["containers"][0][
        "volumeMounts"
    ]
    [role] = [k for k in kids if k["kind"] == "Role"]
    [own] = [r for r in role["rules"] if r["resources"] == ["configmaps"]]
    assert own == {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "resourceNames": ["swe-gym-validated-progress"],
        "verbs": ["get", "patch"],
    }
    # A pool that does not validate has none of it.
    plain = load(EXAMPLE)
    del plain["spec"]["validation"]
    plain_kids = children(RolloutPool.model_validate(plain))
    assert not [k for k in plain_kids if k["metadata"]["name"].endswith("-progress")]
    [plain_role] = [k for k in plain_kids if k["kind"] == "Role"]
    assert not [r for r in plain_role["rules"] if r["resources"] == ["configmaps"]]


def test_a_validating_pool_is_not_ready_until_its_gateway_says_it_is_done() -> None:
    pool = _pool()
    live = _live(pool)
    before = rolloutpool_status(pool, Observed(children=live), None, T0)
    assert _conds(before)["Ready"] == ("False", c.VALIDATING)
    assert before["validation"] == {
        "state": "Validating",
        "total": 0,
        "validated": 0,
        "quarantined": 0,
    }
    midway = _report(
        total=10,
        validated=4,
        quarantined=3,
        reasons={"flaky tests": 1, "gold patch does not resolve": 2},
    )
    during = rolloutpool_status(pool, Observed(children=live, report=midway), before, T0)
    assert _conds(during)["TasksValidated"] == ("False", c.VALIDATING)
    ready = next(x for x in during["conditions"] if x["type"] == "Ready")
    assert (
        "4/10 tasks validated, 3 quarantined: gold patch does not resolve (2)" in ready["message"]
    )
    assert during["validation"]["reasons"][0] == {
        "reason": "gold patch does not resolve",
        "count": 2,
    }

    done = _report(
        total=10, validated=10, quarantined=3, cached=4, finished=True,
        reasons={"flaky tests": 1, "gold patch does not resolve": 2},
        tasks=[{"instanceId": "a__b-1", "reason": "flaky tests"}],
    )  # fmt: skip
    after = rolloutpool_status(pool, Observed(children=live, report=done), during, T1)
    assert _conds(after)["Ready"] == ("True", c.RECONCILED)
    assert _conds(after)["TasksValidated"] == ("True", c.VALIDATED)
    assert (after["validation"]["state"], after["validation"]["cached"]) == ("Done", 4)
    # The status write carries it (the operator owns the key).
    assert status_patch("RolloutPool", during, after)["validation"]["state"] == "Done"
    # Every task broken: nothing to serve, not Ready.
    none = _report(total=2, validated=2, quarantined=2, finished=True, reasons={"no gold patch": 2})
    empty = rolloutpool_status(pool, Observed(children=live, report=none), during, T1)
    assert _conds(empty)["Ready"] == ("False", c.NO_VALID_TASKS)
    # The report gone (the ConfigMap recreated, a malformed write): what was recorded stays.
    kept = rolloutpool_status(pool, Observed(children=live), after, T1)
    assert kept["validation"] == after["validation"]

    # Validation finishing is one Event naming the most common reasons, not one per reconcile.
    [event] = transition_events("RolloutPool", during, after)
    assert (event.type, event.reason) == ("Warning", TASKS_QUARANTINED)
    assert event.message.endswith("gold patch does not resolve (2), flaky tests (1)")
    assert transition_events("RolloutPool", after, kept) == []
    clean = {**after, "validation": {**after["validation"], "quarantined": 0, "reasons": []}}
    [fine] = transition_events("RolloutPool", during, clean)
    assert (fine.type, fine.reason) == ("Normal", TASKS_VALIDATED)

    # A TrainingRun on the pool waits for it (its Reason column says why) and shows its counts.
    run = run_model()
    rpool = {"kind": "RolloutPool", "metadata": {"name": "swe-gym-validated"}, "status": during}
    trun = trainingrun_status(run, Observed(pool=rpool), None, T0)
    assert _conds(trun)["SandboxesReady"] == ("False", c.VALIDATING)
    assert (trun["validation"]["validated"], trun["validation"]["quarantined"]) == (4, 3)
    assert status_patch("TrainingRun", None, trun)["validation"] == trun["validation"]
    # The run's inline pool goes with its cleanup when it ends: the counts stay.
    assert trainingrun_status(run, Observed(), trun, T1)["validation"] == trun["validation"]

    # So does a Benchmark, in its status and its QUARANTINED column, and after the cleanup
    # took its pool away.
    bench = Benchmark.model_validate(load("benchmark-swe-bench-verified-baseline.yaml"))
    seen = benchmark_status(bench, Observed(pool={**rpool, "status": after}), None, T0)
    assert (seen["validation"]["validated"], seen["validation"]["quarantined"]) == (10, 3)
    assert status_patch("Benchmark", None, seen)["validation"] == seen["validation"]
    assert benchmark_status(bench, Observed(), seen, T1)["validation"] == seen["validation"]
    columns = {c["name"]: c["jsonPath"] for c in PRINTER_COLUMNS["Benchmark"]}
    assert columns["Quarantined"] == ".status.validation.quarantined"


def test_the_quarantine_gauge_follows_the_status() -> None:
    def value(reason: str) -> float | None:
        return REGISTRY.get_sample_value(
            "crl_operator_pool_quarantined_tasks",
            {"resource_namespace": "ns", "resource_name": "p", "reason": reason},
        )

    both = [{"reason": "flaky tests", "count": 2}, {"reason": "no gold patch", "count": 1}]
    record_quarantined("ns", "p", {"validation": {"reasons": both}})
    assert (value("flaky tests"), value("no gold patch")) == (2.0, 1.0)
    record_quarantined("ns", "p", {"validation": {"reasons": both[:1]}})
    assert (value("flaky tests"), value("no gold patch")) == (2.0, None)
    forget_quarantined("ns", "p")
    assert value("flaky tests") is None

"""Argo CD against what the operator really writes, on the real control plane.

Two things are proved here with the operator of tests/test_operator_e2e.py running:

- **Health**: the operator is driven into each state a person cares about (starting, queued by
  Kueue, suspended, trainer or runner failed, finished, invalid spec) and Argo CD's own Lua
  health code (tests/argocdhealth, built from argo-cd v3.5.7) maps the live object to the
  expected health. The committed fixtures under gitops/argocd/.../testdata/ are these live
  objects: each test checks that the committed one still carries the same conditions (types,
  statuses, reasons) as the live one, and `CRL_CAPTURE_HEALTH_FIXTURES=1` rewrites them.
- **Sync and drift**: a resource applied with kubectl, settled by the operator, then applied again
  server-side with Argo CD's field manager (`argocd-controller`) meets no conflict and changes
  nothing: the operator writes only status, never the spec or metadata a manifest owns.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from crl_operator.apply import Kube
from crl_operator.dashboard import queries

from .fixtures.argocd_health import CUSTOMIZATIONS, GROUP_DIR, build_argocdhealth, evaluate
from .fixtures.cluster import Cluster
from .fixtures.helm import helm_binary
from .fixtures.observability import exported_names, metric_names, rendered_rules
from .fixtures.operator_process import Operator
from .fixtures.paths import EXAMPLES
from .fixtures.resources import (
    PENDING_TRAINER,
    apply,
    condition,
    is_,
    job_of,
    small_run,
    trainingrun,
    wait_for,
)

CAPTURE = os.environ.get("CRL_CAPTURE_HEALTH_FIXTURES") == "1"
#: Metadata a fixture keeps (the rest is the cluster's bookkeeping).
KEPT_METADATA = ("name", "namespace", "generation")
#: How long the conditions must stay unchanged before a state counts as settled.
STABLE_SECONDS = 3.0


@pytest.fixture(scope="module")
def argocdhealth() -> Path:
    """The argocdhealth binary (built from Argo CD's Go module on first use)."""
    return build_argocdhealth()


def as_fixture(obj: dict[str, Any]) -> dict[str, Any]:
    """The live object as a health fixture: no uid, managed fields, annotations or versions."""
    meta = obj["metadata"]
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "metadata": {k: meta[k] for k in KEPT_METADATA if k in meta} | {"namespace": "team-a"},
        "spec": obj["spec"],
        "status": obj["status"],
    }


#: The conditions the health scripts read.
HEALTH_CONDITIONS = {"Ready", "Failed", "Succeeded", "Suspended", "Admitted", "Running"}


def signature(obj: dict[str, Any]) -> list[tuple[str, str, str]]:
    """What a fixture must keep from the live object: the type, status and reason of each
    condition the health scripts read (the others, such as SandboxesReady, may still move)."""
    return sorted(
        (c["type"], c["status"], c["reason"])
        for c in (obj.get("status") or {}).get("conditions", ())
        if c["type"] in HEALTH_CONDITIONS
    )


def check_health(
    argocdhealth: Path, tmp_path: Path, live: dict[str, Any], fixture: str, want: str
) -> None:
    """Argo CD's health of the live object is `want`; the committed fixture matches it."""
    doc = as_fixture(live)
    path = GROUP_DIR / live["kind"] / "testdata" / fixture
    if CAPTURE:
        path.write_text(
            f"# Captured from the operator by tests/test_gitops_e2e.py ({live['kind']}: {want}).\n"
            + yaml.safe_dump(doc, sort_keys=False)
        )
    scratch = tmp_path / fixture
    scratch.write_text(yaml.safe_dump(doc))
    [got] = evaluate(argocdhealth, CUSTOMIZATIONS, scratch)
    assert got.get("error") is None, got
    assert got["status"] == want, (got, doc["status"])
    committed = yaml.safe_load(path.read_text())
    assert signature(committed) == signature(doc), (
        f"{path} no longer matches what the operator writes: "
        f"rerun with CRL_CAPTURE_HEALTH_FIXTURES=1\n{signature(committed)}\n{signature(doc)}"
    )


def settled(
    client: Kube, kind: str, namespace: str, name: str, test: Callable[[dict[str, Any]], bool]
) -> Callable[[], dict[str, Any] | None]:
    """A probe for wait_for: the object once `test` holds, its status saw the generation, and
    its conditions stayed the same for STABLE_SECONDS (the operator has settled)."""
    last: list[Any] = [None, 0.0]

    def probe() -> dict[str, Any] | None:
        obj = client.get(kind, namespace, name)
        if not obj or not obj.get("status"):
            return None
        observed = obj["status"].get("observedGeneration")
        if observed != obj["metadata"].get("generation") or not test(obj):
            last[0] = None
            return None
        now = [(c["type"], c["status"], c["reason"]) for c in obj["status"].get("conditions", ())]
        if now != last[0]:
            last[:] = [now, time.monotonic()]
            return None
        return obj if time.monotonic() - last[1] >= STABLE_SECONDS else None

    return probe


def patch_job(cluster: Cluster, namespace: str, job: str, manager: str, patch: Any) -> None:
    """Patch a child Job as another controller (Kueue, a deadline) would."""
    cluster.kubectl("patch", "job", job, "-n", namespace, "--type", "merge",
                    "--field-manager", manager, "-p", json.dumps(patch))  # fmt: skip


# --- TrainingRun ---------------------------------------------------------------------------------


def test_trainingrun_health_through_its_life(
    cluster: Cluster,
    kube: Kube,
    operator: Operator,
    namespace: str,
    argocdhealth: Path,
    tmp_path: Path,
) -> None:
    # Starting: inference up, the trainer Job waits for a node.
    apply(cluster, namespace, small_run("starting", trainer=PENDING_TRAINER))
    live = wait_for(
        "the trainer waiting for pods",
        settled(kube, "TrainingRun", namespace, "starting",
                lambda r: is_(r, "InferenceReady") and is_(r, "Training", "False", "WaitingForPods")),
        op=operator,
    )  # fmt: skip
    check_health(argocdhealth, tmp_path, live, "progressing_trainer_pending.yaml", "Progressing")

    # Queued: Kueue holds the trainer Job (suspends it) - not Degraded.
    job = job_of(kube, namespace, live)
    assert job is not None
    patch_job(cluster, namespace, job["metadata"]["name"], "kueue", {"spec": {"suspend": True}})
    live = wait_for(
        "Admitted=False/JobSuspended",
        settled(kube, "TrainingRun", namespace, "starting",
                lambda r: is_(r, "Admitted", "False", "JobSuspended")),
        op=operator,
    )  # fmt: skip
    check_health(argocdhealth, tmp_path, live, "suspended_queued_by_kueue.yaml", "Suspended")

    # Suspended by its owner.
    cluster.kubectl("patch", "trainingrun", "starting", "-n", namespace, "--type", "merge",
                    "-p", '{"spec":{"suspend":true}}')  # fmt: skip
    live = wait_for(
        "Suspended=True",
        settled(kube, "TrainingRun", namespace, "starting", lambda r: is_(r, "Suspended")),
        op=operator,
    )
    check_health(argocdhealth, tmp_path, live, "suspended_by_spec.yaml", "Suspended")

    # Failed trainer: its Job runs past a deadline, and the Job controller fails it.
    apply(cluster, namespace, small_run("doomed", trainer=PENDING_TRAINER))
    doomed = wait_for(
        "the doomed run's trainer Job",
        lambda: (r := trainingrun(kube, namespace, "doomed")) and job_of(kube, namespace, r),
        op=operator,
    )
    patch_job(cluster, namespace, doomed["metadata"]["name"], "e2e-test",
              {"spec": {"activeDeadlineSeconds": 1}})  # fmt: skip
    live = wait_for(
        "Failed=True",
        settled(kube, "TrainingRun", namespace, "doomed", lambda r: is_(r, "Failed")),
        op=operator,
    )
    check_health(argocdhealth, tmp_path, live, "degraded_trainer_failed.yaml", "Degraded")

    # Finished: kwok lets the trainer pods succeed.
    apply(cluster, namespace, small_run("done"))
    live = wait_for(
        "Succeeded=True",
        settled(kube, "TrainingRun", namespace, "done", lambda r: is_(r, "Succeeded")),
        op=operator,
    )
    check_health(argocdhealth, tmp_path, live, "healthy_succeeded.yaml", "Healthy")

    # A spec the operator cannot use (admission accepts it; the model refuses it).
    bad = small_run(
        "bad", trainer={"nodes": 1, "gpusPerNode": 1,
                        "resources": {"requests": {"cpu": "1" + "0" * 70}}},
    )  # fmt: skip
    apply(cluster, namespace, bad)
    live = wait_for(
        "Ready=False/InvalidSpec",
        settled(kube, "TrainingRun", namespace, "bad",
                lambda r: is_(r, "Ready", "False", "InvalidSpec")),
        op=operator,
    )  # fmt: skip
    check_health(argocdhealth, tmp_path, live, "degraded_invalid_spec.yaml", "Degraded")

    # What `kubectl describe` shows along the way (crl_operator.events).
    def events_of(name: str) -> set[tuple[str, str]]:
        return {
            (e["type"], e["reason"])
            for e in kube.list("Event", namespace=namespace)
            if e["involvedObject"]["name"] == name and e["involvedObject"]["kind"] == "TrainingRun"
        }

    assert {("Normal", "ChildrenCreated"), ("Normal", "InferenceReady"), ("Normal", "Admitted"),
            ("Warning", "Preempted")} <= events_of("starting")  # fmt: skip
    assert {("Normal", "ChildrenCreated"), ("Normal", "Succeeded")} <= events_of("done")
    assert ("Warning", "JobFailed") in events_of("doomed")
    assert ("Warning", "InvalidSpec") in events_of("bad")


# --- RolloutPool and Benchmark ---------------------------------------------------------------------


def example(name: str) -> dict[str, Any]:
    """One of examples/*.yaml."""
    doc: dict[str, Any] = yaml.safe_load(next(p for p in EXAMPLES if p.name == name).read_text())
    return doc


def test_rolloutpool_health(
    cluster: Cluster,
    kube: Kube,
    operator: Operator,
    namespace: str,
    argocdhealth: Path,
    tmp_path: Path,
) -> None:
    apply(cluster, namespace, example("rolloutpool-swe-gym.yaml"))
    live = wait_for(
        "the pool Ready",
        settled(kube, "RolloutPool", namespace, "swe-gym", lambda p: is_(p, "Ready")),
        op=operator,
    )
    check_health(argocdhealth, tmp_path, live, "healthy_gateway_up.yaml", "Healthy")

    bad = example("rolloutpool-swe-gym.yaml")
    bad["metadata"]["name"] = "bad-pool"
    bad["spec"]["sandbox"]["resources"]["requests"]["cpu"] = "1" + "0" * 70
    apply(cluster, namespace, bad)
    live = wait_for(
        "Ready=False/InvalidSpec",
        settled(kube, "RolloutPool", namespace, "bad-pool",
                lambda p: is_(p, "Ready", "False", "InvalidSpec")),
        op=operator,
    )  # fmt: skip
    check_health(argocdhealth, tmp_path, live, "degraded_invalid_spec.yaml", "Degraded")


def pending_benchmark(name: str) -> dict[str, Any]:
    """The hosted-endpoint example whose runner stays Pending (its results claim is missing)."""
    doc = example("benchmark-hosted-endpoint.yaml")
    doc["metadata"]["name"] = name
    doc["spec"]["results"] = {"volume": {"claimName": "crl-test-missing"}, "path": name}
    return doc


def test_benchmark_health(
    cluster: Cluster,
    kube: Kube,
    operator: Operator,
    namespace: str,
    argocdhealth: Path,
    tmp_path: Path,
) -> None:
    done = example("benchmark-hosted-endpoint.yaml")
    apply(cluster, namespace, done)
    live = wait_for(
        "the benchmark to succeed",
        settled(kube, "Benchmark", namespace, done["metadata"]["name"],
                lambda b: is_(b, "Succeeded")),
        op=operator,
    )  # fmt: skip
    check_health(argocdhealth, tmp_path, live, "healthy_succeeded.yaml", "Healthy")

    apply(cluster, namespace, pending_benchmark("waiting"))
    live = wait_for(
        "the runner waiting for pods",
        settled(kube, "Benchmark", namespace, "waiting",
                lambda b: is_(b, "Running", "False", "WaitingForPods")),
        op=operator,
    )  # fmt: skip
    check_health(argocdhealth, tmp_path, live, "progressing_runner_pending.yaml", "Progressing")

    patch_job(cluster, namespace, "waiting-runner", "kueue", {"spec": {"suspend": True}})
    live = wait_for(
        "Running=False/JobSuspended",
        settled(kube, "Benchmark", namespace, "waiting",
                lambda b: is_(b, "Running", "False", "JobSuspended")),
        op=operator,
    )  # fmt: skip
    check_health(argocdhealth, tmp_path, live, "suspended_queued_by_kueue.yaml", "Suspended")

    apply(cluster, namespace, pending_benchmark("doomed"))
    wait_for("the doomed runner Job", lambda: kube.get("Job", namespace, "doomed-runner"))
    patch_job(cluster, namespace, "doomed-runner", "e2e-test",
              {"spec": {"activeDeadlineSeconds": 1}})  # fmt: skip
    live = wait_for(
        "Failed=True",
        settled(kube, "Benchmark", namespace, "doomed", lambda b: is_(b, "Failed")),
        op=operator,
    )
    check_health(argocdhealth, tmp_path, live, "degraded_runner_failed.yaml", "Degraded")
    assert condition(live, "Failed")["message"], "the failure says why"


# --- sync and drift ------------------------------------------------------------------------------

#: The field manager Argo CD's application controller applies with (ServerSideApply=true).
ARGOCD_MANAGER = "argocd-controller"
#: What Argo CD adds to the manifests it applies (annotation-based resource tracking).
TRACKING = {"argocd.argoproj.io/tracking-id": "crl-team-a:coderepair.io/{kind}:{ns}/{name}"}


def owned_by_manifest(obj: dict[str, Any]) -> dict[str, Any]:
    """What a user's manifest owns: the spec, labels, annotations, finalizers, owners."""
    meta = obj["metadata"]
    return {
        "spec": obj["spec"],
        **{k: meta.get(k) for k in ("labels", "annotations", "finalizers", "ownerReferences")},
    }


def argocd_diff(cluster: Cluster, namespace: str, text: str) -> subprocess.CompletedProcess[str]:
    """What Argo CD's server-side diff compares: a dry-run apply as argocd-controller."""
    return cluster.kubectl("diff", "--server-side", f"--field-manager={ARGOCD_MANAGER}",
                           "-n", namespace, "-f", "-", input=text, check=False)  # fmt: skip


@pytest.mark.parametrize(
    ("manifest", "done"),
    [
        (lambda: small_run("synced"), ("Succeeded", "True")),
        (lambda: example("rolloutpool-swe-gym.yaml"), ("Ready", "True")),
        (lambda: example("benchmark-hosted-endpoint.yaml"), ("Succeeded", "True")),
    ],
    ids=["TrainingRun", "RolloutPool", "Benchmark"],
)
def test_argo_cd_sync_meets_no_conflict_and_no_diff(
    cluster: Cluster,
    kube: Kube,
    operator: Operator,
    namespace: str,
    manifest: Callable[[], dict[str, Any]],
    done: tuple[str, str],
) -> None:
    doc = manifest()
    doc["metadata"].pop("namespace", None)
    kind, name = doc["kind"], doc["metadata"]["name"]
    text = yaml.safe_dump(doc)
    # A person applies it with kubectl; the operator creates the children and writes status.
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=text)
    probe = settled(kube, kind, namespace, name, lambda o: is_(o, *done))
    before = wait_for(f"{kind} {name} settled", probe, op=operator)

    # Argo CD takes it over: no difference to show, no conflict to force.
    diff = argocd_diff(cluster, namespace, text)
    assert diff.returncode == 0, diff.stdout + diff.stderr
    applied = cluster.kubectl("apply", "--server-side", f"--field-manager={ARGOCD_MANAGER}",
                              "-n", namespace, "-f", "-", input=text, check=False)  # fmt: skip
    assert applied.returncode == 0, applied.stderr
    assert "conflict" not in (applied.stdout + applied.stderr).lower()

    # Argo CD's tracking annotation, then the operator's next reconciles: still in sync.
    tracked = {**doc, "metadata": {**doc["metadata"], "annotations": {
        k: v.format(kind=kind, ns=namespace, name=name) for k, v in TRACKING.items()}}}  # fmt: skip
    tracked_text = yaml.safe_dump(tracked)
    cluster.kubectl("apply", "--server-side", f"--field-manager={ARGOCD_MANAGER}",
                    "-n", namespace, "-f", "-", input=tracked_text)  # fmt: skip
    cluster.kubectl("annotate", kind.lower(), name, "-n", namespace, "crl-test/poke=1")
    time.sleep(2 * STABLE_SECONDS)
    after = wait_for(f"{kind} {name} settled again", probe, op=operator)
    cluster.kubectl("annotate", kind.lower(), name, "-n", namespace, "crl-test/poke-")
    diff = argocd_diff(cluster, namespace, tracked_text)
    assert diff.returncode == 0, diff.stdout + diff.stderr
    # The diff sees a change when there is one (exit 1, not an error).
    changed = {**tracked, "metadata": {**tracked["metadata"], "labels": {"team": "b"}}}
    assert argocd_diff(cluster, namespace, yaml.safe_dump(changed)).returncode == 1

    # The operator wrote only status: the spec and metadata are the manifest's.
    assert owned_by_manifest(after)["spec"] == owned_by_manifest(before)["spec"]
    assert owned_by_manifest(after)["finalizers"] is None
    assert owned_by_manifest(after)["ownerReferences"] is None
    live = kube.get(kind, namespace, name)
    assert live is not None
    for entry in live["metadata"]["managedFields"]:
        if entry["manager"] not in (
            ARGOCD_MANAGER,
            "kubectl-client-side-apply",
            "kubectl-annotate",
        ):
            assert entry.get("subresource") == "status", entry


def test_the_real_operator_exports_what_rules_and_dashboard_read(operator: Operator) -> None:
    """Scrape the operator process itself (not its registry in this process)."""
    url = f"http://127.0.0.1:{operator.proc.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        exported = exported_names(response.read().decode())
    used: set[str] = set()
    rules = rendered_rules(helm_binary())
    for expr in [r["expr"] for g in rules["groups"] for r in g["rules"]] + queries():
        used |= {m for m in metric_names(expr) if m.startswith("crl_operator_")}
    assert used and sorted(used - exported) == []

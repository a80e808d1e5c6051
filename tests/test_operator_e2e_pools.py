"""The operator against the real control plane, for RolloutPools and Benchmarks: scaling and\nsandbox counts, workloads removed after their TTL, status from the runner's reports, a\nnamesake's leftovers."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import yaml

from crl_operator.apply import Kube
from crl_operator.builders.pool import gateway_name
from crl_worker.api import KINDS
from crl_worker.api.common import DEFAULT_WORKER_IMAGE, IMAGE_REGISTRY
from crl_worker.rollout.report import ConfigMapReporter

from .fixtures import operator_e2e
from .fixtures.cluster import Cluster
from .fixtures.operator_e2e import rendered_children
from .fixtures.operator_process import OTHER_REGISTRY, Operator
from .fixtures.paths import EXAMPLES
from .fixtures.resources import (
    apply,
    condition,
    is_,
    owned,
    wait_for,
)

# The GPU nodes the examples ask for (an autouse fixture), bound here so that pytest applies it.
gpu_nodes = operator_e2e.gpu_nodes


# --- pools and benchmarks -----------------------------------------------------------------------


def test_rolloutpool_scale_and_sandbox_counts(
    cluster: Cluster, kube: Kube, operator: Operator, namespace: str
) -> None:
    doc = yaml.safe_load(
        next(p for p in EXAMPLES if p.name == "rolloutpool-swe-gym.yaml").read_text()
    )
    apply(cluster, namespace, doc)
    pool = wait_for(
        "the pool Ready",
        lambda: (p := kube.get("RolloutPool", namespace, "swe-gym")) and is_(p, "Ready") and p,
        op=operator,
    )
    # The gateway's token: a Secret the pool owns, created once.
    secret = wait_for(
        "the token Secret",
        lambda: kube.get("Secret", namespace, "swe-gym-gateway-token"),
        op=operator,
    )
    assert secret["metadata"]["ownerReferences"][0]["uid"] == pool["metadata"]["uid"]
    assert len(secret["data"]["token"]) >= 40
    cluster.kubectl("scale", "rpool/swe-gym", "-n", namespace, "--replicas=3")
    config = "swe-gym-config"

    def scaled() -> bool:
        p = kube.get("RolloutPool", namespace, "swe-gym")
        cm = kube.get("ConfigMap", namespace, config)
        assert p is not None and cm is not None
        return bool(
            p["spec"]["replicas"] == 3
            and p["status"]["desired"] == 3
            and yaml.safe_load(cm["data"]["config.yaml"])["spec"]["replicas"] == 3
        )

    wait_for("spec.replicas, status.desired and the gateway config at 3", scaled, op=operator)
    # Reconciles of a changed spec leave the token alone (never re-drawn, never re-applied).
    again = kube.get("Secret", namespace, "swe-gym-gateway-token")
    assert again is not None
    assert again["data"] == secret["data"]
    assert again["metadata"]["resourceVersion"] == secret["metadata"]["resourceVersion"]
    # The gateway runs the default worker image from the operator's registry.
    gateway = kube.get("Deployment", namespace, gateway_name("swe-gym"))
    assert gateway is not None
    [container] = gateway["spec"]["template"]["spec"]["containers"]
    assert container["image"] == DEFAULT_WORKER_IMAGE.replace(IMAGE_REGISTRY, OTHER_REGISTRY)
    # Act as the gateway: three sandbox pods owned by the pool, one per state.
    owner = {"apiVersion": "coderepair.io/v1alpha1", "kind": "RolloutPool", "name": "swe-gym",
             "uid": pool["metadata"]["uid"], "controller": True}  # fmt: skip
    pods = []
    for i, state in enumerate(("ready", "leased", "starting")):
        pods.append({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"swe-gym-sandbox-{i}", "ownerReferences": [owner],
                         "labels": {"coderepair.io/pool": "swe-gym", "coderepair.io/role": "sandbox",
                                    "coderepair.io/state": state}},
            "spec": {"containers": [{"name": "sandbox", "image": "busybox"}]},
        })  # fmt: skip
    apply(cluster, namespace, *pods)

    def counted() -> bool:
        st = kube.get("RolloutPool", namespace, "swe-gym")["status"]  # type: ignore[index]
        return bool((st.get("ready"), st.get("leased"), st.get("coldStarting")) == (1, 1, 1))

    wait_for("ready=1 leased=1 coldStarting=1", counted, op=operator)
    scale = json.loads(cluster.kubectl("get", "--raw",
                                       f"/apis/coderepair.io/v1alpha1/namespaces/{namespace}/rolloutpools/swe-gym/scale").stdout)  # fmt: skip
    assert scale["spec"]["replicas"] == 3
    assert scale["status"]["selector"] == "coderepair.io/pool=swe-gym"
    assert scale["status"]["replicas"] == 2  # existing, not leased


def test_benchmark_workloads_go_after_ttl(
    cluster: Cluster, kube: Kube, operator: Operator, namespace: str
) -> None:
    doc = yaml.safe_load(
        next(p for p in EXAMPLES if p.name == "benchmark-hosted-endpoint.yaml").read_text()
    )
    doc["spec"]["ttlSecondsAfterFinished"] = 5
    apply(cluster, namespace, doc)
    name = doc["metadata"]["name"]
    bench = wait_for(
        "the benchmark to succeed",
        lambda: (b := kube.get("Benchmark", namespace, name)) and is_(b, "Succeeded") and b,
        op=operator,
    )
    uid = bench["metadata"]["uid"]
    assert bench["status"]["children"]["runnerJob"]
    # Finished: the pool goes at once; the runner Job after the TTL; the config and the verdict stay.
    wait_for(
        "the runner Job deleted after the TTL",
        lambda: not any(k == "Job" for k, _ in owned(kube, namespace, uid)),
        timeout=60,
        op=operator,
    )
    left = owned(kube, namespace, uid)
    assert {k for k, _ in left} == {"ConfigMap"}, set(left)
    final = kube.get("Benchmark", namespace, name)
    assert is_(final, "Succeeded") and is_(final, "Ready")
    assert final["status"]["completionTime"] == bench["status"]["completionTime"]  # type: ignore[index]


def test_benchmark_status_follows_the_runners_reports(
    cluster: Cluster, kube: Kube, operator: Operator, namespace: str
) -> None:
    """The test plays the runner: it publishes reports with the runner's own ServiceAccount."""
    doc = yaml.safe_load(
        next(p for p in EXAMPLES if p.name == "benchmark-hosted-endpoint.yaml").read_text()
    )
    # A results claim that does not exist keeps the runner's pod Pending: it never finishes.
    doc["spec"]["results"] = {"volume": {"claimName": "crl-test-missing"}, "path": "hosted"}
    apply(cluster, namespace, doc)
    name = doc["metadata"]["name"]
    runner, progress = f"{name}-runner", f"{name}-progress"

    def children() -> dict[tuple[str, str], dict[str, Any]] | None:
        bench = kube.get("Benchmark", namespace, name)
        if bench is None:
            return None
        kids = owned(kube, namespace, bench["metadata"]["uid"])
        wanted = {("Job", runner), ("ServiceAccount", runner), ("Role", runner),
                  ("RoleBinding", runner), ("ConfigMap", progress)}  # fmt: skip
        return kids if wanted <= set(kids) else None

    kids = wait_for(
        "the runner Job, its identity and its progress ConfigMap", children, op=operator
    )
    assert kids[("Job", runner)]["spec"]["template"]["spec"]["serviceAccountName"] == runner
    reporter = ConfigMapReporter(
        namespace, progress, kubeconfig=str(cluster.service_account_kubeconfig(runner, namespace))
    )

    def status() -> dict[str, Any]:
        return dict((kube.get("Benchmark", namespace, name) or {}).get("status") or {})

    def child_applies() -> int:
        """Applies of this namespace's children: the operator's request counters cover every
        namespace, and an earlier test's namespace still going gets reconciles (retried, with
        growing pauses) for a while."""
        return operator.proc.applies(namespace)

    # Settle: the operator's own applies land (quiet for three reads in a row).
    patches, quiet, deadline = -1, 0, time.monotonic() + 90
    while time.monotonic() < deadline and quiet < 3:
        now = child_applies()
        quiet = quiet + 1 if now == patches else 0
        patches = now
        time.sleep(3)
    assert patches >= 5, operator.proc.log_tail()  # the runner Job, its identity, its ConfigMap
    first = {"total": 300, "done": 10, "resolved": 4, "errored": 2,
             "passAtK": [{"k": 1, "value": 0.5}], "finished": False}  # fmt: skip
    asyncio.run(reporter.publish(first))
    assert reporter.sent == 1
    st = wait_for(
        "status.progress from the first report",
        lambda: (s := status()).get("progress", {}).get("done") == 10 and s,
        op=operator,
    )
    assert st["progress"] == {"total": 300, "done": 10, "resolved": 4, "errored": 2,
                              "summary": "10/300"}  # fmt: skip
    assert st["resolveRate"] == 0.5  # 4 of the 8 that finished without an infrastructure error
    assert st["passAtK"] == [{"k": 1, "value": 0.5}]
    # The runner's write is not the operator's business: nothing is re-applied (the reconcile
    # it caused skips every child, its progress ConfigMap included), only the status changes.
    assert child_applies() == patches

    # A malformed report is logged and ignored; the status keeps the last good one.
    cluster.kubectl("patch", "configmap", progress, "-n", namespace, "--type", "merge",
                    "-p", json.dumps({"data": {"progress.json": '{"total": 1}'}}))  # fmt: skip
    wait_for(
        "the operator to log the malformed report",
        lambda: "ignoring the progress report" in operator.proc.log_tail(400),
        op=operator,
    )
    st = status()
    assert st["progress"]["done"] == 10 and st["passAtK"] == [{"k": 1, "value": 0.5}]
    assert condition(kube.get("Benchmark", namespace, name), "Ready").get("reason") not in (
        "ApplyFailed", "InvalidSpec",
    )  # fmt: skip
    # So is one with counts the status schema cannot hold (int64): copied, they would make the
    # status patch fail at every reconcile, freezing the Benchmark's conditions.
    errors = operator.reconciles("Benchmark", "error")
    huge = {"total": 2**64, "done": 2**64, "resolved": 0}
    cluster.kubectl("patch", "configmap", progress, "-n", namespace, "--type", "merge",
                    "-p", json.dumps({"data": {"progress.json": json.dumps(huge)}}))  # fmt: skip
    wait_for(
        "the operator to log the report it cannot hold",
        lambda: "less than or equal to 9007199254740991" in operator.proc.log_tail(400),
        op=operator,
    )
    assert status()["progress"]["done"] == 10
    assert operator.reconciles("Benchmark", "error") == errors

    second = {"total": 300, "done": 20, "resolved": 9, "errored": 2, "resolveRate": 0.5,
              "passAtK": [{"k": 1, "value": 0.45}], "finished": False}  # fmt: skip
    asyncio.run(reporter.publish(second))
    st = wait_for(
        "status.progress from the second report",
        lambda: (s := status()).get("progress", {}).get("done") == 20 and s,
        op=operator,
    )
    assert (st["resolveRate"], st["passAtK"]) == (0.5, [{"k": 1, "value": 0.45}])

    # Drift on the progress ConfigMap: the operator takes its label back by server-side apply
    # and leaves the runner's report where it is.
    written = kube.get("ConfigMap", namespace, progress)["data"]["progress.json"]  # type: ignore[index]
    cluster.kubectl("label", "configmap", progress, "-n", namespace, "app.kubernetes.io/part-of-")

    def repaired() -> dict[str, Any] | None:
        cm = kube.get("ConfigMap", namespace, progress) or {}
        labels = cm.get("metadata", {}).get("labels", {})
        return cm if labels.get("app.kubernetes.io/part-of") == "coderepairrl" else None

    cm = wait_for("the label put back", repaired, op=operator)
    # Its log line follows the apply's answer (the label can be seen a moment before).
    wait_for("the apply in the operator's log", lambda: child_applies() > patches, op=operator)
    assert cm["data"]["progress.json"] == written


def test_a_child_left_by_a_deleted_namesake_is_not_adopted(
    cluster: Cluster, kube: Kube, operator: Operator, namespace: str
) -> None:
    """A Benchmark deleted and created again at once finds its old children still there, waiting
    for the garbage collector. Applied over, they would be adopted with their state (a finished
    runner Job, the old runner's report); the operator waits for the collector instead."""
    doc = yaml.safe_load(
        next(p for p in EXAMPLES if p.name == "benchmark-hosted-endpoint.yaml").read_text()
    )
    doc["spec"]["results"] = {"volume": {"claimName": "crl-test-missing"}, "path": "hosted"}
    name = doc["metadata"]["name"]
    progress = f"{name}-progress"
    # The earlier Benchmark's progress ConfigMap, as the operator applied it, with its runner's
    # report; its owner is an object that still exists, so the collector keeps it for now.
    cluster.kubectl("create", "configmap", "earlier-owner", "-n", namespace)
    earlier = kube.get("ConfigMap", namespace, "earlier-owner")
    assert earlier is not None
    bench = KINDS["Benchmark"].model.model_validate(doc)
    [stale] = [
        c
        for c in rendered_children(bench, namespace)
        if c["kind"] == "ConfigMap" and c["metadata"]["name"] == progress
    ]
    stale["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "earlier-owner",
         "uid": earlier["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
    ]  # fmt: skip
    cluster.kubectl("apply", "--server-side", "--field-manager=coderepairrl-operator",
                    "-n", namespace, "-f", "-", input=json.dumps(stale))  # fmt: skip
    old_report = {"total": 300, "done": 299, "resolved": 250, "errored": 0, "finished": True}
    cluster.kubectl("patch", "configmap", progress, "-n", namespace, "--type", "merge",
                    "-p", json.dumps({"data": {"progress.json": json.dumps(old_report)}}))  # fmt: skip

    apply(cluster, namespace, doc)

    def benchmark() -> dict[str, Any]:
        return kube.get("Benchmark", namespace, name) or {}

    def owners(obj: dict[str, Any] | None) -> list[str]:
        return [str(r["uid"]) for r in (obj or {}).get("metadata", {}).get("ownerReferences", [])]

    def refusing() -> dict[str, Any] | None:
        b = benchmark()
        return b if is_(b, "Ready", "False", "ApplyFailed") else None

    refused = wait_for(
        "the Benchmark to report the ConfigMap it does not own", refusing, op=operator
    )
    assert "controlled by another owner" in condition(refused, "Ready")["message"]
    assert refused["status"].get("progress", {}).get("done") != 299
    assert owners(kube.get("ConfigMap", namespace, progress)) == [earlier["metadata"]["uid"]]

    # The collector removes what the earlier owner left; the operator then creates its own.
    cluster.kubectl("delete", "configmap", "earlier-owner", "-n", namespace)
    uid = str(refused["metadata"]["uid"])

    def own_config_map() -> dict[str, Any] | None:
        c = kube.get("ConfigMap", namespace, progress)
        return c if owners(c) == [uid] else None

    fresh = wait_for("a progress ConfigMap of the new Benchmark's own", own_config_map, op=operator)
    assert "progress.json" not in (fresh.get("data") or {})

    def settled_down() -> dict[str, Any] | None:
        b = benchmark()
        return b if b and condition(b, "Ready").get("reason") != "ApplyFailed" else None

    settled = wait_for("the ApplyFailed condition to clear", settled_down, op=operator)
    assert settled["status"].get("progress", {}).get("done") != 299

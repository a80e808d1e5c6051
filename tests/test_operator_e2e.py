"""The operator end to end: `python -m crl_operator` as a subprocess against the real control
plane (kube-apiserver, etcd, controller-manager, scheduler; kwok runs the pods).

The tests act as users (kubectl apply / patch / scale / delete) and, where the cluster has no
real program behind a pod, as that program: they create the sandbox pods a pool gateway would,
and set a Job's `spec.suspend` with their own field manager as Kueue would. kwok makes pods
Running and Ready and Job pods Succeeded at once; a trainer that must stay unfinished is kept
Pending with a node selector no node matches.

The local-* examples are not applied: their task paths are relative to the file on a laptop
(`../../shared/data/...`), which no pod could read; they exist for `python -m crl_worker` on
one machine, and the builders' tests render them.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from crl_operator.apply import Kube
from crl_operator.builders import RenderState, relocate_images, render
from crl_operator.builders.pool import gateway_name
from crl_worker.api import KINDS
from crl_worker.api.common import DEFAULT_WORKER_IMAGE, IMAGE_REGISTRY
from crl_worker.rollout.report import ConfigMapReporter

from .cluster import Cluster
from .fixtures.resources import (
    CHILD_KINDS,
    PENDING_TRAINER,
    apply,
    condition,
    is_,
    job_of,
    owned,
    small_run,
    trainingrun,
    wait_for,
)
from .operator_process import OTHER_REGISTRY, Operator
from .paths import EXAMPLES

# By name, so a new one-machine example (local-benchmark-mini.yaml) is never applied by mistake.
LOCAL_ONLY = {p.name for p in EXAMPLES if p.name.startswith("local-")}

# Extra fake nodes for the examples' GPU appetite (2 trainer nodes x 8 GPUs, vLLM replicas).
GPU_NODE_CAPACITY = {"cpu": "256", "memory": "2Ti", "pods": "250", "nvidia.com/gpu": "64"}


@pytest.fixture(scope="module", autouse=True)
def gpu_nodes(cluster: Cluster) -> list[str]:
    """Two more kwok nodes with 64 GPUs each, labelled as the examples' node selectors ask."""
    names = ["crl-op-gpu-0", "crl-op-gpu-1"]
    wanted: dict[str, str] = {}
    for path in EXAMPLES:
        for selector in dicts(yaml.safe_load(path.read_text()), "nodeSelector"):
            wanted.update(selector)
    items = [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": n,
                "annotations": {"kwok.x-k8s.io/node": "fake"},
                "labels": {**wanted, "kubernetes.io/hostname": n, "type": "kwok"},
            },
            "status": {"capacity": GPU_NODE_CAPACITY, "allocatable": GPU_NODE_CAPACITY},
        }
        for n in names
    ]
    cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
    )
    return names


# --- helpers ------------------------------------------------------------------------------------


def rendered_children(resource: Any, namespace: str) -> list[dict[str, Any]]:
    """What this module's operator applies for `resource` (inference ready): the builders'
    children with the project's images moved to its registry."""
    return relocate_images(
        render(resource, namespace, RenderState(inference_ready=True)), OTHER_REGISTRY
    )


def component(obj: dict[str, Any]) -> str:
    return str(obj["metadata"].get("labels", {}).get("app.kubernetes.io/component", ""))


def model(obj: dict[str, Any]) -> Any:
    return KINDS[obj["kind"]].model.model_validate({k: v for k, v in obj.items() if k != "status"})


def pending_run(
    cluster: Cluster, kube: Kube, op: Operator, namespace: str, name: str
) -> dict[str, Any]:
    """A run whose inference is up and whose trainer Job exists but never runs."""
    apply(cluster, namespace, small_run(name, trainer=PENDING_TRAINER))

    def ready() -> dict[str, Any] | None:
        run = trainingrun(kube, namespace, name)
        if run and is_(run, "InferenceReady") and job_of(kube, namespace, run):
            return run
        return None

    return wait_for(f"TrainingRun {name} with inference ready and a trainer Job", ready, op=op)


# --- tests --------------------------------------------------------------------------------------


def dicts(doc: Any, key: str) -> Iterator[dict[str, str]]:
    """Every mapping under `key` anywhere in a nested document."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k == key and isinstance(v, dict):
                yield v
            else:
                yield from dicts(v, key)
    elif isinstance(doc, list):
        for item in doc:
            yield from dicts(item, key)


def values(doc: Any, key: str) -> Iterator[str]:
    """Every value of `key` anywhere in a nested document."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k == key and isinstance(v, str):
                yield v
            else:
                yield from values(v, key)
    elif isinstance(doc, list):
        for item in doc:
            yield from values(item, key)


def claims(cluster: Cluster, namespace: str, *names: str) -> None:
    """Bound PersistentVolumeClaims for the volumes the examples mount (as an admin would
    provide them); pods whose claim is missing or unbound are never scheduled."""
    items: list[dict[str, Any]] = []
    for name in names:
        pv = f"{namespace}-{name}"
        modes = ["ReadWriteMany"]
        items.append({
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
            "spec": {"capacity": {"storage": "1Ti"}, "accessModes": modes, "storageClassName": "",
                     "hostPath": {"path": f"/tmp/{pv}"},
                     "claimRef": {"namespace": namespace, "name": name}},
        })  # fmt: skip
        items.append({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"accessModes": modes, "storageClassName": "", "volumeName": pv,
                     "resources": {"requests": {"storage": "1Ti"}}},
        })  # fmt: skip
    cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
    )


def test_examples_reach_ready(
    cluster: Cluster, kube: Kube, operator: Operator, namespace: str
) -> None:
    docs = [yaml.safe_load(p.read_text()) for p in EXAMPLES if p.name not in LOCAL_ONLY]
    # What a cluster admin provides: the volumes and PriorityClasses the examples name.
    claims(cluster, namespace, *sorted(set(values(docs, "claimName"))))
    for name in sorted(set(values(docs, "priorityClassName"))):
        pc = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
              "metadata": {"name": name}, "value": 1000}  # fmt: skip
        cluster.kubectl("apply", "-f", "-", input=json.dumps(pc))
    assert {d["kind"] for d in docs} == {"TrainingRun", "RolloutPool", "Benchmark"}
    apply(cluster, namespace, *docs)
    for doc in docs:
        kind, name = doc["kind"], doc["metadata"]["name"]

        def ready(kind: str = kind, name: str = name) -> dict[str, Any] | None:
            obj = kube.get(kind, namespace, name)
            return obj if is_(obj, "Ready") else None

        obj = wait_for(f"{kind} {name} Ready", ready, timeout=120, op=operator)
        st = obj["status"]
        assert st["observedGeneration"] == obj["metadata"]["generation"]
        for c in st["conditions"]:
            assert c["observedGeneration"] == obj["metadata"]["generation"]
        if kind == "RolloutPool":
            assert st["selector"] == f"coderepair.io/pool={name}"
            assert st["desired"] == doc["spec"]["replicas"]
        if kind in ("TrainingRun", "Benchmark"):
            # kwok completes Job pods at once: the trainer and the runners run to the end (Ready
            # can be reported a reconcile before Succeeded, on a busy machine).
            def succeeded(kind: str = kind, name: str = name) -> dict[str, Any] | None:
                obj = kube.get(kind, namespace, name)
                return obj if is_(obj, "Succeeded") else None

            obj = wait_for(f"{kind} {name} Succeeded", succeeded, timeout=120, op=operator)
            st = obj["status"]
            job = job_of(kube, namespace, obj)
            assert job is not None and (job["status"].get("succeeded") or 0) >= 1
            assert st["startTime"] and st["completionTime"]
    # The shape of what stays: each live child holds every field the builders render.
    pool = kube.get("RolloutPool", namespace, "swe-gym")
    assert pool is not None
    live = owned(kube, namespace, pool["metadata"]["uid"])
    rendered = rendered_children(model(pool), namespace)
    assert {(c["kind"], c["metadata"]["name"]) for c in rendered} == set(live)
    from crl_operator.apply import contains

    for child in rendered:
        assert contains(live[(child["kind"], child["metadata"]["name"])], child), child["kind"]


def test_trainer_waits_for_inference_and_spec_edits_reach_children(
    cluster: Cluster, kube: Kube, operator: Operator, namespace: str
) -> None:
    # A node selector no node matches: the vLLM pod stays Pending, so inference is not ready.
    never = {"nodeSelector": {"crl-test/never": "true"}}
    apply(
        cluster,
        namespace,
        small_run("gated", inference={"replicas": 1, "gpus": 1, "placement": never}),
    )
    run = wait_for(
        "InferenceReady=False",
        lambda: (
            (r := trainingrun(kube, namespace, "gated")) and is_(r, "InferenceReady", "False") and r
        ),
        op=operator,
    )
    time.sleep(5)  # several reconciles (pod events, status echoes) happen meanwhile
    run = trainingrun(kube, namespace, "gated")
    assert run is not None
    assert job_of(kube, namespace, run) is None
    assert is_(run, "Training", "False", "WaitingForInference")
    kinds = {k for k, _ in owned(kube, namespace, run["metadata"]["uid"])}
    assert {"ConfigMap", "Deployment", "Service", "RolloutPool"} <= kinds
    # The user fixes the spec: the Deployment follows (server-side apply drops the selector the
    # operator no longer sets), becomes available, and the trainer starts.
    cluster.kubectl("patch", "trainingrun", "gated", "-n", namespace, "--type", "merge",
                    "-p", '{"spec":{"inference":{"placement":null}}}')  # fmt: skip

    def deployment_gpus() -> bool:
        for (kind, _), obj in owned(kube, namespace, run["metadata"]["uid"]).items():
            if kind == "Deployment" and component(obj) == "inference":
                return "nodeSelector" not in obj["spec"]["template"]["spec"]
        return False

    wait_for("the Deployment without the node selector", deployment_gpus, op=operator)
    done = wait_for(
        "the run to succeed",
        lambda: (r := trainingrun(kube, namespace, "gated")) and is_(r, "Succeeded") and r,
        op=operator,
    )
    assert is_(done, "Ready", "True")
    assert done["status"]["observedGeneration"] == 2


def test_suspend_and_resume(
    cluster: Cluster, kube: Kube, operator: Operator, namespace: str
) -> None:
    run = pending_run(cluster, kube, operator, namespace, "pausable")
    uid = run["metadata"]["uid"]
    job = job_of(kube, namespace, run)
    assert job is not None
    cluster.kubectl("patch", "trainingrun", "pausable", "-n", namespace, "--type", "merge",
                    "-p", '{"spec":{"suspend":true}}')  # fmt: skip

    def suspended() -> bool:
        r = trainingrun(kube, namespace, "pausable")
        children = owned(kube, namespace, uid)
        deps = [o for (k, _), o in children.items() if k == "Deployment"]
        pools = [o for (k, _), o in children.items() if k == "RolloutPool"]
        return bool(
            is_(r, "Suspended", "True", "SuspendedByUser")
            and job_of(kube, namespace, run) is None
            and deps
            and deps[0]["spec"]["replicas"] == 0
            and pools
            and pools[0]["spec"]["replicas"] == 0
        )

    wait_for("the trainer Job gone and inference at 0 replicas", suspended, op=operator)
    r = trainingrun(kube, namespace, "pausable")
    assert is_(r, "Ready", "False", "SuspendedByUser")
    cluster.kubectl("patch", "trainingrun", "pausable", "-n", namespace, "--type", "merge",
                    "-p", '{"spec":{"suspend":false}}')  # fmt: skip
    back = wait_for(
        "a new trainer Job after resume",
        lambda: (
            (j := job_of(kube, namespace, run))
            and j["metadata"]["uid"] != job["metadata"]["uid"]
            and j
        ),
        op=operator,
    )
    assert back["metadata"]["name"] == job["metadata"]["name"]
    r = wait_for(
        "Suspended=False",
        lambda: (
            (x := trainingrun(kube, namespace, "pausable")) and is_(x, "Suspended", "False") and x
        ),
    )
    assert is_(r, "InferenceReady")


def test_drift_is_repaired(
    cluster: Cluster, kube: Kube, operator: Operator, namespace: str
) -> None:
    run = pending_run(cluster, kube, operator, namespace, "drifty")
    uid = run["metadata"]["uid"]
    children = owned(kube, namespace, uid)
    config = next(o for (k, _), o in children.items() if k == "ConfigMap")
    dep = next(o for (k, _), o in children.items() if k == "Deployment")
    cm_name, dep_name = config["metadata"]["name"], dep["metadata"]["name"]
    # A deleted child comes back (the delete event enqueues its owner).
    cluster.kubectl("delete", "configmap", cm_name, "-n", namespace)
    wait_for(
        "the ConfigMap back",
        lambda: (
            (c := kube.get("ConfigMap", namespace, cm_name))
            and c["metadata"]["uid"] != config["metadata"]["uid"]
        ),
        op=operator,
    )
    assert kube.get("ConfigMap", namespace, cm_name)["data"] == config["data"]  # type: ignore[index]
    # Edited fields the operator sets are put back.
    cluster.kubectl("patch", "configmap", cm_name, "-n", namespace, "--type", "merge",
                    "-p", json.dumps({"data": {"config.yaml": "tampered: true\n"}}))  # fmt: skip
    cluster.kubectl("label", "deployment", dep_name, "-n", namespace,
                    "app.kubernetes.io/part-of=someone-else", "--overwrite")  # fmt: skip
    cluster.kubectl("scale", "deployment", dep_name, "-n", namespace, "--replicas=3")
    wait_for(
        "the ConfigMap data restored",
        lambda: kube.get("ConfigMap", namespace, cm_name)["data"] == config["data"],  # type: ignore[index]
        op=operator,
    )

    def dep_restored() -> bool:
        d = kube.get("Deployment", namespace, dep_name)
        assert d is not None
        return bool(
            d["metadata"]["labels"]["app.kubernetes.io/part-of"] == "coderepairrl"
            and d["spec"]["replicas"] == 1
        )

    wait_for("the Deployment's label and replicas restored", dep_restored, op=operator)


def test_fields_of_other_managers_are_left_alone(
    cluster: Cluster, kube: Kube, operator: Operator, namespace: str
) -> None:
    run = pending_run(cluster, kube, operator, namespace, "queued")
    job = job_of(kube, namespace, run)
    assert job is not None
    name = job["metadata"]["name"]
    # As Kueue does when it preempts a workload: suspend the Job and label it, as another manager.
    cluster.kubectl("patch", "job", name, "-n", namespace, "--type", "merge", "--field-manager", "kueue",
                    "-p", json.dumps({"metadata": {"labels": {"kueue.x-k8s.io/preempted": "true"}},
                                      "spec": {"suspend": True}}))  # fmt: skip
    wait_for(
        "Admitted=False/JobSuspended",
        lambda: is_(trainingrun(kube, namespace, "queued"), "Admitted", "False", "JobSuspended"),
        op=operator,
    )
    before = operator.reconciles("TrainingRun")
    # Make the operator reconcile several times: metadata edits are events without a new spec.
    for i in range(3):
        cluster.kubectl(
            "annotate",
            "trainingrun",
            "queued",
            "-n",
            namespace,
            f"crl-test/poke={i}",
            "--overwrite",
        )
        time.sleep(1.5)
    wait_for(
        "reconciles after the pokes",
        lambda: operator.reconciles("TrainingRun") >= before + 3,
        op=operator,
    )
    live = kube.get("Job", namespace, name)
    assert live is not None
    assert live["metadata"]["uid"] == job["metadata"]["uid"]  # not replaced
    assert live["spec"]["suspend"] is True
    assert live["metadata"]["labels"]["kueue.x-k8s.io/preempted"] == "true"
    managers = {m["manager"]: m for m in live["metadata"]["managedFields"]}
    ours = json.dumps(managers["coderepairrl-operator"]["fieldsV1"])
    assert '"f:suspend"' not in ours
    assert '"f:suspend"' in json.dumps(managers["kueue"]["fieldsV1"])


def test_a_settled_run_costs_no_writes(
    cluster: Cluster, kube: Kube, operator: Operator, namespace: str
) -> None:
    run = pending_run(cluster, kube, operator, namespace, "quiet")
    pool = next(
        o
        for (k, _), o in owned(kube, namespace, run["metadata"]["uid"]).items()
        if k == "RolloutPool"
    )
    wait_for(
        "the pool Ready",
        lambda: is_(kube.get("RolloutPool", namespace, pool["metadata"]["name"]), "Ready"),
    )
    time.sleep(3)  # the last status writes land

    def snapshot() -> dict[tuple[str, str], str]:
        objs = {
            **owned(kube, namespace, run["metadata"]["uid"]),
            **owned(kube, namespace, pool["metadata"]["uid"]),
        }
        return {key: obj["metadata"]["resourceVersion"] for key, obj in objs.items()}

    before = snapshot()
    status_before = trainingrun(kube, namespace, "quiet")["status"]  # type: ignore[index]
    reconciles = operator.reconciles("TrainingRun")
    # An event (a metadata edit) and a resync (every 20 s in these tests) both reconcile it.
    cluster.kubectl("annotate", "trainingrun", "quiet", "-n", namespace, "crl-test/poke=1")
    wait_for(
        "two reconciles (the annotation's event and the resync)",
        lambda: operator.reconciles("TrainingRun") >= reconciles + 2,
        timeout=40,
        op=operator,
    )
    assert snapshot() == before  # not one child was written
    assert trainingrun(kube, namespace, "quiet")["status"] == status_before  # type: ignore[index]


def test_killed_operator_recovers_without_duplicates(
    cluster: Cluster, kube: Kube, operator: Operator, namespace: str
) -> None:
    doc = small_run("survivor", trainer=PENDING_TRAINER)
    apply(cluster, namespace, doc)
    # Kill it mid-reconcile: as soon as the first child exists, before the rest is done.
    wait_for(
        "the first child",
        lambda: any(
            o["metadata"].get("labels", {}).get("app.kubernetes.io/instance") == "survivor"
            for o in kube.list("ConfigMap", namespace=namespace)
        ),
        timeout=60,
        op=operator,
    )
    operator.proc.kill()
    operator.restart()
    run = wait_for(
        "the run with its trainer Job after the restart",
        lambda: (
            (r := trainingrun(kube, namespace, "survivor"))
            and is_(r, "InferenceReady")
            and job_of(kube, namespace, r)
            and r
        ),
        op=operator,
    )
    live = owned(kube, namespace, run["metadata"]["uid"])
    rendered = rendered_children(model(run), namespace)
    assert set(live) == {(c["kind"], c["metadata"]["name"]) for c in rendered}
    # Nothing was created twice: exactly one Job, one Deployment and their pods.
    instance = "app.kubernetes.io/instance=survivor"
    assert len(kube.list("Job", namespace=namespace, label_selector=instance)) == 1
    assert len(kube.list("Deployment", namespace=namespace, label_selector=instance)) == 1
    pods = [
        p
        for p in kube.list("Pod", namespace=namespace, label_selector=instance)
        if not p["metadata"].get("deletionTimestamp")
    ]
    assert len(pods) == 2, [p["metadata"]["name"] for p in pods]  # one vLLM pod, one trainer pod


def test_delete_cascades(cluster: Cluster, kube: Kube, operator: Operator, namespace: str) -> None:
    run = pending_run(cluster, kube, operator, namespace, "doomed")
    pool = next(
        o
        for (k, _), o in owned(kube, namespace, run["metadata"]["uid"]).items()
        if k == "RolloutPool"
    )
    wait_for(
        "the pool's gateway", lambda: owned(kube, namespace, pool["metadata"]["uid"]), op=operator
    )
    cluster.kubectl("delete", "trainingrun", "doomed", "-n", namespace, "--wait=false")

    def all_gone() -> bool:
        left = [
            (kind, o["metadata"]["name"])
            for kind in (*CHILD_KINDS, "Pod")
            for o in kube.list(kind, namespace=namespace)
            if o["metadata"].get("labels", {}).get("app.kubernetes.io/instance")
            in ("doomed", pool["metadata"]["name"])
        ]
        assert not left, left
        return True

    # The garbage collector (kube-controller-manager) deletes children, grandchildren and pods.
    wait_for("every child, grandchild and pod deleted", all_gone, timeout=120, op=operator)


def test_invalid_spec_is_reported_once(
    cluster: Cluster, kube: Kube, operator: Operator, namespace: str
) -> None:
    # The CRD checks a quantity's pattern only; the model also refuses more than 64 characters.
    doc = small_run(
        "bad",
        trainer={"nodes": 1, "gpusPerNode": 1, "resources": {"requests": {"cpu": "1" + "0" * 70}}},
    )
    apply(cluster, namespace, doc)  # admission accepts it
    run = wait_for(
        "Ready=False/InvalidSpec",
        lambda: (
            (r := trainingrun(kube, namespace, "bad"))
            and is_(r, "Ready", "False", "InvalidSpec")
            and r
        ),
        op=operator,
    )
    message = condition(run, "Ready")["message"]
    assert "spec.trainer.resources.requests.cpu" in message
    assert not owned(kube, namespace, run["metadata"]["uid"])  # nothing was created
    before = operator.reconciles("TrainingRun", "invalid")
    time.sleep(10)
    after = operator.reconciles("TrainingRun", "invalid")
    # No retry storm: at most the resync (every 20 s here) and an echo of the status write.
    assert after - before <= 2, (before, after)
    events = kube.list("Event", namespace=namespace)
    assert any(e["reason"] == "InvalidSpec" and e["type"] == "Warning" for e in events)
    # Fixing the spec clears it.
    cluster.kubectl("patch", "trainingrun", "bad", "-n", namespace, "--type", "json",
                    "-p", '[{"op":"replace","path":"/spec/trainer/resources/requests/cpu","value":"1"}]')  # fmt: skip
    wait_for(
        "the fixed run to get its children",
        lambda: (
            (r := trainingrun(kube, namespace, "bad"))
            and condition(r, "Ready").get("reason") != "InvalidSpec"
            and owned(kube, namespace, r["metadata"]["uid"])
        ),
        op=operator,
    )


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

    def child_applies() -> float:
        """Server-side applies of any child (PATCHes that are not status writes)."""
        return sum(
            value
            for (metric, labels), value in operator.proc.metrics().items()
            if metric == "crl_operator_api_requests_total"
            and ("verb", "PATCH") in labels
            and not any(k == "kind" and v.endswith("/status") for k, v in labels)
        )

    # Settle: the operator's own applies land, and earlier tests' namespaces finish going
    # (quiet for three reads in a row: on a loaded machine one 3 s gap is not enough).
    patches, quiet, deadline = -1.0, 0, time.monotonic() + 90
    while time.monotonic() < deadline and quiet < 3:
        now = child_applies()
        quiet = quiet + 1 if now == patches else 0
        patches = now
        time.sleep(3)
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
    assert child_applies() > patches
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

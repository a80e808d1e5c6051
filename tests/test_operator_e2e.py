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

import yaml

from crl_operator.apply import Kube
from crl_operator.builders.pool import gateway_name
from crl_worker.api import KINDS
from crl_worker.api.progress import PoolProgress
from crl_worker.pool.validation import ConfigMapPublisher

from .fixtures import operator_e2e
from .fixtures.cluster import Cluster
from .fixtures.operator_e2e import rendered_children
from .fixtures.operator_process import Operator
from .fixtures.paths import EXAMPLES
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

# The GPU nodes the examples ask for (an autouse fixture), bound here so that pytest applies it.
gpu_nodes = operator_e2e.gpu_nodes

# By name, so a new one-machine example (local-benchmark-mini.yaml) is never applied by mistake.
LOCAL_ONLY = {p.name for p in EXAMPLES if p.name.startswith("local-")}


# --- helpers ------------------------------------------------------------------------------------


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


def validated_by_its_gateway(
    cluster: Cluster, kube: Kube, operator: Operator, namespace: str, name: str
) -> None:
    """A pool that validates its tasks is not Ready until its gateway's last report; the test
    plays the gateway (kwok runs no program), publishing with the gateway's own
    ServiceAccount and the gateway's publisher. Then `kubectl get rpool` shows the counts, an
    Event names the reasons, and the operator's gauge counts the quarantined tasks."""

    def validating() -> dict[str, Any] | None:
        obj = kube.get("RolloutPool", namespace, name)
        found = condition(obj, "Ready") if obj else None
        return obj if found and found.get("reason") == "Validating" else None

    wait_for(f"RolloutPool {name} Validating", validating, timeout=120, op=operator)
    account = cluster.service_account_kubeconfig(gateway_name(name), namespace)
    publish = ConfigMapPublisher(namespace, f"{name}-progress", str(account))
    done = {"total": 3, "validated": 3, "quarantined": 1, "cached": 0, "finished": True,
            "reasons": {"gold patch does not resolve": 1},
            "tasks": [{"instanceId": "broken__task-1", "reason": "gold patch does not resolve"}]}  # fmt: skip
    asyncio.run(publish(PoolProgress.model_validate(done)))
    wait_for(
        f"RolloutPool {name} Ready after its gateway's last report",
        lambda: is_(kube.get("RolloutPool", namespace, name), "Ready"),
        timeout=120,
        op=operator,
    )
    table = cluster.kubectl("get", "rpool", name, "-n", namespace).stdout.split("\n")
    columns = dict(zip(table[0].split(), table[1].split(), strict=False))
    assert (columns.get("VALIDATED"), columns.get("QUARANTINED")) == ("3", "1"), table
    events = json.loads(cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)
    assert any(
        e["reason"] == "TasksQuarantined" and "gold patch does not resolve (1)" in e["message"]
        for e in events["items"]
        if e["involvedObject"]["name"] == name
    ), [e["reason"] for e in events["items"]]
    gauge = {labels: v for (metric, labels), v in operator.proc.metrics().items()
             if metric == "crl_operator_pool_quarantined_tasks"}  # fmt: skip
    assert 1.0 in [v for labels, v in gauge.items() if ("resource_name", name) in labels], gauge


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
        if kind == "RolloutPool" and doc["spec"].get("validation", {}).get("enabled"):
            validated_by_its_gateway(cluster, kube, operator, namespace, name)

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
    # Inference scales back from 0: its readiness may follow the Suspended condition.
    wait_for(
        "InferenceReady after resume",
        lambda: is_(trainingrun(kube, namespace, "pausable"), "InferenceReady"),
        op=operator,
    )


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

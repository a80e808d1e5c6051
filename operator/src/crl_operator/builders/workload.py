"""The Kueue Workload that admits a TrainingRun or a Benchmark as one unit.

One Workload per resource, owned by it, with one pod set per pod-running child: `inference`
(the vLLM Deployment: its replicas), `trainer` (the indexed Job: its nodes) or `runner` (the
benchmark Job). Kueue reserves quota for all pod sets at once or for none, so a run never holds
inference GPUs while its trainer waits. The children themselves carry no Kueue label: they are
created only once the Workload is admitted (see docs/scheduling.md for why this route and not a
pod group or Kueue's Job/Deployment integrations).

A pod set's template keeps only what Kueue reads to assign flavors and count quota: the
containers' names, images and resources, node selector, tolerations, affinity, priority class
and runtime class. Spec changes elsewhere in a pod template then never touch the Workload,
whose pod sets Kueue makes immutable while quota is reserved.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from crl_operator.builders.meta import (
    COMPONENT_INFERENCE,
    COMPONENT_RUNNER,
    COMPONENT_TRAINER,
    COMPONENT_WORKLOAD,
    KUEUE_PRIORITY_LABEL,
    KUEUE_QUEUE_LABEL,
    child_name,
    object_meta,
    owner_name,
)
from crl_worker.api import Benchmark, TrainingRun

WORKLOAD_API_VERSION = "kueue.x-k8s.io/v1beta2"
#: Pod-set names, in the order they appear in the Workload.
POD_SET_ORDER = (COMPONENT_INFERENCE, COMPONENT_TRAINER, COMPONENT_RUNNER)
_TEMPLATE_KEYS = (
    "nodeSelector",
    "tolerations",
    "affinity",
    "priorityClassName",
    "runtimeClassName",
)


def workload_name(owner: TrainingRun | Benchmark) -> str:
    """`<resource>-workload`."""
    return child_name(owner_name(owner), COMPONENT_WORKLOAD)


def _container(container: Mapping[str, Any]) -> dict[str, Any]:
    out = {"name": container["name"], "image": container.get("image", "")}
    if container.get("resources"):
        out["resources"] = container["resources"]
    return out


def pod_set_template(template: Mapping[str, Any]) -> dict[str, Any]:
    """What Kueue needs of a pod template: resources and placement, nothing else."""
    spec = template.get("spec") or {}
    out: dict[str, Any] = {"containers": [_container(c) for c in spec.get("containers") or ()]}
    if spec.get("initContainers"):
        out["initContainers"] = [_container(c) for c in spec["initContainers"]]
    for key in _TEMPLATE_KEYS:
        if spec.get(key):
            out[key] = spec[key]
    return {"spec": out}


def pod_sets(children: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One pod set per pod-running child (inference Deployment, trainer or runner Job)."""
    found: dict[str, dict[str, Any]] = {}
    for child in children:
        kind = child.get("kind")
        component = (child["metadata"].get("labels") or {}).get("app.kubernetes.io/component")
        if kind == "Deployment" and component == COMPONENT_INFERENCE:
            count = int(child["spec"].get("replicas") or 0)
        elif kind == "Job" and component in (COMPONENT_TRAINER, COMPONENT_RUNNER):
            count = int(child["spec"].get("parallelism") or 1)
        else:
            continue
        if count < 1:
            continue
        found[str(component)] = {
            "name": component,
            "count": count,
            "template": pod_set_template(child["spec"]["template"]),
        }
    return [found[name] for name in POD_SET_ORDER if name in found]


def workload(
    owner: TrainingRun | Benchmark,
    namespace: str,
    children: Sequence[Mapping[str, Any]],
    priority: int | None = None,
) -> dict[str, Any]:
    """The Workload for `owner` whose pod sets are those of `children` rendered as admitted;
    `priority`: the value of its WorkloadPriorityClass (Kueue refuses the reference without
    it)."""
    scheduling = owner.spec.scheduling
    spec: dict[str, Any] = {"queueName": scheduling.queue_name, "podSets": pod_sets(children)}
    if scheduling.workload_priority_class_name:
        spec["priorityClassRef"] = {
            "group": "kueue.x-k8s.io",
            "kind": "WorkloadPriorityClass",
            "name": scheduling.workload_priority_class_name,
        }
        spec["priority"] = priority or 0
    if scheduling.max_run_seconds:
        spec["maximumExecutionTimeSeconds"] = scheduling.max_run_seconds
    return {
        "apiVersion": WORKLOAD_API_VERSION,
        "kind": "Workload",
        "metadata": object_meta(owner, workload_name(owner), COMPONENT_WORKLOAD, namespace),
        "spec": spec,
    }


def strip_kueue_labels(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` without Kueue's queue and priority labels (on it and on its pod template)."""
    out = dict(obj)
    for path in (("metadata",), ("spec", "template", "metadata")):
        parent: Any = out
        for key in path:
            if not isinstance(parent, dict) or key not in parent:
                parent = None
                break
            parent[key] = dict(parent[key])
            parent = parent[key]
        if not isinstance(parent, dict) or "labels" not in parent:
            continue
        parent["labels"] = {
            k: v
            for k, v in parent["labels"].items()
            if k not in (KUEUE_QUEUE_LABEL, KUEUE_PRIORITY_LABEL)
        }
    return out

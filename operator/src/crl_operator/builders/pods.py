"""Pieces of pod specs the workloads share: resources, placement, volumes, Kueue labels, env."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from crl_operator.builders.meta import KUEUE_PRIORITY_LABEL, KUEUE_QUEUE_LABEL, object_meta
from crl_worker.api import AnyResource
from crl_worker.api.base import EnvVar, Placement, ResourceRequirements, VolumeSource
from crl_worker.api.common import SchedulingSpec, TaskSource

GPU_RESOURCE = "nvidia.com/gpu"
#: Where every worker pod finds its ConfigMap.
CONFIG_DIR = "/etc/crl"
CONFIG_VOLUME = "config"
SHM_VOLUME = "dshm"


def resources(spec: ResourceRequirements, gpus: int) -> dict[str, Any]:
    """Container resources from the spec, with the GPU count set from the spec's GPU field.

    GPUs are an extended resource: request and limit must be equal, so both are set (the
    spec's own `nvidia.com/gpu` entries are replaced, as its documentation says).
    """
    wire = spec.to_wire()
    out: dict[str, Any] = {}
    for key in ("requests", "limits"):
        values = {k: v for k, v in wire.get(key, {}).items() if k != GPU_RESOURCE}
        if gpus > 0:
            values[GPU_RESOURCE] = gpus
        if values:
            out[key] = values
    return out


def placement(spec: Placement | None) -> dict[str, Any]:
    """`nodeSelector` and `tolerations` of a pod spec."""
    if spec is None:
        return {}
    wire = spec.to_wire()
    return {k: wire[k] for k in ("nodeSelector", "tolerations") if wire.get(k)}


def scheduling_labels(spec: SchedulingSpec | None) -> dict[str, str]:
    """Kueue's labels: the LocalQueue and the WorkloadPriorityClass, when set."""
    if spec is None:
        return {}
    out: dict[str, str] = {}
    if spec.queue_name:
        out[KUEUE_QUEUE_LABEL] = spec.queue_name
    if spec.workload_priority_class_name:
        out[KUEUE_PRIORITY_LABEL] = spec.workload_priority_class_name
    return out


def priority(spec: SchedulingSpec | None) -> dict[str, Any]:
    """`priorityClassName` of a pod spec, when set."""
    if spec is None or not spec.priority_class_name:
        return {}
    return {"priorityClassName": spec.priority_class_name}


def claim_volume(name: str, source: VolumeSource, *, read_only: bool = False) -> dict[str, Any]:
    """A pod volume of a PersistentVolumeClaim."""
    claim: dict[str, Any] = {"claimName": source.claim_name}
    if read_only:
        claim["readOnly"] = True
    return {"name": name, "persistentVolumeClaim": claim}


def mount(
    name: str, path: str, source: VolumeSource | None = None, *, read_only: bool = False
) -> dict[str, Any]:
    """A volume mount, into the claim's `subPath` when it has one."""
    out: dict[str, Any] = {"name": name, "mountPath": path}
    if source is not None and source.sub_path:
        out["subPath"] = source.sub_path
    if read_only:
        out["readOnly"] = True
    return out


def volume_or_scratch(name: str, source: VolumeSource | None) -> dict[str, Any]:
    """The claim when the spec names one, else an emptyDir (lost with the pod)."""
    if source is None:
        return {"name": name, "emptyDir": {}}
    return claim_volume(name, source)


def shm_volume(size_gi: int) -> dict[str, Any]:
    """A memory-backed `/dev/shm`: NCCL and PyTorch data loaders need more than Docker's 64 MiB.

    It counts against the container's memory limit, hence the size limit.
    """
    return {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": f"{size_gi}Gi"}}


def shm_mount() -> dict[str, Any]:
    """Where the memory-backed volume goes."""
    return {"name": SHM_VOLUME, "mountPath": "/dev/shm"}


def config_volume(config_map_name: str) -> dict[str, Any]:
    """The ConfigMap volume every worker pod reads its config from."""
    return {"name": CONFIG_VOLUME, "configMap": {"name": config_map_name}}


def config_mount() -> dict[str, Any]:
    """The read-only mount of the config volume."""
    return {"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True}


def env(name: str, value: str) -> dict[str, Any]:
    """One literal environment variable."""
    return {"name": name, "value": value}


def env_field(name: str, field_path: str) -> dict[str, Any]:
    """An environment variable from the downward API."""
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


def env_secret(name: str, secret: str, key: str, *, optional: bool = False) -> dict[str, Any]:
    """An environment variable from a Secret's key (the operator itself never reads Secrets)."""
    ref: dict[str, Any] = {"name": secret, "key": key}
    if optional:
        ref["optional"] = True
    return {"name": name, "valueFrom": {"secretKeyRef": ref}}


def user_env(extra: list[EnvVar] | None) -> list[dict[str, Any]]:
    """The spec's own environment variables, after the operator's (so they can override)."""
    return [e.to_wire() for e in extra or []]


def http_probe(
    path: str, port: str, *, period: int, failures: int, timeout: int = 5, initial: int = 0
) -> dict[str, Any]:
    """An HTTP GET probe on a named port."""
    probe: dict[str, Any] = {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": timeout,
    }
    if initial:
        probe["initialDelaySeconds"] = initial
    return probe


#: Container security settings for the worker's own processes (never root privileges).
RESTRICTED_CONTAINER: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


#: Where a task file from a ConfigMap or a PersistentVolumeClaim appears in worker pods.
TASKS_DIR = "/var/lib/crl/tasks"
TASKS_VOLUME = "tasks"


@dataclass(frozen=True)
class TaskMount:
    """How a pod sees its task source: the volume, its mount, and the file's path."""

    volumes: list[dict[str, Any]]
    """Pod volumes to add (none for a path in the image or a download)."""
    mounts: list[dict[str, Any]]
    """Container volume mounts to add."""
    path: str | None
    """The task file's path inside the container; ``None`` when the worker downloads it."""


def task_mount(source: TaskSource) -> TaskMount:
    """Mount the task source's file into a worker pod: a ConfigMap key or a file on a
    PersistentVolumeClaim (read only); a path in the image as is; URLs and Hugging Face
    datasets are fetched by the worker itself."""
    if source.config_map is not None:
        key = source.config_map.key
        return TaskMount(
            volumes=[
                {
                    "name": TASKS_VOLUME,
                    "configMap": {
                        "name": source.config_map.name,
                        "items": [{"key": key, "path": key}],
                    },
                }
            ],
            mounts=[{"name": TASKS_VOLUME, "mountPath": TASKS_DIR, "readOnly": True}],
            path=f"{TASKS_DIR}/{key}",
        )
    if source.volume is not None:
        mount: dict[str, Any] = {"name": TASKS_VOLUME, "mountPath": TASKS_DIR, "readOnly": True}
        if source.volume.sub_path:
            mount["subPath"] = source.volume.sub_path
        return TaskMount(
            volumes=[
                {
                    "name": TASKS_VOLUME,
                    "persistentVolumeClaim": {
                        "claimName": source.volume.claim_name,
                        "readOnly": True,
                    },
                }
            ],
            mounts=[mount],
            path=f"{TASKS_DIR}/{source.volume.path.lstrip('/')}",
        )
    return TaskMount(volumes=[], mounts=[], path=source.path)


def account_rbac(
    meta: dict[str, Any], account: str, namespace: str, rules: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """ServiceAccount `account` (the identity a workload's pods run as), and a Role and
    RoleBinding of the same name granting it `rules`, nothing else; all three with `meta`."""
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta,
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        },
    ]


def job(
    resource: AnyResource,
    name: str,
    component: str,
    namespace: str,
    job_spec: dict[str, Any],
    scheduling: SchedulingSpec,
) -> dict[str, Any]:
    """A batch/v1 Job child with the Kueue labels and the run-time limit of ``scheduling``.

    ``spec.suspend`` is never set: Kueue owns it where it runs.
    """
    spec = dict(job_spec)
    if scheduling.max_run_seconds is not None:
        spec["activeDeadlineSeconds"] = scheduling.max_run_seconds
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": object_meta(
            resource, name, component, namespace, scheduling_labels(scheduling)
        ),
        "spec": spec,
    }

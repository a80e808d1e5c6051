"""Sandbox pods as data: the labels the operator and the gateway agree on, the pod a sandbox
runs in (:func:`build_pod`, hardened: no service account token, no privilege escalation, every
capability dropped), and what a pod's status says (ready, failed, gated by Kueue). Pure
functions, no API calls: :mod:`crl_worker.sandbox.kubernetes` makes and drives the pods.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import socket
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from crl_worker.api.base import API_VERSION
from crl_worker.api.common import SandboxSpec, TaskFormat
from crl_worker.api.contract import ROLE_SANDBOX, Annotation, Env, Label, SandboxState
from crl_worker.errors import SandboxError
from crl_worker.tasks.model import Task

if TYPE_CHECKING:
    pass

logger = logging.getLogger(__name__)

# --- labels the operator and the gateway agree on ---------------------------------------------

MANAGED_BY = "coderepairrl-pool-gateway"
LABEL_POOL = Label.POOL
LABEL_INSTANCE = Label.INSTANCE
LABEL_STATE = Label.STATE
LABEL_GATEWAY = Label.GATEWAY
#: The operator selects sandbox pods (NetworkPolicy, status counts) by pool and this role.
LABEL_ROLE = Label.ROLE
ANNOTATION_INSTANCE_ID = Annotation.INSTANCE_ID
COMPONENT = "sandbox"
#: Kueue's labels: the LocalQueue a pod is admitted against (its plain-pod integration) and the
#: WorkloadPriorityClass; set only with the pool's ``scheduling.sandboxesUseQuota``.
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
#: The scheduling gate Kueue's pod webhook puts on a queued pod until its Workload is admitted.
KUEUE_ADMISSION_GATE = "kueue.x-k8s.io/admission"
CONTAINER = "sandbox"

# Keeps the container up doing nothing, and exits at once on SIGTERM (PID 1 has no default
# signal handlers, so without the trap a pod deletion would wait out the grace period).
KEEPALIVE = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"


# --- pure pieces -------------------------------------------------------------------------------


class KubernetesSandboxConfig(BaseModel):
    """A sandbox in a pod of its own (how the pods of one pool are made)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["kubernetes"] = "kubernetes"
    namespace: str = Field(default_factory=lambda: os.environ.get("POD_NAMESPACE") or "default")
    """Namespace of the pool and its pods."""
    pool: str = "sandboxes"
    """Name of the RolloutPool (pod names and labels derive from it)."""
    pool_uid: str | None = None
    """uid of the RolloutPool (owner reference); pods are unowned when empty (tests only)."""
    gateway_id: str = Field(
        default_factory=lambda: os.environ.get(Env.POD_NAME) or socket.gethostname()
    )
    """Name of the gateway that creates the pods (its pod name in a cluster)."""
    kubeconfig: str | None = None
    """Kubeconfig file; in a pod, the service account when empty; else ``~/.kube/config``."""
    context: str | None = None
    """Context of the kubeconfig."""
    sandbox: SandboxSpec = Field(default_factory=SandboxSpec)
    """The RolloutPool's sandbox spec."""
    image_template: str | None = None
    """The task source's image template (the sandbox spec's one wins)."""
    task_format: TaskFormat = "swe-bench"
    """Format of the tasks (picks the default image naming)."""
    run_as_non_root: bool = False
    """Refuse to run the container as root (for images whose user is not root)."""
    run_as_user: int | None = Field(default=None, ge=0)
    """User id of the container; the image's own user when empty."""
    queue_name: str | None = None
    """Kueue LocalQueue each sandbox pod is admitted against (``kueue.x-k8s.io/queue-name``);
    set only with the pool's ``scheduling.sandboxesUseQuota``; no Kueue labels when empty."""
    workload_priority_class_name: str | None = None
    """Kueue WorkloadPriorityClass of the sandbox pods (with :attr:`queue_name` only)."""


def label_value(value: str) -> str:
    """``value`` as a valid label value: allowed characters only, at most 63, a hash if cut."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", value).strip("-._")
    if len(cleaned) > 63 or cleaned != value:
        digest = hashlib.sha256(value.encode()).hexdigest()[:8]
        cleaned = f"{cleaned[: 63 - 9].rstrip('-._')}-{digest}"
    return cleaned or hashlib.sha256(value.encode()).hexdigest()[:8]


def pod_name(pool: str, sandbox_id: str) -> str:
    """The pod name of a sandbox: ``{pool}-{sandbox_id}``, cut to 63 characters."""
    suffix = sandbox_id.lower()
    return f"{pool[: 62 - len(suffix)].rstrip('-.')}-{suffix}"


def resolve_image(task: Task, config: KubernetesSandboxConfig) -> str:
    """The image of a task's sandbox: the sandbox spec's template, else the task's own image
    (the loaders set it from the task source's template or the format's usual images), else
    the task source's template."""
    template = config.sandbox.image_template or task.image or config.image_template
    if template is None:
        raise SandboxError(
            f"no image for {task.instance_id}: the task names none; set sandbox.imageTemplate"
            " or tasks.imageTemplate of the RolloutPool"
        )
    try:
        return template.format(
            instance_id=task.instance_id,
            # Docker Hub names allow no double underscore: SWE-bench's images spell it _1776_.
            instance_id_docker=task.instance_id.replace("__", "_1776_").lower(),
            repo=task.repo,
            owner=task.owner,
            name=task.name,
            version=task.version or "",
        )
    except (KeyError, IndexError, ValueError) as exc:
        raise SandboxError(
            f"image template {template!r} is invalid ({exc}); placeholders are {{instance_id}},"
            " {repo}, {owner}, {name}, {version}"
        ) from exc


def sandbox_workdir(task: Task, spec: SandboxSpec) -> str:
    """The repository directory: the task's own unless the pool's spec sets another one."""
    default = SandboxSpec.model_fields["workdir"].default
    return spec.workdir if spec.workdir != default else task.workdir


def build_pod(task: Task, name: str, config: KubernetesSandboxConfig) -> dict[str, Any]:
    """The sandbox pod of ``task`` (pure: no client, no I/O)."""
    spec = config.sandbox
    labels = {
        "app.kubernetes.io/name": "coderepairrl",
        "app.kubernetes.io/component": COMPONENT,
        "app.kubernetes.io/part-of": "coderepairrl",
        "app.kubernetes.io/instance": config.pool,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        LABEL_POOL: config.pool,
        LABEL_ROLE: ROLE_SANDBOX,
        LABEL_INSTANCE: label_value(task.instance_id),
        LABEL_STATE: SandboxState.STARTING,
        LABEL_GATEWAY: label_value(config.gateway_id),
    }
    if config.queue_name:
        # Kueue's plain-pod integration gates the pod until the queue's quota admits it.
        labels[KUEUE_QUEUE_LABEL] = config.queue_name
        if config.workload_priority_class_name:
            labels[KUEUE_PRIORITY_LABEL] = config.workload_priority_class_name
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": config.namespace,
        "labels": labels,
        "annotations": {ANNOTATION_INSTANCE_ID: task.instance_id},
    }
    if config.pool_uid:
        # controller=false: the gateway, not a controller of the pool's kind, manages the pods;
        # blockOwnerDeletion keeps a foreground deletion of the pool waiting for them.
        metadata["ownerReferences"] = [
            {
                "apiVersion": API_VERSION,
                "kind": "RolloutPool",
                "name": config.pool,
                "uid": config.pool_uid,
                "controller": False,
                "blockOwnerDeletion": True,
            }
        ]
    env = [{"name": key, "value": value} for key, value in task.env.items()]
    env += [{"name": var.name, "value": var.value} for var in spec.env or []]
    container_security: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
    }
    pod_security: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    if config.run_as_non_root:
        pod_security["runAsNonRoot"] = True
    if config.run_as_user is not None:
        pod_security["runAsUser"] = config.run_as_user
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": resolve_image(task, config),
        "imagePullPolicy": "IfNotPresent",
        "command": [spec.shell, "-c", KEEPALIVE],
        "workingDir": sandbox_workdir(task, spec),
        "env": env,
        # Defaults for what the spec leaves unset: an unbounded sandbox could take the node.
        "resources": spec.container_resources(),
        "securityContext": container_security,
        "stdin": False,
        "tty": False,
    }
    pod_spec: dict[str, Any] = {
        "containers": [container],
        # A sandbox that dies is replaced by the gateway; a restart would silently lose the
        # rollout's state behind a session that looks alive.
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 5,
        "securityContext": pod_security,
    }
    if spec.runtime_class_name:
        pod_spec["runtimeClassName"] = spec.runtime_class_name
    if spec.placement is not None:
        placement = spec.placement.to_wire()
        if placement.get("nodeSelector"):
            pod_spec["nodeSelector"] = placement["nodeSelector"]
        if placement.get("tolerations"):
            pod_spec["tolerations"] = placement["tolerations"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def pool_selector(pool: str) -> str:
    """Label selector of every sandbox pod of ``pool``."""
    return f"{LABEL_POOL}={pool},{LABEL_ROLE}={ROLE_SANDBOX}"


def pod_failure(pod: Mapping[str, Any]) -> str | None:
    """Why a pod can never become ready (image pull, crash, failed phase), or ``None``."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    if phase in ("Failed", "Succeeded"):
        return f"the pod ended in phase {phase} ({status.get('reason') or 'no reason given'})"
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        if reason in {
            "ErrImagePull",
            "ImagePullBackOff",
            "InvalidImageName",
            "CreateContainerConfigError",
            "CreateContainerError",
            "CrashLoopBackOff",
        }:
            return (
                f"container {container.get('name')}: {reason}: {waiting.get('message', '')}".strip()
            )
        terminated = (container.get("state") or {}).get("terminated")
        if terminated:
            return f"container {container.get('name')} terminated: {terminated.get('reason')}"
    return None


def kueue_gated(pod: Mapping[str, Any]) -> bool:
    """Whether Kueue still holds the pod back (its admission scheduling gate is on)."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(gate.get("name") == KUEUE_ADMISSION_GATE for gate in gates)


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """Running with the Ready condition true."""
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def exit_code_of(status: Mapping[str, Any]) -> int:
    """The exit code in the exec error channel's Status object."""
    if status.get("status") == "Success":
        return 0
    for cause in (status.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            return int(cause.get("message", "1"))
    raise SandboxError(f"exec failed: {status.get('message') or status}")

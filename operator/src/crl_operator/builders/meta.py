"""Names, labels, owner references and the observed state every builder shares.

Everything a child's identity derives from lives here, so the runtime (which lists, adopts and
prunes children) and the builders (which make them) agree on it by construction.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from crl_worker.api import API_VERSION, AnyResource
from crl_worker.api.base import VolumeSource
from crl_worker.api.common import IMAGE_REGISTRY
from crl_worker.api.contract import Annotation, Label, owner_label

#: The field manager and `app.kubernetes.io/managed-by` value of every child.
MANAGED_BY = "coderepairrl-operator"
#: Longest name of a Service, a label value, a DNS label.
NAME_LIMIT = 63
#: Longest Job name whose indexed pods still get a valid hostname `<job>-<index>` (index < 10^6).
JOB_NAME_LIMIT = NAME_LIMIT - 7

# Label keys (named once: the runtime selects children with the same keys).
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_PART_OF = "app.kubernetes.io/part-of"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
#: Sandbox pods carry the pool's name under this key (the gateway sets it when it makes them).
LABEL_POOL = Label.POOL
#: `sandbox` on the sandbox pods a gateway creates.
LABEL_ROLE = Label.ROLE
#: Pod-template annotation holding a hash of the config a Deployment reads: a changed config
#: rolls the pods.
ANNOTATION_CONFIG_HASH = Annotation.CONFIG_HASH

KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"

# Components: the `app.kubernetes.io/component` label and the suffix of the child's name.
COMPONENT_CONFIG = "config"
COMPONENT_INFERENCE = "inference"
COMPONENT_INFERENCE_PEERS = "inference-peers"
COMPONENT_TRAINER = "trainer"
COMPONENT_POOL = "rollout-pool"
COMPONENT_GATEWAY = "gateway"
COMPONENT_SANDBOX_POLICY = "sandbox-policy"
COMPONENT_RUNNER = "runner"
COMPONENT_PROGRESS = "progress"
COMPONENT_EVALUATION = "evaluation"
COMPONENT_WORKLOAD = "workload"


class BuildError(ValueError):
    """A resource the builders cannot turn into children (the message says why)."""


@dataclass(frozen=True)
class ResolvedCheckpoint:
    """Where a TrainingRun's checkpoint lies, for a Benchmark that serves it."""

    volume: VolumeSource
    """The run's checkpoint volume."""
    path: str
    """Directory of the checkpoint inside that volume, e.g. `step-400` or `latest`."""
    base_model: str
    """The run's `spec.model.name` (served under this name; a LoRA checkpoint is an adapter on
    top of it)."""
    base_volume: VolumeSource | None = None
    """The run's model volume (needed when the checkpoint is a LoRA adapter)."""
    lora_rank: int | None = None
    """The adapter rank when the run trained LoRA adapters; None for full weights."""
    trust_remote_code: bool = False
    """The run's `spec.model.trustRemoteCode`."""
    dtype: str = "bfloat16"
    """The run's `spec.model.dtype` (the weights are saved in it)."""


@dataclass(frozen=True)
class RenderState:
    """What the runtime observed in the cluster that decides which children are wanted.

    The builders never read the cluster: the runtime fills this in and `render` turns the spec
    plus this state into the desired children. `crl render` uses :meth:`offline`.
    """

    inference_ready: bool = False
    """The resource's vLLM Deployment has its replicas ready (or it serves no model): the
    trainer Job (TrainingRun) and the runner Job (Benchmark) are built only then, so no GPU
    trainer pod waits idle for a server that is still loading weights."""
    suspended: bool = False
    """Treat the resource as suspended even if its spec says otherwise (the spec's
    `suspend: true` always suspends)."""
    finished: bool = False
    """The workload succeeded or failed: inference, the inline pool and other helpers are
    no longer wanted; Jobs are left out of the output but kept (see :func:`retained`)."""
    checkpoint: ResolvedCheckpoint | None = None
    """For a Benchmark serving `model.checkpoint`: where the checkpoint is. Without it the
    Benchmark's inference server and runner cannot be built yet."""
    evaluation_steps: tuple[int, ...] = ()
    """For a TrainingRun with `spec.evaluation`: steps whose evaluation Benchmark should
    exist (the runtime adds a step once its checkpoint is saved)."""
    baseline_results: str | None = None
    """For a Benchmark with `spec.baseline`: the baseline's results directory as the runner
    sees it (both write to the same results volume), or None when the runner cannot see it.
    The runtime keeps the value of a runner Job that exists (its pod template is immutable)."""
    queued: bool = False
    """Kueue admits the resource as one unit: `scheduling.queueName` is set and Kueue is
    installed. The render then holds a Kueue Workload with every pod set (inference, trainer
    or runner), and no child carries Kueue's labels (Kueue's own Job/Deployment integrations
    would otherwise make one Workload per child and admit them separately)."""
    workload_priority: int | None = None
    """With `queued` and `scheduling.workloadPriorityClassName`: that class's value, which
    Kueue wants in the Workload next to the reference (its job integrations copy it too)."""
    admitted: bool = True
    """With `queued`: the Workload holds a quota reservation and was not evicted. Until then
    (and again after an eviction) the resource renders as suspended: no GPU pod exists."""

    @classmethod
    def offline(cls) -> RenderState:
        """The state `crl render` assumes: inference ready, so every child is shown."""
        return cls(inference_ready=True)


def owner_name(resource: AnyResource) -> str:
    """The resource's name, which every child name and label derives from."""
    if not resource.metadata.name:
        raise BuildError(
            f"a {resource.kind} with only metadata.generateName cannot be rendered: the"
            " children's names derive from metadata.name"
        )
    return resource.metadata.name


def child_name(parent: str, suffix: str, limit: int = NAME_LIMIT) -> str:
    """Deterministic child name `parent-suffix`, shortened with a hash when over `limit`.

    The hash is of the whole untruncated name, so two long parents sharing a prefix still get
    different children.
    """
    name = f"{parent}-{suffix}"
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    keep = limit - len(suffix) - len(digest) - 2
    return f"{parent[:keep].rstrip('-.')}-{digest}-{suffix}"


def labels(resource: AnyResource, component: str) -> dict[str, str]:
    """The standard `app.kubernetes.io/*` labels of a child plus `coderepair.io/<kind>`."""
    name = owner_name(resource)
    return {
        LABEL_NAME: "coderepairrl",
        LABEL_INSTANCE: name,
        LABEL_COMPONENT: component,
        LABEL_PART_OF: "coderepairrl",
        LABEL_MANAGED_BY: MANAGED_BY,
        owner_label(resource.kind): name,
    }


def selector(resource: AnyResource, component: str) -> dict[str, str]:
    """The labels that select one component's pods (immutable: a subset of :func:`labels`)."""
    name = owner_name(resource)
    return {
        LABEL_INSTANCE: name,
        LABEL_COMPONENT: component,
        owner_label(resource.kind): name,
    }


def owner_uid(resource: AnyResource) -> str | None:
    """The live object's uid, when the manifest carries one (never offline)."""
    uid = resource.metadata.model_dump().get("uid")
    return str(uid) if uid else None


def owner_references(resource: AnyResource) -> list[dict[str, Any]]:
    """The controller owner reference to `resource`; empty when it has no uid (offline)."""
    uid = owner_uid(resource)
    if not uid:
        return []
    return [
        {
            "apiVersion": API_VERSION,
            "kind": resource.kind,
            "name": resource.metadata.name,
            "uid": uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def object_meta(
    resource: AnyResource,
    name: str,
    component: str,
    namespace: str,
    extra_labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """`metadata` of a child: name, namespace, labels and the owner reference."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": {**labels(resource, component), **(extra_labels or {})},
    }
    owners = owner_references(resource)
    if owners:
        meta["ownerReferences"] = owners
    return meta


def content_hash(text: str) -> str:
    """A short stable hash of some content (for pod-template annotations)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def relocate_images(objects: list[dict[str, Any]], registry: str | None) -> list[dict[str, Any]]:
    """``objects`` with every container image under this project's default registry
    (:data:`~crl_worker.api.common.IMAGE_REGISTRY`) moved to ``registry`` (the operator's
    ``--image-registry``); other images, and everything when ``registry`` is empty, unchanged.

    Pure: the objects are copied where an image changes, never modified.
    """
    if not registry or registry == IMAGE_REGISTRY:
        return objects
    prefix = f"{IMAGE_REGISTRY}/"

    def move(node: Any, key: str = "") -> Any:
        if isinstance(node, dict):
            return {k: move(v, k) for k, v in node.items()}
        if isinstance(node, list):
            moved = [move(item) for item in node]
            if key in ("containers", "initContainers"):
                for container in moved:
                    image = container.get("image") if isinstance(container, dict) else None
                    if isinstance(image, str) and image.startswith(prefix):
                        container["image"] = f"{registry}/{image.removeprefix(prefix)}"
            return moved
        return node

    return [move(obj) for obj in objects]

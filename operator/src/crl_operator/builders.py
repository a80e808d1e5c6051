"""Pure builders: a validated resource in, the Kubernetes objects the operator applies out.

No client and no I/O here, so ``crl render`` shows exactly what the operator would apply, and
the builders are tested on real manifests without a cluster. This is the first slice (the
worker config and the inline RolloutPool); the inference, trainer and runner workloads join it
with the operator.
"""

from __future__ import annotations

import hashlib
from typing import Any

from crl_worker.api import API_VERSION, AnyResource, Benchmark, RolloutPool, TrainingRun
from crl_worker.yamlutil import dump

MANAGED_BY = "coderepairrl-operator"
NAME_LIMIT = 63
CONFIG_KEY = "config.yaml"


class BuildError(ValueError):
    """A resource the builders cannot turn into children (the message says why)."""


def owner_name(resource: AnyResource) -> str:
    """The resource's name, which every child name and label derives from."""
    if not resource.metadata.name:
        raise BuildError(
            f"a {resource.kind} with only metadata.generateName cannot be rendered: the"
            " children's names derive from metadata.name"
        )
    return resource.metadata.name


def child_name(parent: str, suffix: str, limit: int = NAME_LIMIT) -> str:
    """Deterministic child name `parent-suffix`, shortened with a hash when over `limit`."""
    name = f"{parent}-{suffix}"
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    keep = limit - len(suffix) - len(digest) - 2
    return f"{parent[:keep].rstrip('-.')}-{digest}-{suffix}"


def labels(resource: AnyResource, component: str) -> dict[str, str]:
    """The standard `app.kubernetes.io/*` labels of a child."""
    name = owner_name(resource)
    return {
        "app.kubernetes.io/name": "coderepairrl",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "coderepairrl",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        f"coderepair.io/{resource.kind.lower()}": name,
    }


def owner_references(resource: AnyResource) -> list[dict[str, Any]]:
    """The owner reference to `resource`; empty when it has no uid yet (offline rendering)."""
    meta = resource.metadata.model_dump()
    uid = meta.get("uid")
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


def _meta(resource: AnyResource, name: str, component: str, namespace: str) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": labels(resource, component),
    }
    owners = owner_references(resource)
    if owners:
        meta["ownerReferences"] = owners
    return meta


def worker_config(resource: AnyResource) -> dict[str, Any]:
    """The resolved worker config: the resource's spec with every default filled in."""
    return {
        "apiVersion": API_VERSION,
        "kind": resource.kind,
        "name": resource.metadata.name,
        "spec": resource.spec.to_wire(),
    }


def config_map(resource: AnyResource, namespace: str) -> dict[str, Any]:
    """The ConfigMap that hands the resolved config to the worker pods."""
    name = child_name(owner_name(resource), "config")
    text = dump(worker_config(resource))
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(resource, name, "config", namespace),
        "data": {CONFIG_KEY: text},
    }


def inline_pool(owner: TrainingRun | Benchmark, namespace: str) -> dict[str, Any] | None:
    """The RolloutPool a TrainingRun or Benchmark owns when it names no existing pool."""
    if isinstance(owner, TrainingRun):
        pool_ref, pool, tasks = (
            owner.spec.rollout.pool_ref,
            owner.spec.rollout.pool,
            owner.spec.tasks,
        )
    else:
        pool_ref, pool, tasks = owner.spec.pool_ref, owner.spec.pool, owner.spec.suite.tasks
    if pool_ref is not None:
        return None
    settings = pool.to_wire() if pool is not None else {}
    name = child_name(owner_name(owner), "pool")
    spec = {"tasks": tasks.to_wire(), **settings}
    # Validating as a RolloutPool fills the pool's own defaults into the child's spec.
    child = RolloutPool.model_validate(
        {"apiVersion": API_VERSION, "kind": "RolloutPool", "metadata": {"name": name}, "spec": spec}
    )
    return {
        "apiVersion": API_VERSION,
        "kind": "RolloutPool",
        "metadata": _meta(owner, name, "rollout-pool", namespace),
        "spec": child.spec.to_wire(),
    }


def render(resource: AnyResource, namespace: str | None = None) -> list[dict[str, Any]]:
    """Every child object the operator applies for `resource`, in apply order."""
    ns = namespace or resource.metadata.namespace or "default"
    children = [config_map(resource, ns)]
    if isinstance(resource, TrainingRun | Benchmark):
        pool = inline_pool(resource, ns)
        if pool is not None:
            children.append(pool)
    return children

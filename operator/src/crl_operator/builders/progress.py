"""The progress channel of a worker Job: a ConfigMap the worker writes its report into, and the
identity that may write it. Used by the Benchmark's runner, the TrainingRun's trainer and the gateway of a RolloutPool that
validates its tasks.

The worker merge-patches key `progress.json` of `<resource>-progress` (crl_worker.rollout.report,
crl_worker.api.progress) and the reconcile copies the report into the resource's status. The
operator creates that ConfigMap without data and never sends its `data`, so with server-side
apply the key stays the worker's; the worker's ServiceAccount may `get` and `patch` that one
ConfigMap and nothing else.
"""

from __future__ import annotations

from typing import Any

from crl_operator.builders.meta import COMPONENT_PROGRESS, child_name, object_meta, owner_name
from crl_operator.builders.pods import account_rbac
from crl_worker.api import Benchmark, RolloutPool, TrainingRun

Reporting = Benchmark | TrainingRun | RolloutPool
"""A resource whose worker reports progress (a RolloutPool's gateway: its task validation)."""


def progress_name(resource: Reporting) -> str:
    """Name of the ConfigMap the resource's worker writes its progress report into."""
    return child_name(owner_name(resource), COMPONENT_PROGRESS)


def progress_config_map(resource: Reporting, namespace: str) -> dict[str, Any]:
    """The worker's progress ConfigMap, created empty.

    It has no `data` on purpose: server-side apply leaves the fields a manifest does not send
    to their owner, so the worker's `progress.json` is never reverted or contested.
    """
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(resource, progress_name(resource), COMPONENT_PROGRESS, namespace),
    }


def reporter_rbac(
    resource: Reporting, account: str, component: str, namespace: str
) -> list[dict[str, Any]]:
    """ServiceAccount `account`, and a Role and RoleBinding of the same name: `get` and `patch`
    on the resource's progress ConfigMap (by name), nothing else. `component` labels them as
    the worker they belong to."""
    meta = object_meta(resource, account, component, namespace)
    rules = [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [progress_name(resource)],
            "verbs": ["get", "patch"],
        }
    ]
    return account_rbac(meta, account, namespace, rules)

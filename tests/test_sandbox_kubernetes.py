"""The Kubernetes sandbox backend.

- Pure pieces (the pod manifest, names, labels, pod status reading) on real inputs.
- The exec-side code (:class:`ShellSandbox`: framed session, files through one-shot commands,
  snapshot/reset/diff, interrupting a timed-out command with a script run beside the shell)
  over :class:`ProcessTransport`, i.e. exactly the calls a pod exec makes, answered by local
  processes instead of a container.
- Against the real control plane (``cluster`` marker): pods made by a gateway process for a
  RolloutPool, their owner references, labels and security settings, garbage collection.
"""

from __future__ import annotations

from typing import Any

import pytest

from crl_worker.api.common import SandboxSpec
from crl_worker.errors import SandboxError
from crl_worker.sandbox.kubeapi import KubeApi
from crl_worker.sandbox.pods import (
    KUEUE_ADMISSION_GATE,
    KUEUE_PRIORITY_LABEL,
    KUEUE_QUEUE_LABEL,
    LABEL_STATE,
    KubernetesSandboxConfig,
    build_pod,
    exit_code_of,
    kueue_gated,
    label_value,
    pod_failure,
    pod_name,
    pod_ready,
    resolve_image,
)

from .fixtures.kube_sandbox import pod_task


def _config(**overrides: Any) -> KubernetesSandboxConfig:
    fields: dict[str, Any] = {
        "namespace": "team-a",
        "pool": "swe-pool",
        "pool_uid": "0b5a3f9e-9f1d-4a43-9d0e-5c1c2f7e0a11",
        "gateway_id": "swe-pool-gateway-7d9f8-abcde",
    }
    fields.update(overrides)
    return KubernetesSandboxConfig(**fields)


# --- the pod manifest ------------------------------------------------------------------------


def test_pod_is_owned_labelled_and_hardened() -> None:
    spec = SandboxSpec.model_validate(
        {
            "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "4Gi"}},
            "runtimeClassName": "gvisor",
            "env": [{"name": "EXTRA", "value": "1"}],
            "placement": {
                "nodeSelector": {"pool": "sandboxes"},
                "tolerations": [{"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"}],
            },
        }
    )
    pod = build_pod(
        pod_task(), "swe-pool-sbx-1", _config(sandbox=spec, run_as_non_root=True, run_as_user=1000)
    )
    meta = pod["metadata"]
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "coderepair.io/v1alpha1",
            "kind": "RolloutPool",
            "name": "swe-pool",
            "uid": "0b5a3f9e-9f1d-4a43-9d0e-5c1c2f7e0a11",
            "controller": False,
            "blockOwnerDeletion": True,
        }
    ]
    labels = meta["labels"]
    assert labels["coderepair.io/pool"] == "swe-pool"
    assert labels["coderepair.io/role"] == "sandbox"  # what the operator's NetworkPolicy selects
    assert labels["coderepair.io/instance"] == "sympy__sympy-20590"
    assert labels[LABEL_STATE] == "starting"
    assert labels["app.kubernetes.io/managed-by"] == "coderepairrl-pool-gateway"
    assert meta["annotations"]["coderepair.io/instance-id"] == "sympy__sympy-20590"
    body = pod["spec"]
    assert body["automountServiceAccountToken"] is False
    assert body["restartPolicy"] == "Never"
    assert body["runtimeClassName"] == "gvisor"
    assert body["nodeSelector"] == {"pool": "sandboxes"}
    assert body["tolerations"][0]["key"] == "sandbox"
    assert body["securityContext"]["runAsNonRoot"] is True
    assert body["securityContext"]["runAsUser"] == 1000
    (container,) = body["containers"]
    assert container["image"] == "docker.io/swebench/sweb.eval.x86_64.sympy_1776_sympy-20590:latest"
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
    }
    # what the spec sets, and the defaults for the rest (cpu's limit, ephemeral storage)
    assert container["resources"] == {
        "requests": {"cpu": "1", "memory": "2Gi", "ephemeral-storage": "2Gi"},
        "limits": {"memory": "4Gi", "cpu": "4", "ephemeral-storage": "20Gi"},
    }
    assert container["workingDir"] == "/testbed"
    assert {"name": "EXTRA", "value": "1"} in container["env"]
    assert {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"} in container["env"]
    # The container only stays up; commands arrive through exec.
    assert container["command"][:2] == ["/bin/bash", "-c"]


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        # nothing set: every default (before: no limits at all, an agent could take the node)
        (
            {},
            {
                "requests": {"cpu": "500m", "memory": "1Gi", "ephemeral-storage": "2Gi"},
                "limits": {"cpu": "4", "memory": "8Gi", "ephemeral-storage": "20Gi"},
            },
        ),
        # a request above the default limit raises the limit to it; a limit alone stays alone
        (
            {"requests": {"memory": "32Gi", "cpu": 2}, "limits": {"ephemeral-storage": "100Gi"}},
            {
                "requests": {"memory": "32Gi", "cpu": 2},
                "limits": {"cpu": "4", "memory": "32Gi", "ephemeral-storage": "100Gi"},
            },
        ),
        # explicit values win, in any unit
        (
            {"requests": {"cpu": "8000m"}, "limits": {"memory": "512Mi"}},
            {
                "requests": {"cpu": "8000m", "ephemeral-storage": "2Gi"},
                "limits": {"memory": "512Mi", "cpu": "8000m", "ephemeral-storage": "20Gi"},
            },
        ),
    ],
)
def test_sandbox_pods_get_default_limits(
    resources: dict[str, Any], expected: dict[str, Any]
) -> None:
    spec = SandboxSpec.model_validate({"resources": resources})
    pod = build_pod(pod_task(), "swe-pool-sbx-1", _config(sandbox=spec))
    assert pod["spec"]["containers"][0]["resources"] == expected
    assert "runtimeClassName" not in pod["spec"]  # the node's default unless asked


def test_pods_carry_kueue_labels_only_when_the_pool_counts_them() -> None:
    """scheduling.sandboxesUseQuota (the gateway sets queue_name only then): the queue and
    priority labels Kueue's plain-pod integration admits the pod by; none otherwise."""
    plain = build_pod(pod_task(), "swe-pool-sbx-1", _config())["metadata"]["labels"]
    assert not [k for k in plain if k.startswith("kueue.x-k8s.io/")]
    counted = build_pod(
        pod_task(),
        "swe-pool-sbx-1",
        _config(queue_name="team-a", workload_priority_class_name="high"),
    )["metadata"]["labels"]
    assert counted[KUEUE_QUEUE_LABEL] == "team-a"
    assert counted[KUEUE_PRIORITY_LABEL] == "high"
    only_queue = build_pod(pod_task(), "swe-pool-sbx-1", _config(queue_name="team-a"))
    assert KUEUE_PRIORITY_LABEL not in only_queue["metadata"]["labels"]


async def test_waiting_for_a_pod_kueue_holds_back_names_the_quota(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A pod gated by Kueue stays Pending: the start timeout applies, and its error says the
    queue had no quota (not an image or node problem)."""
    gated = {
        "metadata": {"labels": {KUEUE_QUEUE_LABEL: "team-a"}},
        "spec": {"schedulingGates": [{"name": KUEUE_ADMISSION_GATE}]},
        "status": {"phase": "Pending"},
    }
    assert kueue_gated(gated)
    assert not kueue_gated({"spec": {}, "status": {"phase": "Pending"}})
    reads: list[str] = []

    async def read_pod(namespace: str, name: str) -> dict[str, Any]:
        reads.append(name)
        return gated

    api = KubeApi.__new__(KubeApi)  # no client: only read_pod is called
    api.read_pod = read_pod  # type: ignore[method-assign]
    caplog.set_level("INFO", logger="crl_worker.sandbox.kubeapi")
    with pytest.raises(SandboxError, match=r"still gated by Kueue.*queue team-a had no free quota"):
        await api.wait_ready("team-a", "swe-pool-sbx-1", timeout=0.3)
    assert len(reads) >= 2  # it polled, then gave up at the deadline
    assert sum("waits for Kueue" in r.message for r in caplog.records) == 1  # logged once
    ungated = {"spec": {}, "status": {"phase": "Pending"}}

    async def read_plain(namespace: str, name: str) -> dict[str, Any]:
        return ungated

    api.read_pod = read_plain  # type: ignore[method-assign]
    with pytest.raises(SandboxError, match="not ready after") as info:
        await api.wait_ready("team-a", "swe-pool-sbx-1", timeout=0)
    assert "Kueue" not in str(info.value)


def test_root_is_allowed_unless_configured_and_unowned_pods_are_possible() -> None:
    pod = build_pod(pod_task(), "p", _config(pool_uid=None))
    assert "ownerReferences" not in pod["metadata"]
    assert "runAsNonRoot" not in pod["spec"]["securityContext"]


def test_image_resolution_order() -> None:
    task = pod_task()
    assert resolve_image(task, _config()) == task.image
    templated = _config(
        sandbox=SandboxSpec(image_template="registry.local/{owner}/{name}:{version}-{instance_id}")
    )
    assert resolve_image(task, templated) == "registry.local/sympy/sympy:1.7-sympy__sympy-20590"
    bare = pod_task(image=None)
    assert (
        resolve_image(bare, _config(image_template="img/{instance_id}")) == "img/sympy__sympy-20590"
    )
    with pytest.raises(SandboxError, match="no image"):
        resolve_image(bare, _config())
    with pytest.raises(SandboxError, match="placeholders"):
        resolve_image(task, _config(sandbox=SandboxSpec(image_template="x/{nope}")))


def test_names_and_label_values_stay_valid() -> None:
    assert label_value("sympy__sympy-20590") == "sympy__sympy-20590"
    odd = label_value("org/repo:with spaces" + "x" * 80)
    assert len(odd) <= 63
    assert odd[0].isalnum() and odd[-1].isalnum()
    assert label_value("a/b") != label_value("a-b")  # a hash keeps distinct ids distinct
    name = pod_name("p" * 60, "sbx-0123456789")
    assert len(name) <= 63 and name.endswith("-sbx-0123456789")


def test_pod_status_reading() -> None:
    running = {
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
        }
    }
    assert pod_ready(running)
    assert not pod_ready({"status": {"phase": "Pending"}})
    pulling = {
        "status": {
            "phase": "Pending",
            "containerStatuses": [
                {
                    "name": "sandbox",
                    "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}},
                }
            ],
        }
    }
    assert "ImagePullBackOff" in (pod_failure(pulling) or "")
    assert pod_failure({"status": {"phase": "Failed", "reason": "Evicted"}}) is not None
    assert pod_failure({"status": {"phase": "Pending"}}) is None


def test_exec_status_channel() -> None:
    assert exit_code_of({"status": "Success"}) == 0
    failure = {
        "status": "Failure",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": "7"}]},
    }
    assert exit_code_of(failure) == 7
    with pytest.raises(SandboxError, match="exec failed"):
        exit_code_of({"status": "Failure", "message": "container not found"})

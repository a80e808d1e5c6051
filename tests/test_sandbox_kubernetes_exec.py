"""The Kubernetes sandbox's exec side: over local processes standing in for a pod, then against the real control plane."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from crl_worker.errors import SandboxError
from crl_worker.pool import GatewayClient
from crl_worker.sandbox.kubeapi import KubeApi
from crl_worker.sandbox.pods import (
    KUEUE_QUEUE_LABEL,
    KubernetesSandboxConfig,
    build_pod,
    pod_name,
)
from crl_worker.sandbox.shell import ShellSandbox
from crl_worker.sandbox.transport import ProcessTransport

from .fixtures.cluster import Cluster
from .fixtures.gateway import launch, stop
from .fixtures.kube_sandbox import pod_task
from .fixtures.repos import python_task

# --- the exec-side code over local processes ------------------------------------------------------


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A clone of a real repository, as a sandbox image would hold it."""
    task = python_task(tmp_path / "src")
    target = tmp_path / "testbed"
    subprocess.run(["git", "clone", "-q", task.source or "", str(target)], check=True)
    # Provisioning leftovers: an untracked file the base state must keep.
    (target / "build-artifact.txt").write_text("from provisioning\n")
    return target


async def test_shell_sandbox_over_process_transport(checkout: Path) -> None:
    transport = ProcessTransport(cwd=str(checkout))
    sandbox = ShellSandbox(transport, workdir=str(checkout), name="process sandbox")
    async with sandbox:
        assert sandbox.alive
        result = await sandbox.run("echo out; echo err >&2; (exit 5)")
        assert (result.exit_code, result.output) == (5, "out\nerr\n")
        await sandbox.run("export KEPT=yes; cd src")
        result = await sandbox.run('echo "$KEPT $(basename "$PWD")"')
        assert result.output == "yes src\n"
        # A timeout interrupts the command (through a separate signalling command, as a pod
        # exec would) and the session keeps its state.
        result = await sandbox.run("echo before; sleep 60; echo after", timeout=1)
        assert result.timed_out and result.exit_code is None
        assert result.output == "before\n"
        assert (await sandbox.run("echo $KEPT")).output == "yes\n"
        # A pure shell loop has no child process to kill; SIGINT to the interactive shell
        # still ends it.
        result = await sandbox.run("while :; do :; done", timeout=1)
        assert result.timed_out
        assert (await sandbox.run("echo $KEPT")).output == "yes\n"
        capped = await sandbox.run("head -c 10000 /dev/zero | tr '\\0' b", max_output=64)
        assert capped.truncated and capped.output.startswith("b" * 32)

        data = bytes(range(256)) * 100
        await sandbox.write_file("deep/er/blob.bin", data)
        assert await sandbox.read_file("deep/er/blob.bin") == data
        assert (checkout / "deep/er/blob.bin").read_bytes() == data
        with pytest.raises(FileNotFoundError):
            await sandbox.read_file("missing.txt")
        # A directory is the caller's mistake, as in the local backend, not a sandbox failure.
        with pytest.raises(IsADirectoryError):
            await sandbox.read_file("deep/er")
        with pytest.raises(IsADirectoryError):
            await sandbox.write_file("deep/er", b"x")
        assert sandbox.alive
        await sandbox.run("cd .. && echo '# change' >> src/romankit/numerals.py")
        diff = await sandbox.diff()
        assert "src/romankit/numerals.py" in diff
        assert "deep/er/blob.bin" in diff  # new files count
        assert "build-artifact" not in diff  # the base state's own leftovers do not

        await sandbox.reset()
        assert await sandbox.diff() == ""
        assert not (checkout / "deep").exists()
        assert (checkout / "build-artifact.txt").exists()
        after = await sandbox.run('echo "${KEPT:-unset} $(basename "$PWD")"')
        assert after.output == f"unset {checkout.name}\n"
    assert not sandbox.alive


async def test_a_worker_that_ignores_sigint_still_interrupts_its_commands(
    checkout: Path,
) -> None:
    """A worker started in the background by a script inherits SIGINT ignored; its shells get
    the default back, so a timeout interrupts the command instead of killing its processes
    (after which the shell would run the rest of the line)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        transport = ProcessTransport(cwd=str(checkout))
        async with ShellSandbox(transport, workdir=str(checkout)) as sandbox:
            result = await sandbox.run("echo before; sleep 60; echo after", timeout=1)
            assert result.timed_out and result.output == "before\n"
            ignored = await sandbox.run("grep SigIgn /proc/$$/status")
            assert int(ignored.output.split()[1], 16) & (1 << (signal.SIGINT - 1)) == 0
    finally:
        signal.signal(signal.SIGINT, previous)


async def test_run_without_a_timeout_gets_the_default_one(checkout: Path) -> None:
    # A pool sandbox gets its task's command timeout as the default: a command that names
    # no limit is still interrupted, as in the local and Docker backends.
    transport = ProcessTransport(cwd=str(checkout))
    sandbox = ShellSandbox(transport, workdir=str(checkout), default_timeout=1)
    async with sandbox:
        result = await sandbox.run("echo before; sleep 60; echo after")
        assert result.timed_out and result.exit_code is None
        assert result.output == "before\n"
        assert (await sandbox.run("echo still here", timeout=30)).output == "still here\n"


async def test_shell_death_is_a_sandbox_error(checkout: Path) -> None:
    sandbox = ShellSandbox(ProcessTransport(cwd=str(checkout)), workdir=str(checkout))
    async with sandbox:
        with pytest.raises(SandboxError):
            await sandbox.run("exit 3")
        assert not sandbox.alive
        with pytest.raises(SandboxError):
            await sandbox.run("true")


async def test_process_transport_exec_once_reports_exit_codes(tmp_path: Path) -> None:
    transport = ProcessTransport(cwd=str(tmp_path))
    code, out, err = await transport.exec_once(
        ["sh", "-c", "cat; echo e >&2; exit 4"], stdin=b"in\x00put"
    )
    assert (code, out, err) == (4, b"in\x00put", b"e\n")
    with pytest.raises(SandboxError, match="did not finish"):
        await transport.exec_once(["sleep", "5"], timeout=0.5)


def test_config_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "from-env")
    monkeypatch.setenv("POD_NAME", "gw-pod-1")
    config = KubernetesSandboxConfig()
    assert (config.namespace, config.gateway_id) == ("from-env", "gw-pod-1")
    assert json.loads(config.model_dump_json())["type"] == "kubernetes"


# --- against the real control plane -------------------------------------------------------------
#
# The fake nodes (kwok) run every exec as a local process (tests/fixtures/cluster.py: an exec server
# with the kubelet's streaming code), so the pod's "image" is never pulled and its repository is a
# local checkout named as the pool's workdir: the gateway, the API server's exec websocket and the
# kubelet exec protocol are all real.

POOL = "rp-sandboxes"
GATEWAY_ID = "test-gateway-0"


def _pods(cluster: Cluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return [pod for pod in items if not pod["metadata"].get("deletionTimestamp")]


async def _until(what: str, predicate: Callable[[], Any], timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await asyncio.to_thread(predicate)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.3)


def _rolloutpool(namespace: str, task_file: Path, workdir: Path) -> dict[str, Any]:
    return {
        "apiVersion": "coderepair.io/v1alpha1",
        "kind": "RolloutPool",
        "metadata": {"name": POOL, "namespace": namespace},
        "spec": {
            "tasks": {"path": str(task_file), "format": "swe-bench"},
            "sandbox": {
                "workdir": str(workdir),
                "startupTimeoutSeconds": 60,
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
            },
            "replicas": 1,
            "maxSandboxes": 2,
            "reuse": {"maxUses": 3},
        },
    }


def _stray_pod(namespace: str, name: str, gateway: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "coderepair.io/pool": POOL,
                "coderepair.io/role": "sandbox",
                "coderepair.io/gateway": gateway,
            },
        },
        "spec": {"containers": [{"name": "sandbox", "image": "registry.invalid/none:1"}]},
    }


@pytest.mark.parametrize("identity", ["admin", "gateway-role"])
async def test_gateway_runs_a_pool_of_pods(
    cluster: Cluster, namespace: str, tmp_path: Path, checkout: Path, identity: str
) -> None:
    """``gateway-role``: the gateway acts as the ServiceAccount the operator makes for it, with
    exactly the operator's Role (what a gateway pod can do)."""
    task = python_task(tmp_path / "task-src").model_copy(
        update={"image": "registry.invalid/romankit:1", "workdir": str(checkout)}
    )
    task_file = tmp_path / "tasks.jsonl"
    task_file.write_text(task.model_dump_json() + "\n")
    manifest = tmp_path / "rolloutpool.yaml"
    resource = _rolloutpool(namespace, task_file, checkout)
    # Counted sandboxes: the gateway labels its pods with the queue (this cluster has no
    # Kueue, so the label is inert; tests/test_kueue.py shows Kueue gating such a pod).
    resource["spec"]["scheduling"] = {"queueName": "team-a", "sandboxesUseQuota": True}
    manifest.write_text(json.dumps(resource))
    cluster.kubectl("apply", "-f", str(manifest))
    uid = cluster.kubectl(
        "get", "rolloutpool", POOL, "-n", namespace, "-o", "jsonpath={.metadata.uid}"
    ).stdout
    # Leftovers: a sandbox of this gateway's earlier life, one of a gateway that is gone, and
    # one of a live sibling gateway (its pod exists), which must survive the collection.
    cluster.kubectl("create", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "List", "items": [
            _stray_pod(namespace, "old-own", GATEWAY_ID),
            _stray_pod(namespace, "old-orphan", "gateway-long-gone"),
            _stray_pod(namespace, "sibling-sandbox", "sibling-gateway"),
            {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": "sibling-gateway", "namespace": namespace},
             "spec": {"containers": [{"name": "gw", "image": "registry.invalid/gw:1"}]}},
        ]}))  # fmt: skip

    kubeconfig = cluster.kubeconfig
    if identity == "gateway-role":
        from crl_operator.builders.pool import gateway_name, gateway_objects
        from crl_worker.api import RolloutPool

        pool = RolloutPool.model_validate(json.loads(manifest.read_text()))
        account, role, binding, *_ = gateway_objects(pool, namespace, "test")
        cluster.kubectl("apply", "-f", "-", input=json.dumps(
            {"apiVersion": "v1", "kind": "List", "items": [account, role, binding]}))  # fmt: skip
        kubeconfig = cluster.service_account_kubeconfig(gateway_name(POOL), namespace)
    flags = [
        "--config", str(manifest), "--format", "task", "--backend", "kubernetes",
        "--kubeconfig", str(kubeconfig), "--gateway-id", GATEWAY_ID,
    ]  # fmt: skip
    gateway = launch(flags, tmp_path / "gateway.log")
    try:
        selector = f"coderepair.io/pool={POOL},coderepair.io/gateway={GATEWAY_ID}"
        names = {
            p["metadata"]["name"] for p in _pods(cluster, namespace, f"coderepair.io/pool={POOL}")
        }
        assert "old-own" not in names and "old-orphan" not in names
        assert "sibling-sandbox" in names

        async with GatewayClient(gateway.url, token=gateway.token) as gw:
            lease = await gw.lease(task.instance_id, timeout=120)
            assert lease.source == "cold"
            (pod,) = await _until("the leased pod", lambda: _pods(cluster, namespace, selector))
            meta = pod["metadata"]
            assert meta["name"] == pod_name(POOL, lease.sandbox_id)
            assert meta["ownerReferences"][0]["uid"] == uid  # read from the API by the gateway
            assert meta["ownerReferences"][0]["blockOwnerDeletion"] is True
            assert meta["annotations"]["coderepair.io/instance-id"] == task.instance_id
            assert meta["labels"][KUEUE_QUEUE_LABEL] == "team-a"
            assert pod["spec"]["automountServiceAccountToken"] is False
            assert pod["spec"]["containers"][0]["resources"] == {
                "requests": {"cpu": "100m", "memory": "128Mi", "ephemeral-storage": "2Gi"},
                "limits": {"cpu": "4", "memory": "8Gi", "ephemeral-storage": "20Gi"},
            }
            await _until(
                "the leased label",
                lambda: _pods(cluster, namespace, f"{selector},coderepair.io/state=leased"),
            )

            # Commands through the API server's exec websocket and the node's kubelet API.
            result = await gw.run(lease.lease_id, "echo from-pod; echo err >&2; (exit 3)")
            assert (result.exit_code, result.output) == (3, "from-pod\nerr\n")
            await gw.run(lease.lease_id, "export KEPT=1; cd src")
            assert (
                await gw.run(lease.lease_id, 'echo "$KEPT $(basename "$PWD")"')
            ).output == "1 src\n"
            slow = await gw.run(lease.lease_id, "sleep 30", timeout=1)
            assert slow.timed_out and slow.exit_code is None
            assert (await gw.run(lease.lease_id, "echo $KEPT")).output == "1\n"
            blob = bytes(range(256)) * 50
            await gw.write_file(lease.lease_id, "new/blob.bin", blob)
            assert await gw.read_file(lease.lease_id, "new/blob.bin") == blob
            assert "new/blob.bin" in await gw.diff(lease.lease_id)

            assert (await gw.release(lease.lease_id)).action == "reuse"
            await _until(
                "the ready label",
                lambda: _pods(cluster, namespace, f"{selector},coderepair.io/state=ready"),
            )
            again = await gw.lease(task.instance_id, timeout=120)
            assert (again.source, again.sandbox_id) == ("warm", lease.sandbox_id)
            assert await gw.diff(again.lease_id) == ""
            assert not (checkout / "new").exists()

            # Dirty: the pod is deleted and a fresh one takes its place (warm target 1).
            assert (await gw.release(again.lease_id, dirty=True)).action == "replace"
            first = pod_name(POOL, lease.sandbox_id)
            await _until(
                "the replacement pod",
                lambda: [
                    p
                    for p in _pods(cluster, namespace, f"{selector},coderepair.io/state=ready")
                    if p["metadata"]["name"] != first
                ],
                timeout=120,
            )
            assert first not in {p["metadata"]["name"] for p in _pods(cluster, namespace, selector)}
    finally:
        stop(gateway)
    # A clean shutdown deletes the gateway's pods; the sibling's stays.
    await _until("the gateway's pods to go", lambda: not _pods(cluster, namespace, selector))
    assert _pods(cluster, namespace, f"coderepair.io/pool={POOL}")


async def test_deleting_the_rolloutpool_collects_its_pods(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """The owner reference hands the pods to the real garbage collector (no gateway running)."""
    task_file = tmp_path / "tasks.jsonl"
    task_file.write_text("")
    cluster.kubectl(
        "apply", "-f", "-", input=json.dumps(_rolloutpool(namespace, task_file, tmp_path))
    )
    uid = cluster.kubectl(
        "get", "rolloutpool", POOL, "-n", namespace, "-o", "jsonpath={.metadata.uid}"
    ).stdout
    config = KubernetesSandboxConfig(
        namespace=namespace, pool=POOL, pool_uid=uid, gateway_id=GATEWAY_ID
    )
    api = KubeApi(str(cluster.kubeconfig))
    try:
        for index in range(3):
            await api.create_pod(
                namespace, build_pod(pod_task(), pod_name(POOL, f"sbx-{index}"), config)
            )
        for index in range(3):
            await api.wait_ready(namespace, pod_name(POOL, f"sbx-{index}"), 60)
    finally:
        await api.aclose()
    selector = f"coderepair.io/pool={POOL}"
    assert len(_pods(cluster, namespace, selector)) == 3
    cluster.kubectl("delete", "rolloutpool", POOL, "-n", namespace, "--wait=false")
    await _until(
        "the garbage collector", lambda: not _pods(cluster, namespace, selector), timeout=90
    )

"""A real node in the test cluster (tests/fixtures/node.py): pods that really run, as a
user's would.

Every test here runs real containers (containerd, runc, CNI) on a kubelet joined to the test
control plane; `pytest -m realnode` runs them alone. Without root, containerd, the CNI plugins
or Go they are skipped locally and fail under CI=true (the ``real_node`` fixture).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import ssl
import struct
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crl_worker.api.common import SandboxSpec
from crl_worker.sandbox.kubernetes import KubernetesSandbox
from crl_worker.sandbox.pods import KubernetesSandboxConfig, build_pod
from crl_worker.tasks.model import Task, TestSpec

from .fixtures.cluster import Cluster
from .fixtures.node import NODE_KEY, RealNode
from .fixtures.node_build import NodeError
from .fixtures.node_dns import build_answer, parse_query
from .fixtures.node_host import mounts_under
from .fixtures.node_images import PAUSE_IMAGE, image_archive, image_reference

log = logging.getLogger(__name__)

SMALL = {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}}


def _pod(node: RealNode, name: str, image: str, command: list[str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"test": "real-node"}},
        "spec": {
            **node.placement,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            # The test cluster runs no DNS service; the node's resolv.conf is what there is.
            "dnsPolicy": "Default",
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": command,
                    "resources": SMALL,
                }
            ],
            **spec,
        },
    }


def _apply(cluster: Cluster, namespace: str, *objects: dict[str, Any]) -> None:
    body = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(body))


def _wait_ready(cluster: Cluster, namespace: str, *names: str, timeout: int = 120) -> None:
    pods = [f"pod/{name}" for name in names]
    result = cluster.kubectl(
        "wait", "-n", namespace, "--for=condition=Ready", f"--timeout={timeout}s", *pods,
        check=False, timeout=timeout + 30,
    )  # fmt: skip
    if result.returncode != 0:
        described = cluster.kubectl("describe", "-n", namespace, *pods, check=False).stdout
        raise AssertionError(f"pods not Ready: {result.stderr}\n{described[-4000:]}")


@pytest.fixture
def node_namespace(cluster: Cluster, real_node: RealNode) -> Iterator[str]:
    """A fresh namespace for pods on the real node; its pods are deleted and waited for."""
    name = cluster.namespace("node")
    yield name
    cluster.kubectl("delete", "pods", "--all", "-n", name, "--grace-period=1", "--timeout=60s",
                    check=False, timeout=90)  # fmt: skip
    cluster.delete_namespace(name)


def test_the_node_joins_ready_labelled_and_tainted(cluster: Cluster, real_node: RealNode) -> None:
    node = json.loads(cluster.kubectl("get", "node", real_node.name, "-o", "json").stdout)
    assert node["metadata"]["labels"][NODE_KEY] == "real"
    assert {"key": NODE_KEY, "value": "real", "effect": "NoSchedule"} in node["spec"]["taints"]
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready[0]["status"] == "True"
    # The kubelet is the control plane's own version, and the runtime is the real containerd.
    server = json.loads(cluster.kubectl("version", "-o", "json").stdout)["serverVersion"]
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == server["gitVersion"]
    assert info["containerRuntimeVersion"].startswith("containerd://")
    assert {"type": "InternalIP", "address": real_node.node_ip} in node["status"]["addresses"]
    # The fake nodes stay kwok's: no pod lands here without the toleration.
    kwok = json.loads(cluster.kubectl("get", "nodes", "-l", "type=kwok", "-o", "json").stdout)
    assert kwok["items"] and all(NODE_KEY not in n["metadata"]["labels"] for n in kwok["items"])


def test_exec_and_logs_reach_a_real_container(
    cluster: Cluster, real_node: RealNode, docker_base: str, node_namespace: str
) -> None:
    script = "echo started in $(hostname); cat /etc/debian_version; exec sleep 3600"
    _apply(cluster, node_namespace, _pod(real_node, "hello", docker_base, ["bash", "-c", script]))
    _wait_ready(cluster, node_namespace, "hello")
    pod = json.loads(cluster.kubectl("get", "pod", "hello", "-n", node_namespace, "-o",
                                     "json").stdout)  # fmt: skip
    assert pod["spec"]["nodeName"] == real_node.name
    assert pod["status"]["podIP"].startswith(real_node.subnet.rsplit(".", 1)[0] + ".")

    logs = cluster.kubectl("logs", "hello", "-n", node_namespace).stdout
    assert logs.startswith("started in hello\n")
    version = logs.splitlines()[1]
    assert version[:2].isdigit()  # bookworm: 12.x

    # exec: stdin in, stdout and the exit code out, in the container's own namespaces.
    result = cluster.kubectl(
        "exec", "-i", "hello", "-n", node_namespace, "--", "bash", "-c",
        "tr a-z A-Z; cat /proc/1/cmdline | tr '\\0' ' '; exit 7",
        input="from stdin\n", check=False,
    )  # fmt: skip
    assert result.returncode == 7, result.stderr
    assert result.stdout.startswith("FROM STDIN\nsleep 3600")


def test_a_pod_reaches_the_api_server_as_its_service_account(
    cluster: Cluster, real_node: RealNode, docker_base: str, node_namespace: str
) -> None:
    """In-cluster clients: the ``kubernetes`` Service's address and the pod's projected token,
    as the Python client's in-cluster configuration uses them, under the API server's RBAC."""
    cluster.kubectl("create", "rolebinding", "reader", "--clusterrole=view",
                    f"--serviceaccount={node_namespace}:default", "-n", node_namespace)  # fmt: skip
    script = (
        "import json, os, ssl, sys, urllib.request, urllib.error\n"
        "sa = '/var/run/secrets/kubernetes.io/serviceaccount'\n"
        "host = os.environ['KUBERNETES_SERVICE_HOST'] + ':' + os.environ['KUBERNETES_SERVICE_PORT']\n"
        "context = ssl.create_default_context(cafile=sa + '/ca.crt')\n"
        "token = open(sa + '/token').read()\n"
        "for path in sys.argv[1:]:\n"
        "    request = urllib.request.Request('https://' + host + path,\n"
        "                                     headers={'Authorization': 'Bearer ' + token})\n"
        "    try:\n"
        "        with urllib.request.urlopen(request, context=context, timeout=10) as r:\n"
        "            print(r.status, len(json.load(r)['items']))\n"
        "    except urllib.error.HTTPError as error:\n"
        "        print(error.code, json.load(error)['reason'])\n"
    )
    pod = _pod(real_node, "client", docker_base, ["sleep", "3600"],
               automountServiceAccountToken=True)  # fmt: skip
    _apply(cluster, node_namespace, pod)
    _wait_ready(cluster, node_namespace, "client")
    result = cluster.kubectl(
        "exec", "client", "-n", node_namespace, "--", "python3", "-c", script,
        f"/api/v1/namespaces/{node_namespace}/pods", "/api/v1/namespaces/kube-system/secrets",
    )  # fmt: skip
    assert result.stdout.splitlines() == ["200 1", "403 Forbidden"], result.stdout + result.stderr


def test_the_kubelet_api_admits_only_authenticated_authorized_clients(
    cluster: Cluster, real_node: RealNode
) -> None:
    url = f"https://{real_node.node_ip}:{real_node.kubelet_port}/pods"

    def status(cert: tuple[Path, Path] | None) -> int:
        context = ssl.create_default_context(cafile=str(cluster.ca_file))
        if cert:
            context.load_cert_chain(str(cert[0]), str(cert[1]))
        try:
            with urllib.request.urlopen(url, context=context, timeout=10) as response:
                return int(response.status)
        except urllib.error.HTTPError as error:
            return int(error.code)

    # The kubelet serves with a certificate of the cluster CA for its node IP (verified here).
    assert status(None) == 401  # anonymous: refused
    nobody = cluster.issue_certificate("kubelet-nobody", "/CN=nobody")
    assert status(nobody) == 403  # known but not allowed (the API server's RBAC says no)
    admin = cluster.issue_certificate("kubelet-admin", "/O=system:masters/CN=node-admin")
    assert status(admin) == 200


def test_pods_are_created_and_deleted_in_rounds_without_a_failure(
    cluster: Cluster, real_node: RealNode, docker_base: str, node_namespace: str
) -> None:
    # Two rounds of ten: a round reuses what the one before released (sandboxes, veths, cgroups).
    # Many more pods, at once and one by one: perf/real_node.py --burst N --cold N.
    rounds, per_round = 2, 10
    for round_ in range(rounds):
        names = [f"cycle-{round_}-{i}" for i in range(per_round)]
        pods = [_pod(real_node, n, docker_base, ["sleep", "3600"]) for n in names]
        _apply(cluster, node_namespace, *pods)
        _wait_ready(cluster, node_namespace, *names)
        cluster.kubectl("delete", "pods", "-n", node_namespace, "-l", "test=real-node",
                        "--grace-period=1", "--timeout=60s", timeout=90)  # fmt: skip
    # Every container the kubelet ran is gone from containerd, not only from the API.
    deadline = time.monotonic() + 60
    while (tasks := real_node.ctr("tasks", "list", "-q").split()) and time.monotonic() < deadline:
        sandboxes = json.loads(cluster.kubectl("get", "pods", "-A", "--field-selector",
                                               f"spec.nodeName={real_node.name}", "-o",
                                               "json").stdout)["items"]  # fmt: skip
        if sandboxes:  # another test's pods are not this test's leftovers
            break
        time.sleep(0.5)
    else:
        assert not tasks, f"containers left in containerd: {tasks}"
    events = cluster.kubectl("get", "events", "-n", node_namespace, "-o", "json").stdout
    warnings = [e for e in json.loads(events)["items"] if e.get("type") == "Warning"]
    assert not [f"{e['reason']}: {e['message']}" for e in warnings]


def _task(image: str) -> Task:
    return Task(
        instance_id="crl-tests__security-1",
        repo="crl-tests/security",
        base_commit="0" * 40,
        image=image,
        workdir="/srv/repo",
        test=TestSpec(command="pytest -rA {tests}", log_format="pytest"),
    )


async def test_sandbox_pod_hardening_holds_inside_the_container(
    cluster: Cluster, real_node: RealNode, docker_base: str, node_namespace: str
) -> None:
    """The gateway's own pod manifest (build_pod) on a real container, checked from inside."""
    spec = SandboxSpec.model_validate({
        "resources": SMALL,
        "startupTimeoutSeconds": 60,
        "placement": real_node.placement,
        "workdir": "/tmp",
    })  # fmt: skip
    config = KubernetesSandboxConfig(
        namespace=node_namespace, pool="security", gateway_id="test", kubeconfig=str(
            cluster.kubeconfig), sandbox=spec, run_as_non_root=True, run_as_user=65534,
    )  # fmt: skip
    manifest = build_pod(_task(docker_base), "security-sbx-1", config)
    manifest["spec"]["containers"][0]["imagePullPolicy"] = "Never"
    _apply(cluster, node_namespace, manifest)
    _wait_ready(cluster, node_namespace, "security-sbx-1")

    def inside(command: str) -> str:
        return cluster.kubectl("exec", "security-sbx-1", "-n", node_namespace, "--", "bash",
                               "-c", command).stdout  # fmt: skip

    status = dict(
        line.split(":\t", 1)
        for line in inside("cat /proc/self/status").splitlines()
        if ":\t" in line
    )
    assert status["Uid"].split()[:2] == ["65534", "65534"]  # non-root, as configured
    for capabilities in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[capabilities], 16) == 0, capabilities  # every capability dropped
    assert status["NoNewPrivs"].strip() == "1"  # allowPrivilegeEscalation: false
    assert status["Seccomp"].strip() == "2"  # RuntimeDefault: a filter is in force
    # No ServiceAccount token anywhere (the kubelet still sets KUBERNETES_SERVICE_HOST even
    # with enableServiceLinks off; without a credential the address gives nothing).
    assert inside("ls /var/run/secrets/kubernetes.io 2>&1 || true").strip().endswith(
        "No such file or directory")  # fmt: skip
    assert inside("grep -c serviceaccount /proc/self/mountinfo || true").strip() == "0"
    # Root-only operations fail for real.
    assert "Operation not permitted" in inside("mount -t tmpfs none /mnt 2>&1 || true") + inside(
        "chown 0 /tmp 2>&1 || true")  # fmt: skip


async def test_a_root_image_is_refused_when_non_root_is_required(
    cluster: Cluster, real_node: RealNode, docker_base: str, node_namespace: str
) -> None:
    """runAsNonRoot without a user: the kubelet itself refuses the image's root user."""
    spec = SandboxSpec.model_validate({"resources": SMALL, "placement": real_node.placement})
    config = KubernetesSandboxConfig(namespace=node_namespace, pool="rootless", gateway_id="test",
                                     sandbox=spec, run_as_non_root=True)  # fmt: skip
    manifest = build_pod(_task(docker_base), "rootless-sbx-1", config)
    manifest["spec"]["containers"][0]["imagePullPolicy"] = "Never"
    _apply(cluster, node_namespace, manifest)
    deadline = time.monotonic() + 60
    reason = ""
    while time.monotonic() < deadline and not reason:
        pod = json.loads(cluster.kubectl("get", "pod", "rootless-sbx-1", "-n", node_namespace,
                                         "-o", "json").stdout)  # fmt: skip
        for container in pod.get("status", {}).get("containerStatuses") or []:
            waiting = container.get("state", {}).get("waiting") or {}
            if waiting.get("reason") == "CreateContainerConfigError":
                reason = waiting.get("message", "")
        time.sleep(0.3)
    assert "runAsNonRoot and image will run as root" in reason, reason


async def test_kubernetes_sandbox_runs_commands_in_a_real_pod(
    cluster: Cluster, real_node: RealNode, docker_base: str, node_namespace: str, tmp_path: Path
) -> None:
    """The worker's KubernetesSandbox end to end: pod created, websocket exec to the real
    kubelet, a persistent shell, files in and out, the pod deleted on close."""
    spec = SandboxSpec.model_validate({
        "resources": SMALL, "startupTimeoutSeconds": 60, "placement": real_node.placement,
    })  # fmt: skip
    config = KubernetesSandboxConfig(
        namespace=node_namespace, pool="shell", gateway_id="test",
        kubeconfig=str(cluster.kubeconfig), sandbox=spec,
    )  # fmt: skip
    # A git repository in the image's workdir is what a task image has; make one at start.
    task = _task(docker_base).model_copy(update={"workdir": "/srv/repo"})
    sandbox = KubernetesSandbox(config, task)
    sandbox.manifest["spec"]["containers"][0]["imagePullPolicy"] = "Never"
    sandbox.manifest["spec"]["containers"][0]["workingDir"] = "/"
    sandbox.manifest["spec"]["containers"][0]["command"] = [
        "bash", "-c",
        "mkdir -p /srv/repo && cd /srv/repo && git init -q && git config user.email t@t && "
        "git config user.name t && echo one > a.txt && git add a.txt && git commit -qm base && "
        "exec sleep infinity",
    ]  # fmt: skip
    # Ready once the commit is there: the sandbox snapshots HEAD as soon as the pod is Ready
    # (without the probe, a slow start lost that race: "not a valid object name HEAD").
    sandbox.manifest["spec"]["containers"][0]["readinessProbe"] = {
        "exec": {"command": ["git", "-C", "/srv/repo", "rev-parse", "--verify", "HEAD"]},
        "periodSeconds": 1,
    }
    try:
        await sandbox.start()
        first = await sandbox.run("export GREETING=hi; cd /srv/repo && echo $GREETING > b.txt")
        assert first.exit_code == 0, first
        second = await sandbox.run("cat b.txt; echo $GREETING; (exit 3)")
        assert (second.exit_code, second.output.split()) == (3, ["hi", "hi"])
    finally:
        await sandbox.close()
    gone = cluster.kubectl("get", "pod", sandbox.pod, "-n", node_namespace, "--ignore-not-found",
                           "-o", "name").stdout  # fmt: skip
    assert gone.strip() in ("", f"pod/{sandbox.pod}")  # deleted (possibly still terminating)


def test_a_stopped_node_leaves_no_process_mount_or_link(
    cluster: Cluster, real_node: RealNode, docker_base: str, node_namespace: str, tmp_path: Path
) -> None:
    """A second node, with pods and volumes running, stopped: nothing of it remains."""
    second = RealNode(cluster, tmp_path / "node", name="real-node-teardown", label="teardown",
                      bin_dir=real_node.bin_dir)  # fmt: skip
    try:
        second.start()
        # The pause image is in every node's containerd; it only has to keep running.
        pod = _pod(second, "volumes", PAUSE_IMAGE, ["/pause"], volumes=[
            {"name": "scratch", "emptyDir": {"medium": "Memory"}},
            {"name": "token", "projected": {"sources": [{"serviceAccountToken": {
                "path": "token", "expirationSeconds": 3600}}]}},
        ])  # fmt: skip
        pod["spec"]["containers"][0]["volumeMounts"] = [
            {"name": "scratch", "mountPath": "/scratch"}, {"name": "token", "mountPath": "/token"},
        ]  # fmt: skip
        _apply(cluster, node_namespace, pod)
        _wait_ready(cluster, node_namespace, "volumes")
        running = second.leftovers()
        # What the stop must clean up is really there: shims, volume and rootfs mounts, links.
        assert running.processes and running.links and running.cgroups
        assert [m for m in mounts_under(second.workdir) if "volumes" in m]
    finally:
        try:
            second.stop()
        except NodeError as error:
            pytest.fail(str(error))
    assert not second.leftovers()
    assert cluster.kubectl("get", "node", second.name, "--ignore-not-found", "-o",
                           "name").stdout.strip() == ""  # fmt: skip


# --- pure parts (no node needed) ---------------------------------------------------------------


def test_node_names_and_labels_are_checked(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path / "unused")
    for name, label in [("Real_Node", "real"), ("-x", "real"), ("ok", "a b"), ("ok", "-x")]:
        with pytest.raises(NodeError):
            RealNode(cluster, tmp_path, name=name, label=label)
    node = RealNode(cluster, tmp_path, name="n-1", label="teardown")
    assert node.placement["nodeSelector"] == {NODE_KEY: "teardown", "kubernetes.io/hostname": "n-1"}


def test_image_references_are_spelled_as_containerd_names_them() -> None:
    assert image_reference("busybox") == "docker.io/library/busybox:latest"
    assert image_reference("crl-test/operator:0.1.0") == "docker.io/crl-test/operator:0.1.0"
    assert image_reference("registry.k8s.io/pause:3.10") == "registry.k8s.io/pause:3.10"
    assert image_reference("localhost/x") == "localhost/x:latest"


def test_the_pause_archive_is_a_docker_save_archive() -> None:
    archive = image_archive(
        "registry.k8s.io/pause:3.10", {"pause": (b"\x7fELF", 0o755)}, ["/pause"]
    )
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        [manifest] = json.loads(tar.extractfile("manifest.json").read())  # type: ignore[union-attr]
        assert manifest["RepoTags"] == ["registry.k8s.io/pause:3.10"]
        config = json.loads(tar.extractfile(manifest["Config"]).read())  # type: ignore[union-attr]
        layer = tar.extractfile(manifest["Layers"][0]).read()  # type: ignore[union-attr]
    assert config["config"]["Entrypoint"] == ["/pause"]
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer).hexdigest()]
    with tarfile.open(fileobj=io.BytesIO(layer)) as files:
        member = files.getmember("pause")
        assert member.mode == 0o755 and files.extractfile(member).read() == b"\x7fELF"  # type: ignore[union-attr]


def test_cluster_dns_answers_a_query_as_a_resolver_reads_it() -> None:
    # A query as glibc sends it: id, RD set, one question (A, IN).
    name = b"".join(bytes([len(p)]) + p for p in b"mini-gateway.ns.svc.cluster.local".split(b"."))
    query = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" + name + b"\x00\x00\x01\x00\x01"
    assert parse_query(query)[2:4] == ("mini-gateway.ns.svc.cluster.local", 1)
    answer = build_answer(query, ["10.240.3.7", "10.240.3.8"])
    ident, flags, questions, answers = struct.unpack("!HHHH", answer[:8])
    assert (ident, flags & 0x800F, flags & 0x0100, questions, answers) == (0x1234, 0x8000,
                                                                           0x0100, 1, 2)  # fmt: skip
    records = answer[len(query) :]
    assert records[12:16] == bytes([10, 240, 3, 7]) and records[-4:] == bytes([10, 240, 3, 8])
    assert struct.unpack("!HHHIH", records[:12]) == (0xC00C, 1, 1, 5, 4)
    missing = build_answer(query, [], rcode=3)
    assert struct.unpack("!H", missing[2:4])[0] & 0x000F == 3  # NXDOMAIN
    with pytest.raises(ValueError):
        parse_query(query[:20])

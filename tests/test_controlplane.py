"""The test control plane itself, and the project's CRDs and manifests held to a real API server.

`tests/fixtures/cluster.py` starts etcd, kube-apiserver, kube-controller-manager and kube-scheduler
built from the Kubernetes Go modules, plus kwok for fake nodes. These tests show that it behaves
like a cluster (scheduling, controllers, garbage collection, RBAC, exec) and that the API server
itself accepts the generated CRDs and every example, and refuses the wrong manifests with the
messages the project promises.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from .fixtures.cluster import Cluster, KubectlError
from .fixtures.paths import EXAMPLES, INVALID, ROOT

pytestmark = pytest.mark.cluster

CRDS = sorted((ROOT / "crds").glob("*.yaml"))
GO_MOD = ROOT / "tests" / "controlplane" / "go.mod"


def _wait_for(what: str, condition: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.3)


def _json(cluster: Cluster, *args: str) -> Any:
    return json.loads(cluster.kubectl(*args, "-o", "json").stdout)


def test_the_api_server_is_ready(cluster: Cluster) -> None:
    checks = cluster.kubectl("get", "--raw", "/readyz?verbose").stdout
    assert "readyz check passed" in checks
    assert "[+]etcd ok" in checks


def test_version_is_the_pinned_kubernetes_release(cluster: Cluster) -> None:
    pinned = re.search(r"^\s*k8s\.io/kubernetes (v1\.\d+\.\d+)$", GO_MOD.read_text(), re.M)
    assert pinned is not None
    version = json.loads(cluster.kubectl("get", "--raw", "/version").stdout)
    assert version["gitVersion"] == pinned.group(1)
    assert f"v{version['major']}.{version['minor']}." in pinned.group(1) + "."
    client = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert client["clientVersion"]["gitVersion"] == pinned.group(1)
    assert client["serverVersion"]["gitVersion"] == pinned.group(1)


def test_the_generated_crds_are_established(cluster: Cluster) -> None:
    """Applying them at all proves they are structural and their CEL compiles within budget."""
    for path in CRDS:
        name = yaml.safe_load(path.read_text())["metadata"]["name"]
        crd = _json(cluster, "get", "crd", name)
        conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conditions.get("Established") == "True", (name, conditions)
        assert conditions.get("NamesAccepted") == "True", (name, conditions)


def test_a_crd_with_broken_cel_is_refused(cluster: Cluster) -> None:
    """The check above can fail: a rule reading a field that does not exist is refused."""
    text = CRDS[-1].read_text().replace("self.gpus % self.tensorParallelSize", "self.gpu % 2", 1)
    assert text != CRDS[-1].read_text()
    result = cluster.kubectl("apply", "--server-side", "--field-manager=crl-tests", "--dry-run=server", "-f", "-",
                             input=text, check=False)  # fmt: skip
    assert result.returncode != 0
    assert "undefined field 'gpu'" in result.stderr


def test_fake_nodes_are_ready_with_the_advertised_capacity(cluster: Cluster) -> None:
    nodes = _json(cluster, "get", "nodes")["items"]
    assert sorted(n["metadata"]["name"] for n in nodes) == sorted(cluster.node_names)
    for node in nodes:
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True"
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"


def test_a_deployment_gets_running_pods_on_fake_nodes(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("create", "deployment", "web", "--image=nginx:1.27", "--replicas=3",
                    "-n", namespace)  # fmt: skip
    cluster.kubectl("rollout", "status", "deployment/web", "-n", namespace, "--timeout=90s")
    pods = _json(cluster, "get", "pods", "-n", namespace, "-l", "app=web")["items"]
    assert len(pods) == 3
    for pod in pods:
        assert pod["status"]["phase"] == "Running"
        assert pod["spec"]["nodeName"] in cluster.node_names
        assert pod["status"]["podIP"]


def test_a_job_completes(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("create", "job", "once", "--image=busybox:1.36", "-n", namespace,
                    "--", "true")  # fmt: skip
    cluster.kubectl("wait", "--for=condition=Complete", "job/once", "-n", namespace,
                    "--timeout=90s")  # fmt: skip
    job = _json(cluster, "get", "job", "once", "-n", namespace)
    assert job["status"]["succeeded"] == 1


def test_deleting_an_owner_cascades(cluster: Cluster, namespace: str) -> None:
    """The garbage collector removes the ReplicaSet and Pods a deleted Deployment owned."""
    cluster.kubectl("create", "deployment", "gone", "--image=nginx:1.27", "--replicas=2",
                    "-n", namespace)  # fmt: skip
    cluster.kubectl("rollout", "status", "deployment/gone", "-n", namespace, "--timeout=90s")
    assert _json(cluster, "get", "replicasets", "-n", namespace)["items"]
    cluster.kubectl("delete", "deployment", "gone", "-n", namespace, "--cascade=background")

    def everything_gone() -> bool:
        left = _json(cluster, "get", "replicasets,pods", "-n", namespace)["items"]
        return not left

    _wait_for("the ReplicaSet and Pods to be collected", everything_gone)


def test_a_service_account_token_acts_under_rbac(cluster: Cluster, namespace: str) -> None:
    """TokenRequest gives a working identity, and RBAC grants exactly what is bound."""
    kubeconfig = cluster.service_account_kubeconfig("robot", namespace, create=True)
    whoami = json.loads(cluster.kubectl("auth", "whoami", "-o", "json",
                                        kubeconfig=kubeconfig).stdout)  # fmt: skip
    assert whoami["status"]["userInfo"]["username"] == f"system:serviceaccount:{namespace}:robot"
    denied = cluster.kubectl("get", "pods", "-n", namespace, kubeconfig=kubeconfig, check=False)
    assert denied.returncode != 0
    assert "forbidden" in denied.stderr
    cluster.kubectl("create", "role", "pod-reader", "--verb=get,list", "--resource=pods",
                    "-n", namespace)  # fmt: skip
    cluster.kubectl("create", "rolebinding", "robot-reads", "--role=pod-reader",
                    f"--serviceaccount={namespace}:robot", "-n", namespace)  # fmt: skip
    _wait_for(
        "the RoleBinding to take effect",
        lambda: (
            cluster.kubectl(
                "get", "pods", "-n", namespace, kubeconfig=kubeconfig, check=False
            ).returncode
            == 0
        ),
        timeout=20,
    )
    other = cluster.kubectl("get", "pods", "-n", "default", kubeconfig=kubeconfig, check=False)
    assert other.returncode != 0


def test_the_python_client_talks_to_it(cluster: Cluster, namespace: str) -> None:
    from kubernetes import client

    with cluster.api_client() as api:
        names = [
            ns.metadata.name for ns in client.CoreV1Api(api).list_namespace().items if ns.metadata
        ]
        crds = client.ApiextensionsV1Api(api).list_custom_resource_definition().items
    assert namespace in names
    assert {c.spec.group for c in crds} >= {"coderepair.io"}


def test_kubectl_exec_runs_in_a_fake_pod(cluster: Cluster, namespace: str) -> None:
    """The nodes' kubelet endpoint runs exec'd commands locally, in a directory per pod, with
    stdin (up to EOF), stdout, stderr and the exit code passed through as by a real kubelet."""
    cluster.kubectl("run", "shell", "--image=busybox:1.36", "-n", namespace, "--", "sleep", "1d")
    cluster.kubectl("wait", "--for=condition=Ready", "pod/shell", "-n", namespace,
                    "--timeout=60s")  # fmt: skip
    result = cluster.kubectl("exec", "shell", "-n", namespace, "--", "sh", "-c",
                             "echo out-$((6*7)); echo err >&2; exit 3", check=False)  # fmt: skip
    assert result.stdout == "out-42\n"
    assert result.stderr.startswith("err\n")
    assert result.returncode == 3
    fed = cluster.kubectl("exec", "-i", "shell", "-n", namespace, "--", "wc", "-c", input="x" * 70000,
                          timeout=30)  # fmt: skip
    assert fed.stdout.strip() == "70000"
    here = cluster.kubectl("exec", "shell", "-n", namespace, "--", "pwd")
    assert here.stdout.strip() == str(cluster.pods_dir / namespace / "shell")


# -- the project's manifests --------------------------------------------------------------------


def _cel_messages() -> list[str]:
    """Every x-kubernetes-validations message in the generated CRDs."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for rule in node.get("x-kubernetes-validations", []):
                if "message" in rule:
                    found.append(rule["message"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for path in CRDS:
        walk(yaml.safe_load(path.read_text()))
    return found


def _header(path: Path, key: str) -> str | None:
    for line in path.read_text().splitlines():
        if line.startswith(f"# {key}: "):
            return line.removeprefix(f"# {key}: ")
    return None


def _served() -> set[tuple[str, str]]:
    """(apiVersion, kind) pairs the CRDs serve."""
    served = set()
    for path in CRDS:
        crd = yaml.safe_load(path.read_text())
        for version in crd["spec"]["versions"]:
            if version["served"]:
                served.add(
                    (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
                )
    return served


class _DuplicateKeyLoader(yaml.SafeLoader):
    """A YAML loader that refuses a mapping with the same key twice."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        keys = [self.construct_object(k, deep=deep) for k, _ in node.value]
        if len(keys) != len(set(keys)):
            raise yaml.constructor.ConstructorError(None, None, "duplicate key", node.start_mark)
        return super().construct_mapping(node, deep=deep)


def _has_duplicate_key(path: Path) -> bool:
    try:
        list(yaml.load_all(path.read_text(), Loader=_DuplicateKeyLoader))
    except yaml.constructor.ConstructorError:
        return True
    except yaml.YAMLError:
        return False
    return False


def _unseen_reason(path: Path) -> str | None:
    """Why the API server never gets to validate this file's object, or None if it does."""
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except yaml.YAMLError:
        return "not YAML: kubectl fails to parse it before any request"
    if not docs:
        return "no object at all: nothing is sent"
    if not all(isinstance(d, dict) for d in docs):
        return "not a mapping: kubectl cannot read an object out of it"
    if any((d.get("apiVersion"), d.get("kind")) not in _served() for d in docs):
        return "not a kind/version our CRDs serve: another resource, or a version not served"
    return None


@pytest.fixture(scope="module")
def dry_run_namespace(cluster: Cluster) -> Iterator[str]:
    """One namespace for every server-side dry run below (they create nothing)."""
    name = cluster.namespace("dry-run")
    yield name
    cluster.delete_namespace(name)


@pytest.fixture(scope="module")
def example_namespaces(cluster: Cluster) -> Iterator[None]:
    """The namespaces the examples name (team-repair), so a dry run can create into them."""
    wanted = set()
    for path in EXAMPLES:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("metadata", {}).get("namespace"):
                wanted.add(doc["metadata"]["namespace"])
    existing = set(cluster.kubectl("get", "namespaces", "-o", "name").stdout.split())
    created = [n for n in sorted(wanted) if f"namespace/{n}" not in existing]
    for name in created:
        cluster.kubectl("create", "namespace", name)
    yield
    for name in created:
        cluster.delete_namespace(name)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_the_api_server_accepts_every_example(
    cluster: Cluster, dry_run_namespace: str, example_namespaces: None, example: Path
) -> None:
    [doc] = yaml.safe_load_all(example.read_text())
    target = doc["metadata"].get("namespace", dry_run_namespace)
    result = cluster.kubectl("create", "--dry-run=server", "--validate=strict", "-n", target,
                             "-f", str(example), "-o", "name", check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith(("trainingrun", "rolloutpool", "benchmark"))
    assert "Warning" not in result.stderr, result.stderr  # e.g. unknown fields pruned


@pytest.mark.parametrize("manifest", INVALID, ids=lambda p: p.name)
def test_the_api_server_refuses_every_wrong_manifest(
    cluster: Cluster, dry_run_namespace: str, manifest: Path
) -> None:
    """Refused with the promised message where it is a CRD rule's, else naming the field."""
    namespace = dry_run_namespace
    expected = _header(manifest, "expect")
    assert expected is not None, f"{manifest.name} has no '# expect:' header"
    reason = _unseen_reason(manifest)
    if reason is not None:
        pytest.skip(f"the API server never sees it: {reason}")
    if _has_duplicate_key(manifest):
        # kubectl turns YAML into JSON first, keeping only the last value, so the server would
        # never see the duplicate: send the YAML itself, as a YAML-speaking client would.
        [doc] = yaml.safe_load_all(manifest.read_text())
        plural = doc["kind"].lower() + "s"
        status, message = cluster.request(
            "POST",
            f"/apis/{doc['apiVersion']}/namespaces/{namespace}/{plural}"
            "?dryRun=All&fieldValidation=Strict",
            manifest.read_bytes(),
            content_type="application/yaml",
        )
        assert status >= 400, f"the API server accepted {manifest.name}: {message}"
    else:
        try:
            cluster.kubectl("create", "--dry-run=server", "--validate=strict", "-n", namespace,
                            "-f", str(manifest))  # fmt: skip
        except KubectlError as error:
            message = error.result.stderr
        else:
            pytest.fail(f"the API server accepted {manifest.name}")
    if any(expected in rule for rule in _cel_messages()):
        assert expected in message, message
    path = _header(manifest, "expect-path")
    if path is not None:
        # The server's wording differs from `crl validate`'s, but it names the field.
        leaf = path.rsplit(".", 1)[-1]
        assert leaf in message, message


def test_stopping_leaves_no_process_behind(cluster: Cluster) -> None:
    """A second, small cluster starts beside the session's one and stops completely."""
    with Cluster(nodes=1, bin_dir=cluster.bin_dir, crds=[]) as small:
        assert small.kubectl("get", "nodes", "-o", "name").stdout.split() == ["node/kwok-node-0"]
        pids = [p.popen.pid for p in small._processes]
        workdir = small.workdir
        assert len(pids) == 6  # etcd, apiserver, controller-manager, scheduler, exec, kwok
    for pid in pids:
        # Each component leads its own process group: nothing may be left in any of them.
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)
    assert not workdir.exists()

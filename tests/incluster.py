"""The project running in the test cluster as a user runs it: images, the chart, a RolloutPool.

Helpers shared by tests/test_real_node.py and perf/real_node.py, on a `Cluster` with a
`RealNode` and the Docker engine of tests/fixtures/docker.py:

- :func:`build_image`: ``images/build.sh`` of one component on the Debian base;
- :func:`install_operator`: ``helm install`` of the chart with the operator on the real node
  (plus the ``hostAliases`` the test cluster needs: it runs no DNS service);
- :func:`start_pool`: a RolloutPool whose tasks come from a ConfigMap, its gateway moved onto the
  real node; returns a :class:`Gateway` to lease from (at the gateway pod's IP: no kube-proxy).
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from crl_worker.sandbox.kubernetes import pod_ready
from crl_worker.tasks.model import Task

from .cluster import Cluster
from .fixtures.docker import DockerEngine
from .node import KUBERNETES_SERVICE_IP, RealNode
from .paths import ROOT

#: The project's version: the tag of the images images/build.sh makes.
VERSION: str = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
CHART = ROOT / "charts" / "coderepairrl"
REGISTRY = "crl-test"


def until(what: str, predicate: Callable[[], Any], timeout: float = 120) -> Any:
    """Poll ``predicate`` every half second until it returns something true; return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def build_image(engine: DockerEngine, base: str, component: str) -> str:
    """``bash images/build.sh`` of ``component`` on ``base``; returns its tag."""
    built = subprocess.run(
        ["bash", "images/build.sh", "--registry", REGISTRY, "--network", "host",
         "--base-image", base, component],
        cwd=ROOT, env=engine.env(), capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    if built.returncode != 0:
        raise AssertionError(
            f"images/build.sh {component}: {(built.stdout + built.stderr)[-4000:]}"
        )
    return f"{REGISTRY}/{component}:{VERSION}"


def owned_by(cluster: Cluster, kind: str, namespace: str, owner: str) -> list[dict[str, Any]]:
    """Objects of ``kind`` in ``namespace`` with an owner reference to ``owner``."""
    listed = json.loads(cluster.kubectl("get", kind, "-n", namespace, "-o", "json").stdout)
    return [
        item for item in listed["items"]
        if any(o["name"] == owner for o in item["metadata"].get("ownerReferences", []))
    ]  # fmt: skip


def _patch(cluster: Cluster, namespace: str, deployment: str, spec: dict[str, Any]) -> None:
    """Merge ``spec`` into a Deployment's pod template as the field manager ``crl-tests`` (the
    operator's and helm's own fields stay theirs)."""
    body = json.dumps({"spec": {"template": {"spec": spec}}})
    cluster.kubectl("patch", "deployment", deployment, "-n", namespace, "--type=merge",
                    "--field-manager=crl-tests", "-p", body)  # fmt: skip


def install_operator(
    cluster: Cluster, node: RealNode, namespace: str, release: str = "crl"
) -> dict[str, Any]:
    """``helm install`` the chart into ``namespace`` with the operator's image (already on the
    node) on the real node, watching that namespace; returns the operator's pod once Ready."""
    values = [
        "--set", f"image.registry={REGISTRY}",
        "--set", "logFormat=text",
        "--set", "workers=2",
        "--set", "watch.scope=namespaces",
        "--set-json", f"nodeSelector={json.dumps(node.placement['nodeSelector'])}",
        "--set-json", f"tolerations={json.dumps(node.placement['tolerations'])}",
    ]  # fmt: skip
    install = subprocess.run(
        [str(cluster.helm_path), "install", release, str(CHART), "--namespace", namespace,
         *values],
        env=cluster.env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    if install.returncode != 0:
        raise AssertionError(f"helm install: {install.stderr}")
    # No DNS service here, and kopf's in-cluster login names the API server
    # https://kubernetes.default.svc (a real cluster needs none of this).
    _patch(cluster, namespace, f"{release}-coderepairrl", {"hostAliases": [{
        "ip": KUBERNETES_SERVICE_IP,
        "hostnames": ["kubernetes.default.svc", "kubernetes.default.svc.cluster.local"],
    }]})  # fmt: skip
    rollout = cluster.kubectl("rollout", "status", f"deployment/{release}-coderepairrl", "-n",
                              namespace, "--timeout=180s", check=False, timeout=200)  # fmt: skip
    if rollout.returncode != 0:
        described = cluster.kubectl("describe", "pods", "-n", namespace, check=False).stdout
        raise AssertionError(f"the operator did not start: {rollout.stderr}\n{described[-4000:]}")
    pods = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-l",
                                      "app.kubernetes.io/name=coderepairrl", "-o",
                                      "json").stdout)["items"]  # fmt: skip
    [operator] = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    return dict(operator)


def uninstall_operator(cluster: Cluster, namespace: str, release: str = "crl") -> None:
    """``helm uninstall`` (RolloutPools first, while the operator still runs)."""
    cluster.kubectl("delete", "rolloutpools", "--all", "-n", namespace, "--timeout=60s",
                    check=False, timeout=90)  # fmt: skip
    subprocess.run(
        [str(cluster.helm_path), "uninstall", release, "--namespace", namespace, "--wait",
         "--timeout", "60s"],
        env=cluster.env, capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip


@dataclass
class Gateway:
    """A running pool gateway, reached at its pod's IP with the pool's token."""

    url: str
    token: str

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        """One HTTP request; returns (status, decoded JSON or the error text)."""
        request = urllib.request.Request(
            self.url + path, method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=300) as response:
                raw = response.read()
                return int(response.status), json.loads(raw) if raw else None
        except urllib.error.HTTPError as error:
            return int(error.code), error.read().decode()


def start_pool(
    cluster: Cluster, node: RealNode, namespace: str, name: str, tasks: Sequence[Task],
    *, replicas: int = 2, max_sandboxes: int = 4,
) -> Gateway:  # fmt: skip
    """A RolloutPool of ``tasks`` (each with its image on the node; in a ConfigMap) with its
    sandboxes and gateway on the real node; returns the gateway once its pod is Ready."""
    jsonl = "".join(json.dumps(t.model_dump(mode="json")) + "\n" for t in tasks)
    cluster.kubectl("create", "configmap", f"{name}-tasks", "-n", namespace,
                    "--from-file=tasks.jsonl=/dev/stdin", input=jsonl)  # fmt: skip
    pool = {
        "apiVersion": "coderepair.io/v1alpha1",
        "kind": "RolloutPool",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "tasks": {"format": "task", "configMap": {"name": f"{name}-tasks"}},
            "replicas": replicas,
            "maxSandboxes": max_sandboxes,
            "prefetch": 0,
            "sandbox": {
                "placement": node.placement,
                "startupTimeoutSeconds": 120,
                "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}},
            },
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pool))
    [gateway] = until("the gateway Deployment",
                      lambda: owned_by(cluster, "deployments", namespace, name))  # fmt: skip
    secret_name = f"{name}-gateway-token"
    until("the gateway's token Secret", lambda: cluster.kubectl(
        "get", "secret", secret_name, "-n", namespace, check=False).returncode == 0)  # fmt: skip
    # A RolloutPool has no placement for its gateway, only for its sandboxes.
    _patch(cluster, namespace, gateway["metadata"]["name"], node.placement)

    def gateway_pods() -> list[dict[str, Any]]:
        listed = json.loads(cluster.kubectl(
            "get", "pods", "-n", namespace, "-l", "app.kubernetes.io/component=gateway", "-o",
            "json").stdout)["items"]  # fmt: skip
        return [p for p in listed if pod_ready(p) and p["spec"].get("nodeName") == node.name]

    [pod] = until("the gateway pod on the real node", gateway_pods, timeout=180)
    secret = json.loads(cluster.kubectl("get", "secret", secret_name, "-n", namespace, "-o",
                                        "json").stdout)  # fmt: skip
    token = base64.b64decode(secret["data"]["token"]).decode()
    return Gateway(f"http://{pod['status']['podIP']}:8080", token)


def sandbox_pods(cluster: Cluster, namespace: str, pool: str) -> list[dict[str, Any]]:
    """The pool's sandbox pods that are not being deleted."""
    listed = json.loads(cluster.kubectl(
        "get", "pods", "-n", namespace, "-l", f"coderepair.io/pool={pool},coderepair.io/role=sandbox",
        "-o", "json").stdout)["items"]  # fmt: skip
    return [p for p in listed if not p["metadata"].get("deletionTimestamp")]

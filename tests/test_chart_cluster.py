"""The chart and the builders' children against a real API server (the `cluster` fixture).

- `helm template | kubectl apply --server-side --dry-run=server` with default and other values;
- the chart installed for real, then the operator's permissions checked as its own
  ServiceAccount (a TokenRequest token, not impersonation): what it must be able to do in a
  watched namespace, and what it must not (Secrets, namespaces, unwatched namespaces);
- every child of every example created as that ServiceAccount, for real and in render order
  (a RoleBinding's escalation check needs its Role to exist): the API server accepts the
  objects, and RBAC escalation prevention accepts the gateway Roles the operator creates.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from crl_operator.builders import RenderState, render, resolve_checkpoint
from crl_worker.api import Benchmark, TrainingRun
from crl_worker.api.validation import load_resources

from .fixtures.cluster import Cluster
from .fixtures.paths import EXAMPLES, ROOT, run

CHART = ROOT / "charts" / "coderepairrl"


def helm_template(cluster: Cluster, release: str, namespace: str, *args: str) -> str:
    result = run(
        [str(cluster.helm_path), "template", release, str(CHART), "--namespace", namespace, *args],
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def can_i(cluster: Cluster, kubeconfig: Path, *args: str) -> bool:
    """`kubectl auth can-i ARGS` as the identity of `kubeconfig`."""
    result = cluster.kubectl("auth", "can-i", *args, kubeconfig=kubeconfig, check=False)
    answer = result.stdout.strip()
    assert answer in ("yes", "no"), result.stderr
    return answer == "yes"


class Installed:
    """The chart's templates applied for real; cluster-scoped objects removed afterwards."""

    def __init__(self, cluster: Cluster, namespace: str, *values: str) -> None:
        self.cluster = cluster
        self.release = f"crl{uuid.uuid4().hex[:6]}"
        self.manifest = helm_template(cluster, self.release, namespace, *values)
        cluster.kubectl("apply", "--server-side", "-f", "-", input=self.manifest)
        self.fullname = f"{self.release}-coderepairrl"
        self.kubeconfig = cluster.service_account_kubeconfig(self.fullname, namespace)

    def remove(self) -> None:
        cluster_scoped = [
            d
            for d in yaml.safe_load_all(self.manifest)
            if d and d["kind"] in ("ClusterRole", "ClusterRoleBinding")
        ]
        self.cluster.kubectl(
            "delete", "--ignore-not-found", "-f", "-", input=yaml.safe_dump_all(cluster_scoped)
        )


@pytest.fixture
def other_namespace(cluster: Cluster) -> Iterator[str]:
    name = cluster.namespace("other")
    yield name
    cluster.delete_namespace(name)


def test_templates_pass_server_side_dry_run(cluster: Cluster, namespace: str) -> None:
    for values in (
        [],
        ["--set", "watch.scope=namespaces", "--set", f"watch.namespaces={{{namespace}}}"],
    ):
        manifest = helm_template(cluster, "crl-dry", namespace, *values)
        result = cluster.kubectl(
            "apply", "--server-side", "--dry-run=server", "-f", "-", input=manifest, check=False
        )
        assert result.returncode == 0, result.stderr + result.stdout


def test_namespaced_operator_has_exactly_its_permissions(
    cluster: Cluster, namespace: str, other_namespace: str
) -> None:
    installed = Installed(
        cluster,
        namespace,
        "--set",
        "watch.scope=namespaces",
        "--set",
        f"watch.namespaces={{{namespace}}}",
    )
    try:
        me = installed.kubeconfig
        ns = ["-n", namespace]
        for verb, resource in [
            ("create", "deployments.apps"),
            ("delete", "jobs.batch"),
            ("patch", "configmaps"),
            ("create", "services"),
            ("create", "serviceaccounts"),
            ("create", "networkpolicies.networking.k8s.io"),
            ("create", "roles.rbac.authorization.k8s.io"),
            ("create", "rolebindings.rbac.authorization.k8s.io"),
            ("create", "rolloutpools.coderepair.io"),
            ("create", "benchmarks.coderepair.io"),
            ("watch", "trainingruns.coderepair.io"),
            ("patch", "trainingruns.coderepair.io"),
            ("list", "pods"),
            ("create", "events"),
        ]:
            assert can_i(cluster, me, verb, resource, *ns), (verb, resource)
        for subresource in ("status",):
            for cr in ("trainingruns", "rolloutpools", "benchmarks"):
                assert can_i(
                    cluster, me, "patch", f"{cr}.coderepair.io", f"--subresource={subresource}", *ns
                )
        assert can_i(cluster, me, "list", "customresourcedefinitions.apiextensions.k8s.io")
        # What it must not do.
        assert not can_i(cluster, me, "get", "secrets", *ns)
        assert not can_i(cluster, me, "list", "secrets", *ns)
        assert not can_i(cluster, me, "delete", "namespaces")
        assert not can_i(cluster, me, "list", "namespaces")
        assert not can_i(cluster, me, "create", "deployments.apps", "-n", other_namespace)
        assert not can_i(cluster, me, "list", "trainingruns.coderepair.io", "-n", other_namespace)
        assert not can_i(cluster, me, "create", "clusterroles.rbac.authorization.k8s.io")
        assert not can_i(cluster, me, "escalate", "roles.rbac.authorization.k8s.io", *ns)
    finally:
        installed.remove()


def test_cluster_wide_operator_reaches_every_namespace_but_no_secrets(
    cluster: Cluster, namespace: str, other_namespace: str
) -> None:
    installed = Installed(cluster, namespace)
    try:
        me = installed.kubeconfig
        for ns in (namespace, other_namespace):
            assert can_i(cluster, me, "create", "jobs.batch", "-n", ns)
            assert can_i(
                cluster, me, "patch", "benchmarks.coderepair.io", "--subresource=status", "-n", ns
            )
            assert not can_i(cluster, me, "get", "secrets", "-n", ns)
        assert can_i(cluster, me, "watch", "namespaces")
        assert not can_i(cluster, me, "delete", "namespaces")
        assert not can_i(cluster, me, "create", "namespaces")
    finally:
        installed.remove()


def _children(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    """Every child of every example, as the live operator renders it.

    The examples are created in `namespace` first, so the children's owner references name
    real objects (the garbage collector deletes children whose owner does not exist).
    """
    out: list[dict[str, Any]] = []
    resources = [r for path in EXAMPLES for r in load_resources(str(path))]
    live_objects = []
    for resource in resources:
        data = resource.model_dump(mode="json", by_alias=True, exclude_none=True)
        data["metadata"]["namespace"] = namespace
        cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(data))
        uid = cluster.kubectl(
            "get", resource.kind.lower(), str(resource.metadata.name), "-n", namespace,
            "-o", "jsonpath={.metadata.uid}",
        ).stdout  # fmt: skip
        data["metadata"]["uid"] = uid
        live_objects.append(type(resource).model_validate(data))
    runs = {r.metadata.name: r for r in live_objects if isinstance(r, TrainingRun)}
    for live in live_objects:
        state = RenderState(inference_ready=True)
        if isinstance(live, TrainingRun) and live.spec.evaluation is not None:
            state = RenderState(inference_ready=True, evaluation_steps=(50,))
        if isinstance(live, Benchmark) and live.spec.model.checkpoint is not None:
            run_ = runs[live.spec.model.checkpoint.training_run]
            state = RenderState(inference_ready=True, checkpoint=resolve_checkpoint(live, run_))
        out += render(live, namespace, state)
    return out


def test_every_child_is_accepted_as_the_operator(cluster: Cluster, namespace: str) -> None:
    """The API server accepts every child, created by the operator's own identity."""
    # Namespaced: the children name `namespace`, the only one this operator may write to.
    installed = Installed(
        cluster,
        namespace,
        "--set",
        "watch.scope=namespaces",
        "--set",
        f"watch.namespaces={{{namespace}}}",
    )
    try:
        children = _children(cluster, namespace)
        kinds = {c["kind"] for c in children}
        assert {"Deployment", "Job", "Service", "Role", "RoleBinding", "NetworkPolicy",
                "RolloutPool", "Benchmark", "ConfigMap", "ServiceAccount"} <= kinds  # fmt: skip
        for child in children:
            result = cluster.kubectl(
                "apply",
                "--server-side",
                "--field-manager=coderepairrl-operator",
                "-f",
                "-",
                input=json.dumps(child),
                kubeconfig=installed.kubeconfig,
                check=False,
            )
            where = f"{child['kind']}/{child['metadata']['name']}"
            assert result.returncode == 0, f"{where}: {result.stderr}{result.stdout}"
        # Owned by live objects, the children stay (the garbage collector found the owners).
        for child in children:
            kind = child["kind"].lower()
            if "/" in child["apiVersion"]:
                kind += "." + child["apiVersion"].split("/")[0]
            cluster.kubectl("get", kind, child["metadata"]["name"], "-n", namespace)
    finally:
        installed.remove()


def test_gateway_role_is_granted_for_real(cluster: Cluster, namespace: str) -> None:
    """The operator creates a pool's gateway RBAC for real; the gateway can then do its job."""
    installed = Installed(
        cluster,
        namespace,
        "--set",
        "watch.scope=namespaces",
        "--set",
        f"watch.namespaces={{{namespace}}}",
    )
    try:
        [pool] = load_resources(str(ROOT / "examples" / "rolloutpool-swe-gym.yaml"))
        rbac = [
            c
            for c in render(pool, namespace)
            if c["kind"] in ("ServiceAccount", "Role", "RoleBinding")
        ]
        cluster.kubectl(
            "apply",
            "--server-side",
            "--field-manager=coderepairrl-operator",
            "-f",
            "-",
            input=yaml.safe_dump_all(rbac),
            kubeconfig=installed.kubeconfig,
        )
        gateway = cluster.service_account_kubeconfig("swe-gym-gateway", namespace)
        ns = ["-n", namespace]
        assert can_i(cluster, gateway, "create", "pods", *ns)
        assert can_i(cluster, gateway, "create", "pods", "--subresource=exec", *ns)
        assert can_i(cluster, gateway, "get", "pods", "--subresource=log", *ns)
        assert can_i(cluster, gateway, "get", "rolloutpools.coderepair.io/swe-gym", *ns)
        assert not can_i(cluster, gateway, "get", "rolloutpools.coderepair.io/another", *ns)
        assert not can_i(cluster, gateway, "get", "secrets", *ns)
        assert not can_i(cluster, gateway, "create", "deployments.apps", *ns)
    finally:
        installed.remove()


def test_crl_render_output_applies(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    """What `crl render` prints (the CLI, as a reviewer runs it) passes a server-side dry-run."""
    both = tmp_path / "all.yaml"
    both.write_text("---\n".join(p.read_text() for p in EXAMPLES))
    rendered = run([sys.executable, "-m", "crl_cli", "render", str(both), "-n", namespace])
    assert rendered.returncode == 0, rendered.stderr
    result = cluster.kubectl(
        "apply", "--server-side", "--dry-run=server", "-f", "-", input=rendered.stdout, check=False
    )
    assert result.returncode == 0, result.stderr + result.stdout
    assert result.stdout.count("(server dry run)") == len(
        [d for d in yaml.safe_load_all(rendered.stdout) if d]
    )

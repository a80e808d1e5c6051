"""The Helm chart: lint, templates with default and other values, and the schema's verdicts.

Helm is the real binary (built from Go modules by tests/controlplane/build.sh into the cache).
Tests against a real API server (server-side dry-run of the templates, and the operator's
permissions checked as its own ServiceAccount) are in the `cluster`-marked part below.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from .fixtures.helm import helm_binary
from .fixtures.paths import ROOT, run

CHART = ROOT / "charts" / "coderepairrl"
RELEASE = "crl"
FULLNAME = "crl-coderepairrl"

#: Values that differ from every default (namespaced watch, another image, monitoring on).
OTHER_VALUES: dict[str, Any] = {
    "image": {"registry": "registry.example.com/crl/", "tag": "dev"},
    "imagePullSecrets": ["regcred"],
    "watch": {"scope": "namespaces", "namespaces": ["team-a", "team-b"]},
    "serviceAccount": {"create": True, "name": "crl-op", "annotations": {"a.example/b": "c"}},
    "logFormat": "text",
    "logLevel": "DEBUG",
    "workers": 2,
    "resyncSeconds": 30,
    "metrics": {
        "port": 9090,
        "service": {"enabled": True, "type": "ClusterIP"},
        "serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "prom"}},
    },
    "health": {"port": 9091},
    "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "infra", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {},
    "priorityClassName": "system-cluster-critical",
    "podAnnotations": {"example.com/x": "annotated"},
    "podLabels": {"team": "platform"},
    "extraArgs": ["--kubeconfig=/dev/null"],
}


@pytest.fixture(scope="module")
def helm() -> str:
    return helm_binary()


def values_file(tmp_path: Path, values: dict[str, Any]) -> Path:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def template(helm: str, *args: str, namespace: str = "crl-system") -> list[dict[str, Any]]:
    result = run(
        [helm, "template", RELEASE, str(CHART), "--namespace", namespace, *args], timeout=120
    )
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in by_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, [(d["kind"], d["metadata"]["name"]) for d in docs]
    return found[0]


def rules_of(docs: list[dict[str, Any]], name: str) -> set[tuple[str, str, str]]:
    role = one(docs, "ClusterRole", name)
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


# --- lint and templates ---------------------------------------------------------------------


def test_lint_strict(helm: str, tmp_path: Path) -> None:
    for args in ([], ["-f", str(values_file(tmp_path, OTHER_VALUES))]):
        result = run([helm, "lint", "--strict", str(CHART), *args], timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "0 chart(s) failed" in result.stdout


def test_default_values_watch_the_whole_cluster(helm: str) -> None:
    docs = template(helm)
    assert sorted(d["kind"] for d in docs) == [
        "ClusterRole",
        "ClusterRole",
        "ClusterRoleBinding",
        "ClusterRoleBinding",
        "Deployment",
        "Service",
        "ServiceAccount",
    ]
    deployment = one(docs, "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == FULLNAME
    assert pod["securityContext"]["runAsNonRoot"] is True
    [container] = pod["containers"]
    assert container["command"] == ["python", "-m", "crl_operator"]
    assert container["image"] == "ghcr.io/coderepairrl/operator:0.1.0"
    assert {"name": "CRL_OPERATOR_IMAGE_REGISTRY", "value": "ghcr.io/coderepairrl"} in container[
        "env"
    ]
    args = container["args"]
    assert "--all-namespaces" in args and "--standalone" in args
    assert "--metrics-port=8080" in args and "--health-port=8081" in args
    assert "--log-format=json" in args
    assert not [a for a in args if a.startswith("--namespace")]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 8080, "health": 8081}
    service = one(docs, "Service")
    assert service["spec"]["ports"][0]["port"] == 8080
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["selector"] == selector
    assert selector.items() <= spec["template"]["metadata"]["labels"].items()
    bindings = {b["roleRef"]["name"] for b in by_kind(docs, "ClusterRoleBinding")}
    assert bindings == {FULLNAME, f"{FULLNAME}-cluster"}
    assert not by_kind(docs, "RoleBinding")
    assert ("", "namespaces", "watch") in rules_of(docs, f"{FULLNAME}-cluster")


def test_namespaced_watch_binds_only_in_those_namespaces(helm: str, tmp_path: Path) -> None:
    docs = template(helm, "-f", str(values_file(tmp_path, OTHER_VALUES)))
    bindings = by_kind(docs, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for binding in bindings:
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": FULLNAME,
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "crl-op", "namespace": "crl-system"}
        ]
    # Cluster-wide, it may only read CRDs (kopf scans them) and get Kueue's priority classes
    # (their value goes into a queued run's Workload); no namespaces, no children.
    [cluster_binding] = by_kind(docs, "ClusterRoleBinding")
    assert cluster_binding["roleRef"]["name"] == f"{FULLNAME}-cluster"
    assert set(rules_of(docs, f"{FULLNAME}-cluster")) == {
        ("apiextensions.k8s.io", "customresourcedefinitions", "get"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
        ("kueue.x-k8s.io", "workloadpriorityclasses", "get"),
    }
    [container] = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args
    assert "--all-namespaces" not in args
    assert "--log-format=text" in args and "--metrics-port=9090" in args
    assert args[-1] == "--kubeconfig=/dev/null"
    assert container["image"] == "registry.example.com/crl/operator:dev"
    assert {
        "name": "CRL_OPERATOR_IMAGE_REGISTRY",
        "value": "registry.example.com/crl",
    } in container["env"]
    monitor = one(docs, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"][0] == {
        "port": "metrics",
        "path": "/metrics",
        "interval": "15s",
    }


def test_namespaced_watch_defaults_to_the_release_namespace(helm: str) -> None:
    docs = template(helm, "--set", "watch.scope=namespaces", namespace="research")
    [binding] = by_kind(docs, "RoleBinding")
    assert binding["metadata"]["namespace"] == "research"


def test_rbac_is_least_privilege(helm: str) -> None:
    rules = rules_of(template(helm), FULLNAME)
    # The operator creates each pool's token Secret and never reads one.
    assert {r for r in rules if r[1] == "secrets"} == {("", "secrets", "create")}
    assert not [rule for rule in rules if "*" in rule]
    assert not [rule for rule in rules if rule[2] in ("escalate", "bind", "impersonate")]
    for cr in ("trainingruns", "rolloutpools", "benchmarks"):
        for verb in ("get", "list", "watch", "patch"):
            assert ("coderepair.io", cr, verb) in rules
        assert ("coderepair.io", f"{cr}/status", "patch") in rules
        # Owner references with blockOwnerDeletion (OwnerReferencesPermissionEnforcement).
        assert ("coderepair.io", f"{cr}/finalizers", "update") in rules
    # Children are written by server-side apply and pruned by DELETE: nothing is ever PUT.
    assert not [r for r in rules if r[2] == "update" and not r[1].endswith("/finalizers")]
    assert not [r for r in rules if r[1].endswith("/scale")]
    assert [r for r in rules if r[1] == "events"] == [("", "events", "create")]
    # Kueue: the Workload of a queued run, and its status only to release an evicted one's quota.
    assert {r for r in rules if r[1] == "workloads/status"} == {
        ("kueue.x-k8s.io", "workloads/status", "get"),
        ("kueue.x-k8s.io", "workloads/status", "patch"),
    }
    for group, resource in [
        ("", "configmaps"),
        ("", "services"),
        ("", "serviceaccounts"),
        ("apps", "deployments"),
        ("batch", "jobs"),
        ("networking.k8s.io", "networkpolicies"),
        ("rbac.authorization.k8s.io", "roles"),
        ("rbac.authorization.k8s.io", "rolebindings"),
        ("coderepair.io", "rolloutpools"),
        ("coderepair.io", "benchmarks"),
        ("kueue.x-k8s.io", "workloads"),
    ]:
        for verb in ("create", "get", "list", "watch", "patch", "delete"):
            assert (group, resource, verb) in rules, (group, resource, verb)


def test_operator_holds_what_the_gateway_roles_grant(helm: str) -> None:
    """RBAC escalation prevention: the operator can create a Role only with rights it holds."""
    from crl_operator.builders.pool import GATEWAY_RULES

    rules = rules_of(template(helm), FULLNAME)
    for rule in GATEWAY_RULES:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert (group, resource, verb) in rules, (group, resource, verb)


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"replicas": 2}, "replicas"),
        ({"watch": {"scope": "everywhere"}}, "scope"),
        ({"logFormat": "xml"}, "logFormat"),
        ({"metrics": {"port": 0}}, "port"),
        ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
    ],
)
def test_schema_refuses_wrong_values(
    helm: str, tmp_path: Path, values: dict[str, Any], complaint: str
) -> None:
    result = run(
        [helm, "template", RELEASE, str(CHART), "-f", str(values_file(tmp_path, values))],
        timeout=120,
    )
    assert result.returncode != 0
    assert complaint in result.stderr


def test_service_monitor_needs_the_service(helm: str) -> None:
    result = run(
        [
            helm,
            "template",
            RELEASE,
            str(CHART),
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set",
            "metrics.service.enabled=false",
        ],
        timeout=120,
    )
    assert result.returncode != 0
    assert "metrics.service.enabled" in result.stderr


def test_every_value_is_documented() -> None:
    """values.yaml, values.schema.json and the README name the same values."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    readme = (CHART / "README.md").read_text()

    def leaves(schema_node: dict[str, Any], prefix: str = "") -> list[str]:
        out = []
        for key, sub in schema_node.get("properties", {}).items():
            path = f"{prefix}{key}"
            assert sub.get("description"), f"{path} has no description in values.schema.json"
            # `resources` is one value (a container's resources), documented as a whole.
            if sub.get("type") == "object" and "properties" in sub and path != "resources":
                out += leaves(sub, path + ".")
            else:
                out.append(path)
        return out

    def value_paths(node: dict[str, Any], prefix: str = "") -> list[str]:
        out = []
        for key, sub in node.items():
            path = f"{prefix}{key}"
            nested = isinstance(sub, dict) and sub and path != "resources"
            out += value_paths(sub, path + ".") if nested else [path]
        return out

    documented = leaves(schema)
    assert sorted(value_paths(values)) == sorted(documented)
    for path in documented:
        assert f"`{path}`" in readme, f"{path} is missing from the chart README"


def test_local_queues_are_created_when_asked(helm: str, tmp_path: Path) -> None:
    assert not by_kind(template(helm), "LocalQueue")
    values = {
        "kueue": {
            "localQueues": [
                {"name": "team-a", "clusterQueue": "team-a"},
                {"name": "team-b", "namespace": "team-b", "clusterQueue": "team-b"},
            ]
        }
    }
    docs = template(helm, "-f", str(values_file(tmp_path, values)), namespace="team-a")
    queues = {
        (q["metadata"]["namespace"], q["metadata"]["name"]): q for q in by_kind(docs, "LocalQueue")
    }
    assert set(queues) == {("team-a", "team-a"), ("team-b", "team-b")}
    assert queues["team-b", "team-b"]["spec"] == {"clusterQueue": "team-b"}
    assert queues["team-a", "team-a"]["apiVersion"] == "kueue.x-k8s.io/v1beta2"

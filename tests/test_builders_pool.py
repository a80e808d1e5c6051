"""The children of a RolloutPool: the gateway, its network policies, its token."""

from __future__ import annotations

import json

import pytest

from crl_operator.builders import (
    render,
)
from crl_operator.builders.pool import pool_name
from crl_worker.api import RolloutPool

from .fixtures.builders import (
    UID,
    container,
    env_of,
    find,
    kinds,
    load,
    pod_spec,
    with_spec,
)

# --- RolloutPool ----------------------------------------------------------------------------


def test_rollout_pool_gateway() -> None:
    pool = load("rolloutpool-swe-gym.yaml")
    children = render(pool)
    assert kinds(children) == [
        "ConfigMap",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "Deployment",
        "Service",
        "NetworkPolicy",
        "NetworkPolicy",
    ]
    role = find(children, "Role")
    verbs = {(r["resources"][0], v) for r in role["rules"] for v in r["verbs"]}
    assert verbs == {
        *(("pods", v) for v in ("create", "delete", "get", "list", "watch", "patch")),
        ("pods/exec", "create"),
        ("pods/exec", "get"),
        ("pods/log", "get"),
        ("events", "create"),
        ("rolloutpools", "get"),
    }
    [own] = [r for r in role["rules"] if r["resources"] == ["rolloutpools"]]
    assert own["resourceNames"] == ["swe-gym"]
    assert "secrets" not in json.dumps(role)
    binding = find(children, "RoleBinding")
    account = find(children, "ServiceAccount")["metadata"]["name"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": "team-repair"}
    ]
    deployment = find(children, "Deployment")
    pod = pod_spec(deployment)
    assert pod["serviceAccountName"] == account
    gateway = container(deployment)
    assert gateway["command"] == ["python", "-m", "crl_worker.pool"]
    # The flags of `python -m crl_worker.pool`, checked against its own parser.
    from crl_worker.pool.__main__ import parser

    parsed = parser().parse_args(gateway["args"])
    assert str(parsed.config) == "/etc/crl/config.yaml"
    assert parsed.backend == "kubernetes"
    assert parsed.port == 8080
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/healthz"
    env = env_of(deployment)
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["CRL_POOL_NAME"] == "swe-gym"
    assert env["CRL_POOL_UID"] == UID
    assert gateway["securityContext"]["readOnlyRootFilesystem"] is True
    assert gateway["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    service = find(children, "Service")
    assert service["spec"]["ports"][0]["port"] == 8080
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    # The token comes from the pool's Secret (never a literal in the manifest); probes and
    # scrapers use the metrics port, which needs no token.
    assert env["CRL_POOL_TOKEN"] == {
        "secretKeyRef": {"name": "swe-gym-gateway-token", "key": "token"}
    }
    assert parsed.metrics_port == 9090
    assert gateway["readinessProbe"]["httpGet"]["port"] == "metrics"
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {
        "http": 8080,
        "metrics": 9090,
    }
    # A changed config rolls the gateway pods.
    hash_key = "coderepair.io/config-hash"
    before = deployment["spec"]["template"]["metadata"]["annotations"][hash_key]
    changed = find(render(with_spec(pool, prefetch=9)), "Deployment")
    assert changed["spec"]["template"]["metadata"]["annotations"][hash_key] != before


@pytest.mark.parametrize("egress", ["deny", "dns", "allow"])
def test_sandbox_network_policy(egress: str) -> None:
    pool = load("rolloutpool-swe-gym.yaml")
    data = pool.model_dump(mode="json", by_alias=True, exclude_none=True)
    data["spec"]["sandbox"]["egress"] = egress
    children = render(RolloutPool.model_validate(data))
    policies = [
        c
        for c in children
        if c["kind"] == "NetworkPolicy" and c["metadata"]["name"].endswith("-sandboxes")
    ]
    if egress == "allow":
        assert policies == []
        return
    [policy] = policies
    spec = policy["spec"]
    assert spec["podSelector"] == {
        "matchLabels": {"coderepair.io/pool": "swe-gym", "coderepair.io/role": "sandbox"}
    }
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    gateway = find(children, "Deployment")
    [ingress] = spec["ingress"]
    assert ingress["from"] == [
        {"podSelector": {"matchLabels": gateway["spec"]["selector"]["matchLabels"]}}
    ]
    if egress == "deny":
        assert spec["egress"] == []
    else:
        [rule] = spec["egress"]
        assert {p["port"] for p in rule["ports"]} == {53}
        assert {p["protocol"] for p in rule["ports"]} == {"UDP", "TCP"}


def test_gateway_network_policy_admits_only_the_pools_clients() -> None:
    pool = load("rolloutpool-swe-gym.yaml")
    children = render(pool)
    [policy] = [
        c
        for c in children
        if c["kind"] == "NetworkPolicy" and c["metadata"]["name"] == "swe-gym-gateway"
    ]
    gateway = find(children, "Deployment")
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": gateway["spec"]["selector"]["matchLabels"]}
    assert spec["policyTypes"] == ["Ingress"]
    api, metrics = spec["ingress"]
    assert api == {
        "from": [{"podSelector": {"matchLabels": {"coderepair.io/pool-client": "swe-gym"}}}],
        "ports": [{"protocol": "TCP", "port": 8080}],
    }
    assert metrics == {"ports": [{"protocol": "TCP", "port": 9090}]}
    assert policy["metadata"]["ownerReferences"][0]["uid"] == UID


def test_token_secret_is_owned_by_the_pool_and_not_rendered() -> None:
    from crl_operator.builders import token_secret

    pool = load("rolloutpool-swe-gym.yaml")
    assert "Secret" not in kinds(render(pool))
    secret = token_secret(pool, "team-repair", "t0k3n")
    assert secret["metadata"]["name"] == "swe-gym-gateway-token"
    assert secret["stringData"] == {"token": "t0k3n"}
    assert secret["metadata"]["ownerReferences"][0]["uid"] == UID


@pytest.mark.parametrize(
    ("example", "kind"),
    [("benchmark-hosted-endpoint.yaml", "Job"), ("trainingrun-qwen3-8b-swe-gym.yaml", "Job")],
)
def test_pool_clients_get_the_token_and_the_client_label(example: str, kind: str) -> None:
    resource = load(example)
    children = render(resource)
    pool = pool_name(resource)
    [job] = [c for c in children if c["kind"] == kind]
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert labels["coderepair.io/pool-client"] == pool
    assert env_of(job)["CRL_POOL_TOKEN"] == {
        "secretKeyRef": {"name": f"{pool}-gateway-token", "key": "token"}
    }

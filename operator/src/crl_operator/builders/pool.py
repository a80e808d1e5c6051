"""A RolloutPool's children: the gateway (Deployment, Service, ServiceAccount, Role, binding),
its ConfigMap, the NetworkPolicies of its gateway and of its sandboxes, and its token Secret;
and the inline pool a TrainingRun or a Benchmark owns.

The token Secret is not rendered with the other children: its value is random, and a render
must be a pure function of the spec. The runtime creates it once, when missing
(:func:`token_secret`); the gateway and every client of the pool read it by `secretKeyRef`.

The gateway creates and deletes the sandbox pods itself (owned by the RolloutPool, labelled
`coderepair.io/pool=<pool>` and `coderepair.io/role=sandbox`), so its Role may manage pods and
exec into them in the pool's namespace, and nothing else.
"""

from __future__ import annotations

from typing import Any

from crl_operator.builders.config import CONFIG_PATH, config_map_name
from crl_operator.builders.meta import (
    ANNOTATION_CONFIG_HASH,
    COMPONENT_GATEWAY,
    COMPONENT_POOL,
    COMPONENT_SANDBOX_POLICY,
    LABEL_POOL,
    LABEL_ROLE,
    child_name,
    labels,
    object_meta,
    owner_name,
    owner_uid,
    selector,
)
from crl_operator.builders.pods import (
    RESTRICTED_CONTAINER,
    account_rbac,
    config_mount,
    config_volume,
    env,
    env_field,
    env_secret,
    http_probe,
    resources,
    task_mount,
)
from crl_operator.builders.progress import progress_name
from crl_worker.api import API_VERSION, Benchmark, RolloutPool, TrainingRun
from crl_worker.api.contract import (
    GATEWAY_METRICS_PORT,
    GATEWAY_PORT,
    POOL_TOKEN_KEY,
    ROLE_SANDBOX,
    Env,
    Label,
)

#: Where the gateway of a pool that validates its tasks keeps its verdicts (`CRL_CACHE_DIR`).
VALIDATION_CACHE_DIR = "/var/cache/crl"
VALIDATION_CACHE_VOLUME = "validation-cache"

#: What the gateway may do in its namespace: manage the sandbox pods and run commands in them.
GATEWAY_RULES: list[dict[str, Any]] = [
    {
        "apiGroups": [""],
        "resources": ["pods"],
        "verbs": ["create", "delete", "get", "list", "watch", "patch"],
    },
    {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create", "get"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]


def pool_name(owner: TrainingRun | Benchmark) -> str:
    """The RolloutPool a TrainingRun or Benchmark leases from: its poolRef, else its own."""
    ref = owner.spec.rollout.pool_ref if isinstance(owner, TrainingRun) else owner.spec.pool_ref
    if ref is not None:
        return ref.name
    return child_name(owner_name(owner), "pool")


def gateway_name(pool: str) -> str:
    """Name of a pool's gateway Deployment, Service, ServiceAccount, Role and RoleBinding."""
    return child_name(pool, COMPONENT_GATEWAY)


def gateway_url(pool: str) -> str:
    """The gateway's base URL inside the namespace."""
    return f"http://{gateway_name(pool)}:{GATEWAY_PORT}"


def token_secret_name(pool: str) -> str:
    """Name of a pool's token Secret (key :data:`POOL_TOKEN_KEY`)."""
    return child_name(pool, "gateway-token")


def token_env(pool: str) -> dict[str, Any]:
    """The pool's token as the gateway and its clients get it (`CRL_POOL_TOKEN`)."""
    return env_secret(Env.POOL_TOKEN, token_secret_name(pool), POOL_TOKEN_KEY)


def client_labels(pool: str) -> dict[str, str]:
    """The label on the pods that lease from `pool`: the gateway's NetworkPolicy admits them."""
    return {Label.POOL_CLIENT: pool}


def token_secret(pool: RolloutPool, namespace: str, token: str) -> dict[str, Any]:
    """The pool's token Secret holding `token`, owned by the pool (created once, never
    applied again: a second render would bring another random value)."""
    name = owner_name(pool)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": object_meta(pool, token_secret_name(name), COMPONENT_GATEWAY, namespace),
        "type": "Opaque",
        "stringData": {POOL_TOKEN_KEY: token},
    }


def gateway_network_policy(pool: RolloutPool, namespace: str) -> dict[str, Any]:
    """The gateway's NetworkPolicy: its API port only from the pool's clients (pods labelled
    `coderepair.io/pool-client=<pool>`), its metrics port (`/metrics`, `/healthz`) from
    anywhere; no egress rule (it reaches the API server and its sandboxes)."""
    name = owner_name(pool)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": object_meta(
            pool, child_name(name, COMPONENT_GATEWAY), COMPONENT_GATEWAY, namespace
        ),
        "spec": {
            "podSelector": {"matchLabels": gateway_selector(pool)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": client_labels(name)}}],
                    "ports": [{"protocol": "TCP", "port": GATEWAY_PORT}],
                },
                {"ports": [{"protocol": "TCP", "port": GATEWAY_METRICS_PORT}]},
            ],
        },
    }


def sandbox_selector(pool: str) -> dict[str, str]:
    """The labels of a pool's sandbox pods (set by the gateway when it creates them)."""
    return {LABEL_POOL: pool, LABEL_ROLE: ROLE_SANDBOX}


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
    name = pool_name(owner)
    spec = {"tasks": tasks.to_wire(), **settings}
    scheduling = owner.spec.scheduling
    if scheduling.sandboxes_use_quota:
        # Only what the sandboxes' Kueue labels need: the pool itself is not a queued
        # workload (its owner's Workload is), nor bound by the owner's maxRunSeconds.
        spec["scheduling"] = {
            key: value
            for key, value in scheduling.to_wire().items()
            if key in ("queueName", "workloadPriorityClassName", "sandboxesUseQuota")
        }
    # Validating as a RolloutPool fills the pool's own defaults into the child's spec.
    child = RolloutPool.model_validate(
        {"apiVersion": API_VERSION, "kind": "RolloutPool", "metadata": {"name": name}, "spec": spec}
    )
    return {
        "apiVersion": API_VERSION,
        "kind": "RolloutPool",
        "metadata": object_meta(owner, name, COMPONENT_POOL, namespace),
        "spec": child.spec.to_wire(),
    }


def network_policy(pool: RolloutPool, namespace: str) -> dict[str, Any] | None:
    """The sandboxes' NetworkPolicy: ingress from the gateway only; egress per `sandbox.egress`.

    `deny`: no egress at all; `dns`: only to the cluster DNS; `allow`: no policy (the
    sandboxes may reach anything, the gateway included).
    """
    egress = pool.spec.sandbox.egress
    if egress == "allow":
        return None
    name = owner_name(pool)
    rules: list[dict[str, Any]] = []
    if egress == "dns":
        rules.append(
            {
                "to": [
                    {
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
                        },
                        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                    }
                ],
                "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
            }
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": object_meta(
            pool, child_name(name, "sandboxes"), COMPONENT_SANDBOX_POLICY, namespace
        ),
        "spec": {
            "podSelector": {"matchLabels": sandbox_selector(name)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": gateway_selector(pool)}}]}],
            "egress": rules,
        },
    }


def gateway_selector(pool: RolloutPool) -> dict[str, str]:
    """The labels that select a pool's gateway pods."""
    return selector(pool, COMPONENT_GATEWAY)


def gateway_objects(pool: RolloutPool, namespace: str, config_hash: str) -> list[dict[str, Any]]:
    """ServiceAccount, Role, RoleBinding, Deployment and Service of the pool gateway."""
    name = owner_name(pool)
    gw = gateway_name(name)
    meta = object_meta(pool, gw, COMPONENT_GATEWAY, namespace)
    spec = pool.spec.gateway
    uid = owner_uid(pool)
    tasks = task_mount(pool.spec.tasks)
    container_env = [
        env_field("POD_NAMESPACE", "metadata.namespace"),
        env_field(Env.POD_NAME, "metadata.name"),
        env(Env.POOL_NAME, name),
        # The gateway makes its sandbox pods owned by the RolloutPool (garbage collected with
        # it); offline there is no uid and the gateway reads it from the API.
        *([env(Env.POOL_UID, uid)] if uid else []),
        env(Env.CONFIG, CONFIG_PATH),
        token_env(name),
    ]
    container: dict[str, Any] = {
        "name": "gateway",
        "image": spec.image,
        "command": ["python", "-m", "crl_worker.pool"],
        # Namespace, pool name, uid and gateway id come from the env below (the gateway's
        # config reads POD_NAMESPACE, CRL_POOL_NAME, CRL_POOL_UID and POD_NAME).
        "args": [
            "--config",
            CONFIG_PATH,
            "--backend",
            "kubernetes",
            "--host",
            "0.0.0.0",
            "--port",
            str(GATEWAY_PORT),
            "--metrics-port",
            str(GATEWAY_METRICS_PORT),
            "--log-format",
            "json",
            *(["--tasks", tasks.path] if tasks.path else []),
        ],
        "env": container_env,
        "ports": [
            {"name": "http", "containerPort": GATEWAY_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": GATEWAY_METRICS_PORT, "protocol": "TCP"},
        ],
        "resources": resources(spec.resources, 0),
        "volumeMounts": [config_mount(), {"name": "tmp", "mountPath": "/tmp"}, *tasks.mounts],
        "readinessProbe": http_probe("/healthz", "metrics", period=5, failures=3),
        "livenessProbe": http_probe("/healthz", "metrics", period=15, failures=4, initial=10),
        "securityContext": {**RESTRICTED_CONTAINER, "readOnlyRootFilesystem": True},
    }
    validation = validation_mounts(pool)
    if validation is not None:
        container_env += validation[0]
        container["volumeMounts"].append(validation[1])
    rules = [
        *GATEWAY_RULES,
        # Its own RolloutPool, read only when CRL_POOL_UID is missing (the owner uid of the
        # sandbox pods).
        {
            "apiGroups": ["coderepair.io"],
            "resources": ["rolloutpools"],
            "resourceNames": [name],
            "verbs": ["get"],
        },
    ]
    if validation is not None:
        # The validation report: its own progress ConfigMap, by name, nothing else.
        rules.append(
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "resourceNames": [progress_name(pool)],
                "verbs": ["get", "patch"],
            }
        )
    return [
        *account_rbac(meta, gw, namespace, rules),
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta,
            "spec": {
                "replicas": spec.replicas,
                "selector": {"matchLabels": gateway_selector(pool)},
                "template": {
                    "metadata": {
                        "labels": labels(pool, COMPONENT_GATEWAY),
                        "annotations": {ANNOTATION_CONFIG_HASH: config_hash},
                    },
                    "spec": {
                        "serviceAccountName": gw,
                        "enableServiceLinks": False,
                        # The gateway needs no privileges: it talks to the API server only.
                        "securityContext": {
                            "runAsNonRoot": True,
                            "runAsUser": 1000,
                            "runAsGroup": 1000,
                            # A validation cache claim must be writable by the gateway's user.
                            **({"fsGroup": 1000} if validation is not None else {}),
                        },
                        "containers": [container],
                        "volumes": [
                            config_volume(config_map_name(pool)),
                            {"name": "tmp", "emptyDir": {}},
                            *tasks.volumes,
                            *([validation[2]] if validation is not None else []),
                        ],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta,
            "spec": {
                "type": "ClusterIP",
                "selector": gateway_selector(pool),
                "ports": [
                    {"name": "http", "port": GATEWAY_PORT, "targetPort": "http", "protocol": "TCP"},
                    {
                        "name": "metrics",
                        "port": GATEWAY_METRICS_PORT,
                        "targetPort": "metrics",
                        "protocol": "TCP",
                    },
                ],
            },
        },
    ]


def validation_mounts(
    pool: RolloutPool,
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]] | None:
    """What the gateway of a pool that validates its tasks (`spec.validation.enabled`) adds:
    its env (the progress ConfigMap it reports into, the cache folder), the cache's mount and
    its volume (`spec.validation.cache`'s claim, else an emptyDir that survives a container
    restart, not a new pod); None when the pool does not validate."""
    spec = pool.spec.validation
    if not spec.enabled:
        return None
    env_vars = [
        env(Env.PROGRESS_CONFIGMAP, progress_name(pool)),
        env(Env.CACHE_DIR, VALIDATION_CACHE_DIR),
    ]
    mount: dict[str, Any] = {"name": VALIDATION_CACHE_VOLUME, "mountPath": VALIDATION_CACHE_DIR}
    volume: dict[str, Any] = {"name": VALIDATION_CACHE_VOLUME, "emptyDir": {}}
    if spec.cache is not None:
        volume = {
            "name": VALIDATION_CACHE_VOLUME,
            "persistentVolumeClaim": {"claimName": spec.cache.claim_name},
        }
        if spec.cache.sub_path:
            mount["subPath"] = spec.cache.sub_path
    return env_vars, mount, volume

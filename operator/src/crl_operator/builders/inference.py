"""The vLLM server: a Deployment of `vllm serve` pods and the Service the agents call.

The same builder serves a TrainingRun's policy (weights pushed in by the trainer), a model a
Benchmark serves, and a TrainingRun checkpoint a Benchmark evaluates; :class:`ServedModel` says
which weights, under which name, with which weight-update mechanism.

Weight updates (the trainer's side is `crl_worker.train.weights`, docs/weight-sync.md):

- LoRA (`weightSync: lora-adapter`): `--enable-lora` plus `VLLM_ALLOW_RUNTIME_LORA_UPDATING`,
  so the trainer loads each new adapter with `POST /v1/load_lora_adapter`.
- Full weights (`weightSync: nccl`): vLLM's native weight-transfer API (vLLM >= 0.22,
  the first with `/start_weight_update` and `/finish_weight_update`):
  `--weight-transfer-config '{"backend": "nccl"}'` builds the receiving engine in every worker
  and `VLLM_SERVER_DEV_MODE=1` exposes the routes the trainer drives (`/pause`,
  `/init_weight_transfer_engine`, `/start_weight_update`, `/update_weights`,
  `/finish_weight_update`, `/resume`, `/get_world_size`). No worker extension and nothing but
  vLLM in the image. The trainer hosts the group's rendezvous (rank 0, a port of its own
  choosing) and the workers connect out to it, so the server pods open no extra port.

Either way the trainer must reach every replica, not whichever one the ClusterIP Service
picks: a headless peers Service lists every ready server pod by address.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from crl_operator.builders.meta import (
    COMPONENT_INFERENCE,
    COMPONENT_INFERENCE_PEERS,
    child_name,
    labels,
    object_meta,
    owner_name,
    selector,
)
from crl_operator.builders.pods import (
    http_probe,
    placement,
    priority,
    resources,
    scheduling_labels,
    shm_mount,
    shm_volume,
)
from crl_worker.api import AnyResource
from crl_worker.api.base import VolumeSource
from crl_worker.api.common import InferenceSpec, SchedulingSpec

#: `--weight-transfer-config` of a server that receives full weights over NCCL.
WEIGHT_TRANSFER_CONFIG = '{"backend": "nccl"}'
#: Adapter ranks vLLM accepts for `--max-lora-rank`.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
#: Where a model volume is mounted; the weights are read from `MODEL_DIR/<model name>`.
MODEL_DIR = "/models"
#: Where a checkpoint volume is mounted.
CHECKPOINT_DIR = "/checkpoints"
#: Probe period of the startup probe; its failure threshold follows from the startup timeout.
STARTUP_PERIOD = 10


@dataclass(frozen=True)
class ServedModel:
    """What one vLLM Deployment serves and how its weights are updated."""

    model: str
    """What `vllm serve` loads: a Hub id or a path inside a mounted volume."""
    served_name: str
    """The model name clients send (`--served-model-name`)."""
    dtype: str = "bfloat16"
    revision: str | None = None
    trust_remote_code: bool = False
    volumes: tuple[tuple[str, VolumeSource, str], ...] = ()
    """Read-only volumes: (volume name, claim, mount path)."""
    max_lora_rank: int | None = None
    """Serve LoRA adapters up to this rank (None: no LoRA)."""
    max_loras: int = 1
    """Adapters resident at once (a policy version and the ones still in flight)."""
    lora_modules: tuple[str, ...] = ()
    """Adapters loaded at start, as `name=path`."""
    runtime_lora_updates: bool = False
    """Let the trainer load adapters at runtime."""
    nccl_weight_sync: bool = False
    """Receive full weights from the trainer over NCCL."""
    training_rollouts: bool = False
    """Serve a trainer's rollouts: logprobs after temperature and logit processing, what the
    trainer's importance-sampling correction compares with its own."""
    extra_env: tuple[tuple[str, str], ...] = field(default=())


def lora_rank_bound(rank: int) -> int:
    """The smallest `--max-lora-rank` vLLM accepts that holds an adapter of `rank`."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"LoRA rank {rank} is above vLLM's largest ({VLLM_LORA_RANKS[-1]})")


def deployment_name(owner: AnyResource) -> str:
    """Name of the vLLM Deployment (and of its Service)."""
    return child_name(owner_name(owner), COMPONENT_INFERENCE)


def peers_service_name(owner: AnyResource) -> str:
    """Name of the headless Service listing the server pods the trainer pushes weights to."""
    return child_name(owner_name(owner), COMPONENT_INFERENCE_PEERS)


def base_url(owner: AnyResource, spec: InferenceSpec) -> str:
    """The OpenAI-compatible base URL of the server, inside the namespace."""
    return f"http://{deployment_name(owner)}:{spec.port}/v1"


def vllm_args(served: ServedModel, spec: InferenceSpec) -> list[str]:
    """Arguments of `vllm serve`, the spec's `extraArgs` last so they win."""
    args = [
        served.model,
        "--host",
        "0.0.0.0",
        "--port",
        str(spec.port),
        "--served-model-name",
        served.served_name,
        "--dtype",
        served.dtype,
        "--tensor-parallel-size",
        str(spec.tensor_parallel_size),
        "--max-model-len",
        str(spec.max_model_len),
        "--gpu-memory-utilization",
        str(spec.gpu_memory_utilization),
        # The agent sends `tool_choice: auto`; without these vLLM answers every request 400.
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        spec.tool_call_parser,
    ]
    data_parallel = spec.gpus // spec.tensor_parallel_size
    if data_parallel > 1:
        args += ["--data-parallel-size", str(data_parallel)]
    if served.revision:
        args += ["--revision", served.revision]
    if served.trust_remote_code:
        args.append("--trust-remote-code")
    if served.max_lora_rank is not None:
        args += [
            "--enable-lora",
            "--max-lora-rank",
            str(served.max_lora_rank),
            "--max-loras",
            str(served.max_loras),
        ]
        if served.lora_modules:
            args += ["--lora-modules", *served.lora_modules]
    if served.nccl_weight_sync:
        args += ["--weight-transfer-config", WEIGHT_TRANSFER_CONFIG]
    if served.training_rollouts:
        args += ["--logprobs-mode", "processed_logprobs"]
    return args + list(spec.extra_args or [])


def _container(served: ServedModel, spec: InferenceSpec) -> dict[str, Any]:
    env: list[dict[str, Any]] = []
    if served.volumes:
        # Weights come from a volume: never reach out to the Hub for them.
        env.append({"name": "HF_HUB_OFFLINE", "value": "1"})
    if served.runtime_lora_updates:
        env.append({"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "True"})
    if served.nccl_weight_sync:
        env.append({"name": "VLLM_SERVER_DEV_MODE", "value": "1"})
    env += [{"name": k, "value": v} for k, v in served.extra_env]
    ports: list[dict[str, Any]] = [{"name": "http", "containerPort": spec.port, "protocol": "TCP"}]
    mounts = [shm_mount()] + [
        {"name": name, "mountPath": path, "readOnly": True, **_sub_path(source)}
        for name, source, path in served.volumes
    ]
    # Large models take long to load: the startup probe holds liveness off for the whole
    # startup budget, after which a server that never came up is restarted.
    startup_failures = -(-spec.startup_timeout_seconds // STARTUP_PERIOD)
    container: dict[str, Any] = {
        "name": "vllm",
        "image": spec.image,
        "command": ["vllm", "serve"],
        "args": vllm_args(served, spec),
        "ports": ports,
        "resources": resources(spec.resources, spec.gpus),
        "volumeMounts": mounts,
        "startupProbe": http_probe(
            "/health", "http", period=STARTUP_PERIOD, failures=startup_failures
        ),
        "readinessProbe": http_probe("/health", "http", period=5, failures=3),
        "livenessProbe": http_probe("/health", "http", period=15, failures=4, timeout=10),
    }
    if env:
        container["env"] = env
    return container


def _sub_path(source: VolumeSource) -> dict[str, str]:
    return {"subPath": source.sub_path} if source.sub_path else {}


def shm_size_gi(spec: InferenceSpec) -> int:
    """`/dev/shm` of a server pod: 4 GiB per GPU (tensor-parallel workers exchange through it)."""
    return max(2, 4 * spec.gpus)


def inference_objects(
    owner: AnyResource,
    namespace: str,
    served: ServedModel,
    spec: InferenceSpec,
    *,
    replicas: int,
    scheduling: SchedulingSpec | None,
) -> list[dict[str, Any]]:
    """The vLLM Deployment, its Service, and the peers Service when the trainer pushes weights."""
    name = deployment_name(owner)
    kueue = scheduling_labels(scheduling)
    match = selector(owner, COMPONENT_INFERENCE)
    volumes: list[dict[str, Any]] = [shm_volume(shm_size_gi(spec))]
    volumes += [
        {"name": vname, "persistentVolumeClaim": {"claimName": source.claim_name, "readOnly": True}}
        for vname, source, _ in served.volumes
    ]
    pod_spec: dict[str, Any] = {
        # Service links would put e.g. VLLM_PORT=tcp://... into the env, which vLLM misreads.
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 60,
        **priority(scheduling),
        **placement(spec.placement),
        "containers": [_container(served, spec)],
        "volumes": volumes,
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(owner, name, COMPONENT_INFERENCE, namespace, kueue),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": match},
            # No spare GPUs to surge into: replace servers one at a time.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
            },
            "template": {
                "metadata": {"labels": {**labels(owner, COMPONENT_INFERENCE), **kueue}},
                "spec": pod_spec,
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(owner, name, COMPONENT_INFERENCE, namespace),
        "spec": {
            "type": "ClusterIP",
            "selector": match,
            "ports": [{"name": "http", "port": spec.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }
    out = [deployment, service]
    if served.nccl_weight_sync or served.runtime_lora_updates:
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": object_meta(
                    owner, peers_service_name(owner), COMPONENT_INFERENCE_PEERS, namespace
                ),
                "spec": {
                    "clusterIP": "None",
                    "selector": match,
                    "ports": [{"name": "http", "port": spec.port, "targetPort": "http"}],
                },
            }
        )
    return out

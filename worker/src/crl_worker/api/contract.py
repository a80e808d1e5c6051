"""The operator-worker contract: every name both sides of a pod's boundary use, written once.

The operator (crl_operator.builders) starts the workers (the benchmark runner, the trainer, the
pool gateway) with environment variables, labels their pods, mounts ConfigMaps under known keys
and reads back what they publish (progress reports, sandbox pod labels). Each of those names is
defined here and nowhere else: both sides import it, so a rename is one edit and a drift is a
test failure (tests/test_contract.py renders every builder and checks each variable it sets
against the entry point it starts, and each state the gateway writes against what the status
code counts).

The environment variables are :class:`Env` members (``str`` values, so they work wherever a
name does: ``os.environ.get(Env.CONFIG)``); :data:`ENVIRONMENT` says who sets and who reads each.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from crl_worker.api.base import GROUP

# --- environment variables ------------------------------------------------------------------


class Env(StrEnum):
    """Environment variables the workers read (see :data:`ENVIRONMENT` for who sets each)."""

    CONFIG = "CRL_CONFIG"
    """The worker's config file (the resource as the operator wrote it into its ConfigMap)."""
    RUN_NAME = "CRL_RUN_NAME"
    """The TrainingRun's name (the trainer's run name; the config file's name otherwise)."""
    BENCHMARK_NAME = "CRL_BENCHMARK_NAME"
    """The Benchmark's name (the runner's benchmark name; the config file's name otherwise)."""
    MODEL_URL = "CRL_MODEL_URL"
    """The OpenAI-compatible endpoint the benchmark runner's agent talks to."""
    MODEL_NAME = "CRL_MODEL_NAME"
    """The model name the benchmark runner asks that endpoint for."""
    API_KEY = "CRL_API_KEY"
    """The endpoint's API key (from a Secret); ``OPENAI_API_KEY`` is read when this is unset."""
    OPENAI_API_KEY = "OPENAI_API_KEY"
    """The API key's conventional name, read when ``CRL_API_KEY`` is unset (user-set)."""
    POOL_URL = "CRL_POOL_URL"
    """The pool gateway to lease sandboxes from; local sandboxes when unset."""
    POOL_TOKEN = "CRL_POOL_TOKEN"
    """The pool gateway's bearer token (from the pool's token Secret): the gateway admits only
    requests that carry it, its clients send it. A local gateway makes one when unset."""
    RESULTS_DIR = "CRL_RESULTS_DIR"
    """The benchmark runner's results folder (on the results volume in a cluster)."""
    BASELINE_RESULTS = "CRL_BASELINE_RESULTS"
    """The baseline run's results folder the runner compares with."""
    PROGRESS_CONFIGMAP = "CRL_PROGRESS_CONFIGMAP"
    """The ConfigMap a worker merge-patches its progress report into (key :data:`PROGRESS_KEY`)."""
    POD_NAMESPACE = "POD_NAMESPACE"
    """The pod's namespace (downward API); the service account's namespace file otherwise."""
    POD_NAME = "POD_NAME"
    """The pod's name (downward API): the gateway's id on the sandbox pods it creates."""
    INFERENCE_URL = "CRL_INFERENCE_URL"
    """The trainer's inference server (OpenAI ``/v1`` root) for rollouts and weight sync."""
    INFERENCE_MODEL = "CRL_INFERENCE_MODEL"
    """The model name the inference server serves."""
    INFERENCE_PEERS = "CRL_INFERENCE_PEERS"
    """The headless Service naming every inference replica (each gets every weight update)."""
    WEIGHT_SYNC = "CRL_WEIGHT_SYNC"
    """The weight-sync mode the operator derived from the spec (``none``, ``lora-adapter``,
    ``nccl``)."""
    MODEL_PATH = "CRL_MODEL_PATH"
    """Where the model's weights are mounted (a model volume); the hub name otherwise."""
    CHECKPOINT_DIR = "CRL_CHECKPOINT_DIR"
    """The trainer's run folder: checkpoints, trajectories, adapters."""
    METRICS_PORT = "CRL_METRICS_PORT"
    """The port the trainer serves its Prometheus metrics on."""
    POOL_NAME = "CRL_POOL_NAME"
    """The RolloutPool's name (the gateway labels its sandbox pods with it)."""
    POOL_UID = "CRL_POOL_UID"
    """The RolloutPool's uid (the gateway makes it the owner of its sandbox pods)."""
    CACHE_DIR = "CRL_CACHE_DIR"
    """The cache folder for repositories and task sources (user-set; ``~/.cache/coderepairrl``)."""
    GIT_MIRROR = "CRL_GIT_MIRROR"
    """A folder or URL prefix holding bare repositories to clone instead of GitHub (user-set)."""
    GRADING_CONFIRM = "CRL_GRADING_CONFIRM"
    """``0`` (or ``false``, ``off``) turns off the integrity check that grades every resolved
    episode again in a fresh sandbox (docs/security.md, "Grading integrity"); on by default."""
    PUSH_DEADLINE = "CRL_PUSH_DEADLINE_SECONDS"
    """Seconds a weight push may take before the trainer's watchdog counts it as hung (600)."""
    MAX_LOGPROB_GAP = "CRL_MAX_LOGPROB_GAP"
    """The largest mean |trainer - server| logprob gap per step the watchdog accepts (0.1)."""
    WEIGHT_TRANSPORT = "CRL_WEIGHT_TRANSPORT"
    """How full weights travel: ``vllm`` (vLLM's PyNccl group, for its ``nccl`` backend; the
    default) or ``gloo`` (torch.distributed gloo, for the ``crl_gloo`` backend of the project's
    vLLM plugin on a CPU-only server: docs/weight-sync.md)."""
    WEIGHT_CHECK_EVERY = "CRL_WEIGHT_CHECK_EVERY"
    """Check the served weights (vLLM's ``/weight_checker``) on the first full-weight push and
    every that many after it (1: every push); 0, the default, turns the check off."""
    PROGRESS_INTERVAL = "CRL_PROGRESS_INTERVAL_SECONDS"
    """Seconds between two rollout progress events of the trainer (15)."""


Component = Literal["benchmark-runner", "trainer", "pool-gateway"]
"""A worker the operator starts (each is one entry point, see :data:`ENTRY_POINTS`)."""

#: The module each worker's container runs.
ENTRY_POINTS: dict[Component, str] = {
    "benchmark-runner": "crl_worker.bench",
    "trainer": "crl_worker.train",
    "pool-gateway": "crl_worker.pool",
}


@dataclass(frozen=True)
class EnvVar:
    """Who sets an environment variable and who reads it."""

    set_for: frozenset[Component]
    """The workers whose containers the operator gives this variable."""
    user_set: bool = False
    """A user may set it (in ``spec.*.env`` or on one machine), or it is optional; no builder
    needs to set it for every worker that reads it."""


#: Every :class:`Env` member: which workers the operator sets it for, and whether users set it.
ENVIRONMENT: dict[Env, EnvVar] = {
    Env.CONFIG: EnvVar(frozenset({"benchmark-runner", "trainer", "pool-gateway"})),
    Env.RUN_NAME: EnvVar(frozenset({"trainer"})),
    Env.BENCHMARK_NAME: EnvVar(frozenset({"benchmark-runner"})),
    Env.MODEL_URL: EnvVar(frozenset({"benchmark-runner"}), user_set=True),
    Env.MODEL_NAME: EnvVar(frozenset({"benchmark-runner"}), user_set=True),
    Env.API_KEY: EnvVar(frozenset({"benchmark-runner"}), user_set=True),
    Env.OPENAI_API_KEY: EnvVar(frozenset(), user_set=True),
    Env.POOL_URL: EnvVar(frozenset({"benchmark-runner", "trainer"}), user_set=True),
    Env.POOL_TOKEN: EnvVar(
        frozenset({"benchmark-runner", "trainer", "pool-gateway"}), user_set=True
    ),
    Env.RESULTS_DIR: EnvVar(frozenset({"benchmark-runner"})),
    Env.BASELINE_RESULTS: EnvVar(frozenset({"benchmark-runner"})),
    Env.PROGRESS_CONFIGMAP: EnvVar(frozenset({"benchmark-runner", "trainer", "pool-gateway"})),
    Env.POD_NAMESPACE: EnvVar(frozenset({"benchmark-runner", "trainer", "pool-gateway"})),
    # Any worker that makes Kubernetes sandboxes reads it; the host name (a pod's name) otherwise.
    Env.POD_NAME: EnvVar(frozenset({"pool-gateway"}), user_set=True),
    Env.INFERENCE_URL: EnvVar(frozenset({"trainer"}), user_set=True),
    Env.INFERENCE_MODEL: EnvVar(frozenset({"trainer"}), user_set=True),
    Env.INFERENCE_PEERS: EnvVar(frozenset({"trainer"})),
    Env.WEIGHT_SYNC: EnvVar(frozenset({"trainer"})),
    Env.MODEL_PATH: EnvVar(frozenset({"trainer"}), user_set=True),
    Env.CHECKPOINT_DIR: EnvVar(frozenset({"trainer"}), user_set=True),
    Env.METRICS_PORT: EnvVar(frozenset({"trainer"}), user_set=True),
    Env.POOL_NAME: EnvVar(frozenset({"pool-gateway"})),
    Env.POOL_UID: EnvVar(frozenset({"pool-gateway"})),
    # The pool gateway's validation cache (spec.validation); optional everywhere else.
    Env.CACHE_DIR: EnvVar(frozenset({"pool-gateway"}), user_set=True),
    Env.GIT_MIRROR: EnvVar(frozenset(), user_set=True),
    Env.GRADING_CONFIRM: EnvVar(frozenset(), user_set=True),
    Env.PUSH_DEADLINE: EnvVar(frozenset(), user_set=True),
    Env.MAX_LOGPROB_GAP: EnvVar(frozenset(), user_set=True),
    Env.WEIGHT_CHECK_EVERY: EnvVar(frozenset(), user_set=True),
    Env.WEIGHT_TRANSPORT: EnvVar(frozenset(), user_set=True),
    Env.PROGRESS_INTERVAL: EnvVar(frozenset(), user_set=True),
}

#: The API key variables, in the order they are tried.
API_KEY_ENVS: tuple[Env, ...] = (Env.API_KEY, Env.OPENAI_API_KEY)

#: Variables the builders set for other programs than ours (accelerate and torchrun, the
#: Hugging Face libraries, Weights & Biases, CUDA): not part of the contract, listed so the
#: contract test can tell them from a misspelt name of ours.
THIRD_PARTY_ENV = frozenset(
    {
        "MASTER_ADDR",
        "MASTER_PORT",
        "NNODES",
        "NODE_RANK",
        "NPROC_PER_NODE",
        "GPUS_PER_NODE",
        "WORLD_SIZE",
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
        "HF_HUB_OFFLINE",
        "CUDA_VISIBLE_DEVICES",
        "WANDB_PROJECT",
        "WANDB_ENTITY",
        "WANDB_API_KEY",
        "PYTHONUNBUFFERED",
        "HOME",
    }
)

# --- labels and annotations -----------------------------------------------------------------

_PREFIX = f"{GROUP}/"


class Label(StrEnum):
    """Label keys the operator and the workers put on pods and children."""

    POOL = f"{_PREFIX}pool"
    """The RolloutPool a sandbox pod (and the pool's children) belong to."""
    INSTANCE = f"{_PREFIX}instance"
    """A sandbox's repository instance (label-safe form)."""
    STATE = f"{_PREFIX}state"
    """The gateway's view of a sandbox pod: a :class:`SandboxState` value."""
    GATEWAY = f"{_PREFIX}gateway"
    """The gateway that created a sandbox pod."""
    ROLE = f"{_PREFIX}role"
    """What a pod is for (``sandbox``, ``gateway``, ...); NetworkPolicies select on it."""
    STEP = f"{_PREFIX}step"
    """The training step an evaluation Benchmark belongs to."""
    POOL_CLIENT = f"{_PREFIX}pool-client"
    """On the pods that lease from a pool (trainer, benchmark runner): the pool's name. The
    gateway's NetworkPolicy admits API traffic only from pods carrying it."""


def owner_label(kind: str) -> str:
    """The label naming a child's owning resource of ``kind`` (``coderepair.io/trainingrun``)."""
    return f"{_PREFIX}{kind.lower()}"


class Annotation(StrEnum):
    """Annotation keys the operator and the workers write."""

    INSTANCE_ID = f"{_PREFIX}instance-id"
    """A sandbox pod's full instance id (labels cannot hold every id)."""
    CONFIG_HASH = f"{_PREFIX}config-hash"
    """The hash of the config a pod template was rendered with (a change rolls the pods)."""
    APPLIED = f"{_PREFIX}applied"
    """The operator's record of what it last applied to a child."""


#: The label on the containers the Docker sandbox backend starts (one machine, no operator).
DOCKER_SANDBOX_LABEL = f"{_PREFIX}sandbox"
#: The role label's value on sandbox pods.
ROLE_SANDBOX = "sandbox"


class SandboxState(StrEnum):
    """What the gateway labels a sandbox pod with (:attr:`Label.STATE`); the RolloutPool's status
    counts each: ``ready`` (once the pod is Ready), ``leased`` and ``starting``."""

    STARTING = "starting"
    """Being created or reset: not leasable yet."""
    READY = "ready"
    """Warm and leasable."""
    LEASED = "leased"
    """Leased to a rollout."""


# --- ConfigMap keys, ports, field managers --------------------------------------------------

#: The key of a worker's progress ConfigMap the worker writes and the operator reads.
PROGRESS_KEY = "progress.json"
#: The port the pool gateway listens on (the operator's Service targets it).
GATEWAY_PORT = 8080
#: The port the pool gateway serves ``/metrics`` and ``/healthz`` on in a cluster (no token;
#: the NetworkPolicy admits it from anywhere, the API port only from the pool's clients).
GATEWAY_METRICS_PORT = 9090
#: The key of a pool's token Secret that holds the gateway's bearer token.
POOL_TOKEN_KEY = "token"
#: The port the trainer serves Prometheus metrics on (:attr:`Env.METRICS_PORT`'s value).
TRAINER_METRICS_PORT = 9400
#: The exit status with which a worker says its config cannot work, so retrying will not help
#: (the trainer Job's pod failure policy fails the Job on it instead of retrying).
CONFIG_ERROR_EXIT_CODE = 2
#: Server-side-apply field managers: each writer owns its own fields.
OPERATOR_FIELD_MANAGER = "coderepairrl-operator"
"""The operator's field manager on every child (it never sends a progress report's data)."""
RUNNER_FIELD_MANAGER = "crl-bench-runner"
"""The benchmark runner's field manager on its progress ConfigMap."""
TRAINER_FIELD_MANAGER = "crl-trainer"
"""The trainer's field manager on its progress ConfigMap."""
POOL_FIELD_MANAGER = "crl-pool-gateway"
"""The pool gateway's field manager on its progress ConfigMap (task validation)."""

"""Spec pieces that more than one custom resource uses: defined once, reused everywhere."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, StringConstraints

from crl_worker.api.base import (
    ApiModel,
    EnvVar,
    Image,
    LabelName,
    LocalObjectReference,
    ObjectName,
    Path,
    Placement,
    ResourceRequirements,
    SecretKeyRef,
    Short,
    VolumeSource,
    cel,
    quantity_value,
    with_rules,
)

#: Where this project's images live by default (images/build.sh --registry): the operator's
#: ``--image-registry`` (the chart's ``image.registry``) replaces it in every child it runs.
IMAGE_REGISTRY = "ghcr.io/coderepairrl"
#: The version the images are tagged with (pyproject.toml's; a test keeps them equal).
IMAGE_VERSION = "0.1.0"
#: The worker image (pool gateway, benchmark runner) unless a spec says otherwise.
DEFAULT_WORKER_IMAGE = f"{IMAGE_REGISTRY}/worker:{IMAGE_VERSION}"
#: The trainer image (the ``train`` extra and DeepSpeed on a CUDA base) unless a spec says otherwise.
DEFAULT_TRAINER_IMAGE = f"{IMAGE_REGISTRY}/trainer:{IMAGE_VERSION}-cuda"
#: The vLLM OpenAI-compatible server image: the vLLM release the tests run against
#: (requirements/vllm.in, tests/test_vllm_real.py).
DEFAULT_VLLM_IMAGE = "vllm/vllm-openai:v0.32.0"
#: vLLM's tool-call parser for models that write Hermes-style ``<tool_call>{...}</tool_call>``
#: (Qwen 2.5 and 3, Hermes, the toy model).
DEFAULT_TOOL_CALL_PARSER = "hermes"

TaskFormat = Literal[
    "swe-bench",
    "swe-gym",
    "swe-smith",
    "r2e-gym",
    "swe-rebench",
    "multi-swe-bench",
    "defects4j",
    "gitbug-java",
    "bugsinpy",
    "quixbugs",
    "polyglot",
    "bigvul",
    "cvefixes",
    "primevul",
    "task",
]

TaskType = Literal["repair", "implement", "classify"]
"""What a task asks of the agent (docs/task-types.md)."""

# --- tasks ----------------------------------------------------------------------------------


class HuggingFaceDataset(ApiModel):
    """A dataset on the Hugging Face Hub (or a mirror the worker can reach)."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    """Dataset id, e.g. `princeton-nlp/SWE-bench_Verified` or `SWE-Gym/SWE-Gym`."""
    split: Short = "test"
    """Split to read, e.g. `test` or `train`."""
    config: Short | None = None
    """Dataset configuration name, when the dataset has several."""
    revision: Short | None = None
    """Git revision of the dataset (a commit pins the task set); the default branch when empty."""


class ConfigMapFile(ApiModel):
    """A task file stored in a ConfigMap (small suites only: ConfigMaps hold at most 1 MiB)."""

    name: ObjectName
    """Name of the ConfigMap in the resource's namespace."""
    key: Annotated[str, StringConstraints(min_length=1, max_length=253)] = "tasks.jsonl"
    """Key holding the task file (JSON, JSONL)."""


class VolumeFile(VolumeSource):
    """A task file on a PersistentVolumeClaim."""

    path: Path
    """Path of the task file (JSON, JSONL or Parquet) inside the volume."""


class TaskFilter(ApiModel):
    """Which instances of the source to use."""

    instance_ids: list[Short] | None = Field(default=None, max_length=10000)
    """Only these instance ids (all when empty)."""
    exclude_instance_ids: list[Short] | None = Field(default=None, max_length=10000)
    """Never these instance ids."""
    repos: list[Short] | None = Field(default=None, max_length=1000)
    """Only instances of these repositories, as `owner/name`."""
    limit: int | None = Field(default=None, ge=1)
    """At most this many instances, after the other filters."""
    shuffle_seed: int | None = Field(default=None, ge=0)
    """Shuffle the instances with this seed before `limit` applies; source order when empty."""


class TaskSource(ApiModel):
    """Where the task instances come from and how to read them. Exactly one source is set."""

    model_config = ConfigDict(
        json_schema_extra=with_rules(
            cel(
                "[has(self.huggingFace), has(self.configMap), has(self.volume),"
                " has(self.url), has(self.path)].filter(x, x).size() == 1",
                "exactly one task source must be set: huggingFace, configMap, volume, url or path",
            ),
        )
    )

    format: TaskFormat = "swe-bench"
    """How records are shaped: `swe-bench` (also SWE-bench Verified and Lite), `swe-gym`,
    `swe-smith`, `r2e-gym`, `swe-rebench`, `multi-swe-bench` (Java), `defects4j`, `gitbug-java`, `bugsinpy`, `quixbugs`,
    `polyglot` (Aider-polyglot style exercises), the vulnerability datasets `bigvul`,
    `cvefixes` and `primevul` (classify tasks), or `task` (records already in the worker's
    task schema, with the harness settings spelled out)."""
    hugging_face: HuggingFaceDataset | None = None
    """Read the tasks from a Hugging Face dataset."""
    config_map: ConfigMapFile | None = None
    """Read the tasks from a key of a ConfigMap."""
    volume: VolumeFile | None = None
    """Read the tasks from a file on a PersistentVolumeClaim."""
    url: Annotated[str, StringConstraints(max_length=2048, pattern=r"^https?://")] | None = None
    """Download the task file (JSON, JSONL or Parquet) from this HTTP(S) URL."""
    path: Path | None = None
    """A path in the worker's file system; on one machine, relative to the manifest's folder."""
    filter: TaskFilter | None = None
    """Which instances to use (ids, repositories, a limit)."""
    task_type: TaskType = "repair"
    """What the source's tasks ask of the agent: `repair` (fix a bug; tests decide),
    `implement` (write a function whose body was removed; tests decide) or `classify` (name the
    CWE of a weakness; the label decides). Every task of the source must be of this type; a
    record of another type is an error (docs/task-types.md)."""
    image_template: Image | None = None
    """Sandbox image per instance, with placeholders `{instance_id}`, `{repo}`, `{owner}`,
    `{name}`, `{version}`; the format's usual images when empty (for SWE-bench:
    `docker.io/swebench/sweb.eval.x86_64.<id>:latest`, where `<id>` is the instance id in lower
    case with `__` written `_1776_`)."""


# --- sandboxes and pools --------------------------------------------------------------------


#: Requests of a sandbox container for the resources the pool's spec leaves unset.
SANDBOX_DEFAULT_REQUESTS: dict[str, str] = {
    "cpu": "500m",
    "memory": "1Gi",
    "ephemeral-storage": "2Gi",
}
#: Limits of a sandbox container for the resources the pool's spec leaves unset: a fork bomb,
#: `yes > file` or a leak in the agent's commands stops at these (cgroup, eviction).
SANDBOX_DEFAULT_LIMITS: dict[str, str] = {
    "cpu": "4",
    "memory": "8Gi",
    "ephemeral-storage": "20Gi",
}


class SandboxSpec(ApiModel):
    """How each sandbox (one container per repository instance) is started."""

    image_template: Image | None = None
    """Overrides the task source's image template for these sandboxes."""
    workdir: Path = "/testbed"
    """Directory holding the repository inside the sandbox image."""
    shell: Path = "/bin/bash"
    """Shell that runs the persistent session."""
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    """CPU, memory and ephemeral storage of each sandbox container. A resource set here neither
    as a request nor as a limit gets the defaults: requests `cpu: 500m`, `memory: 1Gi`,
    `ephemeral-storage: 2Gi`; limits `cpu: "4"`, `memory: 8Gi`, `ephemeral-storage: 20Gi`. One
    with only a request gets the default limit (or its request, when larger); one with only a
    limit is left as given (Kubernetes then requests the limit)."""
    runtime_class_name: ObjectName | None = None
    """RuntimeClass the sandbox pods run with, for isolation stronger than a container: e.g.
    `gvisor` (runsc) or `kata`, where the cluster has that RuntimeClass; empty: the node's
    default runtime."""
    egress: Literal["deny", "dns", "allow"] = "deny"
    """Network egress of sandboxes: `deny` (default; NetworkPolicy denies all egress), `dns`
    (only DNS), `allow` (no egress policy)."""
    startup_timeout_seconds: int = Field(default=600, ge=10, le=86400)
    """How long a sandbox may take to become ready (image pull included) before it is recreated."""
    env: list[EnvVar] | None = Field(default=None, max_length=128)
    """Extra environment variables in every sandbox."""
    placement: Placement | None = None
    """Node selector and tolerations of the sandbox pods."""

    def container_resources(self) -> dict[str, Any]:
        """The sandbox container's ``resources``: :attr:`resources` with the defaults
        (:data:`SANDBOX_DEFAULT_REQUESTS`, :data:`SANDBOX_DEFAULT_LIMITS`) for what it leaves
        unset, as the field's documentation says."""
        requests: dict[str, int | str] = dict(self.resources.requests or {})
        limits: dict[str, int | str] = dict(self.resources.limits or {})
        for name, default_limit in SANDBOX_DEFAULT_LIMITS.items():
            if name in limits:
                continue
            if name not in requests:
                requests[name] = SANDBOX_DEFAULT_REQUESTS[name]
                limits[name] = default_limit
            elif quantity_value(requests[name]) > quantity_value(default_limit):
                limits[name] = requests[name]
            else:
                limits[name] = default_limit
        return {"requests": requests, "limits": limits}


class ReuseSpec(ApiModel):
    """Whether and how sandboxes are reused between rollouts of the same instance."""

    enabled: bool = True
    """Reset a sandbox to its base state after a rollout and lease it again (faster than a new pod)."""
    max_uses: int = Field(default=16, ge=1, le=10000)
    """Recreate a sandbox after this many rollouts, even when resets succeed."""


class GatewaySpec(ApiModel):
    """The pool gateway: leases sandboxes to rollout workers over HTTP."""

    image: Image = DEFAULT_WORKER_IMAGE
    """Worker image that runs the gateway."""
    replicas: int = Field(default=1, ge=1, le=16)
    """Gateway replicas."""
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    """CPU and memory of the gateway container."""


class ValidationSpec(ApiModel):
    """Validating the pool's tasks before it serves them (docs/tasks.md#validation-in-a-pool).

    The gateway checks each task on the pool's own sandboxes (at most `maxSandboxes` at a
    time): its gold patch must resolve, no patch must not, and `runs` runs of each must agree
    (no flaky test); with `integrity`, the gold patch must also resolve through the integrity
    check that confirms an episode's resolved verdict. Tasks that fail are quarantined with their reason and never leased; the
    status counts them. Only the task set's gold patches are graded, never a policy's answer.
    """

    enabled: bool = False
    """Validate before serving. Off by default (a TrainingRun's or Benchmark's inline pool
    included): it costs `2 x runs` test runs per task on the first start."""
    runs: int = Field(default=1, ge=1, le=10)
    """Runs of the gold patch and of no patch per task; more than one finds flaky tests."""
    timeout_seconds: int | None = Field(default=None, ge=10, le=86400)
    """Seconds one test run may take; the task's own timeout when empty."""
    integrity: bool = True
    """Also grade each gold patch (`runs` times) as an episode's resolved verdict is confirmed (a
    pristine sandbox, only its source changes, canary tests): a task whose gold patch does not
    pass there is quarantined, since a correct answer to it would be graded 0. `runs` more test
    runs per task."""
    cache: VolumeSource | None = None
    """Where verdicts are kept, by each task's content hash, with `quarantine.json` beside
    them: a restarted gateway or a second pool over the same tasks does not validate them
    again. Without it they are kept in the gateway pod's scratch space, which survives a
    container restart but not a new pod."""


class PoolSettings(ApiModel):
    """Pool settings without the task source: used inline in a TrainingRun or Benchmark."""

    model_config = ConfigDict(
        json_schema_extra=with_rules(
            cel(
                "self.replicas <= self.maxSandboxes",
                "replicas (warm sandboxes) cannot exceed maxSandboxes",
                field_path=".replicas",
            ),
        )
    )

    sandbox: SandboxSpec = Field(default_factory=SandboxSpec)
    """How each sandbox is started."""
    replicas: int = Field(default=4, ge=0, le=10000)
    """Sandboxes kept warm (ready before they are leased); `kubectl scale` sets this."""
    max_sandboxes: int = Field(default=64, ge=1, le=10000)
    """Upper bound on sandboxes of this pool, warm and leased together."""
    reuse: ReuseSpec = Field(default_factory=ReuseSpec)
    """Reset and reuse sandboxes between rollouts."""
    prefetch: int = Field(default=2, ge=0, le=1000)
    """Upcoming tasks whose sandboxes are started ahead of their lease."""
    gateway: GatewaySpec = Field(default_factory=GatewaySpec)
    """The gateway that serves leases."""
    validation: ValidationSpec = Field(default_factory=ValidationSpec)
    """Validate the tasks before serving them and quarantine the broken ones (off by
    default)."""


# --- the agent and its reward ---------------------------------------------------------------

AgentTool = Literal["shell", "view", "edit", "submit"]


def _all_tools() -> list[AgentTool]:
    return ["shell", "view", "edit", "submit"]


class AgentSpec(ApiModel):
    """The multi-turn agent that works in the sandbox."""

    tools: list[AgentTool] = Field(
        default_factory=_all_tools,
        min_length=1,
        max_length=4,
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    """Tools offered to the model: `shell` (run a command), `view` (read a file), `edit`
    (replace a unique string in a file), `submit` (end the episode). A classify task
    (docs/task-types.md) drops `edit` and `submit` and always gets `classify` (its answer)."""
    prompt_template: Short = "swe-default"
    """Name of the bundled prompt template set."""
    max_turns: int = Field(default=50, ge=1, le=1000)
    """Model calls per trajectory, checked before each call."""
    max_tokens_per_turn: int = Field(default=4096, ge=16, le=262144)
    """Completion tokens per model call."""
    max_total_tokens: int = Field(default=32768, ge=256, le=1048576)
    """Prompt plus completion tokens of the whole trajectory (the context budget)."""
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    """Sampling temperature (1.0 for on-policy RL rollouts)."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus sampling probability mass."""
    command_timeout_seconds: int = Field(default=120, ge=1, le=86400)
    """Wall time of one shell command before it is interrupted (the session survives)."""
    timeout_seconds: int = Field(default=1800, ge=10, le=172800)
    """Wall time of the whole trajectory, agent and evaluation together."""
    tries: int = Field(default=1, ge=1, le=2)
    """Benchmarks only (a TrainingRun refuses 2): with `2`, a first try graded unresolved is
    shown its failing tests' output and gets one more try in the same conversation, as Aider's
    polyglot "pass@2" (docs/benchmarks.md, "Second try"); each try gets `maxTurns` and
    `timeoutSeconds`."""


# --- the model and its serving --------------------------------------------------------------

DType = Literal["auto", "bfloat16", "float16", "float32"]


class ModelSpec(ApiModel):
    """The language model."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=512)]
    """Hugging Face model id (e.g. `Qwen/Qwen3-8B`) or a path inside `volume`."""
    revision: Short | None = None
    """Revision (branch, tag or commit) of a Hub model; the default branch when empty."""
    dtype: DType = "bfloat16"
    """Weight dtype for training and serving."""
    volume: VolumeSource | None = None
    """Volume holding the weights (pre-downloaded); the Hub when empty."""
    trust_remote_code: bool = False
    """Allow model code from the repository to run (needed by some architectures)."""


class InferenceSpec(ApiModel):
    """The vLLM server the agents talk to through the OpenAI API."""

    model_config = ConfigDict(
        json_schema_extra=with_rules(
            cel(
                "self.gpus % self.tensorParallelSize == 0",
                "gpus must be a multiple of tensorParallelSize"
                " (each engine uses tensorParallelSize GPUs)",
                field_path=".gpus",
            ),
        )
    )

    image: Image = DEFAULT_VLLM_IMAGE
    """vLLM server image."""
    replicas: int = Field(default=1, ge=0, le=256)
    """Server replicas (each a separate engine)."""
    tensor_parallel_size: int = Field(default=1, ge=1, le=64)
    """GPUs one engine shards the model over."""
    gpus: int = Field(default=1, ge=1, le=64)
    """GPUs per replica; a multiple of tensorParallelSize (data parallel inside a pod beyond it)."""
    max_model_len: int = Field(default=32768, ge=256, le=1048576)
    """Context length the server accepts."""
    gpu_memory_utilization: float = Field(default=0.9, ge=0.1, le=0.99)
    """Fraction of GPU memory vLLM may use."""
    port: int = Field(default=8000, ge=1, le=65535)
    """Port of the OpenAI-compatible API."""
    startup_timeout_seconds: int = Field(default=1800, ge=60, le=86400)
    """How long the server may take to load the model before the pod is restarted."""
    tool_call_parser: Annotated[
        str, StringConstraints(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9_-]*$")
    ] = DEFAULT_TOOL_CALL_PARSER
    """vLLM's `--tool-call-parser` for the model family: how tool calls are read out of the
    model's text. `hermes` (Qwen 2.5/3, Hermes), `qwen3_coder`, `llama3_json`, `mistral`,
    `deepseek_v3` and others (`vllm serve --help`). The agent calls tools with `tool_choice:
    auto`, which vLLM refuses (HTTP 400) unless the server has a parser."""
    extra_args: list[Annotated[str, StringConstraints(max_length=1024)]] | None = Field(
        default=None, max_length=64
    )
    """Extra command-line arguments for `vllm serve`."""
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    """CPU and memory of the server container (GPUs come from `gpus`)."""
    placement: Placement | None = None
    """Node selector and tolerations of the server pods."""


class EndpointSpec(ApiModel):
    """An external OpenAI-compatible endpoint (a hosted API or a server you run)."""

    url: Annotated[str, StringConstraints(min_length=1, max_length=2048, pattern=r"^https?://")]
    """Base URL of the API, e.g. `https://api.example.com/v1`."""
    model_name: Annotated[str, StringConstraints(min_length=1, max_length=512)]
    """Model name to send in requests."""
    api_key_secret_ref: SecretKeyRef | None = None
    """Secret holding the API key; no key is sent when empty."""


# --- training pieces ------------------------------------------------------------------------


class DeepSpeedSpec(ApiModel):
    """DeepSpeed ZeRO settings; the worker writes the DeepSpeed config from these."""

    model_config = ConfigDict(
        json_schema_extra=with_rules(
            cel(
                "self.offloadParameters == 'none' || self.zeroStage == 3",
                "offloadParameters needs zeroStage 3 (only ZeRO-3 partitions parameters)",
                field_path=".offloadParameters",
            ),
            cel(
                "self.offloadOptimizer == 'none' || self.zeroStage >= 1",
                "offloadOptimizer needs zeroStage 1, 2 or 3",
                field_path=".offloadOptimizer",
            ),
        )
    )

    zero_stage: Literal[0, 1, 2, 3] = 3
    """ZeRO stage: 0 (off), 1 (optimizer states), 2 (+ gradients), 3 (+ parameters)."""
    offload_optimizer: Literal["none", "cpu"] = "none"
    """Offload optimizer states to CPU memory."""
    offload_parameters: Literal["none", "cpu"] = "none"
    """Offload parameters to CPU memory (ZeRO-3 only)."""
    overrides: dict[str, Any] | None = Field(
        default=None,
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    """Free-form DeepSpeed config keys merged over the generated config (expert use)."""


class TrainerSpec(ApiModel):
    """The trainer pods: an indexed Job, one pod per node, with accelerate and DeepSpeed."""

    image: Image = DEFAULT_TRAINER_IMAGE
    """Trainer image: the worker with the training dependencies (torch, TRL, DeepSpeed)."""
    nodes: int = Field(default=1, ge=1, le=512)
    """Trainer pods (nodes); rendezvous through a headless Service."""
    gpus_per_node: int = Field(default=8, ge=0, le=16)
    """GPUs per trainer pod (0 trains on the CPU: tests and laptops)."""
    deepspeed: DeepSpeedSpec = Field(default_factory=DeepSpeedSpec)
    """DeepSpeed ZeRO settings."""
    gradient_checkpointing: bool = True
    """Recompute activations in the backward pass to save memory."""
    per_device_batch_size: int = Field(default=1, ge=1, le=1024)
    """Sequences per GPU per forward pass."""
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    """CPU and memory of each trainer pod (GPUs come from `gpusPerNode`)."""
    placement: Placement | None = None
    """Node selector and tolerations of the trainer pods."""
    env: list[EnvVar] | None = Field(default=None, max_length=128)
    """Extra environment variables (e.g. NCCL tuning)."""


class CheckpointSpec(ApiModel):
    """Where and how often the trainer saves checkpoints."""

    volume: VolumeSource | None = None
    """Volume the checkpoints go to; without one, checkpoints are lost with the pod."""
    every_steps: int = Field(default=50, ge=1, le=1000000)
    """Save after every N optimizer steps (and on SIGTERM when time allows)."""
    keep_last: int = Field(default=3, ge=1, le=1000)
    """Keep the last K checkpoints and delete older ones."""
    resume_from: Annotated[
        str, StringConstraints(max_length=64, pattern=r"^(latest|none|step-[0-9]+)$")
    ] = "latest"
    """`latest` (resume from the newest checkpoint when one exists), `none` or `step-N`."""


class SchedulingSpec(ApiModel):
    """How the workload is queued and prioritized on a shared cluster."""

    model_config = ConfigDict(
        json_schema_extra=with_rules(
            cel(
                "!has(self.sandboxesUseQuota) || !self.sandboxesUseQuota || has(self.queueName)",
                "sandboxesUseQuota counts the sandboxes against a queue's quota: set queueName"
                " too (or leave sandboxesUseQuota false)",
                field_path=".sandboxesUseQuota",
            ),
        )
    )

    queue_name: LabelName | None = None
    """Kueue LocalQueue; set as `kueue.x-k8s.io/queue-name` on the Jobs and Deployments."""
    priority_class_name: ObjectName | None = None
    """PriorityClass of the pods (preemption between pods)."""
    workload_priority_class_name: ObjectName | None = None
    """Kueue WorkloadPriorityClass (`kueue.x-k8s.io/priority-class` label): the order in which
    Kueue admits and preempts workloads in the queue."""
    max_run_seconds: int | None = Field(default=None, ge=60)
    """Stop the workload after this much wall time (`activeDeadlineSeconds` of its Jobs)."""
    sandboxes_use_quota: bool = False
    """Count the sandbox pods against `queueName`'s quota: the pool gateway labels each sandbox
    pod with the queue (and `workloadPriorityClassName`), and Kueue's plain-pod integration
    (the `pod` framework, which the cluster admin must enable for the namespace) admits each
    one as its own Workload, gated until the queue's CPU and memory quota has room. Needs
    `queueName`. Off by default: sandboxes are an elastic CPU pool whose size follows the
    rollout load, and counting them pod by pod lets Kueue hold back or preempt sandboxes one at
    a time under a running trainer, stalling its rollouts; `maxSandboxes` bounds them instead.
    On a TrainingRun or Benchmark it applies to its inline pool (not to a pool named by
    `poolRef`, which has its own `scheduling`); see docs/scheduling.md."""


class PoolReference(LocalObjectReference):
    """A RolloutPool in the same namespace."""


class ResultsLocation(ApiModel):
    """Where per-instance results and trajectories are written."""

    volume: VolumeSource | None = None
    """Volume for results; an emptyDir (lost with the pod) when empty."""
    path: Path = "results"
    """Directory under the volume (or under the working folder on one machine)."""


__all__ = [
    "DEFAULT_TOOL_CALL_PARSER",
    "DEFAULT_TRAINER_IMAGE",
    "DEFAULT_VLLM_IMAGE",
    "DEFAULT_WORKER_IMAGE",
    "IMAGE_REGISTRY",
    "IMAGE_VERSION",
    "AgentSpec",
    "CheckpointSpec",
    "DeepSpeedSpec",
    "EndpointSpec",
    "InferenceSpec",
    "ModelSpec",
    "PoolReference",
    "PoolSettings",
    "ResultsLocation",
    "SandboxSpec",
    "SchedulingSpec",
    "TaskSource",
    "TrainerSpec",
]

"""The TrainingRun custom resource: one RL post-training run."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Final, Literal

from pydantic import ConfigDict, Field, StringConstraints

from crl_worker.api.base import (
    ApiModel,
    ObjectName,
    Path,
    SecretKeyRef,
    Short,
    cel,
    with_rules,
)
from crl_worker.api.benchmark import BenchmarkTemplate
from crl_worker.api.common import (
    AgentSpec,
    CheckpointSpec,
    InferenceSpec,
    ModelSpec,
    PoolReference,
    PoolSettings,
    SchedulingSpec,
    TaskSource,
    TrainerSpec,
)
from crl_worker.api.reward import RewardSpec
from crl_worker.api.status import CommonStatus, QueueStatus, ValidationStatus


class RolloutSpec(ApiModel):
    """How rollouts are produced: the sandbox pool, the agent and the reward."""

    model_config = ConfigDict(
        json_schema_extra=with_rules(
            cel(
                "!(has(self.poolRef) && has(self.pool))",
                "set either rollout.poolRef (an existing RolloutPool) or rollout.pool (inline), not both",
            ),
            cel(
                "!has(self.agent) || !has(self.agent.tries) || self.agent.tries == 1",
                "rollout.agent.tries: a second try after the failing tests' output is for"
                " benchmarks (Aider's pass@2); a rollout has one try and one reward: leave it out",
                field_path=".agent.tries",
            ),
        )
    )

    pool_ref: PoolReference | None = None
    """Use an existing RolloutPool of the same namespace (its task source must match)."""
    pool: PoolSettings | None = None
    """An inline pool the run owns; used, with defaults, when neither pool nor poolRef is set."""
    agent: AgentSpec = Field(default_factory=AgentSpec)
    """The agent that produces each rollout."""
    reward: RewardSpec = Field(default_factory=RewardSpec)
    """How a finished rollout is scored."""


class LoraSpec(ApiModel):
    """Low-rank adapters (PEFT) instead of full fine-tuning."""

    rank: int = Field(default=16, ge=1, le=1024)
    """Adapter rank r."""
    alpha: int = Field(default=32, ge=1, le=4096)
    """Scaling alpha (the update is scaled by alpha / r)."""
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Dropout on the adapter input, during training only. 0 by default: the trainer computes
    the logprobs it compares with the server's (the importance-sampling correction) in training
    mode, so dropout there makes them differ from the policy that sampled, by 2e-3 on average
    on the toy model at 0.05, against 1e-7 at 0 (tests/test_vllm_real_lora.py)."""
    target_modules: list[Short] = Field(
        default_factory=lambda: ["all-linear"], min_length=1, max_length=64
    )
    """Modules that get adapters; `all-linear` targets every linear layer."""


class SftDataset(ApiModel):
    """Where a supervised run's training set comes from: exactly one of the three."""

    model_config = ConfigDict(
        json_schema_extra=with_rules(
            cel(
                "[has(self.path), has(self.huggingFace), has(self.benchmarkResults)]"
                ".filter(x, x).size() == 1",
                "set exactly one of path (an exported dataset), huggingFace (a dataset id) or"
                " benchmarkResults (a Benchmark's results folder)",
            ),
        )
    )

    path: Path | None = None
    """A dataset folder `crl trajectories export` wrote (its `data/*.parquet`), or a parquet
    file. On one machine relative to the manifest's folder; in a cluster relative to the
    checkpoint volume (`checkpoints.volume`), where the trainer reads it."""
    hugging_face: Short | None = None
    """A Hugging Face dataset id (`owner/name`) of the same columns (or of `messages` chats,
    which TRL tokenizes with the loss on the assistant's turns)."""
    benchmark_results: Path | None = None
    """A Benchmark's results folder (`crl bench --results`; a training run's folder works
    too): its resolved attempts are exported into the run folder (`sft-dataset/`) first, at
    most `perInstance` per instance. Where it is read from: as `path`."""
    split: Short = "train"
    """The split of a Hugging Face dataset."""
    per_instance: int | None = Field(default=None, ge=1, le=1024)
    """With `benchmarkResults`: at most this many trajectories per instance."""


class SftSpec(ApiModel):
    """Supervised fine-tuning (`algorithm.type: sft`): TRL's `SFTTrainer` on agent
    trajectories, the loss on the model's own tokens only."""

    dataset: SftDataset
    """The training set."""
    max_length: int | None = Field(default=None, ge=16, le=1048576)
    """Tokens per sequence at most (longer ones are cut at the end); the agent's
    `maxTotalTokens` when empty."""


#: GRPO's defaults that a supervised run must leave as they are (its CEL rules compare with them).
DEFAULT_LOSS_TYPE: Final = "dapo"
DEFAULT_NUM_GENERATIONS = 8
DEFAULT_TASKS_PER_STEP = 8
DEFAULT_EPSILON = 0.2
DEFAULT_SCALE_REWARDS: Final = "group"

#: How a rule refusing a field for supervised fine-tuning ends its message.
_SFT_WHY = "means nothing for algorithm.type 'sft', which trains on recorded trajectories and"


#: The reward a supervised run leaves as it is.
DEFAULT_REWARD = RewardSpec()


def _not_for_sft(
    condition: str, message: str, field_path: str, *, kind: str = "self.algorithm.type"
) -> dict[str, str]:
    """A CEL rule refusing a field (set, or changed from its default) with `algorithm.type:
    sft`: `condition` holds when the field is left as it is, `message` says why it means
    nothing there, `kind` is where the rule reads the algorithm's type."""
    return cel(f"{kind} != 'sft' || ({condition})", message, field_path=field_path)


class AlgorithmSpec(ApiModel):
    """The training algorithm (GRPO by default, or supervised fine-tuning) and its
    hyperparameters."""

    model_config = ConfigDict(
        json_schema_extra=with_rules(
            cel(
                "self.type == 'sft' || self.numGenerations >= 2",
                "must be at least 2: GRPO scores each rollout against the other rollouts"
                " of the same task",
                field_path=".numGenerations",
            ),
            cel(
                "self.type != 'sft' || has(self.sft)",
                "type 'sft' needs sft.dataset: the trajectories to train on",
                field_path=".sft",
            ),
            cel(
                "self.type == 'sft' || !has(self.sft)",
                "sft is only for type 'sft' (GRPO trains on its own rollouts)",
                field_path=".sft",
            ),
            cel(
                "self.type != 'sft' || self.beta == 0.0",
                "beta (the KL penalty of GRPO) means nothing for type 'sft'; leave it out",
                field_path=".beta",
            ),
            cel(
                "self.type != 'sft' || !has(self.epsilonHigh)",
                "epsilonHigh (GRPO's clipping) means nothing for type 'sft'; leave it out",
                field_path=".epsilonHigh",
            ),
            cel(
                "self.type != 'sft' || self.maxStaleness == 0",
                "maxStaleness (asynchronous rollouts) means nothing for type 'sft'; leave it out",
                field_path=".maxStaleness",
            ),
            _not_for_sft(
                f"self.numGenerations == {DEFAULT_NUM_GENERATIONS}",
                f"numGenerations (rollouts per task in a GRPO group) {_SFT_WHY} runs no"
                " rollouts; leave it out",
                ".numGenerations",
                kind="self.type",
            ),
            _not_for_sft(
                f"self.tasksPerStep == {DEFAULT_TASKS_PER_STEP}",
                f"tasksPerStep (GRPO's task groups per step) {_SFT_WHY} takes"
                " trainer.perDeviceBatchSize sequences per process and step; leave it out",
                ".tasksPerStep",
                kind="self.type",
            ),
            _not_for_sft(
                f"self.lossType == '{DEFAULT_LOSS_TYPE}'",
                f"lossType (GRPO's loss normalization) {_SFT_WHY} uses the cross-entropy of"
                " the model's own tokens; leave it out",
                ".lossType",
                kind="self.type",
            ),
            _not_for_sft(
                f"self.epsilon == {DEFAULT_EPSILON}",
                f"epsilon (GRPO's clipping) {_SFT_WHY} has no importance ratio to clip;"
                " leave it out",
                ".epsilon",
                kind="self.type",
            ),
            _not_for_sft(
                f"self.scaleRewards == '{DEFAULT_SCALE_REWARDS}'",
                f"scaleRewards (GRPO's advantage scaling) {_SFT_WHY} has no rewards to scale;"
                " leave it out",
                ".scaleRewards",
                kind="self.type",
            ),
            cel(
                "!has(self.epsilonHigh) || self.epsilonHigh >= self.epsilon",
                "epsilonHigh (upper clip) must be at least epsilon (lower clip)",
                field_path=".epsilonHigh",
            ),
        )
    )

    type: Literal["grpo", "sft"] = "grpo"
    """`grpo` (default): reinforcement learning on the run's own rollouts. `sft`: supervised
    fine-tuning on recorded trajectories (`sft.dataset`), e.g. the resolved attempts of a
    Benchmark before GRPO starts from the result (docs/training.md). With `sft` the GRPO-only
    fields (`beta`, `epsilon`, `epsilonHigh`, `lossType`, `numGenerations`, `tasksPerStep`,
    `scaleRewards`, `maxStaleness`) must be left out, as must the rollouts' (`rollout.pool`,
    `rollout.poolRef`, `rollout.reward`, `generation`, `weightSync`, `curriculum`);
    `steps`, `learningRate`, `warmupSteps`, `maxGradNorm`, `seed` and `lora` apply to both."""
    sft: SftSpec | None = None
    """Supervised fine-tuning's data and settings (with `type: sft` only)."""
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = DEFAULT_LOSS_TYPE
    """Loss normalization of the GRPO family (TRL's `loss_type`): `grpo` (per sequence),
    `bnpo` (per batch), `dr_grpo` (constant), `dapo` (per token over the global batch)."""
    num_generations: int = Field(default=DEFAULT_NUM_GENERATIONS, ge=1, le=512)
    """Rollouts per task in a group; advantages are relative to the group (at least 2)."""
    tasks_per_step: int = Field(default=DEFAULT_TASKS_PER_STEP, ge=1, le=65536)
    """Tasks (groups) per optimizer step."""
    steps: int = Field(default=200, ge=1, le=10000000)
    """Optimizer steps of the run."""
    learning_rate: float = Field(default=1e-6, gt=0.0, le=1.0)
    """Peak learning rate."""
    warmup_steps: int = Field(default=0, ge=0)
    """Linear warm-up steps."""
    max_grad_norm: float = Field(default=1.0, gt=0.0, le=1000.0)
    """Gradient clipping norm."""
    beta: float = Field(default=0.0, ge=0.0, le=10.0)
    """KL penalty coefficient against the reference model (0 loads no reference model)."""
    epsilon: float = Field(default=DEFAULT_EPSILON, gt=0.0, le=1.0)
    """Lower clipping epsilon of the importance ratio."""
    epsilon_high: float | None = Field(default=None, gt=0.0, le=10.0)
    """Upper clipping epsilon (DAPO's clip-higher); equal to `epsilon` when empty."""
    scale_rewards: Literal["group", "batch", "none"] = DEFAULT_SCALE_REWARDS
    """Divide advantages by the reward spread of the group, of the batch, or not at all."""
    max_staleness: int = Field(default=0, ge=0, le=64)
    """How many policy versions a rollout may lag behind the trainer. 0 (default): synchronous,
    each step's rollouts run on the weights just pushed while nothing else runs during the
    update. N > 0 (with an inference server): the rollouts of the next N steps run while a step
    trains, so sandboxes and inference never wait for the update (up to N+1 times the
    throughput when episodes dominate the step), at the price of training on samples up to N
    versions old, weighed by a per-token importance ratio against the server's sampling
    logprobs (a token whose ratio leaves [0, 3] is masked); older ones are run again. The server keeps N+1 LoRA adapters resident, and a
    failed adapter push is tolerated while the served one lags at most N versions."""
    seed: int = Field(default=42, ge=0)
    """Random seed."""
    lora: LoraSpec | None = None
    """Train LoRA adapters instead of all weights."""


class EvaluationSpec(ApiModel):
    """A benchmark run periodically during training."""

    every_steps: int = Field(ge=1, le=1000000)
    """Run the benchmark after every N optimizer steps."""
    benchmark: BenchmarkTemplate
    """The Benchmark to create each time, without its model: the run's latest checkpoint is
    served for it."""


class CurriculumSpec(ApiModel):
    """The order in which the trainer draws its tasks: easy before hard."""

    model_config = ConfigDict(
        json_schema_extra=with_rules(
            cel(
                "self.order != 'benchmark-results' || has(self.results)",
                "order 'benchmark-results' needs results: a benchmark results folder or its"
                " results.jsonl",
                field_path=".results",
            ),
        )
    )

    order: Literal["none", "patch-size", "benchmark-results"] = "none"
    """`none`: no curriculum, the trainer's usual order; `patch-size`: tasks whose gold patch
    changes fewer lines first; `benchmark-results`: the instances an earlier benchmark resolved
    most often first, those it did not run last."""
    results: Path | None = None
    """The benchmark results to order by (`benchmark-results`): a `crl bench` results folder or
    its `results.jsonl`. On one machine relative to the manifest's folder; in a cluster relative
    to the checkpoint volume (`checkpoints.volume`), where the trainer reads it."""


class WandbSpec(ApiModel):
    """Weights & Biases logging (optional)."""

    project: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    """W&B project."""
    entity: Short | None = None
    """W&B entity (team or user); the key's default when empty."""
    api_key_secret_ref: SecretKeyRef
    """Secret holding the W&B API key."""


class TrainingRunSpec(ApiModel):
    """Desired state of a TrainingRun."""

    model_config = ConfigDict(
        json_schema_extra=with_rules(
            cel(
                "self.weightSync != 'lora-adapter' || has(self.algorithm.lora)",
                "weightSync 'lora-adapter' needs algorithm.lora (only adapters can be loaded"
                " at runtime)",
                field_path=".weightSync",
            ),
            cel(
                "self.generation != 'in-process' || self.trainer.nodes == 1",
                "generation 'in-process' runs in one trainer pod: set trainer.nodes to 1",
                field_path=".generation",
            ),
            cel(
                "self.tasks.taskType != 'classify' || self.rollout.reward.type == 'tests'",
                "classify tasks are scored by their answer's credit along the CWE hierarchy"
                " (rollout.reward.type 'tests'); a diff-similarity or mix reward would pay for"
                " edits the task never asks for",
                field_path=".rollout.reward.type",
            ),
            cel(
                "self.algorithm.type != 'sft' || !has(self.curriculum)",
                "curriculum orders the rollouts' tasks and means nothing for algorithm.type"
                " 'sft'; leave it out",
                field_path=".curriculum",
            ),
            _not_for_sft(
                "!has(self.rollout.poolRef)",
                f"rollout.poolRef (the RolloutPool whose sandboxes run the rollouts) {_SFT_WHY}"
                " runs no rollouts: no pool is used; leave it out",
                ".rollout.poolRef",
            ),
            _not_for_sft(
                "!has(self.rollout.pool)",
                f"rollout.pool (the sandbox pool of the rollouts) {_SFT_WHY} runs no rollouts:"
                " no pool is created; leave it out",
                ".rollout.pool",
            ),
            _not_for_sft(
                f"self.rollout.reward.type == '{DEFAULT_REWARD.type}'"
                f" && self.rollout.reward.testsMode == '{DEFAULT_REWARD.tests_mode}'"
                " && !has(self.rollout.reward.weights)"
                " && self.rollout.reward.evaluationTimeoutSeconds =="
                f" {DEFAULT_REWARD.evaluation_timeout_seconds}",
                f"rollout.reward (how rollouts are scored) {_SFT_WHY} scores nothing (the"
                " dataset's trajectories were graded when they were sampled); leave it out",
                ".rollout.reward",
            ),
            _not_for_sft(
                "self.generation == 'vllm'",
                f"generation (who samples the rollouts) {_SFT_WHY} samples nothing; leave it out",
                ".generation",
            ),
            _not_for_sft(
                "self.weightSync == 'auto'",
                f"weightSync (how new weights reach the inference server) {_SFT_WHY} has no"
                " inference server; leave it out",
                ".weightSync",
            ),
            _not_for_sft(
                "!self.scheduling.sandboxesUseQuota",
                f"scheduling.sandboxesUseQuota {_SFT_WHY} runs no sandboxes; leave it out",
                ".scheduling.sandboxesUseQuota",
            ),
        )
    )

    model: ModelSpec
    """The policy model to train. Immutable once the run has started."""
    tasks: TaskSource
    """The training tasks. Immutable once the run has started."""
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    """Sandboxes, agent and reward of the rollouts."""
    algorithm: AlgorithmSpec = Field(default_factory=AlgorithmSpec)
    """The algorithm (GRPO, or supervised fine-tuning) and its hyperparameters."""
    inference: InferenceSpec = Field(default_factory=InferenceSpec)
    """The vLLM server that generates rollouts (with `generation: vllm`)."""
    generation: Literal["vllm", "in-process"] = "vllm"
    """Who generates the rollouts' completions: `vllm` (the servers of `inference`, the weights
    synced after each step) or `in-process` (the trainer itself with transformers, from the
    weights it trains: no server, no weight sync, as `crl train` without `--url` on one machine;
    for CPU-only runs of small models such as the toy)."""
    weight_sync: Literal["auto", "nccl", "lora-adapter"] = "auto"
    """How updated weights reach vLLM: `nccl` (broadcast from the trainer), `lora-adapter`
    (`/v1/load_lora_adapter`), or `auto` (adapters with LoRA, NCCL otherwise)."""
    trainer: TrainerSpec = Field(default_factory=TrainerSpec)
    """The trainer pods."""
    checkpoints: CheckpointSpec = Field(default_factory=CheckpointSpec)
    """Checkpointing and resume."""
    evaluation: EvaluationSpec | None = None
    """A benchmark run every N steps."""
    curriculum: CurriculumSpec | None = None
    """The order of the training tasks (easy to hard); no curriculum when empty."""
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)
    """Queue, priority and maximum run time."""
    wandb: WandbSpec | None = None
    """Weights & Biases logging."""
    suspend: bool = False
    """Pause the run: inference scales to zero and trainer pods are removed; checkpoints stay."""


class CheckpointRef(ApiModel):
    """A saved checkpoint."""

    step: int = Field(ge=0)
    """Optimizer step of the checkpoint."""
    path: Path
    """Where it is, inside the checkpoint volume."""
    time: datetime | None = None
    """When it was written."""


class TrainingMetrics(ApiModel):
    """A small summary of recent training steps (full metrics are in Prometheus)."""

    reward_mean: float | None = None
    """Mean reward of the last step's rollouts (infrastructure failures excluded)."""
    reward_std: float | None = None
    """Standard deviation of those rewards."""
    resolve_rate: float | None = Field(default=None, ge=0.0, le=1.0)
    """Share of the last step's rollouts that resolved their task."""
    kl: float | None = None
    """Mean KL divergence to the reference policy."""
    rollouts_per_minute: float | None = Field(default=None, ge=0.0)
    """Finished rollouts per minute."""
    tokens_per_second: float | None = Field(default=None, ge=0.0)
    """Training tokens processed per second."""
    infrastructure_failures: int | None = Field(default=None, ge=0)
    """Rollouts dropped because of infrastructure failures, in total."""


class EvaluationResult(ApiModel):
    """The last periodic evaluation."""

    step: int = Field(ge=0)
    """Optimizer step that was evaluated."""
    benchmark: ObjectName
    """The Benchmark object that ran it."""
    resolve_rate: float | None = Field(default=None, ge=0.0, le=1.0)
    """Its resolve rate, once finished."""


class TrainingRunChildren(ApiModel):
    """Names of the objects the operator created for the run."""

    config_map: ObjectName | None = None
    """ConfigMap with the resolved worker config."""
    inference_deployment: ObjectName | None = None
    """vLLM Deployment."""
    inference_service: ObjectName | None = None
    """vLLM Service."""
    trainer_job: ObjectName | None = None
    """Trainer indexed Job."""
    trainer_service: ObjectName | None = None
    """Headless Service for the trainer rendezvous."""
    rollout_pool: ObjectName | None = None
    """RolloutPool used by the run (owned when inline)."""


class TrainingRunStatus(CommonStatus):
    """Observed state of a TrainingRun.

    Condition types: `Ready`, `Admitted`, `InferenceReady`, `SandboxesReady`,
    `Training`, `Suspended`, `Succeeded`, `Failed`.
    """

    start_time: datetime | None = None
    """When training started; from then on the model and the tasks cannot change."""
    completion_time: datetime | None = None
    """When the trainer Job finished (the verdict follows with the trainer's last report)."""
    step: int | None = Field(default=None, ge=0)
    """Last finished optimizer step."""
    total_steps: int | None = Field(default=None, ge=0)
    """Steps of the whole run."""
    policy_version: int | None = Field(default=None, ge=0)
    """Version of the weights the inference server holds."""
    last_checkpoint: CheckpointRef | None = None
    """The newest checkpoint."""
    metrics: TrainingMetrics | None = None
    """Summary of recent steps."""
    last_evaluation: EvaluationResult | None = None
    """The last periodic evaluation."""
    children: TrainingRunChildren | None = None
    """Objects created for the run."""
    queue: QueueStatus | None = None
    """Kueue's admission of the whole run (with `scheduling.queueName`)."""
    validation: ValidationStatus | None = None
    """The task validation of the run's RolloutPool (its `status.validation`), when the pool
    validates: the run trains only on the tasks it did not quarantine."""

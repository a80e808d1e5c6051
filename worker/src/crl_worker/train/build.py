"""Building TRL's ``GRPOTrainer`` from a TrainingRun: the training arguments, DeepSpeed, LoRA,
the dataset of task ids, the reward column and the callbacks.

The DeepSpeed config is the one the operator writes into the trainer's ConfigMap
(:func:`crl_worker.api.launch.deepspeed_config`), derived from ``spec.trainer.deepspeed`` —
never a file users write by hand. Batch sizes follow from the algorithm: one optimizer step
takes ``tasksPerStep x numGenerations`` rollouts, split over every process with
``perDeviceBatchSize`` sequences per forward pass and the rest as gradient accumulation.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path
from typing import Any, Protocol

from crl_worker.api.trainingrun import LoraSpec
from crl_worker.train.errors import TrainConfigError
from crl_worker.train.settings import TrainSettings

logger = logging.getLogger(__name__)


class TrainingJob(Protocol):
    """What the builder needs of the job it builds a trainer for (the trainer module's
    ``TrainingJob`` is one): its settings, the dataset's order, the rollouts and the callbacks.
    A protocol here keeps the builder from importing the trainer that imports it."""

    settings: TrainSettings
    """The resolved TrainingRun."""
    world: int
    """Processes in the run."""
    task_order: list[str]
    """The instance ids of the dataset, in training order."""

    def rollout_func(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        """TRL's rollout function: one group of trajectories per prompt."""
        ...

    def on_log(self, step: int, logs: dict[str, Any]) -> None:
        """TRL logged ``logs`` at ``step``."""
        ...

    def on_step_end(self, step: int) -> bool:
        """An optimizer step ended; True asks TRL to stop."""
        ...

    def on_save(self, step: int) -> None:
        """TRL saved a checkpoint at ``step``."""
        ...


def uses_deepspeed(settings: TrainSettings, world: int) -> bool:
    """DeepSpeed runs when a ZeRO stage is set and there is something to shard across (GPUs,
    or several CPU processes)."""
    trainer = settings.spec.trainer
    return trainer.deepspeed.zero_stage > 0 and (trainer.gpus_per_node > 0 or world > 1)


def batch_layout(settings: TrainSettings, world: int) -> tuple[int, int]:
    """(sequences per forward pass, gradient-accumulation steps) for one optimizer step."""
    algorithm, trainer = settings.spec.algorithm, settings.spec.trainer
    per_step = algorithm.tasks_per_step * algorithm.num_generations
    per_device = trainer.per_device_batch_size
    if per_step % (per_device * world):
        raise TrainConfigError(
            "spec.algorithm.tasksPerStep",
            f"tasksPerStep x numGenerations = {per_step} rollouts per step cannot be split over "
            f"{world} process(es) x perDeviceBatchSize {per_device}; make it a multiple of "
            f"{per_device * world}",
        )
    return per_device, per_step // (per_device * world)


def resume_checkpoint(settings: TrainSettings) -> Path | None:
    """The checkpoint to resume from (``spec.checkpoints.resumeFrom``), ``None`` to start."""
    wanted = settings.spec.checkpoints.resume_from
    directory = settings.checkpoint_dir
    if wanted == "none":
        return None
    if wanted.startswith("step-"):
        path = directory / f"checkpoint-{wanted.removeprefix('step-')}"
        if not (path / "trainer_state.json").is_file():
            raise TrainConfigError(
                "spec.checkpoints.resumeFrom",
                f"no checkpoint {wanted} in {directory} (looked for {path}/trainer_state.json)",
            )
        return path
    return latest_checkpoint(directory)


def latest_checkpoint(directory: Path) -> Path | None:
    """The newest complete ``checkpoint-N`` (one whose trainer state was written last)."""
    if not directory.is_dir():
        return None
    found: list[tuple[int, Path]] = []
    for path in directory.iterdir():
        name = path.name
        if not name.startswith("checkpoint-") or not (path / "trainer_state.json").is_file():
            continue
        try:
            found.append((int(name.removeprefix("checkpoint-")), path))
        except ValueError:
            continue
    return max(found)[1] if found else None


def _prepare_distributed(deepspeed: bool) -> None:
    """Set accelerate's process state up before the training arguments exist.

    With DeepSpeed on CPUs (tests, laptops) transformers would not pass a backend and accelerate
    would fall back to a single process; creating the state first with gloo (NCCL on GPUs) and
    letting the arguments reuse it (``use_configured_state``) keeps every rank in one group.
    """
    import torch
    from accelerate import PartialState

    if not deepspeed:
        return
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        without_shm_kernel()  # before DeepSpeed's backend starts, in the state made here
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    try:
        PartialState(backend="nccl" if torch.cuda.is_available() else "gloo")
    finally:
        del os.environ["ACCELERATE_USE_DEEPSPEED"]


def _report_to() -> list[str]:
    """W&B when a key is given (and wandb is installed), nothing else."""
    if not os.environ.get("WANDB_API_KEY"):
        return []
    if importlib.util.find_spec("wandb") is None:
        logger.warning("WANDB_API_KEY is set but wandb is not installed; W&B logging is off")
        return []
    return ["wandb"]


def rollout_reward(
    prompts: list[Any] | None = None,
    completions: list[Any] | None = None,
    crl_reward: list[float | None] | None = None,
    **_: Any,
) -> list[float | None]:
    """The episode's reward, computed when the rollout ended (``None``: left out)."""
    return list(crl_reward or [])


def lora_config(lora: LoraSpec | None) -> Any:
    """PEFT's ``LoraConfig`` of ``spec.algorithm.lora`` (``None``: train every weight)."""
    if lora is None:
        return None
    from peft import LoraConfig

    targets: Any = lora.target_modules
    if targets == ["all-linear"]:
        targets = "all-linear"
    return LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        task_type="CAUSAL_LM",
    )


def placement(settings: TrainSettings, deepspeed: bool) -> tuple[bool, Any, dict[str, Any]]:
    """Where and how a trainer of ``settings`` trains, for the GRPO and SFT configs alike:
    whether on a GPU, the dtype the weights load in (float32 on the CPU instead of a half
    precision), and the config's DeepSpeed (mixed precision off on the CPU) or CPU arguments."""
    import torch

    spec = settings.spec
    on_gpu = spec.trainer.gpus_per_node > 0 and torch.cuda.is_available()
    dtype = spec.model.dtype
    torch_dtype: Any = "auto" if dtype == "auto" else getattr(torch, dtype)
    if not on_gpu and dtype in ("bfloat16", "float16"):
        logger.info("training on the CPU: loading the weights in float32 instead of %s", dtype)
        torch_dtype = torch.float32
    extra: dict[str, Any] = {}
    if deepspeed:
        from crl_worker.api.launch import deepspeed_config

        ds = deepspeed_config(settings.run())
        if not on_gpu:
            ds["bf16"] = {"enabled": False}
            ds["fp16"] = {"enabled": False}
        extra["deepspeed"] = ds
        extra["accelerator_config"] = {"use_configured_state": True}
    else:
        extra["use_cpu"] = not on_gpu
    return on_gpu, torch_dtype, extra


def without_shm_kernel() -> None:
    """Keep DeepSpeed on the CPU from building its shared-memory all-reduce kernel.

    Its communication backend compiles that C++ kernel when it starts on the CPU (about a
    minute of two cores, again in every new environment, since the installed sources are newer
    than any build of them), after probing every op builder with the compiler. Training never
    uses it: ZeRO's collectives go through gloo; only DeepSpeed's inference all-reduce does.
    The backend asks ``deepspeed.ops.__compatible_ops__``, which is probed on first read, so
    setting it first answers "not available"."""
    import deepspeed.ops

    if "__compatible_ops__" not in vars(deepspeed.ops):
        vars(deepspeed.ops)["__compatible_ops__"] = {"deepspeed_shm_comm": False}


def build_trainer(job: TrainingJob) -> tuple[Any, Any]:
    """The configured ``GRPOTrainer`` and its tokenizer, for this process."""
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl.trainer.grpo_config import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer

    settings = job.settings
    spec = settings.spec
    algorithm, trainer_spec = spec.algorithm, spec.trainer
    world = job.world
    deepspeed = uses_deepspeed(settings, world)
    per_device, accumulation = batch_layout(settings, world)
    _prepare_distributed(deepspeed)
    on_gpu, torch_dtype, extra = placement(settings, deepspeed)
    dtype = spec.model.dtype
    curriculum = getattr(spec, "curriculum", None)
    ordered = curriculum is not None and getattr(curriculum, "order", "none") != "none"
    args = GRPOConfig(
        output_dir=str(settings.checkpoint_dir),
        max_steps=settings.total_steps,
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=accumulation,
        num_generations=algorithm.num_generations,
        learning_rate=algorithm.learning_rate,
        warmup_steps=algorithm.warmup_steps,
        max_grad_norm=algorithm.max_grad_norm,
        beta=algorithm.beta,
        epsilon=algorithm.epsilon,
        epsilon_high=algorithm.epsilon_high,
        loss_type=algorithm.loss_type,
        scale_rewards=algorithm.scale_rewards,
        temperature=spec.rollout.agent.temperature,
        max_completion_length=spec.rollout.agent.max_total_tokens,
        seed=algorithm.seed,
        gradient_checkpointing=trainer_spec.gradient_checkpointing,
        save_strategy="steps",
        save_steps=spec.checkpoints.every_steps,
        save_total_limit=spec.checkpoints.keep_last,
        logging_steps=1,
        report_to=_report_to(),
        run_name=settings.name,
        shuffle_dataset=not ordered,
        bf16=on_gpu and dtype == "bfloat16",
        fp16=on_gpu and dtype == "float16",
        model_init_kwargs={"dtype": torch_dtype, "trust_remote_code": spec.model.trust_remote_code},
        remove_unused_columns=False,
        disable_tqdm=True,
        # Overlapped rollouts come from weights up to maxStaleness updates old: a per-sequence
        # ratio (the product over a long episode's tokens) leaves TRL's [0, 3] window for
        # most of them and would mask them whole. Per token, the ratio is masked (not
        # truncated) outside the window: truncation at 3 kept the tokens the update had
        # already moved most and pushed them further, and the toy's learning collapsed in 7
        # of 9 overlapped runs; masked, 4 of 4 recovered and ended high (docs/training.md).
        vllm_importance_sampling_mode=(
            "token_mask" if algorithm.max_staleness > 0 else "sequence_mask"
        ),
        **extra,
    )
    tokenizer = AutoTokenizer.from_pretrained(
        settings.model_path,
        revision=spec.model.revision,
        trust_remote_code=spec.model.trust_remote_code,
    )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    peft_config = lora_config(algorithm.lora)
    dataset = Dataset.from_dict({"prompt": list(job.task_order)})

    class Hooks(TrainerCallback):
        """The job's step-end, log and save hooks."""

        def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            logs = kwargs.get("logs")
            if logs:
                job.on_log(int(state.global_step), dict(logs))

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if job.on_step_end(int(state.global_step)):
                control.should_save = True
                control.should_training_stop = True
            return control

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            job.on_save(int(state.global_step))

    trainer = GRPOTrainer(
        model=settings.model_path,
        reward_funcs=[rollout_reward],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        rollout_func=job.rollout_func,
        callbacks=[Hooks()],
    )
    if settings.inference_url is not None:
        correct_for_sampling(trainer)
    return trainer, tokenizer


class _WeightsPushedElsewhere:
    """Stands in for TRL's vLLM backend: our job pushes the weights before each batch."""

    def sync_weights(self) -> None:
        """Nothing to do here (see :meth:`crl_worker.train.pushes.WeightPushes.ensure_current`)."""


def correct_for_sampling(trainer: Any) -> None:
    """Turn on TRL's importance-sampling correction for rollouts sampled by a vLLM server.

    The server's sampling logprobs differ from the trainer's (other kernels, bf16, and a
    rollout from an earlier version when a weight push lagged); TRL corrects for that with a
    importance ratio against the logprobs the rollout function returns, but only when
    it drives vLLM itself. We flag the trainer as vLLM-backed after construction and give it a
    backend whose weight sync is a no-op, since our job pushes weights (adapters or NCCL)
    before each batch. The server must return processed logprobs (`--logprobs-mode
    processed_logprobs`, which the operator sets).
    """
    trainer.use_vllm = True
    trainer.vllm_generation = _WeightsPushedElsewhere()
    trainer._last_loaded_step = -1

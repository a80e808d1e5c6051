"""How a TrainingRun is launched: the DeepSpeed and accelerate configs and the weight-sync mode,
derived from the spec.

Torch-free on purpose: the operator renders these into the trainer's ConfigMap (it never installs
torch), and the trainer derives the same values from the same spec when it runs on one machine,
so both halves agree by construction.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

from crl_worker.api import TrainingRun

WeightSyncMode = Literal["nccl", "lora-adapter"]


def merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`overrides` merged over `base`, recursively for nested objects; neither is changed."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def deepspeed_config(run: TrainingRun) -> dict[str, Any]:
    """The DeepSpeed config of the trainer, from `spec.trainer.deepspeed` and the algorithm.

    Values the Hugging Face integration derives from the training arguments stay `"auto"`
    (the global batch and accumulation follow from tasksPerStep x numGenerations, which the
    worker computes); the rest is explicit so the file says what runs. `overrides` are merged
    last, recursively.
    """
    trainer, ds = run.spec.trainer, run.spec.trainer.deepspeed
    dtype = run.spec.model.dtype
    zero: dict[str, Any] = {"stage": ds.zero_stage}
    if ds.zero_stage >= 1:
        zero.update(overlap_comm=True, reduce_bucket_size="auto")
    if ds.zero_stage >= 2:
        zero["contiguous_gradients"] = True
    if ds.zero_stage == 3:
        zero.update(
            stage3_prefetch_bucket_size="auto",
            stage3_param_persistence_threshold="auto",
            stage3_max_live_parameters=1_000_000_000,
            stage3_max_reuse_distance=1_000_000_000,
            # Checkpoints and weight pushes need whole 16-bit weights, not shards.
            stage3_gather_16bit_weights_on_model_save=True,
        )
    if ds.offload_optimizer == "cpu":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if ds.offload_parameters == "cpu":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": trainer.per_device_batch_size,
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": run.spec.algorithm.max_grad_norm,
        "bf16": {"enabled": "auto" if dtype == "auto" else dtype == "bfloat16"},
        "fp16": {"enabled": "auto" if dtype == "auto" else dtype == "float16"},
        "zero_optimization": zero,
        "steps_per_print": 100,
        "wall_clock_breakdown": False,
    }
    if ds.offload_optimizer == "cpu":
        # DeepSpeed's CPU Adam is what makes optimizer offload fast; other optimizers are refused.
        config["zero_force_ds_cpu_optimizer"] = True
    return merge(config, ds.overrides or {})


def processes(run: TrainingRun) -> int:
    """Training processes in the whole run: one per GPU, or one per pod on CPUs."""
    return run.spec.trainer.nodes * max(run.spec.trainer.gpus_per_node, 1)


def accelerate_config(run: TrainingRun, deepspeed_path: str) -> dict[str, Any]:
    """The `accelerate launch` config file; machine rank and addresses come from the pod's env.

    On GPUs accelerate starts DeepSpeed with the JSON of :func:`deepspeed_config`, read from
    `deepspeed_path` (its own mixed-precision and ZeRO keys are left out: with a DeepSpeed config
    file accelerate refuses them). Without GPUs (tests, laptops) it runs plain CPU processes.
    """
    trainer = run.spec.trainer
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "machine_rank": 0,
        "num_machines": trainer.nodes,
        "num_processes": processes(run),
        "main_training_function": "main",
        "rdzv_backend": "static",
        "same_network": True,
    }
    if trainer.gpus_per_node == 0:
        config["distributed_type"] = "MULTI_CPU" if trainer.nodes > 1 else "NO"
        config["use_cpu"] = True
        config["mixed_precision"] = "no"
        return config
    config["distributed_type"] = "DEEPSPEED"
    config["use_cpu"] = False
    config["deepspeed_config"] = {
        "deepspeed_config_file": deepspeed_path,
        # "standard" starts one launcher per pod (torchrun-style) instead of pdsh over SSH.
        "deepspeed_multinode_launcher": "standard",
        "zero3_init_flag": trainer.deepspeed.zero_stage == 3,
    }
    return config


def weight_sync_mode(run: TrainingRun) -> WeightSyncMode:
    """The weight-update mechanism in effect: `auto` resolved to `lora-adapter` or `nccl`."""
    if run.spec.weight_sync != "auto":
        return run.spec.weight_sync
    return "lora-adapter" if run.spec.algorithm.lora is not None else "nccl"

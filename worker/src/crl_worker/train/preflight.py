"""Checks that fail a run before any GPU time is spent, each naming the spec field to fix.

Run by every trainer process before the model is loaded or a process group exists: a config the
trainer cannot honour ends the pod with exit status 2, which the trainer Job's failure policy
turns into a failed Job at once (no restarts of something that cannot work).
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Any

from crl_worker.api.contract import Env
from crl_worker.tasks.model import Task
from crl_worker.train.errors import TrainConfigError
from crl_worker.train.settings import TrainSettings

logger = logging.getLogger(__name__)


def check_packages() -> None:
    """The installed torch, transformers, TRL, PEFT, accelerate and DeepSpeed work together.

    A known-broken combination otherwise fails in the middle of a step (transformers refusing the
    installed PEFT when the first adapter loads); here it is one sentence before anything starts.
    """
    from crl_worker.train.packages import check_installed, describe

    conflicts = check_installed()
    if conflicts:
        raise TrainConfigError(
            "spec.trainer.image",
            "the installed training libraries do not work together: " + describe(conflicts),
        )


def check_parallelism(settings: TrainSettings, *, world: int, gpus_visible: int | None) -> None:
    """Tensor parallelism, GPUs and the batch split."""
    from crl_worker.train.build import batch_layout

    spec = settings.spec
    inference = spec.inference
    if inference.gpus % inference.tensor_parallel_size:
        raise TrainConfigError(
            "spec.inference.tensorParallelSize",
            f"{inference.tensor_parallel_size} does not divide spec.inference.gpus "
            f"({inference.gpus}): each engine needs tensorParallelSize GPUs",
        )
    wanted = spec.trainer.gpus_per_node
    if wanted and gpus_visible is not None and gpus_visible < wanted:
        raise TrainConfigError(
            "spec.trainer.gpusPerNode",
            f"{wanted} GPUs per node asked for, {gpus_visible} visible to this process",
        )
    batch_layout(settings, world)


def check_sampling(settings: TrainSettings) -> None:
    """GRPO needs sampled rollouts; full-weight sync needs vLLM's transfer code."""
    if settings.spec.rollout.agent.temperature <= 0:
        raise TrainConfigError(
            "spec.rollout.agent.temperature",
            "must be above 0 for training: GRPO compares sampled rollouts of a task, and the "
            "loss divides by the temperature",
        )
    # The gloo transport (CRL_WEIGHT_TRANSPORT=gloo, the project's vLLM plugin) needs no vllm.
    if settings.weight_sync == "nccl" and os.environ.get(Env.WEIGHT_TRANSPORT) != "gloo":
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise TrainConfigError(
                "spec.weightSync",
                "nccl weight sync needs the vllm package in the trainer image (its NCCL "
                "rendezvous and communicator are vLLM's own); install it, or use LoRA with "
                "lora-adapter",
            )


def check_model(settings: TrainSettings) -> None:
    """The model's config loads, and LoRA fits it."""
    spec = settings.spec
    try:
        from transformers import AutoConfig

        config: Any = AutoConfig.from_pretrained(
            settings.model_path,
            revision=spec.model.revision,
            trust_remote_code=spec.model.trust_remote_code,
        )
    except Exception as exc:
        raise TrainConfigError(
            "spec.model.name",
            f"cannot load the model config of {settings.model_path!r}: {exc}",
        ) from exc
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden = getattr(text, "hidden_size", None)
    lora = spec.algorithm.lora
    if lora is not None and isinstance(hidden, int) and lora.rank > hidden:
        raise TrainConfigError(
            "spec.algorithm.lora.rank",
            f"rank {lora.rank} is larger than the model's hidden size {hidden}; an adapter "
            "cannot have more dimensions than the layer it adapts",
        )
    if lora is not None and settings.weight_sync == "nccl":
        raise TrainConfigError(
            "spec.weightSync",
            "nccl with LoRA is not supported: the adapters would have to be merged into the base "
            "weights on every push; use lora-adapter (or auto)",
        )


def check_checkpoints(settings: TrainSettings, env: dict[str, str] | None = None) -> None:
    """The checkpoint folder exists (a volume must be mounted in a cluster) and is writable."""
    env = dict(os.environ) if env is None else env
    directory = settings.checkpoint_dir
    in_pod = bool(env.get(Env.CHECKPOINT_DIR)) and directory == Path(env[Env.CHECKPOINT_DIR])
    if in_pod and not directory.is_dir():
        raise TrainConfigError(
            "spec.checkpoints.volume",
            f"the checkpoint folder {directory} does not exist: the volume is not mounted",
        )
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".write-test-{socket.gethostname()}-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise TrainConfigError(
            "spec.checkpoints.volume",
            f"cannot write checkpoints to {directory}: {exc}",
        ) from exc
    if (
        in_pod
        and settings.spec.checkpoints.volume is None
        and settings.weight_sync == "lora-adapter"
    ):
        raise TrainConfigError(
            "spec.checkpoints.volume",
            "weightSync lora-adapter needs a checkpoint volume: the inference server reads each "
            "adapter from it (an emptyDir in the trainer pod is invisible to vLLM)",
        )
    if in_pod and settings.spec.checkpoints.volume is None:
        logger.warning(
            "spec.checkpoints.volume is not set: checkpoints are lost with the pod, and a "
            "restarted trainer starts over"
        )
    from crl_worker.train.build import resume_checkpoint

    resume_checkpoint(settings)


def check_server(settings: TrainSettings, *, timeout: float = 10.0) -> None:
    """Something answers at the inference server, and it serves the model."""
    if settings.inference_url is None:
        return
    import httpx

    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    url = settings.inference_url + "/models"
    try:
        response = httpx.get(url, headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:
        raise TrainConfigError(
            "spec.inference",
            f"the inference server at {settings.inference_url} does not answer ({exc!r}); "
            "start it or give the right --url (an OpenAI API root such as "
            "http://localhost:8000/v1)",
        ) from exc
    if response.status_code != 200:
        raise TrainConfigError(
            "spec.inference",
            f"GET {url} answered {response.status_code}: {response.text[:200]}",
        )
    try:
        served = {m.get("id") for m in response.json().get("data", [])}
    except (ValueError, AttributeError):
        served = set()
    if served and settings.served_model not in served:
        raise TrainConfigError(
            "spec.model.name",
            f"the inference server serves {sorted(str(s) for s in served)}, not "
            f"{settings.served_model!r}",
        )


def check_tasks(settings: TrainSettings, tasks: list[Task]) -> None:
    """There are enough tasks for a step, and the reward can be computed for them."""
    if not tasks:
        raise TrainConfigError("spec.tasks", "the task source selects no instance")
    per_step = settings.spec.algorithm.tasks_per_step
    if len(tasks) < per_step:
        raise TrainConfigError(
            "spec.algorithm.tasksPerStep",
            f"{per_step} tasks per step, but the task source selects only {len(tasks)}",
        )
    reward = settings.spec.rollout.reward
    if reward.type != "tests":
        missing = [t.instance_id for t in tasks if not t.patch]
        if missing:
            raise TrainConfigError(
                "spec.rollout.reward.type",
                f"{reward.type} needs each task's gold patch; {len(missing)} task(s) have none "
                f"(e.g. {missing[0]})",
            )


def gpus_visible() -> int | None:
    """CUDA devices this process sees (``None`` when torch is not installed)."""
    try:
        import torch
    except ImportError:
        return None
    return int(torch.cuda.device_count())


def preflight(settings: TrainSettings, tasks: list[Task], *, world: int) -> None:
    """Every check, cheapest first (after the installed libraries, which every other relies on)."""
    check_packages()
    check_parallelism(settings, world=world, gpus_visible=gpus_visible())
    check_sampling(settings)
    check_tasks(settings, tasks)
    check_checkpoints(settings)
    check_model(settings)
    check_server(settings)

"""What one trainer process needs, resolved from the TrainingRun, the environment the operator
sets and the command line: the model, the run folder, the inference server, the pool, the
weight-sync mode. Torch-free (``crl train`` reads it before launching anything).

Precedence for every setting: the command line, then the environment the operator sets in the
trainer pod (``CRL_*``), then the spec, then a default for one machine.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from crl_worker.api import API_VERSION, TrainingRun
from crl_worker.api.contract import API_KEY_ENVS, Env
from crl_worker.api.launch import weight_sync_mode
from crl_worker.api.trainingrun import TrainingRunSpec
from crl_worker.configfile import read_resource_file
from crl_worker.train.errors import TrainConfigError

WeightSyncMode = Literal["nccl", "lora-adapter", "none"]


@dataclass(frozen=True)
class TrainSettings:
    """One trainer process's resolved settings."""

    name: str
    """The run's name (adapter names, metrics labels, the local run folder)."""
    spec: TrainingRunSpec
    """The validated spec."""
    config_path: Path
    """The file it was read from (relative task paths resolve against its folder)."""
    model_path: str
    """What ``from_pretrained`` loads: a local folder or a Hub id."""
    run_dir: Path
    """Checkpoints (``checkpoint-N``), adapters, trajectories, metrics and status go here."""
    inference_url: str | None
    """The vLLM server's OpenAI API root; ``None`` generates in-process with transformers."""
    served_model: str
    """The model name the server serves the base weights under."""
    weight_sync: WeightSyncMode
    """How new weights reach the server (``none`` when generating in-process)."""
    pool_url: str | None
    """The pool gateway to lease sandboxes from; ``None`` starts one in-process."""
    tasks_file: Path | None = None
    """Where the operator mounted the task source (wins over the spec's source)."""
    metrics_port: int | None = None
    """Port of the Prometheus endpoint (rank 0); ``None``: no endpoint."""
    api_key: str | None = field(default=None, repr=False)
    """Key sent to the inference server."""
    steps: int | None = None
    """Override of ``spec.algorithm.steps`` (``crl train --steps``)."""
    in_pod: bool = False
    """Whether this process runs in a trainer pod: the run folder is the checkpoint volume the
    operator mounted (``CRL_CHECKPOINT_DIR``), and the manifest is its ConfigMap's copy."""

    @property
    def spec_dir(self) -> Path:
        """What a relative path of the spec (``sft.dataset``, ``curriculum.results``) is
        relative to: in a trainer pod the checkpoint volume (the run folder, where the operator
        mounts it), on one machine the manifest's folder."""
        return self.run_dir if self.in_pod else self.config_path.parent

    def spec_path(self, value: str | os.PathLike[str]) -> Path:
        """Where a path of the spec is read: as it is when absolute, else in :attr:`spec_dir`."""
        return self.spec_dir / value  # an absolute path replaces spec_dir

    def run(self) -> TrainingRun:
        """The TrainingRun these settings were read from."""
        return as_run(self.name, self.spec)

    @property
    def total_steps(self) -> int:
        """Optimizer steps of the whole run."""
        return self.steps if self.steps is not None else self.spec.algorithm.steps

    @property
    def checkpoint_dir(self) -> Path:
        """Where ``checkpoint-N`` folders go (the run folder itself: the checkpoint volume)."""
        return self.run_dir

    @property
    def trajectories_dir(self) -> Path:
        """Per-step trajectory files (``step-000001.rank0.jsonl``)."""
        return self.run_dir / "trajectories"

    @property
    def adapters_dir(self) -> Path:
        """LoRA adapters pushed to the inference server (``v<N>``)."""
        return self.run_dir / "adapters"


def as_run(name: str, spec: TrainingRunSpec) -> TrainingRun:
    """A TrainingRun object around ``spec`` (for the helpers that read a whole resource)."""
    return TrainingRun.model_validate(
        {
            "apiVersion": API_VERSION,
            "kind": "TrainingRun",
            "metadata": {"name": name},
            "spec": spec.to_wire(),
        }
    )


def _model_path(spec: TrainingRunSpec, base_dir: Path, env: Mapping[str, str]) -> str:
    """A volume-mounted model (``CRL_MODEL_PATH``), a local folder (relative to the manifest's
    folder), or a Hub id as written."""
    if env.get(Env.MODEL_PATH):
        return env[Env.MODEL_PATH]
    candidate = Path(spec.model.name).expanduser()
    if not candidate.is_absolute():
        candidate = base_dir / candidate
    if candidate.is_dir():
        return str(candidate.resolve())
    return spec.model.name


def resolve_settings(
    config: Path,
    *,
    output: Path | None = None,
    url: str | None = None,
    served_model: str | None = None,
    pool_url: str | None = None,
    tasks_file: Path | None = None,
    metrics_port: int | None = None,
    steps: int | None = None,
    env: Mapping[str, str] | None = None,
) -> TrainSettings:
    """Read the TrainingRun at ``config`` and resolve every setting (see the module docstring).

    Raises :class:`TrainConfigError` for a file that is not a valid TrainingRun.
    """
    env = os.environ if env is None else env
    found = read_resource_file(config, "TrainingRun", TrainingRunSpec, error=_FileError)
    spec = found.spec
    if spec.rollout.agent.tries != 1:
        # As the CEL rule on the cluster (a local manifest is not checked against it).
        raise TrainConfigError(
            "spec.rollout.agent.tries",
            "a second try after the failing tests' output is for benchmarks (Aider's pass@2);"
            " a rollout has one try and one reward: leave it out",
        )
    name = env.get(Env.RUN_NAME) or found.name
    base_dir = config.parent
    mounted = env.get(Env.CHECKPOINT_DIR)
    run_dir = output or (Path(mounted) if mounted else Path.cwd() / "runs" / found.name)
    inference_url = url or env.get(Env.INFERENCE_URL) or None
    weight_sync: WeightSyncMode
    if inference_url is None:
        weight_sync = "none"
    else:
        chosen = env.get(Env.WEIGHT_SYNC) or weight_sync_mode(as_run(found.name, spec))
        if chosen not in ("nccl", "lora-adapter"):
            raise TrainConfigError(
                Env.WEIGHT_SYNC, f"unknown weight-sync mode {chosen!r} (nccl or lora-adapter)"
            )
        weight_sync = "nccl" if chosen == "nccl" else "lora-adapter"
        if weight_sync == "lora-adapter" and spec.algorithm.lora is None:
            raise TrainConfigError(
                "spec.weightSync",
                "lora-adapter needs spec.algorithm.lora (only adapters load at runtime)",
            )
    port_text = env.get(Env.METRICS_PORT)
    if metrics_port is None and port_text:
        try:
            metrics_port = int(port_text)
        except ValueError as exc:
            raise TrainConfigError(Env.METRICS_PORT, f"not a port number: {port_text!r}") from exc
    return TrainSettings(
        name=name,
        spec=spec,
        config_path=config,
        model_path=_model_path(spec, base_dir, env),
        run_dir=run_dir.resolve(),
        inference_url=inference_url.rstrip("/") if inference_url else None,
        served_model=served_model or env.get(Env.INFERENCE_MODEL) or spec.model.name,
        weight_sync=weight_sync,
        pool_url=pool_url or env.get(Env.POOL_URL) or None,
        tasks_file=tasks_file,
        metrics_port=metrics_port,
        api_key=next((env[k] for k in API_KEY_ENVS if env.get(k)), None),
        steps=steps,
        in_pod=bool(mounted) and run_dir.resolve() == Path(str(mounted)).resolve(),
    )


class _FileError(TrainConfigError):
    """The config file itself is unreadable or not a valid TrainingRun."""

    def __init__(self, message: str) -> None:
        super().__init__("config", message)

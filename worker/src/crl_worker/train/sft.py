"""Supervised fine-tuning (``spec.algorithm.type: sft``): TRL's ``SFTTrainer`` on agent
trajectories, on the same machinery as GRPO (accelerate and DeepSpeed, LoRA or all weights,
checkpoints and resume, the run folder's ``step-N``/``latest`` links, ``crl train``).

The data (``spec.algorithm.sft.dataset``) is a dataset ``crl trajectories export`` wrote (a
folder, or parquet files), a Hugging Face dataset id, or a Benchmark's results folder, whose
resolved attempts are exported into the run folder first (``sft-dataset/``). An exported
dataset is pre-tokenized: TRL trains on its ``input_ids`` exactly as the model server sampled
them, with ``assistant_masks`` as the loss mask (the model's own tokens only; the prompt, the
tool output and the template's turn markers carry no loss). A dataset of ``messages`` chats
without token ids is tokenized by TRL with ``assistant_only_loss``.

No rollouts run, no sandbox or inference server is used: the run folder gets TRL's
``checkpoint-N`` (with ``step-N`` and ``latest`` links, as GRPO's), ``final/``,
``metrics.jsonl`` (one line per step: ``step``, ``loss``, ``learning_rate``, ``grad_norm``,
``tokens`` (TRL's count of the tokens seen so far, the untrained ones included),
``tokens_per_second``, ``mean_token_accuracy``) and ``status.json``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from crl_worker.api.trainingrun import SftDataset, SftSpec
from crl_worker.train.build import (
    _prepare_distributed,
    _report_to,
    lora_config,
    placement,
    resume_checkpoint,
    uses_deepspeed,
)
from crl_worker.train.errors import TrainConfigError
from crl_worker.train.events import STEP_EVENT
from crl_worker.train.settings import TrainSettings

logger = logging.getLogger(__name__)

DATASET_FIELD = "spec.algorithm.sft.dataset"
#: Where a Benchmark's results are exported in the run folder.
EXPORTED = "sft-dataset"


def _sft(settings: TrainSettings) -> SftSpec:
    sft = settings.spec.algorithm.sft
    if sft is None:
        raise TrainConfigError("spec.algorithm.sft", "type 'sft' needs sft.dataset")
    return sft


def parquet_files(path: Path, field: str) -> list[str]:
    """The parquet files of an exported dataset folder (``data/*.parquet``), of a folder of
    parquet files, or a parquet file; a :class:`TrainConfigError` naming ``field`` otherwise."""
    if path.is_file():
        return [str(path)]
    if path.is_dir():
        for folder in (path / "data", path):
            files = sorted(str(p) for p in folder.glob("*.parquet"))
            if files:
                return files
    raise TrainConfigError(
        field,
        f"{path} holds no parquet files: give the folder `crl trajectories export --out` wrote, "
        "or a parquet file",
    )


def _export(settings: TrainSettings, dataset: SftDataset) -> list[str]:
    """Export a Benchmark's resolved attempts into the run folder; its parquet files."""
    from crl_worker.rollout.export import ExportError, ExportFilters, export_trajectories

    assert dataset.benchmark_results is not None
    out = settings.run_dir / EXPORTED
    try:
        report = export_trajectories(
            [settings.spec_path(dataset.benchmark_results)],
            out,
            filters=ExportFilters(resolved_only=True, per_instance=dataset.per_instance),
            overwrite=True,
        )
    except ExportError as exc:
        raise TrainConfigError(f"{DATASET_FIELD}.benchmarkResults", str(exc)) from exc
    logger.info("exported %d resolved trajectories to %s", report.written, out)
    return parquet_files(out, f"{DATASET_FIELD}.benchmarkResults")


def load_sft_dataset(settings: TrainSettings) -> Any:
    """The training set of the run (a ``datasets.Dataset``), reduced to what TRL trains on."""
    import datasets
    from accelerate import PartialState

    dataset = _sft(settings).dataset
    cache = str(settings.run_dir / ".datasets-cache")
    try:
        if dataset.hugging_face is not None:
            loaded = datasets.load_dataset(
                dataset.hugging_face, split=dataset.split, cache_dir=cache
            )
        else:
            if dataset.benchmark_results is not None:
                with PartialState().main_process_first():
                    files = _export(settings, dataset)
            else:
                assert dataset.path is not None
                files = parquet_files(settings.spec_path(dataset.path), f"{DATASET_FIELD}.path")
            loaded = datasets.load_dataset(
                "parquet", data_files=files, split="train", cache_dir=cache
            )
    except (OSError, ValueError) as exc:  # datasets' errors derive from these
        raise TrainConfigError(DATASET_FIELD, f"cannot load the dataset: {exc}") from exc
    columns = set(loaded.column_names)
    if "input_ids" in columns:
        keep = [c for c in ("input_ids", "assistant_masks") if c in columns]
        if "assistant_masks" not in columns:
            logger.warning("the dataset has no assistant_masks: every token is trained")
    elif "messages" in columns:
        keep = [c for c in ("messages", "tools") if c in columns]
    else:
        raise TrainConfigError(
            DATASET_FIELD,
            f"the dataset has neither input_ids nor messages (its columns: "
            f"{', '.join(sorted(columns))}); export one with `crl trajectories export`",
        )
    if len(loaded) == 0:
        raise TrainConfigError(DATASET_FIELD, "the dataset has no rows")
    return loaded.select_columns(keep)


def build_sft_trainer(settings: TrainSettings, world: int, callbacks: list[Any]) -> Any:
    """The configured ``SFTTrainer`` for this process."""
    from transformers import AutoTokenizer
    from trl.trainer.sft_config import SFTConfig
    from trl.trainer.sft_trainer import SFTTrainer

    spec = settings.spec
    algorithm, trainer_spec = spec.algorithm, spec.trainer
    sft = _sft(settings)
    deepspeed = uses_deepspeed(settings, world)
    _prepare_distributed(deepspeed)
    on_gpu, torch_dtype, extra = placement(settings, deepspeed)
    dtype = spec.model.dtype
    train_dataset = load_sft_dataset(settings)
    tokenized = "input_ids" in train_dataset.column_names
    args = SFTConfig(
        output_dir=str(settings.checkpoint_dir),
        max_steps=settings.total_steps,
        per_device_train_batch_size=trainer_spec.per_device_batch_size,
        gradient_accumulation_steps=1,
        learning_rate=algorithm.learning_rate,
        warmup_steps=algorithm.warmup_steps,
        max_grad_norm=algorithm.max_grad_norm,
        seed=algorithm.seed,
        gradient_checkpointing=trainer_spec.gradient_checkpointing,
        save_strategy="steps",
        save_steps=spec.checkpoints.every_steps,
        save_total_limit=spec.checkpoints.keep_last,
        logging_steps=1,
        report_to=_report_to(),
        run_name=settings.name,
        bf16=on_gpu and dtype == "bfloat16",
        fp16=on_gpu and dtype == "float16",
        model_init_kwargs={"dtype": torch_dtype, "trust_remote_code": spec.model.trust_remote_code},
        max_length=sft.max_length or spec.rollout.agent.max_total_tokens,
        assistant_only_loss=not tokenized,
        disable_tqdm=True,
        **extra,
    )
    tokenizer = AutoTokenizer.from_pretrained(
        settings.model_path,
        revision=spec.model.revision,
        trust_remote_code=spec.model.trust_remote_code,
    )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return SFTTrainer(
        model=settings.model_path,
        args=args,
        train_dataset=train_dataset,
        processing_class=tokenizer,
        peft_config=lora_config(algorithm.lora),
        callbacks=callbacks,
    )


#: Publishes one progress report (a :class:`~crl_worker.api.progress.TrainingProgress` as
#: JSON): into the run's progress ConfigMap in a cluster.
Publish = Callable[[dict[str, Any]], None]


class Records:
    """``metrics.jsonl``, the step events, ``step-N``/``latest`` links and the progress report
    (``status.json``, and in a cluster the TrainingRun's status through ``publish``); rank 0."""

    def __init__(self, settings: TrainSettings, rank: int, publish: Publish | None = None) -> None:
        self.settings = settings
        self.rank = rank
        self.publish = publish
        self.last = time.monotonic()
        self.tokens = 0.0
        self.step = 0
        self.tokens_per_second: float | None = None
        self.checkpoint: dict[str, Any] | None = None

    def on_log(self, step: int, logs: dict[str, Any]) -> None:
        """TRL's log of ``step`` (``logs``: its loss, learning rate, token count): a line of
        ``metrics.jsonl``, the step event, and the report."""
        if self.rank != 0 or "loss" not in logs:
            return
        now = time.monotonic()
        tokens = float(logs.get("num_tokens", 0.0))
        seconds = now - self.last
        record = {
            "step": step,
            "loss": logs.get("loss"),
            "learning_rate": logs.get("learning_rate"),
            "grad_norm": logs.get("grad_norm"),
            "tokens": tokens,
            "tokens_per_second": (tokens - self.tokens) / seconds if seconds > 0 else None,
            "mean_token_accuracy": logs.get("mean_token_accuracy"),
        }
        self.last, self.tokens = now, tokens
        with (self.settings.run_dir / "metrics.jsonl").open("a") as out:
            out.write(json.dumps(record) + "\n")
        logger.info(
            "step %d: loss %.4f",
            step,
            float(logs["loss"]),
            extra={
                "event": STEP_EVENT,
                "total_steps": self.settings.total_steps,
                "step_seconds": round(seconds, 3),
                **record,
            },
        )
        self.tokens_per_second = record["tokens_per_second"]
        self.status(step, "Training")

    def on_save(self, step: int) -> None:
        """TRL wrote ``checkpoint-<step>``: link ``step-N`` and ``latest`` to it and report it."""
        if self.rank != 0:
            return
        from crl_worker.train.trainer import link_checkpoint

        link_checkpoint(self.settings.checkpoint_dir, step)
        self.checkpoint_saved(step, f"step-{step}")
        self.status(step, "Training")

    def checkpoint_saved(self, step: int, path: str) -> None:
        """Name the newest checkpoint (relative to the checkpoint directory) in the reports."""
        self.checkpoint = {"step": step, "path": path, "time": datetime.now(UTC).isoformat()}

    def status(self, step: int, phase: str) -> None:
        """``status.json`` and the published report: the step, the newest checkpoint, tokens
        per second; ``finished`` once ``phase`` is ``Succeeded``."""
        if self.rank != 0:
            return
        self.step = step
        metrics = (
            {} if self.tokens_per_second is None else {"tokensPerSecond": self.tokens_per_second}
        )
        report: dict[str, Any] = {
            "step": step,
            "totalSteps": self.settings.total_steps,
            # No server holds a policy: the trained weights are the current ones.
            "policyVersion": step,
            "lastCheckpoint": self.checkpoint,
            "metrics": metrics,
            "finished": phase == "Succeeded",
            "phase": phase,
        }
        status = {**report, "algorithm": "sft"}
        (self.settings.run_dir / "status.json").write_text(json.dumps(status, indent=2) + "\n")
        if self.publish is not None:
            try:
                self.publish({k: v for k, v in report.items() if v is not None})
            except Exception as exc:  # reporting never stops training
                logger.warning("publishing the status failed: %s", exc)


def _reporter(rank: int) -> tuple[Publish | None, Callable[[], None]]:
    """Rank 0's publisher into the progress ConfigMap the operator configured (none on one
    machine), on an event loop of its own; and what closes it."""
    from crl_worker.train.report import training_reporter_from_env

    reporter = training_reporter_from_env() if rank == 0 else None
    if reporter is None:
        return None, lambda: None
    from crl_worker.train.runtime import Engine

    engine = Engine()

    def publish(report: dict[str, Any]) -> None:
        engine.call(reporter.publish(report))

    def close() -> None:
        try:
            engine.call(reporter.aclose())
        finally:
            engine.close()

    return publish, close


def run_sft(settings: TrainSettings) -> int:
    """Train the run with supervised fine-tuning; the exit status (0: the last step was
    reached). Its progress goes to ``status.json`` and, in a cluster, the TrainingRun's
    status (the progress ConfigMap)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    publish, close = _reporter(rank)
    try:
        return _train(settings, world, Records(settings, rank, publish))
    finally:
        close()


def _train(settings: TrainSettings, world: int, records: Records) -> int:
    """:func:`run_sft`'s training, its progress in ``records``."""
    from transformers import TrainerCallback

    class Hooks(TrainerCallback):
        """Metrics and checkpoint links."""

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            records.last = time.monotonic()  # the first step's rate without the model's load

        def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if kwargs.get("logs"):
                records.on_log(int(state.global_step), dict(kwargs["logs"]))

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            records.on_save(int(state.global_step))

    trainer = build_sft_trainer(settings, world, [Hooks()])
    checkpoint = resume_checkpoint(settings)
    start = 0
    if checkpoint is not None:
        logger.info("resuming from %s", checkpoint)
        start = int(checkpoint.name.split("-")[-1])
        records.checkpoint_saved(start, f"step-{start}")
    records.status(start, "Training")
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    trainer.save_model(str(settings.run_dir / "final"))
    step = int(trainer.state.global_step)
    records.status(step, "Succeeded")
    logger.info("supervised fine-tuning finished at step %d: %s", step, settings.run_dir / "final")
    return 0


__all__ = ["Records", "build_sft_trainer", "load_sft_dataset", "parquet_files", "run_sft"]

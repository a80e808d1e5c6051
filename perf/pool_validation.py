"""Throughput of a pool validating its tasks (RolloutPool ``spec.validation``), and the cache's
effect on a second start (issue 34).

    python perf/pool_validation.py [--runs 1] [--max-sandboxes 2] [--json]

Starts a pool gateway in process (local backend: a clone and a shell per sandbox) over the
bundled mini suite (``examples/suites/mini``, eight instances) plus one deliberately broken
copy (FAIL_TO_PASS tests that pass without the fix), with validation on, and measures the time
from the start to the end of validation; then starts a second gateway over the same tasks and
cache, whose verdicts all come from the cache. ``$CRL_CACHE_DIR`` is a fresh temporary folder
(the repositories' clones are cached there too, so the first start also pays for them). Prints
figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

from crl_worker.api.common import PoolSettings
from crl_worker.pool.config import GatewayConfig
from crl_worker.pool.gateway import Gateway
from crl_worker.tasks.loaders import load_tasks
from crl_worker.tasks.model import Task

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "examples" / "suites" / "mini" / "tasks.jsonl"


def _tasks() -> list[Task]:
    tasks = load_tasks(SUITE, "task").tasks
    good = next(t for t in tasks if t.instance_id.endswith("iniconf-1"))
    broken = good.model_copy(
        update={
            "instance_id": "crl-mini__iniconf-1-broken",
            "fail_to_pass": good.pass_to_pass[:1],
            "pass_to_pass": [],
        }
    )
    return [*tasks, broken]


async def _start(config: GatewayConfig, tasks: list[Task]) -> dict[str, float | int]:
    begin = time.perf_counter()
    async with Gateway(config, tasks) as gateway:
        await gateway.wait_validated()
        elapsed = time.perf_counter() - begin
        report = gateway.validation
        assert report is not None
        return {
            "seconds": round(elapsed, 2),
            "tasks": len(tasks),
            "valid": len(report.valid),
            "quarantined": len(report.quarantined),
            "cached": report.cached,
            "tasks_per_minute": round(len(tasks) / elapsed * 60, 1),
        }


def main() -> None:
    """Measure a cold and a cached validation, print them."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=1, help="spec.validation.runs")
    parser.add_argument("--max-sandboxes", type=int, default=2, help="validations at a time")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    tasks = _tasks()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["CRL_CACHE_DIR"] = str(Path(tmp) / "cache")
        settings = PoolSettings.model_validate(
            {
                "replicas": 0,
                "maxSandboxes": args.max_sandboxes,
                "validation": {"enabled": True, "runs": args.runs},
            }
        )
        config = GatewayConfig(
            pool="perf", backend="local", port=0, local_root=Path(tmp) / "sb", settings=settings
        )
        cold = asyncio.run(_start(config, tasks))
        cached = asyncio.run(_start(config, tasks))
    result = {
        "runs": args.runs,
        "max_sandboxes": args.max_sandboxes,
        "cold": cold,
        "cached": cached,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for label, found in (("first start", cold), ("second start (cache)", cached)):
        print(
            f"{label}: {found['tasks']} tasks in {found['seconds']} s"
            f" = {found['tasks_per_minute']} tasks/min; {found['valid']} valid,"
            f" {found['quarantined']} quarantined, {found['cached']} from the cache"
        )


if __name__ == "__main__":
    main()

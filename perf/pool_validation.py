"""Throughput of a pool validating its tasks (RolloutPool ``spec.validation``), and the cache's
effect on a second start (issue 34).

    python perf/pool_validation.py [--runs 1] [--max-sandboxes 2] [--json]

Starts a pool gateway in process (local backend: a clone and a shell per sandbox) over the
bundled mini suite (``examples/suites/mini``, eight instances) plus one deliberately broken
copy (a FAIL_TO_PASS test that passes without the fix; tests/fixtures/incluster_validation.py),
with validation on, and measures the time
from the start to the end of validation; then starts a second gateway over the same tasks and
cache, whose verdicts all come from the cache. ``$CRL_CACHE_DIR`` is a fresh temporary folder
(the repositories' clones are cached there too, so the first start also pays for them). Prints
figures; asserts nothing. ``perf/real_node.py --validate`` runs the same in the test cluster
beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from crl_worker.api.common import PoolSettings  # noqa: E402
from crl_worker.pool.config import GatewayConfig  # noqa: E402
from crl_worker.pool.gateway import Gateway  # noqa: E402
from crl_worker.tasks.loaders import load_tasks  # noqa: E402
from crl_worker.tasks.model import Task  # noqa: E402
from tests.fixtures.incluster_validation import with_broken_copy  # noqa: E402
from tests.fixtures.real_node import SUITE  # noqa: E402


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


def measure(runs: int, max_sandboxes: int) -> dict[str, Any]:
    """Validate the suite and its broken copy with a fresh cache, then again from that cache;
    returns both starts' figures. ``$CRL_CACHE_DIR`` is restored afterwards."""
    tasks = with_broken_copy(load_tasks(SUITE, "task").tasks)
    before = os.environ.get("CRL_CACHE_DIR")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["CRL_CACHE_DIR"] = str(Path(tmp) / "cache")
        try:
            settings = PoolSettings.model_validate(
                {
                    "replicas": 0,
                    "maxSandboxes": max_sandboxes,
                    "validation": {"enabled": True, "runs": runs},
                }
            )
            config = GatewayConfig(
                pool="perf", backend="local", port=0, local_root=Path(tmp) / "sb", settings=settings
            )
            cold = asyncio.run(_start(config, tasks))
            cached = asyncio.run(_start(config, tasks))
        finally:
            if before is None:
                os.environ.pop("CRL_CACHE_DIR", None)
            else:
                os.environ["CRL_CACHE_DIR"] = before
    return {"runs": runs, "max_sandboxes": max_sandboxes, "cold": cold, "cached": cached}


def main() -> None:
    """Measure a cold and a cached validation, print them."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=1, help="spec.validation.runs")
    parser.add_argument("--max-sandboxes", type=int, default=2, help="validations at a time")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(args.runs, args.max_sandboxes)
    cold, cached = result["cold"], result["cached"]
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

"""What the task types beyond repair cost (docs/task-types.md): deriving implement tasks, and the
gold agent on the bundled classify and implement suites, in local sandboxes on this machine.

    python perf/task_types.py [--repair-task crl-mini__slugkit-1] [--limit 2]

Prints figures; asserts nothing. Each command runs as a user runs it (``python -m crl_cli``) in a
scratch folder with a cache of its own, so the first sandbox of each repository pays the clone
and the environment; the machine is shared (the load average is printed), so read the figures
as orders of magnitude.

- ``derive-implement``: wall seconds for one repair task of the mini suite, and per candidate
  tried (each candidate runs the tests twice, then the task check runs them twice again).
- ``bench --agent gold``: wall seconds of each bundled suite, and the resolve rate it reports
  (accuracy for classify), which must be 100%.
- CWE credit: microseconds per :func:`crl_worker.tasks.cwe.credit` call over every pair of a
  sample of labels (the grading of one classify answer).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
logger = logging.getLogger("perf.task_types")


def _crl(
    *args: str, cwd: Path, env: dict[str, str]
) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "crl_cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    return time.perf_counter() - t0, done


def main() -> int:
    """Run the measurements and print them."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repair-task", default="crl-mini__slugkit-1")
    parser.add_argument("--limit", type=int, default=2)
    args = parser.parse_args()
    logger.info("load average: %s", " ".join(f"{x:.2f}" for x in os.getloadavg()))
    with tempfile.TemporaryDirectory(prefix="crl-perf-") as tmp:
        scratch = Path(tmp)
        env = {**os.environ, "CRL_CACHE_DIR": str(scratch / "cache"), "COLUMNS": "200"}
        sandbox = json.dumps({"type": "local", "root": str(scratch)})
        seconds, done = _crl(
            "tasks",
            "derive-implement",
            str(ROOT / "examples/suites/mini/tasks.jsonl"),
            "--out",
            str(scratch / "derived"),
            "-i",
            args.repair_task,
            "--limit",
            str(args.limit),
            "--sandbox",
            sandbox,
            cwd=scratch,
            env=env,
        )
        tried = done.stderr.count(f"{args.repair_task}: ")
        logger.info(
            "derive-implement %s: %.1f s for %d candidates tried (%.1f s each), exit %d",
            args.repair_task,
            seconds,
            tried,
            seconds / max(tried, 1),
            done.returncode,
        )
        for name in ("classify", "implement"):
            seconds, done = _crl(
                "bench",
                str(ROOT / "examples" / f"local-benchmark-{name}.yaml"),
                "--agent",
                "gold",
                "--sandbox",
                sandbox,
                cwd=scratch,
                env=env,
            )
            summary = json.loads((scratch / "results" / name / "summary.json").read_text())
            logger.info(
                "bench --agent gold, %s suite: %.1f s for %d attempts, resolve rate %.1f%%%s",
                name,
                seconds,
                summary["done"],
                100 * (summary["resolveRate"] or 0.0),
                f", accuracy {100 * summary['classification']['accuracy']:.1f}%"
                if summary.get("classification")
                else "",
            )
    from crl_worker.tasks.cwe import credit, hierarchy

    labels = sorted(hierarchy())[:200]
    t0 = time.perf_counter()
    for a in labels:
        for b in labels:
            credit(a, b)
    per_call = (time.perf_counter() - t0) / len(labels) ** 2
    logger.info("CWE credit: %.1f us per call (%d pairs)", 1e6 * per_call, len(labels) ** 2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

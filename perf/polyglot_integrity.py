#!/usr/bin/env python3
"""Polyglot gold patches through the integrity check: the false-alarm check and its cost.

For each task of a ``polyglot`` records file (``scripts/polyglot_tasks.py`` writes one), in a
local sandbox: the gold patch as the agent's sandbox grades it (``evaluate``), then, after a
reset, as the integrity check grades it (``grade_candidate``: the source split, canaries, the
test binary run without its sources). Prints one JSON line per task and a summary per language;
a gold patch the check does not resolve is a false alarm (its log goes to ``--logs``).

Usage::

    python perf/polyglot_integrity.py /tmp/pgreal/tasks.jsonl [-i go__bowling] [--logs DIR]

Results: perf/polyglot.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import tempfile
import time
from pathlib import Path

from crl_worker.harness.evaluate import evaluate
from crl_worker.harness.integrity import grade_candidate
from crl_worker.sandbox.registry import create_sandbox
from crl_worker.tasks.loaders import load_tasks
from crl_worker.tasks.model import Task


async def _one(task: Task, root: str, logs: Path | None) -> dict[str, object]:
    async with create_sandbox({"type": "local", "root": root}, task) as sandbox:
        started = time.monotonic()
        plain = await evaluate(sandbox, task, model_patch=task.patch)
        middle = time.monotonic()
        await sandbox.reset()
        checked = await grade_candidate(sandbox, task, task.patch)
        done = time.monotonic()
    if logs is not None and not checked.resolved:
        logs.mkdir(parents=True, exist_ok=True)
        (logs / f"{task.instance_id}.log").write_text(checked.log)
    # Sealed expectations (Python's runs): how many statements, in how many tests.
    sealed = re.search(r"sealed expectations: (\d+) in (\d+) tests", checked.log)
    return {
        "id": task.instance_id,
        "language": task.language,
        "plain": plain.resolved,
        "resolved": checked.resolved,
        "tampered": checked.tampered,
        "error": checked.infrastructure_error,
        "evaluation_s": round(middle - started, 2),
        "check_s": round(done - middle, 2),
        "sealed": [int(sealed[1]), int(sealed[2])] if sealed else None,
    }


async def _main(args: argparse.Namespace) -> int:
    loaded = load_tasks(Path(args.records), "polyglot")
    if not loaded.ok:
        print(loaded.errors)
        return 1
    tasks = [t for t in loaded.tasks if not args.instance or t.instance_id in args.instance]
    rows = []
    with tempfile.TemporaryDirectory(prefix="crl-polyglot-integrity-") as root:
        for task in tasks:
            row = await _one(task, root, Path(args.logs) if args.logs else None)
            print(json.dumps(row), flush=True)
            rows.append(row)
    for language in sorted({str(r["language"]) for r in rows}):
        mine = [r for r in rows if r["language"] == language]
        plain = [float(str(r["evaluation_s"])) for r in mine]
        check = [float(str(r["check_s"])) for r in mine]
        summary = {
            "language": language,
            "tasks": len(mine),
            "gold_resolved_plain": sum(bool(r["plain"]) for r in mine),
            "gold_resolved_checked": sum(bool(r["resolved"]) for r in mine),
            "evaluation_median_s": statistics.median(plain),
            "check_median_s": statistics.median(check),
            "check_over_evaluation": round(sum(check) / sum(plain), 2),
        }
        sealed = [r["sealed"] for r in mine if isinstance(r["sealed"], list)]
        if sealed:
            summary["tasks_sealed"] = sum(1 for s in sealed if s[0])
            summary["statements_sealed"] = sum(s[0] for s in sealed)
            summary["tests_sealed"] = sum(s[1] for s in sealed)
        print(json.dumps(summary))
    return 0 if all(r["resolved"] for r in rows) else 1


def main() -> int:
    """Run the comparison (see the module's docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("records", help="a polyglot records file (tasks.jsonl)")
    parser.add_argument("-i", "--instance", action="append", help="only these instances")
    parser.add_argument("--logs", help="write the logs of gold patches the check rejects here")
    return asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())

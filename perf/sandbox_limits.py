"""What a local sandbox's resource limits hold on this machine, attacked from inside one.

    python perf/sandbox_limits.py [--out FILE]

Prints the cgroup the worker found (v1 or v2, the controllers it got, what it lacks and why:
:func:`crl_worker.sandbox.limits.find`), then starts two local sandboxes with small limits
(128 MiB of memory, 64 processes, one CPU) and runs in the first a memory hog, a fork bomb and
a CPU burner (four busy loops for two seconds), each followed by a command in the second:
what each command's result said, how long it took, and the CPU seconds the burner got per
second (at most about one where the CPU limit holds). For a machine the tests do not run on
(the GPU machine's cgroup v2, a cluster's node): the tests of tests/test_sandbox_local_limits.py
assert the same on the machines CI runs on. Asserts nothing; with ``--out`` writes the figures
as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sandbox_confine import small_repo

from crl_worker.sandbox import limits
from crl_worker.sandbox.config import LocalSandboxConfig
from crl_worker.sandbox.local import LocalSandbox
from crl_worker.tasks.model import Task, TestSpec, Timeouts

logger = logging.getLogger("perf.sandbox_limits")

ATTACKS = {
    "memory hog": "python -c \"chunks = [b'x' * (1 << 20) for _ in range(512)]; print('survived')\"",
    "fork bomb": "bomb() { bomb | bomb & }; bomb; sleep 2; echo survived",
    "cpu burner": (
        'python -c "import os, time, threading\n'
        "def spin():\n    end = time.time() + 2\n    while time.time() < end: pass\n"
        "ts = [threading.Thread(target=spin) for _ in range(4)]\n"
        "[t.start() for t in ts]; [t.join() for t in ts]\n"
        "u = os.times(); print('cpu per second', round((u.user + u.system) / 2, 2))\""
    ),
}


def _hierarchy() -> dict[str, Any]:
    found = limits.find()
    if isinstance(found, str):
        return {"cgroup": None, "reason": found}
    return {
        "cgroup": found.version,
        "controllers": sorted(c for c in found.parents if c != "cgroup"),
        "lacking": found.lacking,
    }


async def main(out: Path | None) -> dict[str, Any]:
    """Probe the limits and print what held."""
    figures: dict[str, Any] = {"hierarchy": _hierarchy()}
    logger.info("cgroup: %s", figures["hierarchy"])
    with tempfile.TemporaryDirectory(prefix="crl-perf-limits-") as folder:
        Path(folder).chmod(0o755)  # the sandboxes' unprivileged user passes through it
        repo = Path(folder) / "repo"
        task = Task(
            instance_id="perf__limits-1",
            repo="perf/limits",
            base_commit=small_repo(repo),
            source=str(repo),
            python=f"{sys.version_info[0]}.{sys.version_info[1]}",
            test=TestSpec(command="python -m pytest -rA {tests}", log_format="pytest"),
            timeouts=Timeouts(command=60, setup=300),
        )
        config = LocalSandboxConfig(
            root=str(Path(folder) / "sandboxes"), mem_limit="128m", pids_limit=64, cpus=1
        )
        first, second = LocalSandbox(config, task), LocalSandbox(config, task)
        async with first, second:
            figures["cgroup made"] = first.cgroup is not None
            figures["attacks"] = {}
            for name, command in ATTACKS.items():
                started = time.monotonic()
                result = await first.run(command, timeout=30)
                seconds = round(time.monotonic() - started, 2)
                after = await second.run("echo alive", timeout=30)
                row = {
                    "exit code": result.exit_code,
                    "output": result.output.strip()[-300:],
                    "seconds": seconds,
                    "second sandbox": after.output.strip(),
                }
                figures["attacks"][name] = row
                logger.info("%s: %s", name, row)
    if out is not None:
        out.write_text(json.dumps(figures, indent=2) + "\n")
    return figures


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    asyncio.run(main(parser.parse_args().out))

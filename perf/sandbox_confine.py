"""What file confinement costs a local sandbox: start, shell restart, base-state script, command.

    python perf/sandbox_confine.py [--rounds N] [--setups hidelist,limited,hidelist,limited]

Six set-ups on the same small repository, one after another in one run (a set-up named twice
gets a column each: interleave them against a shared machine's drifting load): no isolation
(``isolation: none``); ``namespaces``: PID and mount namespaces without file confinement (how
``auto`` ran before confinement); ``confined``: namespaces with it, on the host's root with a
hide list, without resource limits or a user of its own (how ``auto`` ran before issue 36);
``limited``: the default limits (a cgroup per sandbox) and, as root, the default unprivileged
``user``, in an allowlist root where the machine allows (``auto`` now); ``hidelist``:
``limited`` on the host's root with a hide list (how ``auto`` ran before the allowlist root, and
how it runs where the kernel refuses one); ``limited+disk``: ``limited`` with a ``disk_limit``
(a tmpfs for the sandbox's folder). For each: the time to make a sandbox (clone, venv,
snapshot), the command prefix a shell starts behind (namespaces, the confine step, the user)
running ``/bin/true``, a shell restart (``end_session`` + ``open_session``, as each reset does),
a base-state script (``diff``: the harness runs several per evaluation) and a short command in
the open shell (``true``). Prints medians and p90 in milliseconds; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from crl_worker.sandbox import isolation
from crl_worker.sandbox.config import LocalSandboxConfig
from crl_worker.sandbox.local import LocalSandbox
from crl_worker.tasks.model import Task, TestSpec, Timeouts

logger = logging.getLogger("perf.sandbox_confine")


def small_repo(path: Path) -> str:
    """A small Python repository with one commit at ``path``; returns the commit."""
    path.mkdir(parents=True)
    (path / "pkg").mkdir()
    (path / "pkg" / "__init__.py").write_text("def add(a, b):\n    return a + b\n")
    (path / "tests").mkdir()
    (path / "tests" / "test_add.py").write_text(
        "from pkg import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"
    )

    def git(*args: str) -> str:
        command = ["git", "-c", "user.name=p", "-c", "user.email=p@example.org", *args]
        return subprocess.run(command, cwd=path, check=True, capture_output=True, text=True).stdout

    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "base")
    return git("rev-parse", "HEAD").strip()


async def _times(rounds: int, step: Callable[[], Awaitable[Any]]) -> list[float]:
    found = []
    for _ in range(rounds):
        started = time.perf_counter()
        await step()
        found.append((time.perf_counter() - started) * 1000)
    return found


def _summary(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return f"{statistics.median(ordered):8.1f} {p90:8.1f}"


#: The settings of issue 36 off (resource limits, the unprivileged user): how sandboxes ran before.
BEFORE = {"mem_limit": None, "pids_limit": None, "user": "root"}
SETUPS: dict[str, dict[str, Any]] = {
    "none": {"isolation": "none", **BEFORE},
    "namespaces": {"isolation": "namespaces", **BEFORE},
    "confined": {"isolation": "namespaces", **BEFORE},
    "limited": {"isolation": "namespaces"},
    "hidelist": {"isolation": "namespaces"},
    "limited+disk": {"isolation": "namespaces", "disk_limit": "4g"},
}


async def _measure(task: Task, root: Path, mode: str, rounds: int) -> dict[str, list[float]]:
    config = LocalSandboxConfig(root=str(root), **SETUPS[mode])
    starts: list[float] = []
    sandbox: LocalSandbox | None = None
    for _ in range(max(3, rounds // 10)):
        if sandbox is not None:
            await sandbox.close()
        sandbox = LocalSandbox(config, task)
        started = time.perf_counter()
        await sandbox.start()
        starts.append((time.perf_counter() - started) * 1000)
    assert sandbox is not None
    assert sandbox.confined == (mode not in ("none", "namespaces")), (mode, sandbox.confined)
    if mode in ("hidelist", "confined") or not sandbox.confined:
        assert not sandbox.allowlist, mode
    elif not sandbox.allowlist:
        logger.warning("%s: this machine refuses an allowlist root (see the warning)", mode)

    async def restart() -> None:
        assert sandbox is not None
        await sandbox.end_session()
        await sandbox.open_session()

    async def command() -> None:
        assert sandbox is not None
        await sandbox.run("true")

    async def confine() -> None:
        # The start of a shell without the shell: namespaces, the confine step, the user.
        assert sandbox is not None
        proc = await asyncio.create_subprocess_exec(
            *sandbox.transport.prefix, "/bin/true", cwd=sandbox.workdir, env=sandbox.env
        )
        assert await proc.wait() == 0, sandbox.transport.prefix

    try:
        return {
            "sandbox start": starts,
            "confine step (prefix + true)": await _times(rounds, confine),
            "shell restart": await _times(rounds, restart),
            "base-state script (diff)": await _times(rounds, sandbox.diff),
            "command (true)": await _times(rounds, command),
        }
    finally:
        await sandbox.close()


async def main(rounds: int, setups: list[str]) -> None:
    """Measure the three set-ups and print the table."""
    with tempfile.TemporaryDirectory(prefix="crl-perf-confine-") as folder:
        repo = Path(folder) / "repo"
        base = small_repo(repo)
        task = Task(
            instance_id="perf__confine-1",
            repo="perf/confine",
            base_commit=base,
            source=str(repo),
            python=f"{sys.version_info[0]}.{sys.version_info[1]}",
            test=TestSpec(command="python -m pytest -rA {tests}", log_format="pytest"),
            timeouts=Timeouts(command=60, setup=300),
        )
        results: dict[str, dict[str, list[float]]] = {}
        real_can_confine, real_can_root = isolation.can_confine, isolation.can_root

        async def never(*_: Any, **__: Any) -> bool:
            return False

        for mode in setups:
            confine = never if mode == "namespaces" else real_can_confine
            root = never if mode in ("hidelist", "confined") else real_can_root
            isolation.can_confine, isolation.can_root = confine, root  # type: ignore[assignment]
            # A set-up named again (interleaved, against the drift of a shared machine's load)
            # gets a column of its own.
            column = mode if mode not in results else f"{mode}#{len(results)}"
            results[column] = await _measure(task, Path(folder) / "sandboxes", mode, rounds)
        isolation.can_confine, isolation.can_root = real_can_confine, real_can_root  # type: ignore[assignment]
    header = f"{'ms (median, p90)':28}" + "".join(f"{m:>18}" for m in results)
    logger.info("%s", header)
    for measure in next(iter(results.values())):
        row = "".join(f"{_summary(results[m][measure]):>18}" for m in results)
        logger.info("%-28s%s", measure, row)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40, help="timings per measure (default 40)")
    parser.add_argument(
        "--setups", default=",".join(SETUPS), help=f"comma-separated, of {', '.join(SETUPS)}"
    )
    args = parser.parse_args()
    chosen = args.setups.split(",")
    unknown = [name for name in chosen if name not in SETUPS]
    if unknown:
        parser.error(f"unknown set-up(s): {', '.join(unknown)}; choose from {', '.join(SETUPS)}")
    asyncio.run(main(args.rounds, chosen))

"""What a sandbox costs: per-command overhead against SWE-ReX and mini-swe-agent, reset vs fresh.

    python perf/sandbox_overhead.py [--commands N] [--resets N] [--fresh N] [--repo PATH]

Prints figures; asserts nothing. Targets: p50 overhead of the local sandbox at most 5 ms and at
least 3x lower than SWE-ReX's local runtime; reset under 1 s on a real repository.

Per-command overhead: the same short commands (``true`` and ``echo hi``, alternating) run one
after another in one session, timed around each call by the caller, on this machine in one run:

- ``crl local``: :class:`crl_worker.sandbox.local.LocalSandbox` (this project), ``await run``.
- ``swe-rex local``: SWE-ReX's ``LocalRuntime`` with one bash session (pexpect on a pty),
  ``await run_in_session(BashAction(...))``.
- ``mini-swe-agent``: ``LocalEnvironment.execute`` (one ``subprocess`` per command).

The peers run in their own virtual environment so they do not pollute the project's; set it up
once with::

    uv venv -p 3.11 ~/.cache/coderepairrl/bench-venv
    VIRTUAL_ENV=~/.cache/coderepairrl/bench-venv uv pip install swe-rex mini-swe-agent

(or ``--peers-python`` pointing at another interpreter that has them). A peer that is not
installed is skipped with a message. The folder keeps its ``bench-venv`` name from before these
scripts moved from ``bench/`` to ``perf/``, so a venv set up earlier still counts.

Reset versus fresh: a Python sandbox on a real repository (by default sympy 1.13.3 from its
PyPI sdist, about 2,200 files, made into a git repository under the cache; ``--repo`` takes any
local git repository), provisioned with a venv and ``compileall`` so the base state holds build
artefacts. Each reset follows a typical agent's mess (edits, a new file, deleted files, a commit,
``cd`` and ``export``); fresh is a whole new sandbox from the clone cache.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Literal

from crl_worker.sandbox.config import LocalSandboxConfig
from crl_worker.sandbox.local import LocalSandbox
from crl_worker.sandbox.repos import cache_dir
from crl_worker.tasks.model import Task, TestSpec

COMMANDS = ("true", "echo hi")
SYMPY = "sympy==1.13.3"
PEERS_PYTHON = cache_dir() / "bench-venv" / "bin" / "python"
#: The local sandboxes' isolation (``--isolation``).
ISOLATION: list[Literal["auto", "namespaces", "none"]] = ["auto"]

#: Runs in the peers' interpreter: times N commands and prints the durations as JSON.
PEER_CODE = textwrap.dedent(
    """
    import asyncio, json, sys, time
    peer, n, commands = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    times, failures = [], 0
    if peer == "swe-rex":
        from swerex.runtime.abstract import BashAction, CreateBashSessionRequest
        from swerex.runtime.local import LocalRuntime

        async def main():
            global failures
            runtime = LocalRuntime()
            await runtime.create_session(CreateBashSessionRequest())
            for i in range(n):
                action = BashAction(command=commands[i % len(commands)], timeout=30, check="silent")
                start = time.perf_counter()
                result = await runtime.run_in_session(action)
                times.append(time.perf_counter() - start)
                failures += result.exit_code != 0
            await runtime.close()

        asyncio.run(main())
    else:
        from minisweagent.environments.local import LocalEnvironment

        env = LocalEnvironment()
        for i in range(n):
            start = time.perf_counter()
            result = env.execute({"command": commands[i % len(commands)]})
            times.append(time.perf_counter() - start)
            failures += result["returncode"] != 0
    print(json.dumps({"times": times, "failures": failures}))
    """
)


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def make_repo(root: Path) -> Path:
    """A git repository of sympy's sdist under the cache (built once)."""
    repo = root / "sympy-repo"
    if (repo / ".git").exists():
        return repo
    downloads = root / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    if not list(downloads.glob("sympy-*.tar.gz")):
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
             SYMPY, "-d", str(downloads)],
            check=True,
        )  # fmt: skip
    (sdist,) = downloads.glob("sympy-*.tar.gz")
    staging = Path(tempfile.mkdtemp(dir=root))
    with tarfile.open(sdist) as tar:
        tar.extractall(staging, filter="data")
    (top,) = staging.iterdir()
    top.rename(repo)
    shutil.rmtree(staging)
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@coderepair.io"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    (repo / ".gitignore").write_text("__pycache__/\n*.pyc\n*.egg-info/\nbuild/\n")
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "sympy sdist"], cwd=repo, check=True)
    return repo


def task_for(repo: Path, **changes: object) -> Task:
    """A task on ``repo`` at its HEAD."""
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, check=True, capture_output=True, text=True
    ).stdout.strip()
    fields: dict[str, object] = {
        "instance_id": "bench-1",
        "repo": f"bench/{repo.name}",
        "base_commit": head,
        "source": str(repo),
        "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
        "test": TestSpec(command="true", log_format="pytest"),
    }
    fields.update(changes)
    return Task.model_validate(fields)


async def crl_overhead(n: int, root: Path, repo: Path) -> dict[str, object]:
    """Our local sandbox: N commands in one session."""
    task = task_for(repo, language="other")
    times: list[float] = []
    failures = 0
    async with LocalSandbox(
        LocalSandboxConfig(root=str(root), isolation=ISOLATION[0]), task
    ) as sandbox:
        for _ in range(50):  # warm-up
            await sandbox.run("true")
        for i in range(n):
            start = time.perf_counter()
            result = await sandbox.run(COMMANDS[i % len(COMMANDS)])
            times.append(time.perf_counter() - start)
            failures += result.exit_code != 0
    return {"times": times, "failures": failures}


def peer_overhead(peer: str, n: int, python: Path) -> dict[str, object] | str:
    """A peer's figures, or why it was skipped."""
    if not python.exists():
        return f"skipped: {python} does not exist (see the setup in this script's docstring)"
    module = "swerex" if peer == "swe-rex" else "minisweagent"
    probe = subprocess.run([str(python), "-c", f"import {module}"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"skipped: {module} is not installed in {python}"
    proc = subprocess.run(
        [str(python), "-c", PEER_CODE, peer, str(n), *COMMANDS],
        capture_output=True,
        text=True,
        env={**os.environ, "MSWEA_SILENT_STARTUP": "1"},
    )
    if proc.returncode != 0:
        return f"failed: {proc.stderr.strip()[-500:]}"
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


async def reset_versus_fresh(
    repo: Path, root: Path, resets: int, fresh: int
) -> tuple[list[float], list[float], int]:
    """Reset times after an agent's mess, fresh-sandbox times, and the repository's file count."""
    task = task_for(repo, install=["python -m compileall -q sympy >/dev/null"])
    config = LocalSandboxConfig(root=str(root), isolation=ISOLATION[0])
    mess = (
        "echo '# edited' >> sympy/core/basic.py; echo 'x = 1' > sympy/new_module.py; "
        "rm -r sympy/polys/tests; python -c 'import compileall; compileall.compile_file(\"sympy/core/basic.py\", quiet=1)'; "
        "git add -A; git -c user.name=a -c user.email=a@b commit -qm agent; "
        "cd sympy; export AGENT=1"
    )
    reset_times: list[float] = []
    async with LocalSandbox(config, task) as sandbox:
        files = (await sandbox.run("git ls-files | wc -l")).output.strip()
        for _ in range(resets):
            result = await sandbox.run(mess, timeout=120)
            assert result.exit_code == 0, result.output
            start = time.perf_counter()
            await sandbox.reset()
            reset_times.append(time.perf_counter() - start)
            status = await sandbox.run("git status --porcelain; echo $AGENT; pwd")
            assert status.output == f"\n{sandbox.workdir}\n", status.output
    fresh_times = []
    for _ in range(fresh):
        start = time.perf_counter()
        async with LocalSandbox(config, task):
            fresh_times.append(time.perf_counter() - start)
    return reset_times, fresh_times, int(files)


def row(name: str, result: dict[str, object] | str, ours_p50: float | None) -> str:
    """One line of the overhead table."""
    if isinstance(result, str):
        return f"{name:<18} {result}"
    times = [float(t) for t in result["times"]]  # type: ignore[attr-defined]
    p50, p99 = percentile(times, 0.5), percentile(times, 0.99)
    ratio = f"{p50 / ours_p50:7.1f}x" if ours_p50 else "       -"
    return (
        f"{name:<18} {len(times):>6} {p50 * 1e3:>9.2f} {p99 * 1e3:>9.2f} "
        f"{statistics.fmean(times) * 1e3:>9.2f} {ratio} {result['failures']:>8}"
    )


def main() -> None:
    """Run the measurements and print them."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--commands", type=int, default=2000, help="commands per contender")
    parser.add_argument("--resets", type=int, default=20)
    parser.add_argument("--fresh", type=int, default=3)
    parser.add_argument("--repo", type=Path, help="a local git repository (default: sympy)")
    parser.add_argument("--peers-python", type=Path, default=PEERS_PYTHON)
    parser.add_argument("--skip-peers", action="store_true")
    parser.add_argument(
        "--isolation",
        choices=["auto", "namespaces", "none"],
        default="auto",
        help="the local sandboxes' isolation (namespaces cost a little at start and reset)",
    )
    args = parser.parse_args()
    ISOLATION[0] = args.isolation

    bench_root = cache_dir() / "bench"
    bench_root.mkdir(parents=True, exist_ok=True)
    repo = args.repo.resolve() if args.repo else make_repo(bench_root)
    load = os.getloadavg()
    print(f"isolation: {args.isolation}")
    print(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")

    with tempfile.TemporaryDirectory(prefix="crl-bench-") as tmp:
        root = Path(tmp)
        ours = asyncio.run(crl_overhead(args.commands, root, repo))
        peers: dict[str, dict[str, object] | str] = {}
        for peer in ("swe-rex", "mini-swe-agent"):
            peers[peer] = (
                "skipped (--skip-peers)"
                if args.skip_peers
                else peer_overhead(peer, args.commands, args.peers_python)
            )
        ours_p50 = percentile([float(t) for t in ours["times"]], 0.5)  # type: ignore[attr-defined]

        print(f"\nper-command overhead ({' / '.join(COMMANDS)}, alternating, one session each)")
        print(f"{'':<18} {'n':>6} {'p50 ms':>9} {'p99 ms':>9} {'mean ms':>9} {'vs crl':>8} "
              f"{'failures':>8}")  # fmt: skip
        print(row("crl local", ours, None))
        print(row("swe-rex local", peers["swe-rex"], ours_p50))
        print(row("mini-swe-agent", peers["mini-swe-agent"], ours_p50))

        resets, fresh, files = asyncio.run(reset_versus_fresh(repo, root, args.resets, args.fresh))
    print(f"\nreset versus fresh sandbox: {repo.name} ({files} tracked files, venv + compileall)")
    print(f"{'':<18} {'n':>6} {'p50 s':>9} {'max s':>9}")
    print(f"{'reset':<18} {len(resets):>6} {percentile(resets, 0.5):>9.3f} {max(resets):>9.3f}")
    print(
        f"{'fresh sandbox':<18} {len(fresh):>6} {percentile(fresh, 0.5):>9.3f} {max(fresh):>9.3f}"
    )


if __name__ == "__main__":
    main()

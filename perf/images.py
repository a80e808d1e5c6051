"""Component images and the Docker sandbox, measured against a real engine on this machine.

    python perf/images.py [--components operator worker trainer-cpu] [--commands N] [--resets N]

Prints figures; asserts nothing. Needs root, Debian's docker.io and debootstrap (the engine and
the base images of tests/fixtures/docker.py: dockerd on its own socket, Debian bookworm with
python3 and python3-venv built from Debian packages, since no registry is reachable here).

- Images: each component built by ``images/build.sh`` on that base with ``--network host`` (the
  engine has no default bridge), cold (``--no-cache``: every step again, PyPI downloads
  included) then warm (nothing changed: every step from the cache); the size ``docker images``
  reports. ``trainer-cpu`` (only when named: it needs about 14 GB of disk while it is measured,
  and is removed afterwards) gets PyPI's torch (``--torch-index ''``): the PyTorch CPU index is
  not reachable here, so its figure includes the CUDA libraries the lock pins.
- Docker sandbox: start (container create + base-state snapshot + session) on a small real
  repository (tests/fixtures' calendarkit at /testbed), the exec round trip of ``true`` / ``echo
  hi`` in the session, p50 and p99, against the local sandbox on the same repository in the same
  run, and reset after a typical agent's mess versus a fresh container.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from crl_worker.sandbox.config import DockerSandboxConfig, LocalSandboxConfig  # noqa: E402
from crl_worker.sandbox.docker import DockerSandbox  # noqa: E402
from crl_worker.sandbox.local import LocalSandbox  # noqa: E402
from crl_worker.sandbox.shell import ShellSandbox  # noqa: E402
from crl_worker.tasks.model import TestSpec  # noqa: E402
from tests.fixtures.docker import (  # noqa: E402
    PYTHON_PACKAGES,
    SANDBOX_PACKAGES,
    DockerEngine,
    debian_image,
    missing_tools,
    running_engine,
)
from tests.fixtures.repos import unittest_repo  # noqa: E402

COMPONENTS = ("operator", "worker", "trainer-cpu", "trainer-cuda")
COMMANDS = ("true", "echo hi")
MESS = (
    "echo broken > calendarkit/__init__.py; rm -r tests; echo new > new.txt; git add -A; "
    "git -c user.name=a -c user.email=a@b commit -qm agent; cd calendarkit; export SECRET=1"
)


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def tag_of(component: str, version: str) -> str:
    """The tag build.sh gives ``component`` under the registry ``crl-perf``."""
    if component.startswith("trainer-"):
        return f"crl-perf/trainer:{version}-{component.removeprefix('trainer-')}"
    return f"crl-perf/{component}:{version}"


def build(engine: DockerEngine, component: str, base: str, *, cold: bool) -> float:
    """Seconds ``images/build.sh`` takes for ``component`` (raises with its output on failure)."""
    args = ["bash", "images/build.sh", "--registry", "crl-perf", "--network", "host"]
    args += ["--base-image", base, "--cuda-base-image", base, "--torch-index", ""]
    if cold:
        args.append("--no-cache")
    started = time.monotonic()
    done = subprocess.run(
        [*args, component], cwd=ROOT, env=engine.env(), capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"building {component} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return time.monotonic() - started


def image_size(engine: DockerEngine, tag: str) -> float:
    """The image's size in MB (10^6 bytes, as ``docker images`` counts)."""
    out = engine.cli("image", "inspect", "--format", "{{.Size}}", tag).stdout
    return int(out.strip()) / 1e6


def images(engine: DockerEngine, components: list[str]) -> None:
    """Cold and warm build times and sizes of ``components``."""
    version = subprocess.run(
        ["sed", "-n", 's/^version = "\\(.*\\)"$/\\1/p', "pyproject.toml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[0]
    base = debian_image(engine, PYTHON_PACKAGES)
    base_size = image_size(engine, base)
    print(f"\nimages (base {base}: Debian bookworm + python3, {base_size:.0f} MB)")
    print(f"{'':<14} {'cold s':>8} {'warm s':>8} {'size MB':>9} {'over base':>10}")
    for component in components:
        cold = build(engine, component, base, cold=True)
        warm = build(engine, component, base, cold=False)
        size = image_size(engine, tag_of(component, version))
        print(f"{component:<14} {cold:>8.1f} {warm:>8.1f} {size:>9.0f} {size - base_size:>10.0f}")
        if component.startswith("trainer"):
            # 6.5 GB, and as much again in the builder stage: given back at once
            engine.cli("rmi", tag_of(component, version))
            engine.cli("image", "prune", "--force")


async def round_trips(sandbox: ShellSandbox, n: int) -> list[float]:
    """Seconds of ``n`` short commands, alternating, in the sandbox's session."""
    times = []
    for i in range(n):
        started = time.perf_counter()
        await sandbox.run(COMMANDS[i % 2])
        times.append(time.perf_counter() - started)
    return times


async def sandboxes(engine: DockerEngine, workdir: Path, commands: int, resets: int) -> None:
    """Docker sandbox start, exec round trips (vs local), reset vs a fresh container."""
    fixture = unittest_repo(workdir, python="python3")
    base = debian_image(engine, SANDBOX_PACKAGES)
    (workdir / "Dockerfile").write_text(f"FROM {base}\nCOPY calendarkit /testbed\n")
    built = engine.cli("build", "-q", "-t", "crl-perf/calendarkit:1", str(workdir))
    if built.returncode != 0:
        raise RuntimeError(built.stderr)
    task = fixture.task.model_copy(
        update={
            "image": "crl-perf/calendarkit:1",
            "source": None,
            "test": TestSpec(command="python3 -m unittest {tests}", log_format="unittest"),
        }
    )
    docker_config = DockerSandboxConfig(base_url=engine.host, network="none", pull="never")

    starts = []
    for _ in range(resets):
        started = time.perf_counter()
        sandbox = DockerSandbox(docker_config, task)
        await sandbox.start()
        starts.append(time.perf_counter() - started)
        await sandbox.close()

    local_task = fixture.task.model_copy(update={"language": "other", "install": []})
    local = LocalSandbox(LocalSandboxConfig(root=str(workdir)), local_task)
    docker = DockerSandbox(docker_config, task)
    await local.start()
    await docker.start()
    try:
        await round_trips(docker, 20)  # warm both up
        await round_trips(local, 20)
        docker_times = await round_trips(docker, commands)
        local_times = await round_trips(local, commands)
        reset_times = []
        for _ in range(resets):
            await docker.run(MESS)
            started = time.perf_counter()
            await docker.reset()
            reset_times.append(time.perf_counter() - started)
    finally:
        await docker.close()
        await local.close()

    print(f"\ndocker sandbox (calendarkit at /testbed, {len(starts)} starts)")
    print(
        f"{'start (fresh container)':<26} p50 {statistics.median(starts):.3f} s, max {max(starts):.3f} s"
    )
    print(
        f"{'reset after a mess':<26} p50 {statistics.median(reset_times):.3f} s, "
        f"max {max(reset_times):.3f} s"
    )
    print(f"\nexec round trip ({' / '.join(COMMANDS)}, alternating, {commands} each)")
    print(f"{'':<10} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
    for name, times in (("docker", docker_times), ("local", local_times)):
        print(
            f"{name:<10} {percentile(times, 0.5) * 1e3:>8.2f} {percentile(times, 0.99) * 1e3:>8.2f}"
            f" {statistics.fmean(times) * 1e3:>8.2f}"
        )


def main() -> None:
    """Parse the arguments, start the engine, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--components",
        nargs="*",
        default=["operator", "worker"],
        help="images to build (trainer-cpu / trainer-cuda: minutes, and about 14 GB of disk "
        "while they are measured)",
    )
    parser.add_argument("--commands", type=int, default=500)
    parser.add_argument("--resets", type=int, default=10)
    parser.add_argument("--no-sandbox", action="store_true", help="images only")
    args = parser.parse_args()
    unknown = set(args.components) - set(COMPONENTS)
    if unknown:
        parser.error(f"unknown components {sorted(unknown)}; choose from {COMPONENTS}")
    problem = missing_tools()
    if problem:
        sys.exit(f"perf/images.py: {problem}")
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    with (
        tempfile.TemporaryDirectory(prefix="crl-perf-images-") as tmp,
        running_engine(Path(tmp) / "engine") as process,
    ):
        engine = process.engine
        version = engine.cli("version", "--format", "{{.Server.Version}}").stdout.strip()
        print(f"engine: dockerd {version}, data root {engine.data_root}")
        if args.components:
            images(engine, args.components)
        if not args.no_sandbox:
            asyncio.run(sandboxes(engine, Path(tmp) / "repo", args.commands, args.resets))


if __name__ == "__main__":
    main()

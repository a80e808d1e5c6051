"""Task images of the bundled suite: cold and warm build times, sizes, and the Docker sandbox's
verdicts and time against the local sandbox's, in one run.

    python perf/task_images.py [--jobs 2] [--java] [--polyglot]

Starts its own Docker engine (tests/fixtures/docker.py: dockerd on its own socket, data root in
the cache) and builds the Debian base images the tests use (``git python3 python3-venv``, and
with ``--java`` ``git openjdk-17-jdk-headless maven``), which stand for the public bases a user
builds from. Then:

- **cold**: every layer of every task built (a prefix of its own, so no layer is found by its
  tag, and no build cache, so every step runs);
- **warm**: the same again (every layer found by its content tag);
- **one task changed**: one task's install commands changed, so only its instance layer builds;
- **verdicts**: ``check_tasks`` (gold and no patch) on the Docker backend (no network) and on
  the local backend, with their wall times;
- with ``--polyglot``, the bundled polyglot suite (Go, Rust, C++, JavaScript) on a Debian
  trixie base with those toolchains: its images' build time and sizes, and each exercise's gold
  test run (the evaluation's own duration) in its container and in a local sandbox, one
  exercise at a time.

Prints figures; asserts nothing. The machine's load average is printed, since the seconds are
only comparable on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crl_worker.harness.check import InstanceCheck, check_tasks
from crl_worker.sandbox.images import TaskImage, TaskImageBuilder
from crl_worker.tasks.loaders import load_tasks
from crl_worker.tasks.model import Task
from tests.fixtures.docker import (
    JAVA_PACKAGES,
    POLYGLOT_PACKAGES,
    POLYGLOT_SUITE,
    SANDBOX_PACKAGES,
    DockerEngine,
    debian_image,
    running_engine,
)
from tests.fixtures.repos import java_repo

SUITE = Path(__file__).resolve().parents[1] / "examples" / "suites" / "mini" / "tasks.jsonl"
POLYGLOT = SUITE.parents[1] / "polyglot" / "tasks.jsonl"


def _timed_build(
    builder: TaskImageBuilder, tasks: list[Task], jobs: int
) -> tuple[float, list[TaskImage]]:
    started = time.perf_counter()
    results = asyncio.run(builder.build_all(tasks, jobs=jobs))
    return time.perf_counter() - started, results


def _layers(results: list[TaskImage]) -> str:
    counts: dict[str, int] = {}
    for r in results:
        for layer in r.built:
            counts[layer] = counts.get(layer, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "nothing"


def _verdicts(checks: list[InstanceCheck]) -> str:
    gold = sum(c.gold_verdict == "resolved" for c in checks)
    none = sum(c.no_patch_verdict == "resolved" for c in checks)
    return f"gold {gold}/{len(checks)} resolved, no patch {none}/{len(checks)} resolved"


def _sizes(engine: DockerEngine, prefix: str) -> list[str]:
    """``repository size`` of every image under ``prefix`` (each size includes its parents)."""
    out = engine.cli(
        "image", "ls", "--filter", f"reference={prefix}*", "--filter", f"reference={prefix}*/*",
        "--format", "{{.Repository}} {{.Size}}",
    ).stdout.split("\n")  # fmt: skip
    return sorted({line for line in out if line.strip()})


def _gold_seconds(task: Task, config: Mapping[str, object]) -> float | None:
    """The gold patch's test run in one sandbox of ``config`` (the evaluation's duration)."""
    (check,) = asyncio.run(check_tasks([task], sandbox_config=config))
    runs = [r.duration for r in check.gold if r.duration is not None and r.resolved]
    return runs[0] if runs else None


def _polyglot(
    engine: DockerEngine, prefix: str, docker_config: Mapping[str, object], jobs: int
) -> None:
    """The polyglot suite's images on a trixie base, and its gold runs per backend."""
    started = time.perf_counter()
    base = debian_image(engine, POLYGLOT_PACKAGES, suite=POLYGLOT_SUITE)
    print(f"\nDebian {POLYGLOT_SUITE} base with {' '.join(POLYGLOT_PACKAGES)}: "
          f"{time.perf_counter() - started:.1f} s")  # fmt: skip
    tasks = load_tasks(POLYGLOT, "polyglot").tasks
    bases = dict.fromkeys(("go", "rust", "cpp", "javascript"), base)
    builder = TaskImageBuilder(engine.client(), prefix=f"{prefix}-pg", bases=bases, no_cache=True)
    build_s, built = _timed_build(builder, tasks, jobs)
    print(f"polyglot suite: {len(tasks)} images in {build_s:.1f} s ({_layers(built)})")
    for r in built:
        if not r.ok:
            print(f"  {r.instance_id}: {r.error}")
    print("image sizes (each includes its parents; the base alone is the toolchains):")
    print(f"  {base} {engine.cli('image', 'ls', base, '--format', '{{.Size}}').stdout.strip()}")
    for line in _sizes(engine, f"{prefix}-pg"):
        print(f"  {line}")
    print(f"\n{'exercise':26}{'local gold run':>16}{'docker gold run':>17}  (seconds)")
    for task, image in zip(tasks, built, strict=True):
        if not image.ok:
            continue
        local = _gold_seconds(task, {"type": "local"})
        docker = _gold_seconds(task.model_copy(update={"image": image.image}), docker_config)
        cells = [f"{s:.2f}" if s is not None else "unresolved" for s in (local, docker)]
        print(f"{task.instance_id:26}{cells[0]:>16}{cells[1]:>17}")


def main(argv: list[str] | None = None) -> int:
    """Build, rebuild, check; print the figures."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=2, help="tasks built and checked at a time")
    p.add_argument("--java", action="store_true", help="also the Java fixture (Maven)")
    p.add_argument(
        "--polyglot", action="store_true", help="also the bundled Go, Rust, C++, JavaScript suite"
    )
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    load_before = os.getloadavg()
    tasks = load_tasks(SUITE, "task").tasks
    with running_engine(Path(tempfile.mkdtemp(prefix="crl-perf-docker-"))) as process:
        engine = process.engine
        started = time.perf_counter()
        base = debian_image(engine, SANDBOX_PACKAGES)
        print(
            f"Debian base with {' '.join(SANDBOX_PACKAGES)}: {time.perf_counter() - started:.1f} s ({base})"
        )
        prefix = f"crl-perf-{uuid.uuid4().hex[:6]}"
        # Cold: every step run (no build cache); the other two runs as a user's would.
        cold_builder = TaskImageBuilder(
            engine.client(), prefix=prefix, bases={"python": base}, no_cache=True
        )
        builder = TaskImageBuilder(engine.client(), prefix=prefix, bases={"python": base})

        cold_s, cold = _timed_build(cold_builder, tasks, a.jobs)
        failed = [r for r in cold if not r.ok]
        if failed:
            print(f"{len(failed)} tasks failed: {failed[0].error}")
            return 1
        warm_s, warm = _timed_build(builder, tasks, a.jobs)
        changed = [
            t.model_copy(update={"install": [*t.install, "true"]}) if i == 0 else t
            for i, t in enumerate(tasks)
        ]
        one_s, one = _timed_build(builder, changed, a.jobs)

        print(f"\nbundled suite: {len(tasks)} tasks, {a.jobs} at a time")
        print(f"{'build':28}{'seconds':>10}  layers built")
        for name, seconds, results in (
            ("cold", cold_s, cold),
            ("warm (nothing changed)", warm_s, warm),
            ("one task's install changed", one_s, one),
        ):
            print(f"{name:28}{seconds:>10.1f}  {_layers(results)}")

        print("\nimage sizes (each includes its parents):")
        for line in _sizes(engine, prefix):
            print(f"  {line}")

        with_images = [
            t.model_copy(update={"image": r.image}) for t, r in zip(tasks, cold, strict=True)
        ]
        docker_config = {
            "type": "docker",
            "base_url": engine.host,
            "network": "none",
            "pull": "never",
        }
        print(f"\n{'gold and no patch, per backend':32}{'seconds':>10}  verdicts")
        for name, config, subject in (
            ("docker (no network)", docker_config, with_images),
            ("local", {"type": "local"}, tasks),
        ):
            started = time.perf_counter()
            checks = asyncio.run(check_tasks(subject, sandbox_config=config, jobs=a.jobs))
            print(f"{name:32}{time.perf_counter() - started:>10.1f}  {_verdicts(checks)}")

        if a.java:
            started = time.perf_counter()
            java_base = debian_image(engine, JAVA_PACKAGES)
            print(
                f"\nDebian base with {' '.join(JAVA_PACKAGES)}: {time.perf_counter() - started:.1f} s"
            )
            java = java_repo(Path(tempfile.mkdtemp(prefix="crl-perf-java-"))).task
            jbuilder = TaskImageBuilder(
                engine.client(), prefix=prefix, bases={"java": java_base}, no_cache=True
            )
            java_s, (built,) = _timed_build(jbuilder, [java], 1)
            print(
                f"Java fixture image (Maven warm-up included): {java_s:.1f} s, {built.error or 'ok'}"
            )
            if built.ok:
                started = time.perf_counter()
                checks = asyncio.run(
                    check_tasks(
                        [java.model_copy(update={"image": built.image})],
                        sandbox_config=docker_config,
                    )
                )
                print(
                    f"Java fixture in its container: {time.perf_counter() - started:.1f} s, {_verdicts(checks)}"
                )
        if a.polyglot:
            _polyglot(engine, prefix, docker_config, a.jobs)
        # Untag by name (an image id may also carry the tests' tags: the same layers).
        mine = engine.cli(
            "image", "ls", "--filter", f"reference={prefix}*", "--filter",
            f"reference={prefix}*/*", "--format", "{{.Repository}}:{{.Tag}}",
        ).stdout.split()  # fmt: skip
        if mine:
            engine.cli("image", "rm", *mine)
    load_after = os.getloadavg()
    print(
        "\nload average (1, 5, 15 min) before: {:.2f} {:.2f} {:.2f}, after: {:.2f} {:.2f} {:.2f}".format(
            *load_before, *load_after
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

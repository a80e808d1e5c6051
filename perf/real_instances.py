"""Real benchmark instances through ``check_tasks``: verdicts, flakiness and throughput, local
sandboxes against Docker sandboxes in the same run (its results: perf/real_instances.md; how to run
it: docs/validation.md).

    python perf/real_instances.py [--suite lite|verified|gitbug|byo ...] [--repo owner/name ...]
                                  [--instance ID ...] [--runs 3] [--jobs 1] [--docker] [--httpbin URL] [--json FILE]

Instances (nothing of them is committed; tests/fixtures/fetched.py finds the fetched copies):

- ``lite``, ``verified``: ``shared/data``'s SWE-bench Lite and Verified-sample records of the
  repositories given with ``--repo`` (default: pallets/flask, pytest-dev/pytest, psf/requests),
  with their recipes; an instance in both files is taken once (from Lite);
- ``gitbug``: GitBug-Java bugs of small Maven projects, read from GitBug-Java's data files
  (``clone_url`` dropped: the fetched copies are found through ``$CRL_GIT_MIRROR``);
- ``byo``: the two bug fixes of repositories no recipe knows (click, marshmallow) as raw
  SWE-bench records (tests/test_real_instances.py).

Each instance is checked ``--runs`` times with its gold patch and without (``crl tasks check``'s
rules: gold resolves, no patch does not, no listed test changes status between runs). With
``--docker`` the same instances are then checked in Docker sandboxes (no network) from images
``crl tasks images`` builds on Debian bookworm bases (tests/fixtures/docker.py: Python 3.11,
OpenJDK 17 and Maven): tasks whose recipe asks for another Python are listed as not run there.
Image builds are timed apart from the checks. ``--httpbin URL`` gives requests' tests a local
httpbin (their ``HTTPBIN_URL``) instead of httpbin.org.

Prints a table per repository (instances, gold resolved, no patch resolved, flaky, valid,
seconds) per backend, each instance's problems, and throughput in instances per minute. Asserts
nothing. The machine's load average is printed: the seconds are only comparable on an otherwise
idle machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crl_worker.harness.check import InstanceCheck, check_tasks
from crl_worker.sandbox.images import TaskImageBuilder
from crl_worker.tasks.loaders import load_records
from crl_worker.tasks.model import Task
from crl_worker.tasks.records import rows_with_refs
from tests.fixtures.docker import JAVA_PACKAGES, SANDBOX_PACKAGES, debian_image, running_engine
from tests.fixtures.fetched import fetched, git_mirror
from tests.fixtures.real_instances import DATA, PAIRS, gitbug_records, swebench_record

#: The Python of the Debian bookworm base images.
DOCKER_PYTHON = "3.11"
DEFAULT_REPOS = ("pallets/flask", "pytest-dev/pytest", "psf/requests")
#: GitBug-Java bugs of small Maven projects: (data file, fixing commit).
GITBUG = (
    ("davidmoten-word-wrap", "e59eedf0bac7"),
    ("semver4j-semver4j", "10102b374298"),
    ("semver4j-semver4j", "de7dadc7ece6"),
    ("semver4j-semver4j", "beb7e5d466c7"),
    ("klausbrunner-solarpositioning", "79c0044373b4"),
    ("klausbrunner-solarpositioning", "4d35aecb4840"),
    ("cdimascio-dotenv-java", "bbfbcfa63e3a"),
)


def _swebench(files: Sequence[str], repos: Sequence[str], httpbin: str | None) -> list[Task]:
    rows: dict[str, dict[str, Any]] = {}
    for name in files:
        for line in (DATA / name).read_text().splitlines():
            record = json.loads(line)
            if record["repo"] in repos and record["instance_id"] not in rows:
                if httpbin and record["repo"] == "psf/requests":
                    # With the slash: requests 0.14's tests append paths to it ("…/post").
                    record["env"] = {"HTTPBIN_URL": httpbin.rstrip("/") + "/"}
                rows[record["instance_id"]] = record
    return _convert(list(rows.values()), "swe-bench")


def _convert(rows: list[dict[str, Any]], format: str) -> list[Task]:
    result = load_records(rows_with_refs(rows), format, strict=True)  # type: ignore[arg-type]
    return result.tasks


def instances(suites: Sequence[str], repos: Sequence[str], httpbin: str | None) -> list[Task]:
    """The tasks of ``suites`` whose repositories this machine has copies of."""
    tasks: list[Task] = []
    if "lite" in suites or "verified" in suites:
        files = [
            f
            for s, f in (
                ("lite", "swe-bench-lite.jsonl"),
                ("verified", "swe-bench-verified-sample50.jsonl"),
            )
            if s in suites
        ]
        tasks += _swebench(files, repos, httpbin)
    if "gitbug" in suites:
        data = fetched("gitbugactions/gitbug-java")
        if data is None:
            print("gitbug: no fetched copy of gitbugactions/gitbug-java: left out")
        else:
            tasks += _convert(gitbug_records(data, GITBUG), "gitbug-java")
    if "byo" in suites:
        rows = [swebench_record(p, path) for p in PAIRS if (path := fetched(p.repo)) is not None]
        tasks += _convert(rows, "swe-bench")
    missing = sorted({t.repo for t in tasks if fetched(t.repo) is None})
    if missing:
        print(f"no fetched copy of {', '.join(missing)}: their instances are left out")
    return [t for t in tasks if t.repo not in missing]


def _table(
    title: str, tasks: Sequence[Task], checks: Sequence[InstanceCheck], seconds: float
) -> None:
    by_repo: dict[str, list[InstanceCheck]] = defaultdict(list)
    repo_of = {t.instance_id: t.repo for t in tasks}
    for c in checks:
        by_repo[repo_of[c.instance_id]].append(c)
    print(f"\n{title}: {len(checks)} instances in {seconds:.0f} s")
    header = (
        f"{'repository':32}{'tried':>6}{'gold ok':>9}{'empty ok':>10}{'flaky':>7}"
        f"{'checked ok':>12}{'valid':>7}"
    )
    print(header)
    for repo in sorted(by_repo):
        rows = by_repo[repo]
        print(
            f"{repo:32}{len(rows):>6}"
            f"{sum(c.gold_verdict == 'resolved' for c in rows):>9}"
            f"{sum(c.no_patch_verdict == 'resolved' for c in rows):>10}"
            f"{sum(bool(c.flaky) for c in rows):>7}"
            f"{_checked(rows):>12}"
            f"{sum(c.ok for c in rows):>7}"
        )
    for c in checks:
        seconds_each = sum(r.duration for r in [*c.gold, *c.no_patch])
        line = f"  {c.instance_id}: gold {c.gold_verdict}, no patch {c.no_patch_verdict}"
        if c.confirmed:
            line += f", gold through the integrity check {c.integrity_verdict}"
        line += f", {seconds_each:.0f} s of tests"
        if c.problems:
            line += "; " + " | ".join(p.splitlines()[0][:240] for p in c.problems[:3])
        print(line)
    if seconds > 0:
        print(f"throughput: {60 * len(checks) / seconds:.2f} instances per minute")


def _checked(rows: Sequence[InstanceCheck]) -> str:
    """How many gold patches the integrity check confirmed ("-" when it did not run)."""
    if not any(c.confirmed for c in rows):
        return "-"
    return str(sum(c.integrity_verdict == "resolved" for c in rows))


def _timed_check(
    tasks: list[Task],
    config: dict[str, Any],
    runs: int,
    jobs: int,
    partial: Path | None = None,
    integrity: bool = False,
) -> tuple[list[InstanceCheck], float]:
    """Check ``tasks``; each instance's verdict is printed (and appended to ``partial``) as it
    finishes, so a run stopped part-way keeps what it found."""
    started = time.perf_counter()

    def done(check: InstanceCheck) -> None:
        print(
            f"  done: {check.instance_id}: gold {check.gold_verdict}, "
            f"no patch {check.no_patch_verdict}, flaky {len(check.flaky)}, "
            f"{time.perf_counter() - started:.0f} s",
            flush=True,
        )
        if partial is not None:
            with partial.open("a") as out:
                out.write(json.dumps({"backend": config["type"], **check.to_dict()}) + "\n")

    checks = asyncio.run(
        check_tasks(
            tasks,
            sandbox_config=config,
            runs=runs,
            jobs=jobs,
            progress=done,
            integrity=integrity,
        )
    )
    return checks, time.perf_counter() - started


def _docker(
    tasks: list[Task], runs: int, jobs: int, integrity: bool = False
) -> list[dict[str, Any]]:
    runnable = [t for t in tasks if t.language == "java" or t.python in (None, DOCKER_PYTHON)]
    for t in tasks:
        if t not in runnable:
            print(f"docker: {t.instance_id} not run (its recipe asks for Python {t.python})")
    if not runnable:
        return []
    with running_engine(Path(tempfile.mkdtemp(prefix="crl-perf-docker-"))) as process:
        engine = process.engine
        bases = {"python": debian_image(engine, SANDBOX_PACKAGES)}
        if any(t.language == "java" for t in runnable):
            bases["java"] = debian_image(engine, JAVA_PACKAGES)
        builder = TaskImageBuilder(engine.client(), prefix="crl-real", bases=bases)
        started = time.perf_counter()
        built = asyncio.run(builder.build_all(runnable, jobs=jobs))
        print(f"\ndocker images: {len(built)} built in {time.perf_counter() - started:.0f} s")
        with_images = []
        for task, image in zip(runnable, built, strict=True):
            if image.ok:
                with_images.append(task.model_copy(update={"image": image.image}))
            else:
                print(f"docker: {task.instance_id}: image failed: {str(image.error)[:300]}")
        config = {"type": "docker", "base_url": engine.host, "network": "none", "pull": "never"}
        checks, seconds = _timed_check(with_images, config, runs, jobs, integrity=integrity)
        _table(f"docker, {runs} runs", with_images, checks, seconds)
    return [{"backend": "docker", "seconds": seconds, **c.to_dict()} for c in checks]


def main(argv: list[str] | None = None) -> int:
    """Check the instances with each backend; print the tables."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", action="append", choices=["lite", "verified", "gitbug", "byo"])
    p.add_argument("--repo", action="append", help="SWE-bench repositories (owner/name)")
    p.add_argument("--instance", action="append", help="only this instance id (repeatable)")
    p.add_argument("--runs", type=int, default=3, help="runs of each patch (flakiness)")
    p.add_argument("--jobs", type=int, default=1, help="instances at a time")
    p.add_argument("--docker", action="store_true", help="also in Docker sandboxes")
    p.add_argument("--httpbin", help="HTTPBIN_URL for psf/requests' tests")
    p.add_argument("--json", type=Path, help="write every instance's check here (JSONL)")
    p.add_argument(
        "--integrity",
        action="store_true",
        help="also grade each gold patch through the integrity check (canaries): false alarms",
    )
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    load_before = os.getloadavg()
    tasks = instances(
        a.suite or ["lite", "verified", "gitbug", "byo"], a.repo or DEFAULT_REPOS, a.httpbin
    )
    if a.instance:
        tasks = [t for t in tasks if t.instance_id in a.instance]
    mirror = Path(tempfile.mkdtemp(prefix="crl-real-mirror-"))
    copies = {t.repo: path for t in tasks if (path := fetched(t.repo)) is not None}
    os.environ["CRL_GIT_MIRROR"] = str(git_mirror(copies, mirror))
    partial = a.json.with_suffix(a.json.suffix + ".partial") if a.json else None
    checks, seconds = _timed_check(
        tasks, {"type": "local"}, a.runs, a.jobs, partial, integrity=a.integrity
    )
    _table(f"local, {a.runs} runs", tasks, checks, seconds)
    rows = [{"backend": "local", "seconds": seconds, **c.to_dict()} for c in checks]
    if a.docker:
        rows += _docker(tasks, a.runs, a.jobs, a.integrity)
    if a.json:
        a.json.write_text("".join(json.dumps(r) + "\n" for r in rows))
    load_after = os.getloadavg()
    print(
        "\nload average (1, 5, 15 min) before: {:.2f} {:.2f} {:.2f}, after: {:.2f} {:.2f} {:.2f}".format(
            *load_before, *load_after
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""Build the mini suite from its plain-text sources: one git bundle per repository and tasks.jsonl.

Layout of ``src/<name>/``:

- ``repo.json``: the repository's ``owner/name``, install commands and test command;
- ``base/``: the repository's first commit;
- ``<n>-<slug>/``, one per instance in history order: ``instance.json`` (id, FAIL_TO_PASS,
  PASS_TO_PASS, creation date, a one-line description of the bug), ``issue.md`` (the problem
  statement), ``fix.patch`` (the gold patch) and ``tests.patch`` (the test patch), both unified
  diffs as ``git diff`` writes them, against the instance's base commit.

History: the base commit, then for each instance the commit that fixes it (both patches applied
with ``git apply``, dated by the instance's ``created_at``). An instance's base commit is the
commit before its fix, so later instances start from a tree holding the earlier fixes, as in a
real project. The task's patches are ``git diff`` of each patch applied to the base commit, so a
hand-edited patch file lands in the JSONL in git's own form. Commits carry a fixed identity and
dates, and git runs without user or system configuration, so the same sources give the same commit
ids on every machine.

``python build.py`` rewrites ``tasks.jsonl`` and each bundle whose commits changed (an unchanged
bundle is left alone: pack files are not byte-stable across git versions, commit ids are).
``python build.py --check`` changes nothing and exits 1 when the checked-in files do not match the
sources: the JSONL must be identical, and each bundle must clone and hold exactly the commits the
sources give.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "src"
BUNDLES = HERE / "repos"
TASKS = HERE / "tasks.jsonl"

#: Date of every repository's first commit.
BASE_DATE = "2024-01-01T09:00:00+00:00"
#: What a task gives each evaluation step, in seconds: small repositories, fast tests.
TIMEOUTS = {"setup": 600, "test": 120, "command": 60}
#: Files ``base/`` never contributes (left behind by running the sources' tests by hand).
IGNORED = re.compile(r"(^|/)(__pycache__|\.pytest_cache)(/|$)|\.py[cod]$")

_GIT_ENV = {
    "GIT_AUTHOR_NAME": "CodeRepairRL mini suite",
    "GIT_AUTHOR_EMAIL": "suite@coderepair.io",
    "GIT_COMMITTER_NAME": "CodeRepairRL mini suite",
    "GIT_COMMITTER_EMAIL": "suite@coderepair.io",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "LC_ALL": "C",
}


class BuildError(Exception):
    """The sources are inconsistent, or git failed."""


@dataclass(frozen=True)
class Built:
    """One repository built from its sources."""

    name: str
    path: Path
    head: str
    records: list[dict[str, Any]]


def say(message: str, *, error: bool = False) -> None:
    """One line for the person running the script (standard error for problems)."""
    (sys.stderr if error else sys.stdout).write(message + "\n")


def git(repo: Path, *args: str, date: str = BASE_DATE) -> str:
    """Run git in ``repo`` with the fixed identity and ``date``; return its standard output."""
    env = {**os.environ, **_GIT_ENV, "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    done = subprocess.run(
        [
            "git",
            "-c",
            "commit.gpgsign=false",
            "-c",
            "core.autocrlf=false",
            "-c",
            "pack.threads=1",
            *args,
        ],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise BuildError(f"git {' '.join(args)} failed in {repo}: {done.stderr.strip()}")
    return done.stdout


def overlay(source: Path, target: Path) -> None:
    """Copy the files under ``source`` over ``target`` (contents only: modes stay 644)."""
    if not source.is_dir():
        raise BuildError(f"{source} is missing")
    for path in sorted(source.rglob("*")):
        relative = path.relative_to(source).as_posix()
        if path.is_file() and not IGNORED.search(relative):
            destination = target / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, destination)


def apply(repo: Path, patch: Path) -> None:
    """Apply the patch file ``patch`` to ``repo``'s working tree and index."""
    if not patch.is_file():
        raise BuildError(f"{patch} is missing")
    try:
        git(repo, "apply", "--index", str(patch))
    except BuildError as exc:
        raise BuildError(
            f"{patch.relative_to(HERE)} does not apply to the tree the earlier instances leave "
            f"({exc}); rewrite it with git diff in a clone at the instance's base commit"
        ) from exc


def diff_of(repo: Path, patch: Path) -> str:
    """``patch`` applied to HEAD's tree, as ``git diff`` writes it; the tree is restored after."""
    apply(repo, patch)
    text = git(repo, "diff", "--cached", "--binary", "--no-color", "--no-ext-diff", "HEAD")
    git(repo, "reset", "--quiet", "--hard", "HEAD")
    git(repo, "clean", "-fdxq")
    if not text.strip():
        raise BuildError(f"{patch.relative_to(HERE)} changes nothing")
    return text


def instance_dirs(repo_sources: Path) -> list[Path]:
    """The instance folders (``<n>-<slug>``), in history order."""
    found = [p for p in repo_sources.iterdir() if p.is_dir() and re.match(r"^\d+-", p.name)]
    return sorted(found, key=lambda p: int(p.name.split("-", 1)[0]))


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``."""
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise BuildError(f"cannot read {path}: {exc}") from exc
    if not isinstance(loaded, dict):
        raise BuildError(f"{path} must hold a JSON object")
    return loaded


def build_repo(name: str, workdir: Path) -> Built:
    """Create repository ``name`` under ``workdir`` and return its task records."""
    sources = SOURCES / name
    spec = read_json(sources / "repo.json")
    repo = workdir / name
    repo.mkdir(parents=True)
    git(repo, "init", "--quiet", "--initial-branch=main")
    overlay(sources / "base", repo)
    git(repo, "add", "--all")
    git(repo, "commit", "--quiet", "-m", f"{name}: initial import")
    records = []
    for folder in instance_dirs(sources):
        meta = read_json(folder / "instance.json")
        issue = (folder / "issue.md").read_text(encoding="utf-8")
        title = issue.splitlines()[0].strip()
        number = int(folder.name.split("-", 1)[0])
        base_commit = git(repo, "rev-parse", "HEAD").strip()
        patch = diff_of(repo, folder / "fix.patch")
        test_patch = diff_of(repo, folder / "tests.patch")
        records.append(
            {
                "instance_id": meta["instance_id"],
                "repo": spec["repo"],
                "base_commit": base_commit,
                "patch": patch,
                "test_patch": test_patch,
                "fail_to_pass": meta["fail_to_pass"],
                "pass_to_pass": meta["pass_to_pass"],
                "problem_statement": issue,
                "created_at": meta["created_at"],
                "language": "python",
                "source": f"{BUNDLES.name}/{name}.bundle",
                "install": spec["install"],
                "test": spec["test"],
                "env": {"PYTHONDONTWRITEBYTECODE": "1"},
                "timeouts": TIMEOUTS,
                "metadata": {"suite": "crl-mini", "bug": meta["bug"]},
            }
        )
        # The fix lands (code and tests together): the next instance starts from there.
        apply(repo, folder / "fix.patch")
        apply(repo, folder / "tests.patch")
        date = meta["created_at"].replace("Z", "+00:00")
        git(repo, "commit", "--quiet", "-m", f"{title} (#{number})", date=date)
    head = git(repo, "rev-parse", "HEAD").strip()
    return Built(name=name, path=repo, head=head, records=records)


def tasks_text(built: list[Built]) -> str:
    """The JSONL text: one validated native task per line, in repository then history order."""
    try:
        from crl_worker.tasks.model import Task
    except ImportError as exc:  # run with the project's interpreter
        raise BuildError(
            "crl_worker is not importable; run this with the project's environment "
            "(.venv/bin/python examples/suites/mini/build.py)"
        ) from exc
    lines = []
    for repo in built:
        for record in repo.records:
            task = Task.model_validate(record)
            lines.append(json.dumps(task.model_dump(mode="json", exclude_defaults=True)))
    return "\n".join(lines) + "\n"


def bundle_head(bundle: Path, scratch: Path) -> str | None:
    """The ``main`` commit of a bundle, after cloning it whole (which checks every object);
    ``None`` when the file is missing or does not clone."""
    if not bundle.is_file():
        return None
    clone = scratch / f"verify-{bundle.stem}"
    try:
        git(scratch, "clone", "--quiet", "--mirror", str(bundle), str(clone))
        return git(clone, "rev-parse", "refs/heads/main").strip()
    except BuildError:
        return None
    finally:
        shutil.rmtree(clone, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Build (or with ``--check`` verify) the suite; the exit status says whether it matched."""
    parser = argparse.ArgumentParser(description="Build the mini suite's bundles and tasks.jsonl.")
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if the files are stale"
    )
    args = parser.parse_args(argv)
    names = sorted(p.name for p in SOURCES.iterdir() if (p / "repo.json").is_file())
    with tempfile.TemporaryDirectory(prefix="crl-mini-") as scratch_name:
        scratch = Path(scratch_name)
        built = [build_repo(name, scratch) for name in names]
        text = tasks_text(built)
        stale = []
        current = TASKS.read_text(encoding="utf-8") if TASKS.is_file() else None
        if current != text:
            stale.append(TASKS)
        for repo in built:
            bundle = BUNDLES / f"{repo.name}.bundle"
            if bundle_head(bundle, scratch) != repo.head:
                stale.append(bundle)
        extra = sorted(
            p for p in (BUNDLES.glob("*.bundle") if BUNDLES.is_dir() else []) if p.stem not in names
        )
        if args.check:
            for path in [*stale, *extra]:
                why = "has no sources" if path in extra else "does not match the sources"
                say(f"{path.relative_to(HERE)} {why}", error=True)
            if stale or extra:
                say("rebuild: python examples/suites/mini/build.py", error=True)
                return 1
            say(f"up to date: {len(names)} repositories, {text.count(chr(10))} instances")
            return 0
        BUNDLES.mkdir(exist_ok=True)
        for repo in built:
            bundle = BUNDLES / f"{repo.name}.bundle"
            if bundle in stale:
                partial = bundle.with_suffix(".bundle.partial")
                git(repo.path, "bundle", "create", "--quiet", str(partial), "main")
                partial.replace(bundle)
                say(f"wrote {bundle.relative_to(HERE)} ({bundle.stat().st_size} bytes)")
        if TASKS in stale:
            TASKS.write_text(text, encoding="utf-8")
            say(f"wrote {TASKS.relative_to(HERE)} ({text.count(chr(10))} instances)")
        for path in extra:
            say(f"warning: {path.relative_to(HERE)} has no sources", error=True)
        return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BuildError as exc:
        say(f"error: {exc}", error=True)
        sys.exit(2)

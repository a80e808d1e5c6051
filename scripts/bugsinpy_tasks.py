#!/usr/bin/env python3
"""Write ``bugsinpy`` records for some bugs of one BugsInPy project, from a copy of BugsInPy
(``soarsmu/BugsInPy``) and a copy of the project's own repository.

For each bug, ``projects/<P>/bugs/<N>/`` gives:

- ``bug.info``: the Python version, the buggy and fixed commits, the test files;
- ``bug_patch.txt``: the fix (the record's gold ``patch``);
- ``run_test.sh``: the failing tests' command (the record's ``run_test``; a ``tox ARGS`` line
  becomes ``pytest ARGS``, which is what the one project that uses tox, cookiecutter, runs,
  and the ``deps`` of ``tox.ini``'s ``[testenv]`` join the requirements);
- ``requirements.txt`` and ``setup.sh``: the packages the tests need. The record's
  ``requirements`` are the first plus the ``pip install`` lines of the second.

BugsInPy's checkout copies the fixed commit's test files over the buggy tree; here that is the
record's ``test_patch``, the diff of those files from the buggy commit to the fixed one, with
the other files the fix changed below the test files' folders (data the new tests read),
applied only when grading. The record's ``source`` is the project's repository as given (an
absolute path): the sandbox clones it at the buggy commit and keeps only that commit's history,
so the fix, a later commit, is not in the agent's checkout.

Usage::

    python scripts/bugsinpy_tasks.py BUGSINPY REPOSITORY --project PySnooper --bug 1 --out DIR

``BUGSINPY`` and ``REPOSITORY`` are git repositories (bare or not). The records go to
``DIR/tasks.jsonl``; ``crl tasks check -f bugsinpy DIR/tasks.jsonl`` then checks that the gold
patch resolves and no patch does not. ``--requirement PKG`` adds a package that the tests
import and that neither BugsInPy's files nor ``tox.ini`` list (PySnooper's tests need
``python-toolbox``).
"""

from __future__ import annotations

import argparse
import configparser
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

_FIELD = re.compile(r'^(\w+)\s*=\s*"(.*)"\s*$')
_PIP = re.compile(r"^\s*pip3?\s+install\s+(?P<args>.+)$")
_TOX = re.compile(r"^(\s*)tox\s+(?=\S)", re.MULTILINE)


class ConvertError(Exception):
    """A bug that cannot be converted (the reason is the message)."""


def say(message: str) -> None:
    """One line of the script's report on standard output."""
    sys.stdout.write(message + "\n")


def _git_dir(repo: Path) -> Path:
    return repo if (repo / "HEAD").is_file() else repo / ".git"


def git(repo: Path, *args: str) -> str:
    """Run git on ``repo``; its output (raises :class:`ConvertError` on failure)."""
    # Bytes, not text: text mode would turn CRLF lines into LF ones and break the patches.
    done = subprocess.run(["git", f"--git-dir={_git_dir(repo)}", *args], capture_output=True)
    if done.returncode != 0:
        raise ConvertError(f"git {' '.join(args[:2])} failed: {done.stderr.decode()[-300:]}")
    return done.stdout.decode()


def read(bugsinpy: Path, path: str) -> str | None:
    """A file of BugsInPy's ``HEAD``; ``None`` when it has none."""
    try:
        return git(bugsinpy, "show", f"HEAD:{path}")
    except ConvertError:
        return None


def info(text: str) -> dict[str, str]:
    """``key="value"`` lines (``bug.info``, ``project.info``)."""
    return {m.group(1): m.group(2) for m in map(_FIELD.match, text.splitlines()) if m}


def repo_of(url: str) -> str:
    """``owner/name`` of a GitHub URL."""
    match = re.search(r"github\.com/([^/]+)/([^/]+?)(?:\.git)?/?$", url.strip())
    if not match:
        raise ConvertError(f"project.info's github_url {url!r} is not a GitHub repository")
    return f"{match.group(1)}/{match.group(2)}"


def setup_packages(setup: str) -> list[str]:
    """The packages of ``setup.sh``'s ``pip install`` lines (its ``setup.py`` lines are the
    project's own install, which the record's install does)."""
    packages: list[str] = []
    for line in setup.splitlines():
        match = _PIP.match(line)
        if match:
            packages += [a for a in shlex.split(match.group("args")) if not a.startswith("-")]
    return packages


def tox_deps(repository: Path, commit: str) -> list[str]:
    """The ``deps`` of ``tox.ini``'s ``[testenv]`` at ``commit`` (``-rfile`` lines read from the
    checkout by pip); none when it has no ``tox.ini``."""
    try:
        text = git(repository, "show", f"{commit}:tox.ini")
    except ConvertError:
        return []
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(text)
    deps = parser.get("testenv", "deps", fallback="")
    return [line.split(" #", 1)[0].strip().replace("-r ", "-r", 1) for line in deps.splitlines()
            if line.strip() and not line.strip().startswith("#")]  # fmt: skip


def fixtures(
    repository: Path, buggy: str, fixed: str, test_files: list[str], patch: str
) -> list[str]:
    """Files the fix changed beside the test files, below their folders, that the gold patch
    does not touch: the data the new tests read (cookiecutter-1's
    ``tests/test-generate-context/non_ascii.json``). BugsInPy's checkout copies only the test
    files, so without these the fixed tests fail with the gold patch too."""
    folders = {f"{Path(t).parent}/" for t in test_files if "/" in t}
    fixed_files = set(re.findall(r"^\+\+\+ b/(\S+)", patch, re.MULTILINE))
    changed = git(repository, "diff", "--name-only", "--no-renames", buggy, fixed).splitlines()
    return [f for f in changed if f not in test_files and f not in fixed_files
            and any(f.startswith(folder) for folder in folders)]  # fmt: skip


def convert(bugsinpy: Path, repository: Path, project: str, bug: str, repo: str) -> dict[str, Any]:
    """The ``bugsinpy`` record of one bug."""
    folder = f"projects/{project}/bugs/{bug}"
    bug_info = read(bugsinpy, f"{folder}/bug.info")
    if bug_info is None:
        raise ConvertError(f"BugsInPy has no {folder}/bug.info")
    fields = info(bug_info)
    buggy, fixed = fields.get("buggy_commit_id", ""), fields.get("fixed_commit_id", "")
    if not buggy or not fixed:
        raise ConvertError("bug.info names no buggy_commit_id or fixed_commit_id")
    for commit in (buggy, fixed):
        git(repository, "cat-file", "-e", f"{commit}^{{commit}}")
    test_files = [f for f in re.split(r"[;\s]+", fields.get("test_file", "")) if f]
    if not test_files:
        raise ConvertError("bug.info names no test_file")
    patch = read(bugsinpy, f"{folder}/bug_patch.txt")
    if not patch:
        raise ConvertError("bug_patch.txt is missing")
    tests = git(repository, "diff", "--no-color", "--no-ext-diff", buggy, fixed, "--",
                *test_files, *fixtures(repository, buggy, fixed, test_files, patch))  # fmt: skip
    run_test = read(bugsinpy, f"{folder}/run_test.sh")
    if not run_test:
        raise ConvertError("run_test.sh is missing")
    requirements = (read(bugsinpy, f"{folder}/requirements.txt") or "").splitlines()
    requirements += setup_packages(read(bugsinpy, f"{folder}/setup.sh") or "")
    if _TOX.search(run_test):
        requirements += tox_deps(repository, buggy)
    return {
        "project": project,
        "bug_id": bug,
        "repo": repo,
        "buggy_commit_id": buggy,
        "python_version": fields.get("python_version", ""),
        # cookiecutter's tox.ini hands its arguments to pytest: ``tox ids`` runs ``pytest ids``.
        "run_test": _TOX.sub(r"\1pytest ", run_test),
        "requirements": "\n".join(requirements),
        "patch": patch,
        "test_patch": tests,
        "source": str(repository.resolve()),
    }


def main(argv: list[str] | None = None) -> int:
    """Convert the bugs asked for; one line each, then a total; exit 1 when none converted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bugsinpy", type=Path, help="BugsInPy's repository")
    parser.add_argument("repository", type=Path, help="the project's repository")
    parser.add_argument("--project", required=True, help="BugsInPy's project name (PySnooper)")
    parser.add_argument("--bug", action="append", required=True, help="bug id (repeatable)")
    parser.add_argument("--out", type=Path, required=True, help="folder for tasks.jsonl")
    parser.add_argument(
        "--requirement",
        action="append",
        default=[],
        help="a package every bug's tests need that BugsInPy does not list (repeatable)",
    )
    args = parser.parse_args(argv)
    project_info = read(args.bugsinpy, f"projects/{args.project}/project.info")
    if project_info is None:
        say(f"BugsInPy has no project {args.project!r}")
        return 1
    repo = repo_of(info(project_info).get("github_url", ""))
    args.out.mkdir(parents=True, exist_ok=True)
    converted = 0
    with (args.out / "tasks.jsonl").open("w") as sink:
        for bug in args.bug:
            try:
                record = convert(args.bugsinpy, args.repository, args.project, bug, repo)
            except ConvertError as exc:
                say(f"skipped {args.project}-{bug}: {exc}")
                continue
            if args.requirement:
                record["requirements"] = "\n".join([record["requirements"], *args.requirement])
            sink.write(json.dumps(record) + "\n")
            converted += 1
            say(f"converted {args.project}-{bug}")
    say(f"{converted} converted, {len(args.bug) - converted} skipped")
    return 0 if converted else 1


if __name__ == "__main__":
    sys.exit(main())

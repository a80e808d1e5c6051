#!/usr/bin/env python3
"""Write ``defects4j`` records for some bugs of one Defects4J project, from a copy of Defects4J
(``rjust/defects4j``) and a copy of the project's own repository.

For each bug: the row of ``framework/projects/<P>/active-bugs.csv``, the trigger tests
(``framework/projects/<P>/trigger_tests/<id>``, ``--- Class::method`` lines) and Defects4J's
patches. Defects4J's buggy version is the fixed revision with ``patches/<id>.src.patch`` and
``patches/<id>.test.patch`` applied (both go fixed -> buggy), not a commit of the project; that
tree becomes a root commit of its own (``repos/<P>-<id>.bundle``, repository
``<owner>/<name>--d4j-<id>``, no history holding the fix), the gold patch its diff to the fixed
revision's sources, the test patch its diff to the fixed revision's tests.

Usage::

    python scripts/defects4j_tasks.py DEFECTS4J REPOSITORY --project Cli --bug 40 --bug 39 \\
        --out DIR

``DEFECTS4J`` and ``REPOSITORY`` are git repositories (bare or not). The records go to
``DIR/tasks.jsonl`` (sources relative to it); ``crl tasks check -f defects4j DIR/tasks.jsonl``
then checks that the gold patch resolves and no patch does not.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

#: The projects' repositories (Defects4J's project names).
DEFECTS4J_REPOS = {"Cli": "apache/commons-cli", "Lang": "apache/commons-lang",
                   "Codec": "apache/commons-codec", "Csv": "apache/commons-csv",
                   "Jsoup": "jhy/jsoup", "Gson": "google/gson"}  # fmt: skip
#: Maven properties that let old Apache Commons revisions build and test on Java 17: their
#: poms compile for Java 1.5 (javac 17 needs 7 or later), commons-parent's animal-sniffer
#: check looks for a Java 8 signature, and its JaCoCo 0.7 agent cannot start on Java 17.
JAVA17_OPTIONS = (
    "-Dmaven.compiler.source=8 -Dmaven.compiler.target=8 -Danimal.sniffer.skip=true"
    " -Djacoco.skip=true"
)
#: Identity and date of every base commit, so that a bug gives the same commit anywhere.
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "CodeRepairRL Defects4J",
    "GIT_AUTHOR_EMAIL": "defects4j@coderepair.io",
    "GIT_COMMITTER_NAME": "CodeRepairRL Defects4J",
    "GIT_COMMITTER_EMAIL": "defects4j@coderepair.io",
    "GIT_AUTHOR_DATE": "2024-01-01T09:00:00+00:00",
    "GIT_COMMITTER_DATE": "2024-01-01T09:00:00+00:00",
}


class ConvertError(Exception):
    """A bug that cannot be converted (the reason is the message)."""


def say(message: str) -> None:
    """One line of the script's report on standard output."""
    sys.stdout.write(message + "\n")


def git(
    *args: str, cwd: Path | None = None, stdin: str | None = None, env: dict[str, str] | None = None
) -> str:
    """Run git; its output (raises :class:`ConvertError` on failure)."""
    # Bytes, not text: text mode would turn CRLF lines into LF ones and break the patches.
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True,
                          input=stdin.encode() if stdin is not None else None,
                          env={**os.environ, **env} if env else None)  # fmt: skip
    if done.returncode != 0:
        raise ConvertError(f"git {' '.join(args[:2])} failed: {done.stderr.decode()[-300:]}")
    return done.stdout.decode()


def show(defects4j: Path, path: str) -> str:
    """A file of Defects4J's ``HEAD``."""
    return git(f"--git-dir={_git_dir(defects4j)}", "show", f"HEAD:{path}")


def _git_dir(repo: Path) -> Path:
    return repo if (repo / "HEAD").is_file() else repo / ".git"


def _files(patch: str) -> list[str]:
    """The files a patch touches (its ``+++ b/`` names)."""
    return [line[6:].strip() for line in patch.splitlines() if line.startswith("+++ b/")]


def convert(
    defects4j: Path, work: Path, project: str, row: dict[str, str], out: Path
) -> dict[str, Any]:
    """The ``defects4j`` record of one bug; its bundle written under ``out/repos``.

    Defects4J's buggy version is not a commit of the project: it is the fixed revision with
    ``<id>.src.patch`` and ``<id>.test.patch`` applied (both go fixed -> buggy). That tree is
    committed here as a root commit of its own (fixed identity and date), so that neither the
    bundle nor its history holds the fix; the gold and test patches are its diff to the fixed
    revision."""
    bug = row["bug.id"]
    base = f"framework/projects/{project}"
    trigger = [
        line[4:].strip()
        for line in show(defects4j, f"{base}/trigger_tests/{bug}").splitlines()
        if line.startswith("--- ")
    ]
    if not trigger:
        raise ConvertError("no trigger tests")
    fixed = row["revision.id.fixed"]
    src_patch = show(defects4j, f"{base}/patches/{bug}.src.patch")
    test_patch = show(defects4j, f"{base}/patches/{bug}.test.patch")
    # In the index only: a checkout would pass the files through the repository's
    # .gitattributes (eol normalization), and the blobs of the tree would no longer be the
    # fixed revision's where the patches do not touch them.
    git("read-tree", fixed, cwd=work)
    for patch in (src_patch, test_patch):
        git("apply", "--cached", "--whitespace=nowarn", "-", cwd=work, stdin=patch)
    tree = git("write-tree", cwd=work).strip()
    commit = git("commit-tree", tree, "-m", f"Defects4J {project}-{bug}, buggy version",
                 cwd=work, env=_GIT_ENV).strip()  # fmt: skip
    branch = f"d4j-{project}-{bug}"
    git("branch", "-f", branch, commit, cwd=work)
    bundle = out / "repos" / f"{project}-{bug}.bundle"
    bundle.parent.mkdir(parents=True, exist_ok=True)
    git("bundle", "create", "-q", str(bundle.resolve()), branch, cwd=work)
    gold = git("diff", "--no-color", "--no-ext-diff", commit, fixed, "--", *_files(src_patch),
               cwd=work)  # fmt: skip
    tests = git("diff", "--no-color", "--no-ext-diff", commit, fixed, "--",
                *_files(test_patch), cwd=work)  # fmt: skip
    repo, _, _ = DEFECTS4J_REPOS[project].partition(" ")
    return {
        "project": project,
        "bug.id": bug,
        "repo": f"{repo}--d4j-{bug}",
        "revision.id.buggy": commit,
        "source": f"repos/{project}-{bug}.bundle",
        "trigger_tests": trigger,
        "patch": gold,
        "test_patch": tests,
        "report.url": row.get("report.url", ""),
    }


def main(argv: list[str] | None = None) -> int:
    """Convert the bugs asked for; one line each, then a total; exit 1 when none converted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("defects4j", type=Path, help="Defects4J's repository")
    parser.add_argument("repository", type=Path, help="the project's repository")
    parser.add_argument("--project", required=True, help="Defects4J's project name (Cli)")
    parser.add_argument("--bug", action="append", required=True, help="bug id (repeatable)")
    parser.add_argument("--out", type=Path, required=True, help="folder for tasks.jsonl")
    parser.add_argument(
        "--maven-options",
        default=JAVA17_OPTIONS,
        help=f"the records' maven_options (default, for Java 17: {JAVA17_OPTIONS!r})",
    )
    args = parser.parse_args(argv)
    table = show(args.defects4j, f"framework/projects/{args.project}/active-bugs.csv")
    rows = {r["bug.id"]: r for r in csv.DictReader(io.StringIO(table))}
    args.out.mkdir(parents=True, exist_ok=True)
    converted = 0
    with tempfile.TemporaryDirectory() as scratch, (args.out / "tasks.jsonl").open("w") as sink:
        work = Path(scratch) / "work"
        git("clone", "-q", "--shared", "--no-checkout", str(_git_dir(args.repository)), str(work))
        for bug in args.bug:
            if bug not in rows:
                say(f"skipped {args.project}-{bug}: not in active-bugs.csv")
                continue
            try:
                record = convert(args.defects4j, work, args.project, rows[bug], args.out)
            except ConvertError as exc:
                say(f"skipped {args.project}-{bug}: {exc}")
                continue
            if args.maven_options:
                record["maven_options"] = args.maven_options
            sink.write(json.dumps(record) + "\n")
            converted += 1
            say(f"converted {args.project}-{bug}")
    say(f"{converted} converted, {len(args.bug) - converted} skipped")
    return 0 if converted else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Build the classify suite from its sources: one git bundle per record and tasks.jsonl.

Each ``src/<name>/`` holds ``record.json`` (package, version, licence, CVE, CWE label, location,
a one-line summary kept for people, never shown to the agent, and ``label_source``: the advisory
the label was checked against, its file and commit in github/advisory-database, its CWE ids and
affected versions; a label that is not among those ids stops the build) and ``files/``: the vulnerable
module exactly as the package's release on PyPI ships it, with the package's licence. The
repository of a record is one commit of ``files/`` with a fixed identity and date, so the same
sources give the same commit id on every machine.

``python build.py`` rewrites ``tasks.jsonl`` and each bundle whose commit changed;
``python build.py --check`` changes nothing and exits 1 when a checked-in file does not match.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "src"
BUNDLES = HERE / "repos"
TASKS = HERE / "tasks.jsonl"
DATE = "2024-01-01T09:00:00+00:00"
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "CodeRepairRL classify suite",
    "GIT_AUTHOR_EMAIL": "suite@coderepair.io",
    "GIT_COMMITTER_NAME": "CodeRepairRL classify suite",
    "GIT_COMMITTER_EMAIL": "suite@coderepair.io",
    "GIT_AUTHOR_DATE": DATE,
    "GIT_COMMITTER_DATE": DATE,
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}
logger = logging.getLogger("classify-suite")


def git(repo: Path, *args: str) -> str:
    """Run git in ``repo`` with the suite's fixed identity; its stdout."""
    done = subprocess.run(
        ["git", *args],
        cwd=repo,
        env={**os.environ, **_GIT_ENV},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def build_repo(name: str, scratch: Path) -> tuple[Path, str, dict[str, Any]]:
    """The record's repository in ``scratch``: its path, its commit, its task record."""
    record = json.loads((SOURCES / name / "record.json").read_text(encoding="utf-8"))
    source = record["label_source"]
    if record["cwe"] not in source["cwe_ids"]:
        raise SystemExit(
            f"{name}: the label {record['cwe']} is not among the CWE ids of its source "
            f"{source['advisory']} ({', '.join(source['cwe_ids'])})"
        )
    repo = scratch / name
    shutil.copytree(SOURCES / name / "files", repo)
    git(repo, "init", "--quiet", "--initial-branch=main")
    git(repo, "add", "--all")
    git(repo, "commit", "--quiet", "-m", f"{record['package']} {record['version']}")
    head = git(repo, "rev-parse", "HEAD")
    task = {
        "instance_id": f"crl-vuln__{name}",
        "repo": f"crl-vuln/{name}",
        "base_commit": head,
        "source": f"{BUNDLES.name}/{name}.bundle",
        "task_type": "classify",
        "classification": {
            "cwe": record["cwe"],
            "location": record["location"],
            "cve": record["cve"],
        },
        "problem_statement": (
            f"The repository holds one module of {record['package']} {record['version']} "
            "as released on PyPI."
        ),
        "language": "python",
        "timeouts": {"setup": 300, "test": 60, "command": 60},
        "metadata": {
            "licence": record["licence"],
            "package": record["package"],
            "label_source": source["url"],
        },
    }
    return repo, head, task


def bundle_head(bundle: Path, scratch: Path) -> str | None:
    """The ``main`` commit of a checked-in bundle (``None`` when it is missing or broken)."""
    if not bundle.is_file():
        return None
    try:
        return git(scratch, "bundle", "list-heads", str(bundle), "refs/heads/main").split()[0]
    except (subprocess.CalledProcessError, IndexError):
        return None


def main(argv: list[str] | None = None) -> int:
    """Build, or with ``--check`` verify, the suite's files."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description="Build the classify suite.")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        built = [build_repo(p.name, scratch) for p in sorted(SOURCES.iterdir()) if p.is_dir()]
        text = "".join(json.dumps(task, sort_keys=True) + "\n" for _, _, task in built)
        stale = [
            repo
            for repo, head, _ in built
            if bundle_head(BUNDLES / f"{repo.name}.bundle", scratch) != head
        ]
        if args.check:
            problems = [f"repos/{r.name}.bundle does not match the sources" for r in stale]
            if not TASKS.is_file() or TASKS.read_text(encoding="utf-8") != text:
                problems.append("tasks.jsonl does not match the sources")
            for problem in problems:
                logger.error("%s", problem)
            if not problems:
                logger.info("%d records, up to date", len(built))
            return 1 if problems else 0
        BUNDLES.mkdir(exist_ok=True)
        for repo in stale:
            bundle = BUNDLES / f"{repo.name}.bundle"
            git(repo, "bundle", "create", "--quiet", str(bundle), "main")
            logger.info("wrote %s", bundle.relative_to(HERE))
        TASKS.write_text(text, encoding="utf-8")
        logger.info("wrote tasks.jsonl (%d records)", len(built))
    return 0


if __name__ == "__main__":
    sys.exit(main())

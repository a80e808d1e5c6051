#!/usr/bin/env python3
"""How many SWE-bench instances sealed expectations reach (results: perf/seal_coverage.md).

For each instance of a SWE-bench file (``../shared/data/swe-bench-lite.jsonl``), reads its
FAIL_TO_PASS tests' bodies from the new side of its test patch (a test function the patch shows
whole: its ``def`` and every line of it up to the next statement at its indentation, within one
hunk) and asks :func:`crl_worker.harness.seals._targets` whether one of them has a statement the
graded run would seal. A body the patch shows only in part is not counted, so the figures are a
lower bound. Prints per repository: instances, instances with a sealable statement, and
instances with no FAIL_TO_PASS body shown whole. Every runner of SWE-bench's Python
repositories is sealed (pytest through the harness's reporter; Django's and SymPy's with the
recorder in the sealed modules).

    python perf/seal_coverage.py ../shared/data/swe-bench-lite.jsonl [more files]
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
import re
import sys
import textwrap
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "worker" / "src"))

from crl_worker.harness.diffsplit import parse_diff  # noqa: E402
from crl_worker.harness.mutants import TestDef  # noqa: E402
from crl_worker.harness.seals import _targets  # noqa: E402

logger = logging.getLogger("seal_coverage")
_HUNK = "\x00hunk"


def new_lines(patch: str) -> list[str]:
    """The lines the patch leaves (added and context), hunk after hunk, a marker between."""
    lines: list[str] = []
    for change in parse_diff(patch):
        for hunk in change.hunks:
            for line in hunk.splitlines()[1:]:
                if line[:1] in ("+", " "):
                    lines.append(line[1:])
                elif not line:
                    lines.append("")
            lines.append(_HUNK)
    return lines


def body(lines: list[str], name: str) -> ast.FunctionDef | None:
    """The function ``name`` when ``lines`` show it whole, else ``None``."""
    for at, line in enumerate(lines):
        found = re.match(r"(\s*)(?:async\s+)?def\s+" + re.escape(name) + r"\s*\(", line)
        if not found:
            continue
        indent, taken = len(found.group(1)), [line]
        for following in lines[at + 1 :]:
            if following == _HUNK:
                return None
            stripped = following.lstrip()
            outdented = len(following) - len(stripped) <= indent
            if stripped and outdented and not stripped.startswith((")", "]", "}")):
                break
            taken.append(following)
        try:
            node = ast.parse(textwrap.dedent("\n".join(taken))).body[0]
        except SyntaxError:
            return None
        return node if isinstance(node, ast.FunctionDef) else None
    return None


def main() -> int:
    """Count (see the module's docstring)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="SWE-bench JSON lines files")
    args = parser.parse_args()
    for path in args.files:
        total, sealable, unknown = Counter[str](), Counter[str](), Counter[str]()
        for line in Path(path).read_text().splitlines():
            row = json.loads(line)
            repo, f2p = row["repo"], row["FAIL_TO_PASS"]
            ids = json.loads(f2p) if isinstance(f2p, str) else f2p
            lines = new_lines(row["test_patch"])
            total[repo] += 1
            shown = [
                node
                for test_id in ids
                if (node := body(lines, test_id.split(" ")[0].split("[")[0].split("::")[-1]))
            ]
            unknown[repo] += not shown
            sealable[repo] += any(_targets(TestDef(repo, None, node, False)) for node in shown)
        logger.info("%s", path)
        logger.info("  %-28s %9s %9s %14s", "repository", "instances", "sealable", "none shown")
        for repo in sorted(total):
            logger.info("  %-28s %9d %9d %14d", repo, total[repo], sealable[repo], unknown[repo])
        whole = sum(total.values()) - sum(unknown.values())
        logger.info(
            "  sealable: %d of %d instances (of the %d with a FAIL_TO_PASS body shown whole)",
            sum(sealable.values()),
            sum(total.values()),
            whole,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

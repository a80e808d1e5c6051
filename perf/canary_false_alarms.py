"""False alarms of the Python canaries on a real repository's own tests (results:
perf/canary_false_alarms.md).

    python perf/canary_false_alarms.py --root CHECKOUT --python PYTHON [--tests tests]
        [--sample 40] [--seeds 2] [--kind any|new] [--src worker/src]

A canary is a copy of a real test with one expectation changed, so on code that passes the
real test it must fail; one that passes is a false alarm (a correct answer graded ``tampered``),
and a derived module that no longer imports (a copy or a moved test planted above what its
decorators read) fails the real test too (a correct answer graded unresolved). This takes the
copyable tests of ``CHECKOUT``'s test modules that have an expectation (``--kind new``: only
those with a constructor's argument, a ``parametrize`` column or a bound name, the kinds of
:mod:`crl_worker.harness.mutant_targets`), a random ``--sample`` of them, and for each of
``--seeds`` draws derives four copies as grading does (the test listed as FAIL_TO_PASS), runs
the real test and its copies with ``PYTHON -m pytest`` in the checkout (which must be the
repository's code, passing its tests: the honest answer), and counts runs where the real test
passes and every copy fails. ``--src`` runs another version of the harness (a ``git archive``
of an older commit's ``worker/src``) for a before/after comparison in one sitting.

Prints one line per bad run and a summary; asserts nothing.
"""

from __future__ import annotations

import argparse
import ast
import logging
import os
import random
import sys
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fixtures.shapes import pytest_outcomes

logger = logging.getLogger("canary_false_alarms")
#: The probed repository's environment: the given Python's own, this process's variables.
ENV = dict(os.environ)


def _candidates(root: Path, folder: str, kind: str, harness: ModuleType) -> list[str]:
    """The ids of the copyable tests with an expectation (of the new kinds for ``new``)."""
    mutants, targets = harness.mutants, harness.mutant_targets
    from crl_worker.harness.mutant_edits import equality_sides

    found = []
    for path in sorted((root / folder).rglob("test_*.py")):
        relative = str(path.relative_to(root))
        try:
            tree = ast.parse(path.read_text())
        except (SyntaxError, UnicodeDecodeError):
            continue
        for test in mutants.tests_of(relative, tree, "pytest"):
            if not mutants.copyable(test):
                continue
            found_here = mutants.expectations(test)
            if kind == "new":
                sides = {
                    id(side)
                    for stmt in ast.walk(test.node)
                    if isinstance(stmt, ast.stmt)
                    for side in equality_sides(stmt)
                }
                found_here = [
                    t for t in found_here if isinstance(t, targets.Column) or id(t) not in sides
                ]
            if found_here:
                found.append(test.id)
    return found


def main() -> None:
    """Parse the arguments, probe, print."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True, help="the repository's checkout")
    parser.add_argument("--python", required=True, help="a Python with the repository installed")
    parser.add_argument("--tests", default=".", help="the folder of test modules (relative)")
    parser.add_argument("--sample", type=int, default=40, help="tests probed at most")
    parser.add_argument("--seeds", type=int, default=2, help="draws per test")
    parser.add_argument("--kind", choices=("any", "new"), default="any")
    parser.add_argument("--src", type=Path, help="another harness's worker/src to probe")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    src = args.src or Path(__file__).resolve().parents[1] / "worker" / "src"
    sys.path.insert(0, str(src))
    from crl_worker.harness import mutants

    try:
        from crl_worker.harness import mutant_targets
    except ImportError:  # an older harness: no targets beyond literals
        mutant_targets = ModuleType("mutant_targets")
        mutant_targets.Column = type("Column", (), {})  # type: ignore[attr-defined]
    harness = ModuleType("harness")
    harness.mutants, harness.mutant_targets = mutants, mutant_targets  # type: ignore[attr-defined]
    root: Path = args.root.resolve()
    ids = _candidates(root, args.tests, args.kind, harness)
    random.Random(7).shuffle(ids)
    ids = ids[: args.sample]
    counts = {"good": 0, "false alarm": 0, "real test broken": 0, "no copies": 0, "skipped": 0}
    for test_id in ids:
        if set(
            pytest_outcomes(root, test_id, python=args.python, env=ENV, timeout=900).values()
        ) != {"passed"}:
            counts["skipped"] += 1  # failing or skipped before any copy: not the honest answer
            continue
        path = test_id.split("::")[0]
        original = (root / path).read_text()
        for seed in range(args.seeds):
            derived = mutants.derive(
                path, original, "pytest", [test_id], [], random.Random(seed), 4
            )
            if derived is None:
                counts["no copies"] += 1
                continue
            real = {old: new for new, old in derived.renamed}.get(test_id, test_id)
            try:
                (root / path).write_text(derived.text)
                outcomes = pytest_outcomes(
                    root, real, *derived.ids, python=args.python, env=ENV, timeout=900
                )
            finally:
                (root / path).write_text(original)
            copies = {i.rsplit("::", 1)[1] for i in derived.ids}
            own = real.rsplit("::", 1)[1]
            real_runs = {o for n, o in outcomes.items() if n.split("[")[0] == own}
            copy_runs = {o for n, o in outcomes.items() if n.split("[")[0] in copies}
            if real_runs != {"passed"}:
                verdict = "real test broken"
            elif not copy_runs or not copy_runs <= {"failure", "error"}:
                verdict = "false alarm"
            else:
                verdict = "good"
            counts[verdict] += 1
            if verdict != "good":
                logger.info("%s: %s (seed %d) real %s copies %s", verdict, test_id, seed,
                            sorted(real_runs), sorted(copy_runs))  # fmt: skip
    logger.info("harness %s, %d tests probed (%s kind), %d draws each", src, len(ids), args.kind,
                args.seeds)  # fmt: skip
    logger.info("%s", ", ".join(f"{k}: {v}" for k, v in counts.items()))


if __name__ == "__main__":
    main()

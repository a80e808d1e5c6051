"""Canaries for SymPy's runner (``sympy`` log format: ``bin/test --verbose``, ids are bare
function names), derived from a real SymPy test module (tests/fixtures/sympy/) and read back
through the parser from the real run's log (tests/logs/sympy-21614-nopatch.log)."""

from __future__ import annotations

import ast
import random
from pathlib import Path

from crl_worker.harness import mutants
from crl_worker.harness.canary import (
    canary_files,
    derive_canary,
    make_canary,
    restore_ids,
    tampered,
    with_canary,
)
from crl_worker.harness.parsers import parse_sympy
from crl_worker.harness.result import TestStatus
from crl_worker.tasks.model import Task, TestSpec
from tests.fixtures.canary_tasks import adding_module

HERE = Path(__file__).parent
MODULE = (HERE / "fixtures" / "sympy" / "test_kind.py.txt").read_text()
LOG = (HERE / "logs" / "sympy-21614-nopatch.log").read_text()
PATH = "sympy/core/tests/test_kind.py"
F2P = ["test_Derivative_kind"]
P2P = ["test_NumberKind", "test_Add_kind", "test_Integral_kind"]
#: Another module of the run.
OTHER = {"sympy/core/tests/test_other.py": "def test_Add_kind_of_mul():\n    assert 1\n"}


def _task() -> Task:
    return adding_module(
        "sympy__sympy-21614",
        PATH,
        MODULE,
        F2P,
        P2P,
        TestSpec(command="bin/test -C --verbose {tests}", log_format="sympy"),
    )


def _log(canary_text: str, failing: set[str]) -> str:
    """The real run's log with the planted module's tests in it: each copy's line (``F`` when
    in ``failing``, else ``ok``) after the test it follows in the module."""
    names = [n.name for n in ast.parse(canary_text).body if isinstance(n, ast.FunctionDef)]
    known = {n.name for n in ast.parse(MODULE).body if isinstance(n, ast.FunctionDef)}
    lines = LOG.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(PATH))
    end = next(i for i, line in enumerate(lines) if line.startswith("test_MatMul_kind"))
    real = {line.split(" ")[0]: line for line in lines[start + 1 : end + 1]}
    block = [
        real.get(name, f"{name} ok")
        if name in known
        else f"{name} {'F' if name in failing else 'ok'}"
        for name in names
    ]
    return "\n".join([*lines[: start + 1], *block, *lines[end + 1 :]]) + "\n"


def test_sympy_copies_are_module_functions_named_apart_from_the_run() -> None:
    """Copies of the listed functions (``is`` expectations, so a failing ``assert`` of two
    numbers after the body), bare-name ids no other module of the run uses; a run where the
    copies fail as they must is clean and grades the task's ids, one where they pass is
    tampered; the synthetic fallback is a module-level function."""
    task = _task()
    assert canary_files(task) == [PATH]
    for seed in range(8):
        canary = derive_canary(task, {PATH: MODULE, **OTHER}, random.Random(seed))
        assert canary is not None and canary.text is not None and canary.path == PATH
        assert len(canary.ids) == 4 and all(i.isidentifier() for i in canary.ids)
        tree = ast.parse(canary.text)
        functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert set(canary.ids) <= functions
        # The same draw with the first draw's names in another module of the run: none again.
        again = mutants.derive(
            PATH, MODULE, "sympy", F2P, P2P, random.Random(seed), 4, keep=" ".join(canary.ids)
        )
        first = mutants.derive(PATH, MODULE, "sympy", F2P, P2P, random.Random(seed), 4)
        assert again is not None and first is not None
        assert not set(again.ids) & set(first.ids)
        tests = mutants.tests_of(PATH, tree, "sympy")
        assert {t.id for t in tests} == functions
        copies = set(canary.ids)
        honest = restore_ids(canary, parse_sympy(_log(canary.text, copies)))
        assert tampered(canary, honest) is None
        assert {honest[i] for i in canary.ids} == {TestStatus.FAILED}
        # The real run's failure (the bug is in) is kept under the task's id.
        assert honest["test_Derivative_kind"] is TestStatus.FAILED
        assert all(honest[i] is TestStatus.PASSED for i in P2P)
        forged = restore_ids(canary, parse_sympy(_log(canary.text, set())))
        assert tampered(canary, forged) is not None
        assert set(with_canary(task, canary).fail_to_pass) >= copies
    synthetic = make_canary(task)
    assert synthetic is not None and len(synthetic.ids) == 1
    assert synthetic.code.startswith(f"\n\ndef {synthetic.ids[0]}():")


def test_an_expectation_spread_over_lines_is_copied() -> None:
    """SymPy's printing tests compare with strings joined over several lines (found on
    sympy__sympy-11400, whose integrity check crashed reading such a literal back)."""
    for expected in (
        '\\\n        "   sin(x)/x\\n" \\\n        "next line"',
        '(\n        "   sin(x)/x\\n"\n        "next line"\n    )',
    ):
        module = (
            "from m import pretty\n\n\ndef test_pretty():\n"
            f"    assert pretty(1) == {expected}\n\n\ndef test_two():\n    assert pretty(2) == 'x'\n"
        )
        derived = mutants.derive("t.py", module, "sympy", ["test_pretty"], [], random.Random(1), 4)
        assert derived is not None and len(derived.ids) == 4, expected
        tree = ast.parse(derived.text)
        copies = [f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name in derived.ids]
        values = {ast.literal_eval(f.body[0].test.comparators[0]) for f in copies}  # type: ignore[attr-defined]
        assert len(values) == 4 and "   sin(x)/x\nnext line" not in values

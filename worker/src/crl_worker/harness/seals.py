"""Sealed expectations: a listed test's expected literals kept out of the test process.

The candidate's code runs inside the test process, so it can read whatever the process holds:
the test's code objects, its frames, the module's other tests. A forgery that finds the
assertion a test is about to make can answer it (an object equal to everything, or the literal
it reads), and one that compares a canary group's members can guess which is real. Neither
works on a value that is not in the process.

So, for the graded run (the integrity check's, through the harness's reporter), each listed
test's equality assertions against a literal, among the statements that run whenever the test
passes (its top level, and ``with`` blocks that cannot swallow a failure), lose the literal:

- ``assert <value> == <literal>`` becomes ``assert <recorder>("<hole>", "<type>", (<value>))``;
- ``self.assertEqual(<value>, <literal>)`` (either order; ``assertEquals``, ``assertListEqual``,
  ``assertTupleEqual``, ``assertDictEqual``, ``assertSetEqual``, ``assertMultiLineEqual``)
  becomes ``<recorder>("<hole>", "<type>", (<value>))``.

The recorder (``inprocess/seals.pyt``, installed in ``builtins`` under a name drawn for the run)
writes the value to the report as plain data, made by the value's own protocols (a subclass of
a built-in type as that type, a number by ``__index__`` or ``__float__``, a mapping by its
items, anything else by the literal's type) and checked equal to it, and returns True. The
harness compares it with the literal outside the process (:func:`judge`): a test reported passed
whose hole recorded nothing, or anything but the literal, failed. A forgery can write records,
but it has nothing to write but guesses; a correct answer records what the literal says.

Canary copies (:mod:`crl_worker.harness.canary`) are sealed with the tests they copy, so a
copy and its test differ in the process only by their hole ids: which of a group is real is no
longer in the process either. A test that could run under another listed id (a subclass's run
of an inherited method, a name listed in a module the harness did not read) is not sealed, nor
one with a ``return`` or ``yield`` of its own (a statement after it might not run).
"""

from __future__ import annotations

import ast
import logging
import secrets
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from crl_worker.harness.canary import Canary
from crl_worker.harness.mutant_edits import Text
from crl_worker.harness.mutants import TestDef, _straight, tests_of
from crl_worker.harness.result import TestStatus
from crl_worker.sandbox.base import Sandbox
from crl_worker.tasks.model import Task

logger = logging.getLogger(__name__)

#: unittest's assertions whose two first arguments are compared with ``==`` (not
#: ``assertSequenceEqual``, which takes a list for an equal tuple).
SEALED_ASSERTIONS = frozenset(
    {
        "assertEqual",
        "assertEquals",
        "failUnlessEqual",
        "assertListEqual",
        "assertTupleEqual",
        "assertDictEqual",
        "assertSetEqual",
        "assertMultiLineEqual",
    }
)
#: The log formats whose run goes through the harness's reporter, where the recorder exists.
SEALED_FORMATS = frozenset({"pytest", "unittest"})


@dataclass(frozen=True)
class Seals:
    """The seals of one graded run."""

    #: The name the sealed statements call the recorder by (a ``builtins`` name).
    name: str
    #: By the test's id as the run reports it (without parameters): hole to the expected
    #: literal's value (its ``repr``).
    holes: dict[str, dict[str, str]] = field(default_factory=dict)
    #: The test modules sealed: path to their new text.
    texts: dict[str, str] = field(default_factory=dict)


def _literal_kind(node: ast.expr) -> str | None:
    """The type name of ``node``'s value when it is a literal (``ast.literal_eval``), else
    ``None``."""
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return "none" if value is None else type(value).__name__


def _sides(stmt: ast.stmt) -> tuple[ast.expr, ast.expr] | None:
    """The value and the literal of a sealable equality assertion, else ``None``."""
    if isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Compare):
        test = stmt.test
        if len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
            return None
        pair = (test.left, test.comparators[0])
    elif (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Call)
        and isinstance(stmt.value.func, ast.Attribute)
        and stmt.value.func.attr in SEALED_ASSERTIONS
        and len(stmt.value.args) >= 2
        and not any(isinstance(a, ast.Starred) for a in stmt.value.args)
        and all(k.arg == "msg" for k in stmt.value.keywords)
    ):
        pair = (stmt.value.args[0], stmt.value.args[1])
    else:
        return None
    left, right = (_literal_kind(side) is not None for side in pair)
    if left == right:  # two values, or two literals (nothing to hide)
        return None
    return (pair[1], pair[0]) if left else pair


def _own_nodes(node: ast.AST) -> list[ast.AST]:
    """The nodes of a function's body, not those of functions, lambdas or classes in it."""
    found: list[ast.AST] = []
    todo = list(ast.iter_child_nodes(node))
    while todo:
        child = todo.pop()
        found.append(child)
        if not isinstance(
            child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef
        ):
            todo.extend(ast.iter_child_nodes(child))
    return found


def _sealable(test: TestDef) -> list[ast.stmt]:
    """The statements of ``test`` to seal: its equality assertions against a literal that run
    whenever it passes; none when it can end early (``return``, ``yield``)."""
    if any(isinstance(n, ast.Return | ast.Yield | ast.YieldFrom) for n in _own_nodes(test.node)):
        return []
    return [stmt for stmt in _straight(test.node.body) if _sides(stmt) is not None]


def _name_of(test_id: str, log_format: str) -> str:
    """The function name in a test id (``path::Class::name[params]``, ``name (module.Class)``)."""
    if log_format == "pytest":
        return test_id.partition("[")[0].rsplit("::", 1)[-1]
    return test_id.split(" ", 1)[0]


def base_id(test_id: str, log_format: str) -> str:
    """``test_id`` without its parameters (``[...]``, pytest's)."""
    return test_id.partition("[")[0] if log_format == "pytest" else test_id


def seal_modules(
    texts: Mapping[str, str],
    sealed: Collection[str],
    listed: Collection[str],
    log_format: str,
    name: str | None = None,
) -> Seals:
    """Seal the tests ``sealed`` (ids as the run reports them) in the modules ``texts`` (path
    to text); ``listed`` are every id the run is graded on, which decide what may be sealed
    (see the module's docstring)."""
    seals = Seals(name or f"_crl_{secrets.token_hex(6)}")
    if log_format not in SEALED_FORMATS:
        return seals
    trees: dict[str, ast.Module] = {}
    for path, text in texts.items():
        try:
            trees[path] = ast.parse(text)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
    found = {path: tests_of(path, tree, log_format) for path, tree in trees.items()}
    defined = {t.id for tests in found.values() for t in tests}
    unsure = {_name_of(i, log_format) for i in listed if base_id(i, log_format) not in defined}
    wanted = {base_id(i, log_format) for i in sealed}
    for path, tests in found.items():
        source = Text(texts[path])
        edits: list[tuple[int, int, bytes]] = []
        for test in tests:
            if test.id not in wanted or test.node.name in unsure:
                continue
            for stmt in _sealable(test):
                hole = secrets.token_hex(6)
                edits.append(_edit(source, stmt, seals.name, hole))
                seals.holes.setdefault(test.id, {})[hole] = repr(ast.literal_eval(_literal(stmt)))
        if edits:
            data = source.data
            for start, end, new in sorted(edits, reverse=True):
                data = data[:start] + new + data[end:]
            seals.texts[path] = data.decode("utf-8")
    return seals


def _literal(stmt: ast.stmt) -> ast.expr:
    sides = _sides(stmt)
    assert sides is not None
    return sides[1]


def _segment(source: Text, node: ast.AST) -> str:
    start = source.offset(node.lineno, node.col_offset)  # type: ignore[attr-defined]
    end = source.offset(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]
    return source.data[start:end].decode("utf-8")


def _edit(source: Text, stmt: ast.stmt, name: str, hole: str) -> tuple[int, int, bytes]:
    """The span of ``stmt`` and its sealed text (as many lines as before)."""
    sides = _sides(stmt)
    assert sides is not None
    value, literal = sides
    kind = _literal_kind(literal)
    start = source.offset(stmt.lineno, stmt.col_offset)
    end = source.offset(stmt.end_lineno or stmt.lineno, stmt.end_col_offset or 0)
    call = f'{name}("{hole}", "{kind}", ({_segment(source, value)}'
    call += "\n" * (source.data[start:end].count(b"\n") - call.count("\n")) + "))"
    text = f"assert {call}" if isinstance(stmt, ast.Assert) else call
    return start, end, text.encode("utf-8")


def matches(recorded: str | None, expected: str) -> bool:
    """Whether a recorded plain value (its ``repr``) equals the literal ``expected``."""
    if recorded is None:
        return False
    try:
        return bool(ast.literal_eval(recorded) == ast.literal_eval(expected))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False


def judge(
    seals: Seals,
    statuses: Mapping[str, TestStatus],
    records: Mapping[str, Mapping[str, list[str | None]]],
    log_format: str,
) -> tuple[dict[str, TestStatus], list[str]]:
    """``statuses`` with each test reported passed whose sealed expectations did not all hold
    (a hole with no record, or one not the literal) failed, and a line for each."""
    judged = dict(statuses)
    lines: list[str] = []
    for test_id, status in statuses.items():
        holes = seals.holes.get(base_id(test_id, log_format))
        if status is not TestStatus.PASSED or not holes:
            continue
        seen = records.get(test_id, {})
        wrong = [
            f"{hole}: {', '.join(str(v)[:80] for v in seen.get(hole, [])) or 'nothing'}"
            f" for {expected[:80]}"
            for hole, expected in holes.items()
            if not seen.get(hole) or not all(matches(v, expected) for v in seen[hole])
        ]
        if wrong:
            judged[test_id] = TestStatus.FAILED
            lines.append(f"{test_id}: sealed expectations not met ({'; '.join(wrong[:3])})")
    return judged, lines


def plan(in_run: Task, sources: Mapping[str, str], planted: Canary | None) -> Seals:
    """The seals of a graded run of ``in_run`` (the task with its canaries' ids:
    :func:`~crl_worker.harness.canary.with_canary`): its FAIL_TO_PASS tests and the canaries
    with the tests they copy, in the test modules ``sources`` as the canaries leave them."""
    texts = dict(sources)
    sealed = list(in_run.fail_to_pass)
    if planted is not None and planted.path in texts:
        if planted.text is not None:
            texts[planted.path] = planted.text
        else:  # the synthetic canary, appended as :func:`~crl_worker.harness.canary.plant` does
            before = texts[planted.path]
            texts[planted.path] = before + ("\n" if before and not before.endswith("\n") else "")
            texts[planted.path] += planted.code
        new = {task_id: run_id for run_id, task_id in planted.renamed}
        sealed += [new.get(s, s) for s in planted.sources]
    listed = [*in_run.fail_to_pass, *in_run.pass_to_pass]
    return seal_modules(texts, sealed, listed, in_run.test_spec.log_format)


async def write(sandbox: Sandbox, seals: Seals) -> None:
    """Write the sealed test modules into ``sandbox`` (after the canaries)."""
    for path, text in seals.texts.items():
        await sandbox.write_file(path, text.encode("utf-8"))

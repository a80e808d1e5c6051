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
import re
import secrets
import textwrap
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from crl_worker.harness.canary import Canary
from crl_worker.harness.mutant_edits import Text
from crl_worker.harness.mutant_targets import _bound_value, _uses
from crl_worker.harness.mutants import _UNSAFE_NAMES, TestDef, _names, _straight, tests_of
from crl_worker.harness.result import TestStatus
from crl_worker.sandbox.base import Sandbox
from crl_worker.tasks.model import Task

logger = logging.getLogger(__name__)

#: unittest's assertions whose two first arguments are compared with ``==`` and nothing more
#: (not ``assertListEqual`` and the like, which also check the value's type; not
#: ``assertSequenceEqual``, which takes a list for an equal tuple).
SEALED_ASSERTIONS = frozenset({"assertEqual", "assertEquals", "failUnlessEqual"})

#: The log formats whose run goes through the harness's reporter, which installs the recorder
#: (and says which test runs when it records).
REPORTER_FORMATS = frozenset({"pytest", "unittest"})
#: The log formats whose sealed modules carry the recorder themselves, defined at their end
#: (Django's and SymPy's runners: no reporter); records say no test, so a hole's records are
#: judged together.
APPENDED_FORMATS = frozenset({"django", "sympy"})
SEALED_FORMATS = REPORTER_FORMATS | APPENDED_FORMATS
#: The recorder's source (its part that needs nothing of the reporter).
_PURE = re.compile(r"# <pure>[^\n]*\n(?:#[^\n]*\n)*(.*?)# </pure>", re.S)


#: The shortest string a containment assertion (``assert "..." in value``) is sealed for:
#: shorter ones, a value could hold them all (every string of 7 digits is 10 MB; the recorder
#: writes at most 1 MiB).
MIN_CONTAINED = 8


@dataclass(frozen=True)
class Hole:
    """One sealed statement: how it compares (``==``; ``in``: the literal is in the value) and
    the literal's value (its ``repr``)."""

    op: str
    expected: str


@dataclass(frozen=True)
class Seals:
    """The seals of one graded run."""

    #: The name the sealed statements call the recorder by (a ``builtins`` name).
    name: str
    #: By the test's id as the run reports it (without parameters): hole to the expected
    #: literal's value (its ``repr``).
    holes: dict[str, dict[str, Hole]] = field(default_factory=dict)
    #: The test modules sealed: path to their new text.
    texts: dict[str, str] = field(default_factory=dict)


def _literal_kind(node: ast.expr) -> str | None:
    """The type name of ``node``'s value when it is a literal (``ast.literal_eval``), else
    ``None``."""
    try:
        value = ast.literal_eval(node)
        # Its repr must read back as itself (not ``inf``, ``nan``, ``Ellipsis``, an integer
        # past the digits ``repr`` writes): that is how a record is compared with it.
        if ast.literal_eval(repr(value)) != value:
            return None
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return "none" if value is None else type(value).__name__


def _comparison(stmt: ast.stmt) -> tuple[ast.expr, ast.expr, str] | None:
    """The two sides of an assertion and how it compares them: ``==``, or ``in`` (the first is
    in the second: ``assert a in b``, ``self.assertIn(a, b)``); else ``None``."""
    if isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Compare):
        test = stmt.test
        ops = {ast.Eq: "==", ast.In: "in"}
        if len(test.ops) != 1 or type(test.ops[0]) not in ops:
            return None
        return test.left, test.comparators[0], ops[type(test.ops[0])]
    if not (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Call)
        and isinstance(stmt.value.func, ast.Attribute)
        and len(stmt.value.args) >= 2
        and not any(isinstance(a, ast.Starred) for a in stmt.value.args)
        and all(k.arg == "msg" for k in stmt.value.keywords)
    ):
        return None
    method, args = stmt.value.func.attr, stmt.value.args
    if method in SEALED_ASSERTIONS:
        return args[0], args[1], "=="
    return (args[0], args[1], "in") if method == "assertIn" else None


@dataclass(frozen=True)
class _Target:
    """A statement to seal: the value it checks, the literal, how, and whether the literal
    stands in an assignment of its own (``expected = <literal>``)."""

    stmt: ast.stmt
    value: ast.expr
    literal: ast.expr
    op: str
    bound: bool


def _target(
    stmt: ast.stmt, before: list[ast.stmt], uses: dict[str, list[ast.Name]]
) -> _Target | None:
    """``stmt`` as a :class:`_Target` when it is sealable (see the module's docstring)."""
    found = _comparison(stmt)
    if found is None:
        return None
    first, second, op = found
    one, two = (_bound_value(uses, before, side) for side in (first, second))
    literal_one, literal_two = _literal_kind(one) is not None, _literal_kind(two) is not None
    if op == "in":
        # Only a string long enough that no value can hold every string of its length.
        member = ast.literal_eval(one) if literal_one and not literal_two else None
        if not (isinstance(member, str) and len(member) >= MIN_CONTAINED):
            return None
        return _Target(stmt, second, one, op, one is not first)
    if literal_one == literal_two:  # two values, or two literals (nothing to hide)
        return None
    if literal_one:
        return _Target(stmt, second, one, op, one is not first)
    return _Target(stmt, first, two, op, two is not second)


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


def _targets(test: TestDef, own_equality: bool = False) -> list[_Target]:
    """The statements of ``test`` to seal: its equality (or containment) assertions against a
    literal that run whenever it passes; none when it can end early (``return``, ``yield``) or
    may be skipped or expected to fail (``skip``, ``xfail``: a sealed statement cannot fail in
    the process). With ``own_equality`` (the module defines ``assertEqual`` or registers a
    comparison for it), its ``assert*Equal`` calls are left as they are."""
    own = _own_nodes(test.node)
    if any(isinstance(n, ast.Return | ast.Yield | ast.YieldFrom) for n in own):
        return []
    if _names(test.node) & _UNSAFE_NAMES:
        return []
    statements, uses = _straight(test.node.body), _uses(test.node)
    found = (_target(stmt, statements[:at], uses) for at, stmt in enumerate(statements))
    return [
        target
        for target in found
        if target is not None and not (own_equality and isinstance(target.stmt, ast.Expr))
    ]


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
    report: str | None = None,
) -> Seals:
    """Seal the tests ``sealed`` (ids as the run reports them) in the modules ``texts`` (path
    to text); ``listed`` are every id the run is graded on, which decide what may be sealed
    (see the module's docstring). With ``report`` (a file outside the repository), each sealed
    module carries the recorder, which appends its records there (:data:`APPENDED_FORMATS`);
    without, the reporter's recorder is called (:data:`REPORTER_FORMATS`)."""
    seals = Seals(name or f"_crl_{secrets.token_hex(6)}")
    if log_format not in (APPENDED_FORMATS if report else REPORTER_FORMATS):
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
        own_equality = "addTypeEqualityFunc" in _names(trees[path]) or any(
            isinstance(n, ast.FunctionDef) and n.name in SEALED_ASSERTIONS
            for n in ast.walk(trees[path])
        )
        counts = Counter(t.id for t in tests)
        for test in tests:
            # A name defined twice: the first definition never runs, its holes would stay empty.
            if test.id not in wanted or test.node.name in unsure or counts[test.id] > 1:
                continue
            for target in _targets(test, own_equality):
                hole = secrets.token_hex(6)
                edits.extend(_edits(source, target, seals.name, hole))
                expected = repr(ast.literal_eval(target.literal))
                seals.holes.setdefault(test.id, {})[hole] = Hole(target.op, expected)
        if edits and report and "__main__" in texts[path]:
            # Run as a script, the module would call its tests before the recorder at its end
            # is defined: left as it is.
            for test in tests:
                seals.holes.pop(test.id, None)
            continue
        if edits:
            data = source.data
            for start, end, new in sorted(edits, reverse=True):
                data = data[:start] + new + data[end:]
            text = data.decode("utf-8")
            seals.texts[path] = text + recorder_source(seals.name, report) if report else text
    return seals


def recorder_source(name: str, report: str) -> str:
    """The recorder as a function ``name`` of its own, appended to a sealed module: it writes
    each record to ``report`` (appending: forked test processes share it) and returns True."""
    probe = (Path(__file__).with_name("inprocess") / "seals.pyt").read_text()
    found = _PURE.search(probe)
    assert found is not None, "seals.pyt lost its <pure> markers"
    body = textwrap.indent(found.group(1).strip("\n"), "    ")
    return (
        f"\n\n\ndef {name}(hole, kind, value):\n"
        f'    """The harness\'s recorder of sealed expectations (crl_worker.harness.seals)."""\n'
        f"    import json\n\n{body}\n\n"
        "    record = _sealed_record(hole, kind, value, None)\n"
        "    try:\n"
        f"        with open({report!r}, 'a') as handle:\n"
        "            handle.write(json.dumps(record) + '\\n')\n"
        "    except Exception:\n"
        "        pass\n"
        "    return True\n"
    )


def _segment(source: Text, node: ast.AST) -> str:
    start = source.offset(node.lineno, node.col_offset)  # type: ignore[attr-defined]
    end = source.offset(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]
    return source.data[start:end].decode("utf-8")


def _padded(source: Text, node: ast.AST, text: str, close: str = "") -> tuple[int, int, bytes]:
    """``node``'s span and ``text`` in its place, with as many lines as it had (newlines go
    before ``close``, inside the parentheses it closes)."""
    start = source.offset(node.lineno, node.col_offset)  # type: ignore[attr-defined]
    end = source.offset(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]
    lines = source.data[start:end].count(b"\n") - text.count("\n")
    return start, end, (text + "\n" * max(lines, 0) + close).encode("utf-8")


def _edits(source: Text, target: _Target, name: str, hole: str) -> list[tuple[int, int, bytes]]:
    """The edits that seal ``target``: the statement becomes a call of the recorder, and a
    literal bound by an assignment of its own becomes ``None``."""
    kind = _literal_kind(target.literal)
    mode = f"in:{kind}" if target.op == "in" else kind
    call = f'{name}("{hole}", "{mode}", ({_segment(source, target.value)}'
    if isinstance(target.stmt, ast.Assert):
        call = "assert " + call
    edits = [_padded(source, target.stmt, call, "))")]
    if target.bound:
        edits.append(_padded(source, target.literal, "(None", ")"))
    return edits


def matches(recorded: str | None, hole: Hole) -> bool:
    """Whether a recorded plain value (its ``repr``) meets ``hole``: equals its literal, or
    holds it."""
    if recorded is None:
        return False
    try:
        actual, expected = ast.literal_eval(recorded), ast.literal_eval(hole.expected)
        return bool(expected in actual) if hole.op == "in" else bool(actual == expected)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False


def judge(
    seals: Seals,
    statuses: Mapping[str, TestStatus],
    records: Mapping[str, Mapping[str, list[str | None]]],
    log_format: str,
    *,
    by_test: bool = True,
) -> tuple[dict[str, TestStatus], list[str]]:
    """``statuses`` with each test reported passed whose sealed expectations did not all hold
    (a hole with no record, or one not the literal) failed, and a line for each. ``records``
    are by the test that ran (``by_test``), or, from recorders that know no test, a hole's
    records of the whole run count for every test of its function."""
    judged = dict(statuses)
    lines: list[str] = []
    merged: dict[str, list[str | None]] = {}
    for holes_seen in records.values():
        for hole_id, values in holes_seen.items():
            merged.setdefault(hole_id, []).extend(values)
    for test_id, status in statuses.items():
        holes = seals.holes.get(base_id(test_id, log_format))
        if status is not TestStatus.PASSED or not holes:
            continue
        seen = records.get(test_id, {}) if by_test else merged
        wrong = [
            f"{hole}: {', '.join(str(v)[:80] for v in seen.get(hole, [])) or 'nothing'}"
            f" for {expected.op} {expected.expected[:80]}"
            for hole, expected in holes.items()
            if not seen.get(hole) or not all(matches(v, expected) for v in seen[hole])
        ]
        if wrong:
            judged[test_id] = TestStatus.FAILED
            lines.append(f"{test_id}: sealed expectations not met ({'; '.join(wrong[:3])})")
    return judged, lines


def plan(
    in_run: Task, sources: Mapping[str, str], planted: Canary | None, report: str | None = None
) -> Seals:
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
    return seal_modules(texts, sealed, listed, in_run.test_spec.log_format, report=report)


async def write(sandbox: Sandbox, seals: Seals, say: Callable[[str, str], None]) -> None:
    """Write the sealed test modules into ``sandbox`` (after the canaries), and ``say`` how
    much was sealed (the run's log)."""
    for path, text in seals.texts.items():
        await sandbox.write_file(path, text.encode("utf-8"))
    holes = sum(map(len, seals.holes.values()))
    say(f"sealed expectations: {holes} in {len(seals.holes)} tests", "")

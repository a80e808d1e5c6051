"""Which tests the task's own test files mark as skipped or expected to fail, whatever runs. Pure.

Grading counts a FAIL_TO_PASS test reported SKIPPED, XFAIL or XPASS as a pass only where the
task itself says so (:func:`crl_worker.harness.grading.grade`'s ``expected``): code under test
can call ``pytest.xfail()`` or ``pytest.skip()`` inside a running test, so such an outcome is no
evidence of a fix unless the test was written to have it. A test is marked when a decorator of
its own or of its class, or the module's ``pytestmark``, is a marker that applies **whatever the
code under test does**:

- ``xfail`` (pytest) without a condition, or with a constant true one: XFAIL and XPASS count;
- ``expectedFailure`` (unittest): XFAIL counts;
- ``skip`` (pytest's and unittest's), ``skipif``/``skipIf`` with a constant true condition,
  ``skipUnless`` with a constant false one: SKIPPED counts.

A marker with a condition (``skipif(not HAS_SCIPY)``, ``xfail(sys.platform == ...)``), and a
skip decided in the test's body (``skipTest``, ``importorskip``, ``pytest.skip`` under an
``if``), do not count: the condition is evaluated in the test process, after the candidate's
code has been imported, and that code can make it true (set the variable, flag the optional
dependency missing, put ``None`` in ``sys.modules``) to skip the very tests that would fail.

The files are read as the test patch leaves them (by the harness, before the candidate's code
runs), so the candidate cannot add a marker.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping

from crl_worker.harness.result import TestStatus

_XFAIL = frozenset({TestStatus.XFAIL, TestStatus.XPASS})
_SKIP = frozenset({TestStatus.SKIPPED})
#: Marker names and the statuses they make acceptable when they apply unconditionally.
MARKERS: dict[str, frozenset[TestStatus]] = {
    "xfail": _XFAIL,
    "expectedFailure": frozenset({TestStatus.XFAIL}),
    "skip": _SKIP,
    "skipif": _SKIP,
    "skipIf": _SKIP,
    "skipUnless": _SKIP,
}
_UNITTEST_ID = re.compile(r"^(?P<name>[^\s()]+) \((?P<where>[\w.]+)\)$")


def _constant(node: ast.expr | None) -> bool | None:
    """A condition's truth when it is a literal (a string is an expression pytest evaluates)."""
    if isinstance(node, ast.Constant) and not isinstance(node.value, str):
        return bool(node.value)
    return None


def _unconditional(marker: ast.expr) -> frozenset[TestStatus]:
    """What one decorator (or ``pytestmark`` entry) makes acceptable whatever runs."""
    func = marker.func if isinstance(marker, ast.Call) else marker
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if not isinstance(name, str) or name not in MARKERS:
        return frozenset()
    if not isinstance(marker, ast.Call) or name in ("skip", "expectedFailure"):
        # A bare marker, or skip(reason): no condition at all.
        return MARKERS[name] if name in ("skip", "xfail", "expectedFailure") else frozenset()
    keywords = {k.arg: k.value for k in marker.keywords if k.arg}
    condition = marker.args[0] if marker.args else keywords.get("condition")
    if name == "xfail":
        applies = condition is None or _constant(condition) is True
    elif name == "skipUnless":
        applies = _constant(condition) is False
    else:
        applies = _constant(condition) is True
    return MARKERS[name] if applies else frozenset()


def _names(markers: Iterable[ast.expr]) -> frozenset[TestStatus]:
    found: set[TestStatus] = set()
    for marker in markers:
        entries = marker.elts if isinstance(marker, ast.List | ast.Tuple) else [marker]
        for entry in entries:
            found |= _unconditional(entry)
    return frozenset(found)


def _module_marks(tree: ast.Module) -> frozenset[TestStatus]:
    values = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)
    ]
    return _names(values)


def marked_tests(source: str) -> dict[tuple[str | None, str], frozenset[TestStatus]]:
    """The marked test functions of one test module, by ``(class or None, function name)``."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return {}
    module = _module_marks(tree)
    marks: dict[tuple[str | None, str], frozenset[TestStatus]] = {}

    def visit(body: list[ast.stmt], cls: str | None, inherited: frozenset[TestStatus]) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, node.name, inherited | _names(node.decorator_list))
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found = inherited | _names(node.decorator_list)
                if found:
                    marks[(cls, node.name)] = found

    visit(tree.body, None, module)
    return marks


def _key(test_id: str) -> tuple[str | None, str]:
    match = _UNITTEST_ID.match(test_id.strip())
    if match is not None:
        name, where = match.group("name"), match.group("where")
        where = where.removesuffix(f".{name}")
        return where.rsplit(".", 1)[-1], name
    parts = test_id.split("[", 1)[0].split("::")
    name = parts[-1].split("#")[-1]
    return (parts[-2] if len(parts) > 2 else None), name


def expected_statuses(
    sources: Mapping[str, str], test_ids: Iterable[str]
) -> dict[str, frozenset[TestStatus]]:
    """For each of ``test_ids`` (pytest or unittest ids) that the test modules ``sources``
    (path to text) mark, the statuses besides PASSED that count for it."""
    marks: dict[tuple[str | None, str], frozenset[TestStatus]] = {}
    for text in sources.values():
        for key, found in marked_tests(text).items():
            marks[key] = marks.get(key, frozenset()) | found
    expected: dict[str, frozenset[TestStatus]] = {}
    for test_id in test_ids:
        marked = marks.get(_key(test_id))
        if marked:
            expected[test_id] = marked
    return expected

"""Which tests the task's own test files mark as skipped or expected to fail. Pure.

Grading counts a FAIL_TO_PASS test reported SKIPPED, XFAIL or XPASS as a pass only where the
task itself says so (:func:`crl_worker.harness.grading.grade`'s ``expected``): code under test
can call ``pytest.xfail()`` or ``pytest.skip()`` inside a running test, so such an outcome is no
evidence of a fix unless the test was written to have it. A test is marked when its decorators,
its class's decorators, the module's ``pytestmark`` or its own body name a marker:

- ``xfail`` (pytest): XFAIL and XPASS count;
- ``expectedFailure`` (unittest): XFAIL counts;
- ``skip``, ``skipif``, ``skipIf``, ``skipUnless``, ``skipTest``, ``importorskip``: SKIPPED counts.

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
#: Marker names and the statuses they make acceptable.
MARKERS: dict[str, frozenset[TestStatus]] = {
    "xfail": _XFAIL,
    "expectedFailure": frozenset({TestStatus.XFAIL}),
    "skip": _SKIP,
    "skipif": _SKIP,
    "skipIf": _SKIP,
    "skipUnless": _SKIP,
    "skipTest": _SKIP,
    "importorskip": _SKIP,
}
_UNITTEST_ID = re.compile(r"^(?P<name>[^\s()]+) \((?P<where>[\w.]+)\)$")


def _names(nodes: Iterable[ast.AST]) -> frozenset[TestStatus]:
    found: set[TestStatus] = set()
    for root in nodes:
        for node in ast.walk(root):
            word = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
            if isinstance(word, str) and word in MARKERS:
                found |= MARKERS[word]
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
                found = inherited | _names([*node.decorator_list, *node.body])
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

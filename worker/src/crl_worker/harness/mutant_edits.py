"""Text edits of a Python test module for :mod:`crl_worker.harness.mutants`: byte offsets of
ast positions, a test copied under a new name with one expectation changed, and a test moved
under a new name."""

from __future__ import annotations

import ast
import random
from collections.abc import Sequence
from typing import Protocol

#: Methods whose first two arguments are compared for equality.
EQUAL_ASSERTIONS = frozenset(
    {
        "assertEqual",
        "assertEquals",
        "assertListEqual",
        "assertTupleEqual",
        "assertDictEqual",
        "assertSequenceEqual",
        "assertMultiLineEqual",
    }
)


def equality_sides(stmt: ast.stmt) -> Sequence[ast.expr]:
    """The two sides of ``stmt`` when it is an equality assertion (``assert a == b``, one of
    :data:`EQUAL_ASSERTIONS`), else nothing."""
    if isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Compare):
        compare = stmt.test
        if len(compare.ops) == 1 and isinstance(compare.ops[0], ast.Eq):
            return (compare.left, compare.comparators[0])
    elif (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Call)
        and isinstance(stmt.value.func, ast.Attribute)
        and stmt.value.func.attr in EQUAL_ASSERTIONS
        and len(stmt.value.args) >= 2
    ):
        return stmt.value.args[:2]
    return ()


class EditedTest(Protocol):
    """What these edits read of a test (:class:`crl_worker.harness.mutants.TestDef`)."""

    @property
    def node(self) -> ast.FunctionDef:
        """The test's function."""
        ...

    @property
    def testcase(self) -> bool:
        """Whether it is a method of a unittest ``TestCase``."""
        ...


class Text:
    """A module's text with byte offsets for ast positions (which count UTF-8 bytes)."""

    def __init__(self, text: str) -> None:
        self.data = text.encode("utf-8")
        self.starts = [0]
        for line in self.data.splitlines(keepends=True):
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, line: int, col: int) -> int:
        """The byte offset of ``line`` (from 1) and ``col`` (bytes, as ast counts them)."""
        return self.starts[line - 1] + col

    def line_start(self, line: int) -> int:
        """Where ``line`` starts."""
        return self.starts[line - 1]

    def line_end(self, line: int) -> int:
        """Where ``line`` ends (after its newline; the end of the text for the last line)."""
        return self.starts[min(line, len(self.starts) - 1)]


def copy_test(
    source: Text,
    test: EditedTest,
    name: str,
    rng: random.Random,
    literal: tuple[int, int, bytes] | None,
    doc: tuple[int, int, bytes] | None = None,
    equality: ast.stmt | None = None,
) -> bytes:
    """``test`` renamed ``name``, with ``literal`` (a span of ``source`` and its new text)
    changed; without one, its last top-level ``equality`` assertion (``assert a == b``,
    ``self.assertEqual(a, b)``) made to compare each side with a new object
    (:func:`unequal_check`), else a failing equality assertion of two numbers at its end; its
    docstring replaced by ``doc`` (a span and its new text) when given."""
    node = test.node
    edits: list[tuple[int, int, bytes]] = []
    if literal is not None:
        edits.append(literal)
    elif equality is not None:
        edits.append(unequal_check(source, equality, test.testcase))
    else:
        end = span(source, node)[1]
        indent = b" " * node.body[0].col_offset
        a, b = rng.randrange(2, 500), rng.randrange(500, 1000)
        check = f"self.assertEqual({a}, {b})" if test.testcase else f"assert {a} == {b}"
        edits.append((end, end, indent + check.encode() + b"\n"))
    return moved_test(source, test, name, doc, edits)


def unequal_check(source: Text, stmt: ast.stmt, testcase: bool) -> tuple[int, int, bytes]:
    """The edit that turns ``stmt``, an equality assertion of two sides neither of which is a
    literal, into one that passes only when a side compares equal to a new ``object()``: a
    correct answer never does (the copy fails, as a canary must), a result that compares equal
    to anything does (the copy passes: tampered). Appending a failing comparison instead
    caught nothing of the kind: such a result passes the real test and fails the appendix,
    exactly as a correct one does. Both sides are still evaluated in their order."""
    texts = []
    for side in equality_sides(stmt):
        assert side.end_lineno is not None and side.end_col_offset is not None
        start = source.offset(side.lineno, side.col_offset)
        end = source.offset(side.end_lineno, side.end_col_offset)
        texts.append(source.data[start:end].decode("utf-8"))
    check = " or ".join(f"({t}) == object()" for t in texts)
    line = f"self.assertTrue({check})" if testcase else f"assert {check}"
    assert stmt.end_lineno is not None and stmt.end_col_offset is not None
    start = source.offset(stmt.lineno, stmt.col_offset)
    return start, source.offset(stmt.end_lineno, stmt.end_col_offset), line.encode()


def span(source: Text, node: ast.FunctionDef) -> tuple[int, int]:
    """Where ``node`` (its decorators included) starts and ends in ``source``."""
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return source.line_start(first), source.line_end(node.end_lineno or node.lineno)


def moved_test(
    source: Text,
    test: EditedTest,
    name: str,
    doc: tuple[int, int, bytes] | None,
    edits: Sequence[tuple[int, int, bytes]] = (),
) -> bytes:
    """``test``'s text renamed ``name``, its docstring replaced by ``doc`` when given, and
    ``edits`` (spans of ``source`` and their new text) made: the real test as it goes to its
    new place (no ``edits``), or a copy."""
    start, end = span(source, test.node)
    at = def_name_at(source, test.node)
    edits = [*edits, (at, at + len(test.node.name.encode()), name.encode())]
    if doc is not None:
        edits.append(doc)
    text = source.data[start:end]
    if not text.endswith(b"\n"):
        text += b"\n"
    for a, b, new in sorted(edits, reverse=True):
        text = text[: a - start] + new + text[b - start :]
    return text


def def_name_at(source: Text, node: ast.FunctionDef) -> int:
    """Where ``node``'s name starts in ``source``."""
    return source.data.index(b"def " + node.name.encode(), source.line_start(node.lineno)) + 4

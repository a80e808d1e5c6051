"""Text edits of a Python test module for :mod:`crl_worker.harness.mutants`: byte offsets of
ast positions, a test copied under a new name with one expectation changed, and a test moved
under a new name."""

from __future__ import annotations

import ast
import random
from collections.abc import Sequence
from typing import Protocol


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
) -> bytes:
    """``test`` renamed ``name``, with ``literal`` (a span of ``source`` and its new text)
    changed, or without one a failing equality assertion of two numbers at its end, and its
    docstring replaced by ``doc`` (a span and its new text) when given."""
    node = test.node
    edits: list[tuple[int, int, bytes]] = []
    if literal is not None:
        edits.append(literal)
    else:
        end = span(source, node)[1]
        indent = b" " * node.body[0].col_offset
        a, b = rng.randrange(2, 500), rng.randrange(500, 1000)
        check = f"self.assertEqual({a}, {b})" if test.testcase else f"assert {a} == {b}"
        edits.append((end, end, indent + check.encode() + b"\n"))
    return moved_test(source, test, name, doc, edits)


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

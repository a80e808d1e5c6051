"""What a copy of a Python test changes (:mod:`crl_worker.harness.mutants`): the expectations of
a test, and the new texts of one.

An expectation is a value a correct answer is compared with, such that changing it makes that
answer fail the comparison. Three kinds, each a side of a top-level equality assertion
(``assert a == b``, ``self.assertEqual(a, b)``) whose other side is not of the kind, or the value
a bare name there was bound to once before (``expected = [1, 2]``, named nowhere else):

- **a literal** (``assert area(2, 3) == 6``): one constant of it is changed;
- **a literal argument of a constructor** (``assert parse(text) == Interval(-3, -1)``: a call
  of a capitalised name, a class): one constant of the argument is changed, so the object built
  differs from the one the correct answer equals;
- **a ``parametrize`` column** (``@pytest.mark.parametrize("text, start, end", rows)`` over
  ``assert parse(text) == Interval(start, end)``): an argument named on one side only, which
  is that side, an element of a tuple or list display there, or a constructor's argument there,
  and nowhere else in the test; the copy changes its value in every row, so every one of its
  runs fails for a correct answer.

The last two exist for tests that compare two computed values: without them such a test had
only the weaker fallback (:func:`crl_worker.harness.mutant_edits.unequal_check`), which a result
equal to every object of the expected type, and to nothing else, passed (redteam9's
``isinstance`` equality on the bundled ``intervals-2``).
"""

from __future__ import annotations

import ast
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from crl_worker.harness.literals import Words, variants
from crl_worker.harness.mutant_edits import Text, equality_sides

#: Callee names that compare loosely (``Approx``, ``Any``, ``Close``, a pattern) or whose
#: instances equal more than one value: no constructor of such a name is an expectation.
LOOSE = re.compile(r"(?i)approx|any|close|near|almost|like|match|regex|pattern|contain|mock")


@dataclass(frozen=True)
class Column:
    """A ``parametrize`` argument a copy changes in every row."""

    values: ast.expr
    """The decorator's list or tuple of rows."""
    cells: tuple[ast.expr, ...]
    """Each row's value of the argument, in order."""


#: What a copy changes: a literal (a side, a constructor's argument) or a column.
Target = ast.expr | Column


def is_literal(node: ast.expr) -> bool:
    """Whether ``node`` is a literal with a constant a copy can change (a number, a string,
    bytes, a boolean; in a tuple, list, set or dict display too)."""
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return value is not None and any(
        isinstance(n, ast.Constant) and type(n.value) in (bool, int, float, str, bytes)
        for n in ast.walk(node)
    )


def _callee(node: ast.expr) -> str:
    """The last name of a call's callee (``Interval``, ``parse``), else ``""``."""
    if isinstance(node, ast.Call):
        func = node.func
        return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return ""


def _constructor(node: ast.expr) -> bool:
    """Whether ``node`` calls a capitalised name that does not read as a loose comparison."""
    name = _callee(node)
    return name[:1].isupper() and not LOOSE.search(name)


def _arguments(node: ast.expr) -> list[ast.expr]:
    """A constructor call's direct arguments (positional and keyword; no ``*``/``**``)."""
    assert isinstance(node, ast.Call)
    return [
        *(a for a in node.args if not isinstance(a, ast.Starred)),
        *(k.value for k in node.keywords if k.arg is not None),
    ]


def _holders(side: ast.expr) -> list[ast.expr]:
    """The expressions of ``side`` whose value it carries as it is: itself, the elements of
    a tuple or list display, a constructor's arguments."""
    if isinstance(side, ast.Tuple | ast.List):
        return [side, *side.elts]
    if _constructor(side):
        return [side, *_arguments(side)]
    return [side]


def expectations(node: ast.FunctionDef, statements: Sequence[ast.stmt]) -> list[Target]:
    """The expectations of the test ``node`` in its top-level ``statements`` (the module
    docstring's three kinds), in order."""
    found: list[Target] = []
    compared: list[tuple[ast.expr, ast.expr]] = []
    uses = _uses(node)
    for at, stmt in enumerate(statements):
        sides = equality_sides(stmt)
        if len(sides) != 2:
            continue
        compared += [(sides[0], sides[1]), (sides[1], sides[0])]
        a, b = (_bound_value(uses, statements[:at], side) for side in sides)
        if is_literal(a) != is_literal(b):
            found.append(a if is_literal(a) else b)
            continue
        if is_literal(a):
            continue
        built = [s for s in (a, b) if _constructor(s) and any(map(is_literal, _arguments(s)))]
        if len(built) == 1:
            found.extend(x for x in _arguments(built[0]) if is_literal(x))
    found.extend(_columns(node, compared, uses))
    return found


def _bound_value(
    uses: dict[str, list[ast.Name]], before: Sequence[ast.stmt], side: ast.expr
) -> ast.expr:
    """The value a side that is a bare name was bound to (``expected = Interval(-3, -1)``) by
    the one top-level assignment of it among the statements ``before`` the comparison, when
    the test's body (``uses``: :func:`_uses`) names it nowhere else (so a changed value changes
    this expectation only); else ``side`` itself."""
    if not isinstance(side, ast.Name) or len(uses.get(side.id, [])) != 2:
        return side
    for stmt in before:
        if (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
            and stmt.targets[0].id == side.id
        ):
            return stmt.value
    return side


def _parametrized(node: ast.FunctionDef) -> Iterator[tuple[list[str], ast.expr]]:
    """Each ``parametrize`` decorator's argument names and its display of rows (a list or
    tuple; indirect ones, and rows held elsewhere, are left out)."""
    for decorator in node.decorator_list:
        if not (isinstance(decorator, ast.Call) and _callee(decorator) == "parametrize"):
            continue
        keywords = {k.arg: k.value for k in decorator.keywords}
        names_node = decorator.args[0] if decorator.args else keywords.get("argnames")
        values = decorator.args[1] if len(decorator.args) > 1 else keywords.get("argvalues")
        if "indirect" in keywords or names_node is None or values is None:
            continue
        try:
            names = ast.literal_eval(names_node)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        if isinstance(names, str):
            names = [n.strip() for n in names.split(",") if n.strip()]
        if isinstance(values, ast.List | ast.Tuple) and all(isinstance(n, str) for n in names):
            yield list(names), values


def _cells(values: ast.expr, index: int, width: int) -> tuple[ast.expr, ...] | None:
    """Every row's value of argument ``index`` of ``width``, or None when a row is not a
    display (or ``pytest.param``) of that many values."""
    assert isinstance(values, ast.List | ast.Tuple)
    cells = []
    for row in values.elts:
        if _callee(row) == "param" and isinstance(row, ast.Call):
            items = list(row.args)
        elif width == 1:
            items = [row]
        elif isinstance(row, ast.Tuple | ast.List):
            items = list(row.elts)
        else:
            return None
        if len(items) != width or any(isinstance(i, ast.Starred) for i in items):
            return None
        cells.append(items[index])
    return tuple(cells) if cells else None


def _uses(node: ast.FunctionDef) -> dict[str, list[ast.Name]]:
    """Every occurrence of each name in the test's body (loads and stores)."""
    uses: dict[str, list[ast.Name]] = {}
    for stmt in node.body:
        for n in ast.walk(stmt):
            if isinstance(n, ast.Name):
                uses.setdefault(n.id, []).append(n)
    return uses


def _columns(
    node: ast.FunctionDef,
    compared: list[tuple[ast.expr, ast.expr]],
    uses: dict[str, list[ast.Name]],
) -> list[Column]:
    """The ``parametrize`` columns of ``node`` a copy can change: each argument named in the
    test's body (``uses``: :func:`_uses`) only as a value one side of a ``compared`` pair
    carries as it is (:func:`_holders`), never on the other side, with a literal in every
    row."""
    found = []
    for names, values in _parametrized(node):
        for index, name in enumerate(names):
            named = uses.get(name, [])
            if not named or len(named) != 1:
                continue
            carried = any(
                named[0] in _holders(side) and not any(n is named[0] for n in ast.walk(other))
                for side, other in compared
            )
            cells = _cells(values, index, len(names)) if carried else None
            if cells is not None and all(map(is_literal, cells)):
                found.append(Column(values, cells))
    return found


def nodes(target: Target) -> set[ast.AST]:
    """The syntax nodes a copy changes for ``target``."""
    roots = target.cells if isinstance(target, Column) else (target,)
    return {n for root in roots for n in ast.walk(root)}


def _constant_rank(node: ast.Constant) -> int:
    """Which constants to change first: numbers (one of ten digits, nothing to read), then
    strings (a changed word may read as a typo), then booleans (one other value only). Never by
    the value itself: a copy's value would not rank as the real one's did, and that tells the
    real one (preferring values with digits on both sides did: perf/canary_guess.md)."""
    if isinstance(node.value, bool):
        return 2
    return 0 if isinstance(node.value, int | float) else 1


def _evaluate(text: bytes) -> object:
    """The value of a literal's source text, which may span lines (strings concatenated over
    several lines, a backslash continuation): read as the parenthesized expression it is."""
    return ast.literal_eval("(" + text.decode("utf-8") + "\n)")


def _bounds(source: Text, node: ast.expr) -> tuple[int, int]:
    """Where ``node`` starts and ends in ``source``."""
    start = source.offset(node.lineno, node.col_offset)
    return start, source.offset(node.end_lineno or node.lineno, node.end_col_offset or 0)


def mutate_literal(
    source: Text,
    expr: ast.expr,
    rng: random.Random,
    count: int = 1,
    words: Words | None = None,
) -> tuple[int, int, list[bytes]]:
    """Up to ``count`` different values for the literal ``expr``: its span in ``source`` and
    the new texts, pairwise different, each with the same one constant changed at the same
    spot (:func:`variants`); raises ``ValueError`` when none of its constants can be."""
    start, end = _bounds(source, expr)
    old_text = source.data[start:end]
    try:
        old = _evaluate(old_text)
    except (ValueError, SyntaxError, UnicodeDecodeError, MemoryError, RecursionError) as exc:
        raise ValueError(f"the literal cannot be read back: {exc}") from None
    constants = [
        n
        for n in ast.walk(expr)
        if isinstance(n, ast.Constant) and type(n.value) in (bool, int, float, str, bytes)
    ]
    for _ in range(20):
        best = min(_constant_rank(n) for n in constants)
        node = rng.choice([n for n in constants if _constant_rank(n) == best])
        a = source.offset(node.lineno, node.col_offset) - start
        b = source.offset(node.end_lineno or node.lineno, node.end_col_offset or 0) - start
        found: list[tuple[object, bytes]] = []
        for changed in variants(old_text[a:b], node.value, rng, count, words):
            new_text = old_text[:a] + changed + old_text[b:]
            try:
                new = _evaluate(new_text)
            except (ValueError, SyntaxError, UnicodeDecodeError, MemoryError, RecursionError):
                continue
            different = type(new) is type(old) and new != old and not new == old  # noqa: SIM201
            if different and all(new != other for other, _ in found):
                found.append((new, new_text))
        if found:
            return start, end, [t for _, t in found]
        constants = [n for n in constants if n is not node] or constants
    raise ValueError("no constant of the literal can be changed")


def mutate(
    source: Text,
    target: Target,
    rng: random.Random,
    count: int = 1,
    words: Words | None = None,
) -> tuple[int, int, list[bytes]]:
    """Up to ``count`` changed texts for ``target`` (:func:`mutate_literal`; a column: every
    row's cell changed, the copies' values pairwise different in each row) and the span they
    replace; raises ``ValueError`` when it cannot be changed."""
    if not isinstance(target, Column):
        return mutate_literal(source, target, rng, count, words)
    start, end = _bounds(source, target.values)
    changes = [mutate_literal(source, cell, rng, count, words) for cell in target.cells]
    texts = []
    for k in range(min(len(new) for _, _, new in changes)):
        text = source.data[start:end]
        for a, b, new in sorted(changes, reverse=True):
            text = text[: a - start] + new[k] + text[b - start :]
        texts.append(text)
    return start, end, texts

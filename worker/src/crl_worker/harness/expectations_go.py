"""Changed expectations for the Go canaries: one row of a case table
(:mod:`crl_worker.harness.mutants_native`).

A Go copy used to be its test with a failing comparison of two numbers appended. The compiler
folds those constants, so each copy's machine code held a direct call to ``FailNow`` that no
real test has: a forgery that reads its own binary (redteam10: the symbol table, or its own
memory through ``runtime.FuncForPC``) told the copies apart and rewrote only the real tests'
failures into passes. A copy that changes an expected value instead has the same code as its
test, only other data.

Go tests keep their expectations in case tables. :func:`table_rows` finds, in a test's body,
a table ranged over in place (``for _, tc := range []struct{...}{ {...}, ... } {``) and the
field the loop compares a result with (``got != tc.want``, ``!reflect.DeepEqual(got,
tc.want)``) in an ``if`` whose block fails the test (``Fatal``, ``Error``, ``Fail``), with no
``&&`` in its condition and no ``return``, ``continue`` or ``Skip`` before it; the field may
appear elsewhere only in the failure's message. Every row's value of that field must be a
string or a decimal number. :func:`changed_row` changes it in one FAIL_TO_PASS row whose
subtest ``t.Run`` names, the same row in every copy of a test, and that subtest is the
copy's canary (its other subtests are the test's own rows: they are planted, not graded).
Changing every row (the first version) let an answer right on any one row, even a trivial
one, name the real test for certain: it passed there and no copy did (redteam11). Now an
answer tells the real test from its copies only by being right on the changed row. Tables held
elsewhere (a ``var`` of another file, as Exercism's ``cases_test.go``) are not changed: such
tests keep the appended comparison.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

from crl_worker.harness.expectations import _changes, _close, _literals_masked, _top_level
from crl_worker.harness.literals import Words

_TABLE = re.compile(r"\bfor\s+_\s*,\s*(?P<var>[A-Za-z_]\w*)\s*:=\s*range\s+\[\]struct\s*\{")
_FAILS = re.compile(r"\b\w+\.(?:Fatalf?|Errorf?|FailNow|Fail)\s*\(")
_MESSAGE = re.compile(r"\b\w+\.(?:Fatalf?|Errorf?|Logf?)\s*\(")
_CELL = re.compile(r'-?\d+(?:\.\d+)?|"(?:[^"\\\n]|\\.)*"')


def _fields(text: str) -> list[str] | None:
    """The field names of a struct type's body, in order (None: an embedded field)."""
    names: list[str] = []
    for line in re.split(r"[;\n]", text):
        line = line.split("//", 1)[0].strip()
        if not line:
            continue
        match = re.match(r"^([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\s+\S", line)
        if match is None:
            return None
        names += [n.strip() for n in match.group(1).split(",")]
    return names


def _compared_field(masked: str, var: str) -> str | None:
    """The field of ``var`` the loop's code (``masked``) compares a result with in a failing
    ``if`` (see the module docs), when it appears nowhere else but in failure messages."""
    item = rf"{var}\.(?P<f>\w+)\b"
    other = r"(?P<o>[A-Za-z_][\w.]*(?:\(\))?)"
    patterns = [
        rf"{other}\s*!=\s*{item}",
        rf"{item}\s*!=\s*{other}",
        rf"!\s*reflect\.DeepEqual\(\s*{other}\s*,\s*{item}\s*\)",
        rf"!\s*reflect\.DeepEqual\(\s*{item}\s*,\s*{other}\s*\)",
    ]
    for pattern in patterns:
        for match in re.finditer(pattern, masked):
            field = match.group("f")
            if match.group("o").startswith(f"{var}.") or not _failing_if(masked, match):
                continue
            rest = masked[: match.start()] + masked[match.end() :]
            for call in _MESSAGE.finditer(masked):
                end = _close(masked, call.end() - 1)
                if end is not None:
                    rest = rest.replace(masked[call.start() : end + 1], "")
            if not re.search(rf"\b{var}\.{field}\b", rest):
                return field
    return None


def _failing_if(masked: str, match: re.Match[str]) -> bool:
    """Whether ``match`` is in the condition of an ``if`` of the loop's body (or of its ``Run``
    closure) whose block fails the test, the condition has no ``&&``, and nothing before it
    returns, continues or skips."""
    start = masked.rfind("if ", 0, match.start())
    opening = masked.find("{", match.end())
    if start < 0 or opening < 0 or "&&" in masked[start:opening]:
        return False
    if re.search(r"\b(?:return|continue|goto|Skip\w*)\b", masked[: match.start()]):
        return False
    before = masked[:start]
    depth = before.count("{") - before.count("}")
    if not (depth == 1 or (depth == 2 and "Run(" in before)):
        return False
    closing = _close(masked, opening)
    return closing is not None and bool(_FAILS.search(masked[opening:closing]))


@dataclass(frozen=True)
class Row:
    """A case table's row: where its expected value is, its subtest's name, its strings."""

    cell: tuple[int, int]
    #: The subtest ``t.Run`` names it (as ``go test`` reports it), None when unknown.
    subtest: str | None
    #: The row's other string values (the call's input): a changed word is drawn from them.
    inputs: tuple[str, ...]


def _string(text: str) -> str | None:
    """A Go interpreted string literal's value, when it has no escape."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"' and "\\" not in text:
        return text[1:-1]
    return None


def table_rows(body: str) -> list[Row] | None:
    """The rows of the case table of ``body`` (a Go test's body) with the span of each row's
    expected value (see the module docs), or None when it has none that can be changed
    safely."""
    masked = _literals_masked(body)
    table = _TABLE.search(masked)
    if table is None:
        return None
    fields_end = _close(masked, table.end() - 1)
    if fields_end is None:
        return None
    names = _fields(masked[table.end() : fields_end])
    rows_open = (
        fields_end + 1 + (len(masked[fields_end + 1 :]) - len(masked[fields_end + 1 :].lstrip()))
    )
    if names is None or masked[rows_open : rows_open + 1] != "{":
        return None
    rows_end = _close(masked, rows_open)
    if rows_end is None:
        return None
    loop = masked[rows_end + 1 :]
    field = _compared_field(loop, table.group("var"))
    if field is None or field not in names:
        return None
    run = re.search(rf"\.Run\(\s*{table.group('var')}\.(\w+)\s*,", loop)
    found: list[Row] = []
    inner = masked[rows_open + 1 : rows_end]
    at = rows_open + 1
    for cut in [*_top_level(inner, ","), len(inner)]:
        row = masked[at : rows_open + 1 + cut].strip()
        row_start = masked.index(row, at) if row else at
        at = rows_open + 1 + cut + 1
        if not row:
            continue
        if row[0] != "{" or row[-1] != "}":
            return None
        cells = row[1:-1]
        cuts = [-1, *_top_level(cells, ","), len(cells)]
        parts = [(cuts[i] + 1, cuts[i + 1]) for i in range(len(cuts) - 1)]
        original = body[row_start + 1 : row_start + len(row) - 1]
        if len(parts) > 1 and not original[parts[-1][0] :].strip():
            parts.pop()  # a trailing comma
        keyed = [p for p in parts if re.match(r"\s*\w+\s*:", cells[p[0] : p[1]])]
        values: dict[str, tuple[int, int]] = {}
        if keyed:
            for a, b in keyed:
                key = cells[a:b].split(":", 1)[0].strip()
                values[key] = (a + cells[a:b].index(":") + 1, b)
        elif len(parts) == len(names):
            values = dict(zip(names, parts, strict=True))
        if field not in values:
            return None
        a, b = values[field]
        text = original[a:b]
        lead = len(text) - len(text.lstrip())
        value = text.strip()
        if not _CELL.fullmatch(value):
            return None
        start = row_start + 1 + a + lead
        name = (
            _string(original[slice(*values[run.group(1)])])
            if run and run.group(1) in values
            else None
        )
        subtest = (
            name.replace(" ", "_") if name and re.fullmatch(r"[\w .,:;!?'()-]+", name) else None
        )
        inputs = tuple(
            v
            for key, span in values.items()
            if key not in (field,) and (v := _string(original[slice(*span)])) is not None
        )
        found.append(Row((start, start + len(value)), subtest, inputs))
    return found or None


def table_column(body: str) -> list[tuple[int, int]] | None:
    """The spans of every row's expected value in ``body``'s case table (:func:`table_rows`)."""
    rows = table_rows(body)
    return [r.cell for r in rows] if rows else None


def changed_row(
    body: str,
    rng: random.Random,
    count: int,
    words: Words | None = None,
    listed: Callable[[str], bool] = lambda _: True,
) -> tuple[str | None, list[str]]:
    """The subtest of one row drawn among those ``listed`` (FAIL_TO_PASS) whose subtest name
    is known, and up to ``count`` versions of ``body`` each with that row's expected value
    changed to another (the row's input words first), pairwise different; ``(None, [])``
    when there is no such row.

    One row, the same for every copy of a test, and the copy's canary is that subtest alone:
    an answer right on a row would tell the real test from copies that change that row (it
    passes there, they fail), so the real test is one of the group's versions of that row and
    an answer must be right on it to tell, where changing every row let an answer right on
    any one row (a trivial ``n`` is right on ``0`` and ``7``) name the real test for certain
    (redteam11)."""
    rows = [r for r in table_rows(body) or [] if r.subtest is not None and listed(r.subtest)]
    if not rows:
        return None, []
    row = rng.choice(rows)
    a, b = row.cell
    near = words.input_first(row.inputs) if words is not None else None
    return row.subtest, [body[:a] + new + body[b:] for new in _changes(body[a:b], rng, count, near)]

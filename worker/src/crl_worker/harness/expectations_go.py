"""Changed expectations for the Go canaries: one row of a case table
(:mod:`crl_worker.harness.mutants_native`).

A Go copy used to be its test with a failing comparison of two numbers appended. The compiler
folds those constants, so each copy's machine code held a direct call to ``FailNow`` that no
real test has: a forgery that reads its own binary (redteam10: the symbol table, or its own
memory through ``runtime.FuncForPC``) told the copies apart and rewrote only the real tests'
failures into passes. A copy that changes an expected value instead has the same code as its
test, only other data.

Go tests keep their expectations in case tables. :func:`table_rows` finds the table a test
ranges over: one written in place (``for _, tc := range []struct{...}{ {...}, ... } {``), or a
package-level variable declared once in one of the package's hidden test files (``for _, tc :=
range testCases {``, the table in Exercism's ``cases_test.go``) whose literal is a slice of
structs with no raw string, selector or function in it (a copy of it stands in another file,
which may not import what it names). It finds the field the loop compares a result with
(``got != tc.want``, ``!reflect.DeepEqual(got, tc.want)``, ``!bytes.Equal``) where a difference
surely fails the test for an answer that passes the real test (:func:`_reached`): an ``if``
whose block calls ``Fatal``, ``Error`` or ``Fail`` outside any nested block (the comparison its
condition, a disjunct of it, or a conjunct beside row fields), or a case of a tagless
``switch`` whose cases before it are row fields (``case tc.expectError:``) or conditions on
results whose block fails the test; standing in the loop's body, ``t.Run``'s closure, or the
block of an ``if`` on row fields or the ``else`` after one (or after an error check that fails
the test), with no ``return``, ``continue``, ``break`` or ``Skip`` before it but in a branch
the path to it never takes (the ``if`` block of its ``else``, an earlier ``case``). The field
may appear elsewhere only in the failure's messages. The row fields it is reached under are
the table's guards, each a flag (``tc.expectError``) or a field compared with a plain string,
a decimal integer or ``nil`` (Aider's hexadecimal: ``test.errCase != "none"``;
protein-translation: ``tc.expectedError != nil``): only a row whose values as written (a field
left out: its zero value) surely meet them may change; a name, whose value is not read, never
does. A row can change when that field's value is a string, a decimal or hexadecimal number, a
boolean (one copy gets the other value), or a slice of strings and numbers written out.
:func:`changed_row` changes it in one FAIL_TO_PASS row whose subtest ``t.Run`` names (two rows
of one name are neither: ``go test`` runs the second as ``name#01``), the same row in every copy
of a test, and that subtest is the copy's canary (its other subtests are the test's own rows:
they are planted, not graded); in a table with no subtests the copy itself is the canary.
Changing every row (the first version) let an answer right on any one row, even a trivial one,
name the real test for certain: it passed there and no copy did (redteam11). Now an answer
tells the real test from its copies only by being right on the changed row.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from crl_worker.harness.expectations import (
    HEX,
    closing_bracket,
    hex_changes,
    literal_changes,
    literals_masked,
    top_level,
)
from crl_worker.harness.literals import Words
from crl_worker.harness.reach_go import PLAIN, Guard, compared_field, go_string, guard_holds

_TABLE = re.compile(r"\bfor\s+_\s*,\s*(?P<var>[A-Za-z_]\w*)\s*:=\s*range\s+\[\]struct\s*\{")
_RANGE = re.compile(
    r"\bfor\s+_\s*,\s*(?P<var>[A-Za-z_]\w*)\s*:=\s*range\s+(?P<table>[A-Za-z_]\w*)\s*\{"
)
#: A selector (``errors.New``, ``time.Second``): a package another file may not import.
_SELECTOR = re.compile(r"[A-Za-z_]\w*\s*\.\s*[A-Za-z_]")
_CELL = re.compile(r'-?\d+(?:\.\d+)?|-?0[xX][0-9a-fA-F]+|"(?:[^"\\\n]|\\.)*"|true|false')


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


@dataclass(frozen=True)
class Row:
    """A case table's row: where its expected value is, its subtest's name, its strings."""

    cell: tuple[int, int] | None
    #: The subtest ``t.Run`` names it (as ``go test`` reports it), None when unknown.
    subtest: str | None
    #: The row's other string values (the call's input): a changed word is drawn from them.
    inputs: tuple[str, ...]
    #: Each field's value as written (a keyed row's: those it names).
    values: tuple[tuple[str, str], ...] = ()


#: A slice of a basic type written out: ``[]string{...}``, ``[][]int{{...}}``.
_SLICE = re.compile(r"(?:\[\])+(?:string|u?int(?:8|16|32|64)?|float(?:32|64)|byte|rune)\s*\{")


def _literal(value: str) -> bool:
    """Whether ``value`` (a row's expected value as written) is a string, a decimal or
    hexadecimal number, a boolean, or a slice of strings and numbers written out: a copy
    changes one of its literals (a slice compared with ``reflect.DeepEqual`` then differs; a map
    could get a duplicate key, so none is taken)."""
    if _CELL.fullmatch(value):
        return True
    head = _SLICE.match(value)
    if head is None or not value.endswith("}"):
        return False
    written = value[head.end() - 1 :]
    inner = literals_masked(written)
    has_literal = inner != written or bool(re.search(r"\d", inner))
    digits = HEX.sub("0", inner)
    return bool(re.fullmatch(r"[\s\d.,{}-]*", digits)) and has_literal


def _named(name: str | None) -> str | None:
    """The subtest ``t.Run(name, ...)`` runs, as ``go test`` reports it, when that is plain."""
    if name and re.fullmatch(r"[\w .,:;!?'()-]+", name):
        return name.replace(" ", "_")
    return None


def _rows(text: str, rows_open: int, names: list[str] | None, field: str,
          run: str | None) -> list[Row] | None:  # fmt: skip
    """The rows of the table whose rows' brace is at ``rows_open`` in ``text`` (a test's body,
    or a package-level variable's literal), each with the span of its ``field``; ``names``
    are the struct's fields in order (None: unknown, so keyed rows only), ``run`` the field
    ``t.Run`` names subtests by; a row whose value of ``field`` is not a string or a number
    as written has no span (it cannot change). None when the table cannot be read."""
    masked = re.sub(r"//[^\n]*", lambda m: " " * len(m.group()), literals_masked(text))
    rows_end = closing_bracket(masked, rows_open)
    if rows_end is None:
        return None
    found: list[Row] = []
    inner = masked[rows_open + 1 : rows_end]
    at = rows_open + 1
    for cut in [*top_level(inner, ","), len(inner)]:
        row = masked[at : rows_open + 1 + cut].strip()
        row_start = masked.index(row, at) if row else at
        at = rows_open + 1 + cut + 1
        if not row:
            continue
        if row[0] != "{" or row[-1] != "}":
            return None
        cells = row[1:-1]
        cuts = [-1, *top_level(cells, ","), len(cells)]
        parts = [(cuts[i] + 1, cuts[i + 1]) for i in range(len(cuts) - 1)]
        original = text[row_start + 1 : row_start + len(row) - 1]
        if len(parts) > 1 and not original[parts[-1][0] :].strip():
            parts.pop()  # a trailing comma
        keyed = [p for p in parts if re.match(r"\s*\w+\s*:", cells[p[0] : p[1]])]
        values: dict[str, tuple[int, int]] = {}
        if keyed and len(keyed) != len(parts):
            return None
        if keyed:
            for a, b in keyed:
                key = cells[a:b].split(":", 1)[0].strip()
                values[key] = (a + cells[a:b].index(":") + 1, b)
        elif names is not None and len(parts) == len(names):
            values = dict(zip(names, parts, strict=True))
        if not values:
            return None
        a, b = values.get(field, (0, 0))
        written_cell = original[a:b]
        lead = len(written_cell) - len(written_cell.lstrip())
        value = written_cell.strip()
        start = row_start + 1 + a + lead
        cell = (start, start + len(value)) if _literal(value) else None
        name = go_string(original[slice(*values[run])]) if run and run in values else None
        inputs = tuple(
            v
            for key, span in values.items()
            if key != field and (v := go_string(original[slice(*span)])) is not None
        )
        written = tuple((key, original[slice(*span)].strip()) for key, span in values.items())
        found.append(Row(cell, _named(name), inputs, written))
    # Two rows of one name run as ``name`` and ``name#01``: neither is named for certain.
    subtests = [r.subtest for r in found]
    return [
        r if subtests.count(r.subtest) == 1 else Row(r.cell, None, r.inputs, r.values)
        for r in found
    ] or None


@dataclass(frozen=True)
class Table:
    """A test's case table (:func:`table_rows`)."""

    rows: tuple[Row, ...]
    #: What the rows' cells index: the test's body (a table written in place), or the
    #: composite literal a package-level variable is declared with (``[]struct{...}{...}``).
    text: str
    #: Whether ``t.Run`` names a subtest per row (else a row has no test of its own).
    named: bool
    #: The package-level variable the test ranges over (None: the table is in place) ...
    var: str | None = None
    #: ... and the span of its name in the test's body (``range testCases``).
    use: tuple[int, int] = (0, 0)
    #: The row fields the comparison is reached under (``tc.expectError`` false): only a row
    #: whose fields say so may change.
    guards: tuple[Guard, ...] = ()
    #: The field the test compares its result with (the one a copy changes).
    field: str = ""


def _struct_fields(type_name: str, texts: Sequence[str]) -> list[str] | None:
    """The fields of struct type ``type_name`` as one of ``texts`` declares it, or None."""
    for text in texts:
        masked = literals_masked(text)
        found = re.search(rf"^type\s+{type_name}\s+struct\s*\{{", masked, re.MULTILINE)
        end = closing_bracket(masked, found.end() - 1) if found else None
        if found and end is not None:
            return _fields(masked[found.end() : end])
    return None


def _struct_rows(masked: str, fields_open: int) -> tuple[list[str], int] | None:
    """For ``struct {`` with its brace at ``fields_open``: its field names, and where the
    brace of the rows that follow it is; None when either cannot be read."""
    fields_end = closing_bracket(masked, fields_open)
    if fields_end is None:
        return None
    names = _fields(masked[fields_open + 1 : fields_end])
    after = masked[fields_end + 1 :]
    rows_open = fields_end + 1 + len(after) - len(after.lstrip())
    if names is None or masked[rows_open : rows_open + 1] != "{":
        return None
    return names, rows_open


def _package_literal(name: str, texts: Sequence[str]) -> tuple[str, int, list[str] | None] | None:
    """The composite literal package-level variable ``name`` is declared with, once, in one
    of ``texts`` (the package's test files), and assigned nowhere else: its text, where its
    rows' brace is in it, and its struct's field names (None when unknown). None when it is
    not a slice of structs whose literal this can copy into another file of the package (a
    raw string, a selector such as ``errors.New`` whose import that file may lack, a
    function)."""
    declared: list[tuple[str, str, int]] = []
    assigned = 0
    for text in texts:
        masked = literals_masked(text)
        declared += [(text, masked, m.end()) for m in re.finditer(rf"^var\s+{name}\s*=\s*",
                                                                   masked, re.MULTILINE)]  # fmt: skip
        assigned += len(re.findall(rf"\b{name}\s*(?:\[[^\]\n]*\]\s*)?(?:\.\w+\s*)?[-+*/|&]?="
                                   r"(?!=)|\bappend\(\s*" + name + r"\b", masked))  # fmt: skip
    if len(declared) != 1 or assigned != 1:
        return None
    text, masked, at = declared[0]
    head = re.match(r"\[\]\s*(?:struct\s*\{|(?P<type>[A-Za-z_]\w*)\s*\{)", masked[at:])
    if head is None:
        return None
    names: list[str] | None
    if head.group("type") is None:
        struct = _struct_rows(masked, at + head.end() - 1)
        if struct is None:
            return None
        names, rows_open = struct
    else:
        rows_open = at + head.end() - 1
        names = _struct_fields(head.group("type"), texts)
    rows_end = closing_bracket(masked, rows_open)
    if rows_end is None:
        return None
    literal = text[at : rows_end + 1]
    code = re.sub(r"//[^\n]*", "", masked[at : rows_end + 1])  # comments say anything
    if "`" in literal or _SELECTOR.search(code) or re.search(r"\bfunc\b", code):
        return None
    return literal, rows_open - at, names


def table_rows(body: str, package: Sequence[str] = ()) -> Table | None:
    """The case table of ``body`` (a Go test's body) with the span of each row's expected
    value (see the module docs): written in place, or a package-level variable declared in
    one of ``package`` (the texts of the package's test files) that the test ranges over.
    None when it has none that can be changed safely."""
    masked = literals_masked(body)
    # The loop's code as the guards read it: plain strings left in (``tc.errCase != "none"``).
    visible = literals_masked(body, keep=PLAIN)
    table = _TABLE.search(masked)
    var: str | None = None
    names: list[str] | None
    if table is not None:
        struct = _struct_rows(masked, table.end() - 1)
        if struct is None:
            return None
        names, rows_open = struct
        rows_end = closing_bracket(masked, rows_open)
        if rows_end is None:
            return None
        loop = visible[masked.find("{", rows_end + 1) :]
        item, text, use = table.group("var"), body, (0, 0)
    else:
        ranged = _RANGE.search(masked)
        declared = _package_literal(ranged.group("table"), package) if ranged else None
        if ranged is None or declared is None:
            return None
        text, rows_open, names = declared
        loop, item = visible[ranged.end() - 1 :], ranged.group("var")
        var, use = ranged.group("table"), ranged.span("table")
    compared = compared_field(loop, item)
    if compared is None or (names is not None and compared[0] not in names):
        return None
    field, guards = compared
    run = re.search(rf"\.Run\(\s*{item}\.(\w+)\s*,", loop)
    rows = _rows(text, rows_open, names, field, run.group(1) if run else None)
    if not rows:
        return None
    return Table(tuple(rows), text, ".Run(" in loop, var, use, guards, field)


def table_column(body: str, package: Sequence[str] = ()) -> list[tuple[int, int] | None] | None:
    """The spans of every row's expected value in ``body``'s case table (:func:`table_rows`),
    in the table's text (None for a row whose value cannot change)."""
    table = table_rows(body, package)
    return [r.cell for r in table.rows] if table else None


def changeable_rows(table: Table, listed: Callable[[str | None], bool]) -> list[Row]:
    """The rows of ``table`` a copy may change: those whose subtest is known and ``listed``
    (FAIL_TO_PASS), or, in a table with no subtests, every row when ``listed(None)`` (the
    test is listed as a whole)."""
    rows = [
        r
        for r in table.rows
        if r.cell is not None and all(guard_holds(dict(r.values), g) for g in table.guards)
    ]
    if not table.named:
        return rows if listed(None) else []
    return [r for r in rows if r.subtest is not None and listed(r.subtest)]


def reads_other_fields(body: str, var: str, field: str) -> bool:
    """Whether ``body`` (another Go test's) reads the package-level table ``var`` only through
    fields other than ``field``: ``for i, row := range var`` with ``row`` used only as
    ``row.f``, ``var[i].f`` or ``len(var)``, and no ``.field`` anywhere. Never the whole table
    or a whole row (a function it is passed to could read ``field``). Such a test runs the
    same on a copy of the table whose ``field`` differs in a row."""
    masked = literals_masked(body)
    if re.search(rf"\.\s*{field}\b", masked):
        return False
    rows: list[str] = []
    for use in re.finditer(rf"\b{var}\b", masked):
        before, after = masked[: use.start()], masked[use.end() :]
        loop = re.search(r"\bfor\s+\w+\s*,\s*(\w+)\s*:=\s*range\s+$", before)
        if loop is not None and re.match(r"\s*\{", after):
            rows.append(loop.group(1))
        elif not (
            re.match(r"\[[^\[\]{}]*\]\s*\.\s*\w+", after)
            or (re.search(r"\blen\(\s*$", before) and re.match(r"\s*\)", after))
        ):
            return False
    for row in set(rows) - {"_"}:
        for use in re.finditer(rf"\b{row}\b", masked):
            declared = re.search(r"\bfor\s+\w+\s*,\s*$", masked[: use.start()])
            if declared is None and not re.match(r"\s*\.\s*\w+", masked[use.end() :]):
                return False
    return True


def changed_row(
    table: Table,
    rng: random.Random,
    count: int,
    words: Words | None = None,
    listed: Callable[[str | None], bool] = lambda _: True,
) -> tuple[str | None, list[str]]:
    """The subtest of one row of :func:`changeable_rows` (one whose value gives the most
    copies, drawn among them), and up to ``count``
    versions of ``table.text`` each with that row's expected value changed to another (the
    row's input words first), pairwise different; ``(None, [])`` when there is no such row.
    The subtest is None in a table with no subtests (the copy itself is the canary).

    One row, the same for every copy of a test, and the copy's canary is that subtest alone:
    an answer right on a row would tell the real test from copies that change that row (it
    passes there, they fail), so the real test is one of the group's versions of that row and
    an answer must be right on it to tell, where changing every row let an answer right on
    any one row (a trivial ``n`` is right on ``0`` and ``7``) name the real test for certain
    (redteam11)."""
    rows = changeable_rows(table, listed)
    rng.shuffle(rows)
    best: tuple[str | None, list[str]] = (None, [])
    text = table.text
    # The row whose value gives the most copies (the first drawn of those: a boolean gives one,
    # a number or string as many as asked where it can change; literals.exchangeable).
    for row in rows:
        assert row.cell is not None  # changeable_rows: every row has one
        a, b = row.cell
        near = words.input_first(row.inputs) if words is not None else None
        old = text[a:b]
        if old in ("true", "false"):
            news = ["false" if old == "true" else "true"]  # the one other value: one copy
        else:
            news = literal_changes(old, rng, count, near) or hex_changes(old, rng, count)
        if len(news) > len(best[1]):
            best = (row.subtest, [text[:a] + new + text[b:] for new in news])
        if len(best[1]) >= count:
            break
    return best

"""Changed expectations for the Go canaries: a case table's expected column
(:mod:`crl_worker.harness.mutants_native`).

A Go copy used to be its test with a failing comparison of two numbers appended. The compiler
folds those constants, so each copy's machine code held a direct call to ``FailNow`` that no
real test has: a forgery that reads its own binary (redteam10: the symbol table, or its own
memory through ``runtime.FuncForPC``) told the copies apart and rewrote only the real tests'
failures into passes. A copy that changes expected values instead has the same code as its
test, only other data.

Go tests keep their expectations in case tables. :func:`table_column` finds, in a test's body,
a table ranged over in place (``for _, tc := range []struct{...}{ {...}, ... } {``) and the
field the loop compares a result with (``got != tc.want``, ``!reflect.DeepEqual(got,
tc.want)``) in an ``if`` whose block fails the test (``Fatal``, ``Error``, ``Fail``), with no
``&&`` in its condition and no ``return``, ``continue`` or ``Skip`` before it; the field may
appear elsewhere only in the failure's message. Every row's value of that field must be a
string or a decimal number. :func:`changed_tables` changes it in every row (each row at one
spot, as :mod:`crl_worker.harness.expectations` changes a literal), so every subtest of a copy
fails for a correct answer and passes for an answer that is equal to anything or that rewrites
failures. Tables held elsewhere (a ``var`` of another file, as Exercism's ``cases_test.go``)
are not changed: such tests keep the appended comparison.
"""

from __future__ import annotations

import random
import re

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


def table_column(body: str) -> list[tuple[int, int]] | None:
    """The spans in ``body`` (a Go test's body) of every row's expected value of its case
    table (see the module docs), or None when it has none that can be changed safely."""
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
    field = _compared_field(masked[rows_end + 1 :], table.group("var"))
    if field is None or field not in names:
        return None
    spans: list[tuple[int, int]] = []
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
        if keyed:
            chosen = [p for p in keyed if re.match(rf"\s*{field}\s*:", cells[p[0] : p[1]])]
            if len(chosen) != 1:
                return None
            a, b = chosen[0]
            a += cells[a:b].index(":") + 1
        elif len(parts) == len(names):
            a, b = parts[names.index(field)]
        else:
            return None
        text = body[row_start + 1 + a : row_start + 1 + b]
        lead = len(text) - len(text.lstrip())
        value = text.strip()
        if not _CELL.fullmatch(value):
            return None
        spans.append((row_start + 1 + a + lead, row_start + 1 + a + lead + len(value)))
    return spans or None


def changed_tables(
    body: str, rng: random.Random, count: int, words: Words | None = None
) -> list[str]:
    """Up to ``count`` versions of ``body`` (a Go test's body), each with every row's expected
    value changed (:func:`table_column`), the versions pairwise different in every row; empty
    when the body has no such table."""
    spans = table_column(body)
    if spans is None:
        return []
    options = [_changes(body[a:b], rng, count, words) for a, b in spans]
    found = []
    for k in range(min(len(o) for o in options)):
        text = body
        for (a, b), new in sorted(zip(spans, options, strict=True), reverse=True):
            text = text[:a] + new[k] + text[b:]
        found.append(text)
    return found

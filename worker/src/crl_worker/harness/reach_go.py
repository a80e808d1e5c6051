"""Where a Go test's comparison with a row of its case table surely runs, and under which
values of the row's other fields (:mod:`crl_worker.harness.expectations_go` changes a row only
there): the ``if``/``else`` and ``switch`` shapes of Exercism's tests, read from the loop's code
with its literals masked (but plain strings, which a guard may compare a field with).
"""

from __future__ import annotations

import itertools
import re

from crl_worker.harness.expectations import closing_bracket, top_level

_FAILS = re.compile(r"\b\w+\.(?:Fatalf?|Errorf?|FailNow|Fail)\s*\(")
_MESSAGE = re.compile(r"\b\w+\.(?:Fatalf?|Errorf?|Logf?)\s*\(")


#: A row's field a condition reads, ``==`` or ``!=``, and the value as Go writes it
#: (``tc.expectError``: ``("expectError", "==", "true")``; ``tc.errCase != "none"``;
#: ``tc.err == nil``).
Guard = tuple[str, str, str]

#: A string literal that a condition may compare a row field with, left unmasked in the code
#: the guards are read from: nothing in it can open a bracket, a string or an operator.
PLAIN = re.compile(r'"[\w .-]*"')
_GUARD_VALUE = r'(?P<v>"[\w .-]*"|-?\d+|nil|true|false)'


def compared_field(masked: str, var: str) -> tuple[str, tuple[Guard, ...]] | None:
    """The field of ``var`` the loop's code (``masked``) compares a result with where a
    difference fails the test (:func:`_reached`), when it appears nowhere else but in failure
    messages, and the row fields the comparison is reached under."""
    item = rf"{var}\.(?P<f>\w+)\b"
    other = r"(?P<o>[A-Za-z_][\w.]*(?:\(\))?)"
    patterns = [
        rf"{other}\s*!=\s*{item}",
        rf"{item}\s*!=\s*{other}",
        rf"!\s*(?:reflect\.DeepEqual|bytes\.Equal)\(\s*{other}\s*,\s*{item}\s*\)",
        rf"!\s*(?:reflect\.DeepEqual|bytes\.Equal)\(\s*{item}\s*,\s*{other}\s*\)",
    ]
    for pattern in patterns:
        for match in re.finditer(pattern, masked):
            field = match.group("f")
            if match.group("o").startswith(f"{var}."):
                continue
            guards = _reached(masked, match, var)
            if guards is None:
                continue
            rest = masked[: match.start()] + masked[match.end() :]
            for call in _MESSAGE.finditer(masked):
                end = closing_bracket(masked, call.end() - 1)
                if end is not None:
                    rest = rest.replace(masked[call.start() : end + 1], "")
            if not re.search(rf"\b{var}\.{field}\b", rest):
                return field, tuple(guards)
    return None


def _guards(condition: str, var: str) -> list[Guard] | None:
    """What ``condition`` (``tc.f``, ``!tc.f``, ``tc.f == V`` or ``!=``, with ``V`` a plain
    string, a decimal integer, ``nil``, ``true`` or ``false``; or ``&&`` of them) requires of
    a row's fields to hold; None when it reads anything else."""
    found: list[Guard] = []
    for part in condition.split("&&"):
        field = rf"{var}\.(?P<f>\w+)"
        flag = re.fullmatch(rf"\s*(?P<not>!\s*)?{field}\s*", part)
        compared = re.fullmatch(rf"\s*{field}\s*(?P<op>[=!]=)\s*{_GUARD_VALUE}\s*", part) or (
            re.fullmatch(rf"\s*{_GUARD_VALUE}\s*(?P<op>[=!]=)\s*{field}\s*", part)
        )
        if flag is not None:
            found.append((flag.group("f"), "==", "false" if flag.group("not") else "true"))
        elif compared is not None:
            found.append((compared.group("f"), compared.group("op"), compared.group("v")))
        else:
            return None
    return found


def _negated(condition: str, var: str) -> list[Guard] | None:
    """What ``condition`` being false requires of a row (one field only), or None."""
    guards = _guards(condition, var)
    if not guards or len(guards) != 1:
        return None
    field, op, value = guards[0]
    return [(field, "!=" if op == "==" else "==", value)]


def _line(masked: str, at: int) -> str:
    """The text of ``masked``'s line from its start up to index ``at``, stripped."""
    return masked[masked.rfind("\n", 0, at) + 1 : at].strip()


def _fails_at_top(block: str) -> bool:
    """Whether ``block`` (a block's text, braces excluded) calls ``Fatal``, ``Error`` or
    ``Fail`` outside any nested block: the test fails whenever the block runs."""
    return any(
        block[: m.start()].count("{") == block[: m.start()].count("}")
        for m in _FAILS.finditer(block)
    )


_IF = re.compile(r"^(?P<else>\}\s*else\s+)?if\s+(?P<cond>[^;{]*;)?(?P<rest>[^{]*)$")


def _previous_if(masked: str, else_at: int, var: str) -> list[Guard] | None:
    """For an ``} else`` at ``else_at``: what reaching it requires of a row. The ``if`` it
    follows is on one row field (which must then be false), or on results with a block that
    fails the test (an answer that passes the real test did not take it); else None."""
    block = _if_block(masked, else_at)
    if block is None:
        return None
    opening, closing = block
    head = _IF.match(_line(masked, opening))
    if head is None or head.group("else") or head.group("cond"):
        return None
    negated = _negated(head.group("rest"), var)
    if negated is not None:
        return negated
    if re.search(rf"\b{var}\.", head.group("rest")) or "||" in head.group("rest"):
        return None
    return [] if _fails_at_top(masked[opening + 1 : closing]) else None


def _reached(masked: str, match: re.Match[str], var: str) -> list[Guard] | None:
    """The row fields (and their values) under which the comparison ``match`` in the loop's
    code ``masked`` (from its ``{``) is reached, and fails the test when it differs; None when
    that is not sure.

    The comparison is an ``if``'s condition (with only row fields ``&&`` it) whose block
    fails the test outside any nested block, or a ``case`` of a ``switch`` with no tag whose
    block does so, every case before it being a row field or a condition on results whose
    block fails the test (a correct answer that passes the real test took none of those). It
    stands in the loop's body, ``t.Run``'s closure, the block of an ``if`` on row fields or the
    ``else`` of one, nothing else; nothing before it returns, continues, jumps or skips. An
    answer that passes the real test's row reaches it in the copy too, where only the expected
    value differs: the copy's row fails."""
    stack: list[int] = []
    for i in range(match.start()):
        if masked[i] in "([{":
            stack.append(i)
        elif masked[i] in ")]}" and stack:
            stack.pop()
    if not stack or stack[0] != 0:
        return None
    guards: list[Guard] = []
    # Blocks the path to the comparison never runs: the ``if`` block before an ``else`` on
    # the path, and the cases of a ``switch`` before the comparison's (a Go case does not fall
    # through unless it says ``fallthrough``, which stays a jump below).
    skipped: list[tuple[int, int]] = []
    for k, opening in enumerate(stack[1:], 1):
        line = _line(masked, opening)
        if masked[opening] == "(" and line.endswith(".Run"):
            continue
        run = masked[stack[k - 1]] == "(" and _line(masked, stack[k - 1]).endswith(".Run")
        if masked[opening] != "{":
            return None
        if run and re.search(r"func\s*\(\s*\w+\s+\*testing\.T\s*\)$", line):
            continue
        if re.fullmatch(r"\}\s*else", line):
            else_at = masked.rfind("else", 0, opening)
            found = _previous_if(masked, else_at, var)
            skipped += [block] if (block := _if_block(masked, else_at)) else []
        elif (head := _IF.match(line)) is not None and not head.group("cond"):
            found = _guards(head.group("rest"), var)
            if found is not None and head.group("else"):
                before = _previous_if(masked, masked.rfind("else", 0, opening), var)
                found = None if before is None else [*before, *found]
        elif re.fullmatch(r"switch(?:\s+[^{]*;)?", line) and k == len(stack) - 1:
            found = _switch_case(masked, opening, match, var, guards)
            cases = list(re.finditer(r"\bcase\b", masked[opening : match.start()]))
            if found is None or not cases:
                return None
            skipped.append((opening, opening + cases[-1].start()))
            return found if _no_jump(masked, match.start(), skipped) else None
        else:
            return None
        if found is None:
            return None
        guards += found
    found = _if_condition(masked, match, var, guards)
    if re.match(r"\}\s*else\s+if\b", _line(masked, match.start())):
        block = _if_block(masked, masked.rfind("else", 0, match.start()))
        skipped += [block] if block else []
    return found if found is not None and _no_jump(masked, match.start(), skipped) else None


def _if_block(masked: str, else_at: int) -> tuple[int, int] | None:
    """Where the block before the ``else`` at ``else_at`` opens and closes (the last ``}``
    before it), or None when its braces do not pair."""
    closing = masked.rfind("}", 0, else_at + 1)
    depth = 0
    for i in range(closing, -1, -1):
        depth += {"}": 1, "{": -1}.get(masked[i], 0)
        if depth == 0:
            return i, closing
    return None


def _no_jump(masked: str, end: int, skipped: list[tuple[int, int]]) -> bool:
    """Whether nothing before ``end`` returns, continues, breaks or skips the test but in the
    ``skipped`` spans, and nothing at all jumps (``goto``, ``fallthrough``)."""
    before = list(masked[:end])
    for a, b in skipped:
        before[a:b] = " " * (b - a)
    leaves = r"\b(?:return|continue|break|Skip\w*)\b"
    jumps = r"\b(?:goto|fallthrough)\b"
    return not re.search(leaves, "".join(before)) and not re.search(jumps, masked[:end])


def _if_condition(masked: str, match: re.Match[str], var: str,
                  guards: list[Guard]) -> list[Guard] | None:  # fmt: skip
    """The comparison as an ``if``'s condition on its line, or a term of it: a disjunct (any
    true one fails the test, so a differing value does), or a conjunct beside row fields only
    (see :func:`_reached`)."""
    line_start = masked.rfind("\n", 0, match.start()) + 1
    opening = masked.find("{", match.end())
    head = _IF.match(masked[line_start:opening].strip()) if opening > 0 else None
    if head is None or "\n" in masked[match.end() : opening]:
        return None
    rest = head.group("rest")
    cuts = [-2, *top_level(rest, "||"), len(rest)]
    disjuncts = [rest[a + 2 : b] for a, b in itertools.pairwise(cuts)]
    held = [d for d in disjuncts if match.group() in d]
    if len(held) != 1:
        return None
    conjuncts = held[0].split("&&")
    compared = [c for c in conjuncts if masked[match.start() : match.end()] in c]
    others = [c for c in conjuncts if c not in compared]
    found = _guards("&&".join(others), var) if others else []
    if len(compared) != 1 or compared[0].strip() != match.group().strip() or found is None:
        return None
    if head.group("else"):
        before = _previous_if(masked, masked.rfind("else", 0, match.start()), var)
        if before is None:
            return None
        found += before
    closing = closing_bracket(masked, opening)
    if closing is None or not _fails_at_top(masked[opening + 1 : closing]):
        return None
    return [*guards, *found]


def _switch_case(masked: str, opening: int, match: re.Match[str], var: str,
                 guards: list[Guard]) -> list[Guard] | None:  # fmt: skip
    """The comparison as a ``case`` of the tagless ``switch`` whose block opens at
    ``opening`` (see :func:`_reached`)."""
    closing = closing_bracket(masked, opening)
    if closing is None:
        return None
    block = masked[opening + 1 : closing]
    # The switch's own clauses: ``case``/``default`` outside any bracket of its block.
    starts = [m.start() for m in re.finditer(r"\b(?:case\b|default\s*:)", block)
              if block[: m.start()].count("{") == block[: m.start()].count("}")]  # fmt: skip
    clauses = [block[a:b] for a, b in zip(starts, [*starts[1:], len(block)], strict=True)]
    at = match.start() - opening - 1
    found = list(guards)
    for start, clause in zip(starts, clauses, strict=True):
        if clause.startswith("default"):
            continue
        colon = clause.find(":")
        condition, body = clause[len("case") : colon], clause[colon + 1 :]
        if start <= at < start + len(clause):
            if condition.strip() != match.group().strip() or not _fails_at_top(body):
                return None
            return found
        negated = _negated(condition, var)
        if negated is not None:
            found += negated
        elif re.search(rf"\b{var}\.", condition) or "," in condition or not _fails_at_top(body):
            return None
    return None


def go_string(text: str) -> str | None:
    """A Go interpreted string literal's value, when it has no escape."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"' and "\\" not in text:
        return text[1:-1]
    return None


def _guard_value(written: str, kind: str) -> str | int | None:
    """A row's value as written, read as ``kind`` (that of the value a guard compares it
    with), or None when it is not surely known: a name (a constant, a variable), an escape."""
    if kind == "bool":
        return written if written in ("true", "false") else None
    if kind == "nil":
        if written == "nil":
            return "nil"
        # A composite literal (``&E{}``) or a new error (``errors.New("x")``) is never nil; a
        # name may be a nil variable, another call may return nil (``error(nil)`` is nil).
        never = re.match(r"&?\w+\s*\{|(?:errors\.New|fmt\.Errorf)\s*\(", written)
        return "set" if never else None
    if kind == "string":
        return go_string(written)
    return int(written) if re.fullmatch(r"-?\d+", written) else None


def guard_holds(values: dict[str, str], guard: Guard) -> bool:
    """Whether a row whose fields are written as ``values`` surely meets ``guard`` (a keyed
    row that does not name the field: its zero value, that of the compared value's kind)."""
    field, op, want = guard
    if want in ("true", "false"):
        kind, zero = "bool", "false"
    elif want == "nil":
        kind, zero = "nil", "nil"
    elif want.startswith('"'):
        kind, zero = "string", '""'
    else:
        kind, zero = "number", "0"
    value = _guard_value(values.get(field, zero), kind)
    if value is None:
        return False
    return (value == _guard_value(want, kind)) == (op == "==")

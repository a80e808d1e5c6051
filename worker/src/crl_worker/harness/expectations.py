"""Changed expectations for the Rust and C++ canaries (:mod:`crl_worker.harness.mutants_native`).

A canary must fail for a correct answer and pass for a forged one. Appending a failing
comparison to a copied test does the first, not the second: an answer whose value compares
equal to anything (a Rust type whose ``PartialEq`` always says yes, a C++ ``operator==`` that
does) passes the copy's body and fails the appended comparison, exactly as a correct answer
would. A copy whose last assertion expects a *different* value tells them apart: a correct
answer fails it, an equal-to-anything one passes it, and a passing canary marks the run
tampered.

:func:`changed_expectation` finds the body's last assertion at the body's own level (never in a
nested block, a loop or a branch: it must run whenever the test passes): Rust ``assert_eq!(a,
b)`` or ``assert!(a == b)``, C++ ``REQUIRE(a == b)`` or ``CHECK(a == b)``. One side must be
made of literals only (numbers, strings, ``Some``/``None``/``Ok``/``Err``, ``vec!``, arrays,
tuples, ``String::from``, ``.to_string()``, ``std::vector<...>{...}``, ``std::string``) and the
other must not, or one side is a name bound to such literals on a line of its own before (Rust
``let expected = 800;``, C++ ``vector<int> expected{1};``) and used nowhere else, whose literals
are then the expectation; one of that side's literals changes: an integer ``n`` to ``n - 1`` (``0`` to
``1``: never out of its type's range), a decimal to one more, a string gains a letter. A value
built from different literals is a different value, so the changed assertion fails for every
answer that passes the real one. Anything else (a side with a call or a variable, a raw string,
a hexadecimal number only, several ``==``) gives ``None``: the copy keeps the appended
comparison.
"""

from __future__ import annotations

import random
import re

_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')
_CHAR = re.compile(r"'(?:[^'\\\n]|\\[^'\n]{1,10})'")
_NUMBER = re.compile(r"(?<![\w.])(\d+)(?:\.(\d+))?([A-Za-z]\w*)?(?![\w.])")
#: Words a literal-only side may hold besides its literals.
_WORDS = {
    "rust": {
        "Some", "None", "Ok", "Err", "vec", "String", "from", "to_string", "to_owned", "into",
        "to_vec", "as", "true", "false", "b", "u8", "u16", "u32", "u64", "u128", "usize", "i8",
        "i16", "i32", "i64", "i128", "isize", "f32", "f64", "char", "str", "bool",
    },
    "cpp": {
        "std", "string", "vector", "map", "set", "pair", "unordered_map", "unordered_set",
        "true", "false", "int", "long", "unsigned", "short", "double", "float", "char", "bool",
        "size_t", "uint8_t", "uint16_t", "uint32_t", "uint64_t", "int8_t", "int16_t",
        "int32_t", "int64_t", "s",
    },
}  # fmt: skip
_PUNCTUATION = {"rust": set("[](){},&-+.:!*"), "cpp": set("[](){},&-+.:<>*")}
_ASSERTS = {
    "rust": re.compile(r"(?<![\w!])(assert_eq!|assert!)\s*\("),
    "cpp": re.compile(r"(?<![\w])(REQUIRE|CHECK)\s*\("),
}
_OPEN, _CLOSE = "([{", ")]}"


def _literals_masked(text: str, fill: str = " ") -> str:
    """``text`` with its string and character literals replaced by ``fill`` (same length)."""
    masked = _STRING.sub(lambda m: fill * len(m.group()), text)
    return _CHAR.sub(lambda m: fill * len(m.group()), masked)


def _close(masked: str, start: int) -> int | None:
    """The index of the bracket closing the one at ``start`` in ``masked``, or None."""
    depth = 0
    for i in range(start, len(masked)):
        if masked[i] in _OPEN:
            depth += 1
        elif masked[i] in _CLOSE:
            depth -= 1
            if depth == 0:
                return i
    return None


def _top_level(masked: str, separator: str) -> list[int]:
    """Where ``separator`` occurs in ``masked`` outside any bracket."""
    found, depth, i = [], 0, 0
    while i < len(masked):
        if masked[i] in _OPEN:
            depth += 1
        elif masked[i] in _CLOSE:
            depth -= 1
        elif depth == 0 and masked.startswith(separator, i):
            found.append(i)
            i += len(separator)
            continue
        i += 1
    return found


def _sides(text: str, masked: str, macro: str) -> list[tuple[int, int]] | None:
    """The (start, end) spans of the two compared sides of an assertion's argument ``text``."""
    if macro == "assert_eq!":
        if "<" in masked:  # a turbofish's comma would split the arguments wrongly
            return None
        commas = _top_level(masked, ",")
        if not commas:
            return None
        second_end = commas[1] if len(commas) > 1 else len(text)  # a message may follow
        return [(0, commas[0]), (commas[0] + 1, second_end)]
    equals = _top_level(masked, "==")
    if len(equals) != 1 or _top_level(masked, "&&") or _top_level(masked, "||"):
        return None
    return [(0, equals[0]), (equals[0] + 2, len(text))]


def _literal_only(side: str, language: str) -> bool:
    """Whether ``side`` is made of literals and the language's constructors only, one at least."""
    if "r#" in side or re.search(r'\br"', side) or ";" in side:
        return False
    rest = _NUMBER.sub(" ", _literals_masked(side))
    words = re.findall(r"[A-Za-z_]\w*", rest)
    symbols = re.sub(r"[A-Za-z_]\w*|\s", "", rest)
    has_literal = bool(_STRING.search(side) or _NUMBER.search(_literals_masked(side)))
    return (
        has_literal
        and all(w in _WORDS[language] for w in words)
        and set(symbols) <= _PUNCTUATION[language]
    )


def _changes(side: str) -> list[tuple[int, int, str]]:
    """(start, end, replacement) for each literal of ``side`` that can be changed."""
    found = [(m.start(), m.end(), m.group()[:-1] + 'q"') for m in _STRING.finditer(side)]
    for m in _NUMBER.finditer(_literals_masked(side)):
        whole, fraction, suffix = m.group(1), m.group(2), m.group(3) or ""
        if suffix[:1] in ("x", "X", "b", "B", "o", "O", "e", "E"):
            continue  # hexadecimal, binary, octal, an exponent: left alone
        if fraction is not None:
            new = f"{int(whole) + 1}.{fraction}{suffix}"
        else:
            value = int(whole)
            new = f"{value - 1 if value > 0 else 1}{suffix}"
        found.append((m.start(), m.end(), new))
    return found


def _depth_zero(masked: str, position: int) -> bool:
    """Whether ``position`` of a body lies outside every block of it."""
    before = masked[:position]
    return before.count("{") == before.count("}")


def changed_expectation(body: str, language: str, rng: random.Random) -> str | None:
    """``body`` (a Rust or C++ test's body) with one literal of its last assertion's expected
    side changed (see the module docs), or None when it has no such assertion."""
    if language not in _ASSERTS:
        return None
    masked = _literals_masked(body)
    calls = [m for m in _ASSERTS[language].finditer(masked) if _depth_zero(masked, m.start())]
    if not calls:
        return None
    call = calls[-1]
    opening = call.end() - 1
    closing = _close(masked, opening)
    if closing is None:
        return None
    inner, inner_masked = body[opening + 1 : closing], masked[opening + 1 : closing]
    spans = _sides(inner, inner_masked, call.group(1))
    if spans is None:
        return None
    offset = opening + 1
    sides = [inner[a:b] for a, b in spans]
    literal = [(offset + a, offset + b) for (a, b), side in zip(spans, sides, strict=True)
               if _literal_only(side, language)]  # fmt: skip
    # A side that is a name bound to literals once before, and used nowhere else: its binding.
    bound = [
        b for side in sides if (b := _binding(body, masked, side.strip(), call.start(), language))
    ]
    if len(literal) + len(bound) != 1:
        return None
    start, end = (literal or bound)[0]
    changes = _changes(body[start:end])
    if not changes:
        return None
    at, until, new = rng.choice(changes)
    return body[: start + at] + new + body[start + until :]


def _binding(
    body: str, masked: str, name: str, before: int, language: str
) -> tuple[int, int] | None:
    """The span of the literals ``name`` is bound to in a statement of its own (one or more
    lines) before ``before``, at the body's own level, when ``name`` appears nowhere else but
    there and in the assertion."""
    if not re.fullmatch(r"[A-Za-z_]\w*", name) or name in _WORDS[language]:
        return None
    if len(re.findall(rf"(?<![\w.]){name}(?!\w)", masked)) != 2:
        return None
    if language == "rust":
        pattern = (
            rf"^[ \t]*let[ \t]+{name}(?:[ \t]*:[^=\n]+)?[ \t]*=[ \t]*(?P<value>[^;]*?);[ \t]*$"
        )
    else:
        pattern = (
            rf"^[ \t]*(?:const[ \t]+)?[\w:<>, ]+?[ \t]+{name}[ \t]*"
            rf"(?:=[ \t]*(?P<value>[^;]*?)|(?P<init>\{{[^;]*\}}))[ \t]*;[ \t]*$"
        )
    # Literals as a filler no whitespace pattern takes, so that they stay in the value.
    marked = _literals_masked(body, "\x01")
    for match in re.finditer(pattern, marked[:before], re.MULTILINE):
        group = "value" if match.group("value") is not None else "init"
        start, end = match.span(group)
        if _depth_zero(masked, match.start()) and _literal_only(body[start:end], language):
            return start, end
    return None

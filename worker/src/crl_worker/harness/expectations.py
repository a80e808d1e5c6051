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
are then the expectation; one of that side's literals changes, drawn at random, and every copy
of one test changes it at the same spot to another value, drawn at random too: a number's digit
(an integer never past the width it fits: :data:`_BOUNDS`), a string's word to another word of
the test file (else a character), the spot and the number of copies decided by what the group's
values share, the new values drawn as often as tests expect them (an empty string gives no
copy). No rule leads from the copies to the original (a fixed ``n - 1`` or an appended letter
did: the value the rule turns into all the others was the real one; so did the smallest of a
group, and the value in the middle of its kind). A value built from different literals is a different value, so the changed assertion
fails for every answer that passes the real one. Anything else (a side with a call or a
variable, a raw string, a hexadecimal number only, several ``==``) has no expected side
(:func:`expected_side` gives ``None``): the copy keeps the appended comparison.
"""

from __future__ import annotations

import random
import re

from crl_worker.harness.literals import Words, exchangeable, number_weight, variants

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


def literals_masked(text: str, fill: str = " ", keep: re.Pattern[str] | None = None) -> str:
    """``text`` with its string and character literals replaced by ``fill`` (same length),
    but for the strings ``keep`` matches whole (left as written)."""

    def masked_string(m: re.Match[str]) -> str:
        kept = keep is not None and keep.fullmatch(m.group())
        return m.group() if kept else fill * len(m.group())

    return _CHAR.sub(lambda m: fill * len(m.group()), _STRING.sub(masked_string, text))


def closing_bracket(masked: str, start: int) -> int | None:
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


def top_level(masked: str, separator: str) -> list[int]:
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
        commas = top_level(masked, ",")
        if not commas:
            return None
        second_end = commas[1] if len(commas) > 1 else len(text)  # a message may follow
        return [(0, commas[0]), (commas[0] + 1, second_end)]
    equals = top_level(masked, "==")
    if len(equals) != 1 or top_level(masked, "&&") or top_level(masked, "||"):
        return None
    return [(0, equals[0]), (equals[0] + 2, len(text))]


def _literal_only(side: str, language: str) -> bool:
    """Whether ``side`` is made of literals and the language's constructors only, one at least."""
    if "r#" in side or re.search(r'\br"', side) or ";" in side:
        return False
    rest = _NUMBER.sub(" ", literals_masked(side))
    words = re.findall(r"[A-Za-z_]\w*", rest)
    symbols = re.sub(r"[A-Za-z_]\w*|\s", "", rest)
    has_literal = bool(_STRING.search(side) or _NUMBER.search(literals_masked(side)))
    return (
        has_literal
        and all(w in _WORDS[language] for w in words)
        and set(symbols) <= _PUNCTUATION[language]
    )


#: The largest value of each integer width: a changed literal never passes the smallest of these
#: that the original is within (200 stays within an u8's 255), so it fits whatever type the
#: original had.
_BOUNDS = (127, 255, 32767, 65535, 2**31 - 1, 2**32 - 1, 2**63 - 1, 2**64 - 1)
#: The same for a negative literal's digits (``-128`` is an i8's least value).
_NEGATIVE_BOUNDS = (128, 32768, 2**31, 2**63)


def _spots(side: str) -> list[tuple[int, int, bool]]:
    """(start, end, whether a string) of each literal of ``side`` that can be changed: strings,
    decimal integers and decimals (their digits, not a type suffix); not hexadecimal, binary,
    octal or exponent numbers."""
    found = [(m.start(), m.end(), True) for m in _STRING.finditer(side)]
    for m in _NUMBER.finditer(literals_masked(side)):
        suffix = m.group(3) or ""
        if suffix[:1] in ("x", "X", "b", "B", "o", "O", "e", "E"):
            continue  # hexadecimal, binary, octal, an exponent: left alone
        found.append((m.start(), m.end() - len(suffix), False))
    return found


def _number_variants(
    text: str, rng: random.Random, count: int, negative: bool, base: int = 10
) -> list[str]:
    """Up to ``count`` different numbers for the number ``text`` (digits of ``base``, maybe
    one ``.`` in a decimal; ``negative`` when a minus sign comes before it), each with the same
    one digit changed to another (:func:`~crl_worker.harness.literals.exchangeable`, weighted
    by :func:`~crl_worker.harness.literals.number_weight`): any value of the group could have
    made it (a fixed ``n - 1`` could not, nor could any but the middle value of its kind when
    as many copies were drawn below as above). An integer stays within the width that its
    spot's smallest value fits (:data:`_BOUNDS`) and gets no leading zero."""
    hexadecimal = "abcdef" if base == 16 else ""
    digits = [i for i, c in enumerate(text) if c.isdigit() or c.lower() in hexadecimal]
    integer = "." not in text
    bounds = _NEGATIVE_BOUNDS if negative else _BOUNDS
    spots = []
    for i in digits:
        lead = i == 0 and len(digits) > 1 and integer
        # Within the original's kind at that spot (a digit, a hexadecimal letter of its case),
        # and under the width the spot's smallest value fits: both decided by what every value
        # of the group shares, so that any of them could have made the group.
        kind = "0123456789" if text[i].isdigit() else hexadecimal
        kind = kind.upper() if text[i].isupper() else kind
        options = [d for d in kind if not (lead and d == "0")]
        if integer:
            least = int(text[:i] + options[0] + text[i + 1 :], base)
            bound = next((b for b in bounds if least <= b), bounds[-1])
            options = [d for d in options if int(text[:i] + d + text[i + 1 :], base) <= bound]
        spots.append((i, "".join(options)))

    def weight(made: bytes) -> float:
        return number_weight(made if base == 10 else b"0x" + made)

    return [v.decode() for v in exchangeable(text.encode(), spots, rng, count, weight)]


#: A hexadecimal integer (``0x7F``), its digits the group.
HEX = re.compile(r"(?<![\w.])0[xX]([0-9a-fA-F]+)(?![\w.])")


def hex_changes(side: str, rng: random.Random, count: int) -> list[str]:
    """As :func:`literal_changes`, for the hexadecimal integers of ``side`` (Go's
    ``[]byte{0x7F}``): one drawn at random, one of its digits changed within the width the
    original fits."""
    spots = list(HEX.finditer(literals_masked(side)))
    rng.shuffle(spots)
    best: list[str] = []
    for m in spots:
        negative = side[: m.start()].rstrip().endswith("-")
        new = _number_variants(m.group(1), rng, count, negative, base=16)
        if len(new) > len(best):
            best = [side[: m.start(1)] + n + side[m.end(1) :] for n in new]
        if len(best) >= count:
            break
    return best


def _string_variants(text: str, rng: random.Random, count: int, words: Words | None) -> list[str]:
    """Up to ``count`` different texts for the string literal ``text`` (quotes included), the
    same one spot changed in each: a word of the file where there is one, else a character
    (:func:`crl_worker.harness.literals.variants`)."""
    found = variants(text.encode(), text[1:-1], rng, count, words)
    return [v.decode() for v in found]


def literal_changes(side: str, rng: random.Random, count: int, words: Words | None) -> list[str]:
    """Up to ``count`` different versions of ``side`` (a literal-only expectation), one of its
    literals drawn at random and changed at the same spot in each."""
    spots = _spots(side)
    rng.shuffle(spots)
    best: list[str] = []
    for start, end, string in spots:
        literal = side[start:end]
        if string:
            new = _string_variants(literal, rng, count, words)
        else:
            negative = side[:start].rstrip().endswith("-")
            new = _number_variants(literal, rng, count, negative)
        if len(new) > len(best):
            best = [side[:start] + n + side[end:] for n in new]
        if len(best) >= count:
            break
    return best


def _depth_zero(masked: str, position: int) -> bool:
    """Whether ``position`` of a body lies outside every block of it."""
    before = masked[:position]
    return before.count("{") == before.count("}")


def expected_side(body: str, language: str) -> tuple[int, int] | None:
    """The span of ``body`` (a Rust or C++ test's body) holding its last assertion's expected
    side (see the module docs), or None when it has no such assertion."""
    if language not in _ASSERTS:
        return None
    masked = literals_masked(body)
    calls = [m for m in _ASSERTS[language].finditer(masked) if _depth_zero(masked, m.start())]
    if not calls:
        return None
    call = calls[-1]
    opening = call.end() - 1
    closing = closing_bracket(masked, opening)
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
    return (start, end) if _spots(body[start:end]) else None


def changed_expectations(
    body: str, language: str, rng: random.Random, count: int, words: Words | None = None
) -> list[str]:
    """Up to ``count`` different versions of ``body`` (a Rust or C++ test's body), each with
    the same literal of its last assertion's expected side changed at the same spot to another
    value drawn at random (a string's word to another of ``words``, the test file's); empty
    when it has no such assertion."""
    span = expected_side(body, language)
    if span is None:
        return []
    start, end = span
    if words is not None:
        # A word of the call's input strings first, as the other copies do (literals.Words).
        rest = body[:start] + body[end:]
        words = words.input_first(m.group()[1:-1] for m in _STRING.finditer(rest))
    return [
        body[:start] + new + body[end:]
        for new in literal_changes(body[start:end], rng, count, words)
    ]


def _binding(
    body: str, masked: str, name: str, before: int, language: str
) -> tuple[int, int] | None:
    """The span of the literals ``name`` is bound to in a statement of its own (one or more
    lines) before ``before``, at the body's own level, when ``name`` appears nowhere else but
    there and in the assertion."""
    if not re.fullmatch(r"[A-Za-z_]\w*", name) or name in _WORDS[language]:
        return None
    # Not a field (``x.name``), but a range's bound is a use (``0..trials``: Exercism's
    # simple-cipher loops ``trials`` times and expects ``trials`` keys; a copy that changed the
    # binding passed on a correct answer).
    if len(re.findall(rf"(?<!\w)(?:(?<=\.\.)|(?<!\.)){name}(?!\w)", masked)) != 2:
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
    marked = literals_masked(body, "\x01")
    for match in re.finditer(pattern, marked[:before], re.MULTILINE):
        group = "value" if match.group("value") is not None else "init"
        start, end = match.span(group)
        if _depth_zero(masked, match.start()) and _literal_only(body[start:end], language):
            return start, end
    return None

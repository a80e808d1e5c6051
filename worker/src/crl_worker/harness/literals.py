"""New values for a test's literal expectations and docstrings: the constants of
:mod:`crl_worker.harness.mutants`' copies, changed so that nothing tells the original apart.

A string's changed word is another word of the module (:func:`vocabulary`), a number's a digit
(:func:`variants`); a docstring's first line (what unittest's verbose runner prints, and what
SWE-bench names some Django tests by) gets the same kind of change (:func:`doc_variants`).
"""

from __future__ import annotations

import ast
import random
import re
from collections import Counter
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field, replace

#: A word of a string literal's text: letters not after a backslash (an escape) or a letter.
_TEXT_WORD = re.compile(rb"(?<![\\A-Za-z])[A-Za-z]{2,}(?![A-Za-z])")


def vocabulary(tree: ast.AST, skip: Collection[ast.AST] = ()) -> Counter[str]:
    """How often each word (lower case, two letters or more) occurs in a module's identifiers
    and string constants, leaving out the subtrees ``skip``: what a changed word of a string is
    drawn from."""
    found: Counter[str] = Counter()
    todo = [tree]
    while todo:
        node = todo.pop()
        if node in skip:
            continue
        todo.extend(ast.iter_child_nodes(node))
        text = ""
        if isinstance(node, ast.Name):
            text = node.id
        elif isinstance(node, ast.Attribute | ast.FunctionDef | ast.ClassDef):
            text = node.attr if isinstance(node, ast.Attribute) else node.name
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        found.update(w.lower() for w in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])", text))
    return Counter({w: n for w, n in found.items() if len(w) > 1})


#: A word of source text that no Python parser reads (Java, JavaScript): a run of lower-case
#: letters, capitalized or not, or of capitals; camel case splits as :func:`vocabulary` does.
_SOURCE_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")


def text_vocabulary(text: str) -> Counter[str]:
    """How often each word (lower case, two letters or more) occurs in ``text``: identifiers,
    string literals and comments alike, the :func:`vocabulary` of a source in a language this
    package does not parse (Java, JavaScript)."""
    found = Counter(w.lower() for w in _SOURCE_WORD.findall(text))
    return Counter({w: n for w, n in found.items() if len(w) > 1})


def source_words(text: str, new: Iterable[tuple[int, int]]) -> Words:
    """The :class:`Words` of a source this package does not parse: all of ``text``'s, and
    those outside the spans ``new`` (the tests the task adds; a span inside an earlier one is
    part of it)."""
    kept, at = [], 0
    for start, end in sorted(new):
        if start >= at:
            kept.append(text[at:start])
            at = end
    return Words(text_vocabulary(text), text_vocabulary("".join([*kept, text[at:]])))


@dataclass(frozen=True)
class Words:
    """A module's words (:func:`vocabulary`): all of them, and those outside the tests the
    task adds (what a reader of the repository before the task knows)."""

    all: Counter[str]
    old: Counter[str]
    close: frozenset[str] = field(default=frozenset())
    """Words of the expression an expectation is compared with (the call's own arguments, in
    lower case): replacements drawn from them first, so that a changed expectation shares as
    much with the call's input as the original does and overlap with the input, a forgery's
    cheapest guess at which value is real, does not tell them apart."""

    def input_first(self, inputs: Iterable[str]) -> Words:
        """These words, with those of ``inputs`` (the compared call's input strings) as
        :attr:`close`."""
        return replace(self, close=frozenset(text_vocabulary(" ".join(inputs))))


def comment_top(text: str, code: str, start: int) -> int:
    """Where the member (a Java method, a Jest test) starting at ``start`` begins with the
    comment lines right above it (a doc comment, ``//`` lines; no blank line between): what a
    copy takes along and what is not split from the member a copy is placed before, so no
    comment marks the real test. ``code`` is ``text`` with its comments blanked out."""
    line = text.rfind("\n", 0, start) + 1
    if text[line:start].strip():
        return start
    top = line
    while top > 0:
        above = text.rfind("\n", 0, top - 1) + 1
        if code[above:top].strip() or not text[above:top].strip():
            break
        top = above
    if top == line:
        return start
    return top + len(text[top:line]) - len(text[top:line].lstrip())


def _cased(word: str, like: str) -> str:
    if like.isupper():
        return word.upper()
    return word.capitalize() if like[:1].isupper() else word


def word_variants(
    text: bytes, body: tuple[int, int], words: Words, rng: random.Random, count: int
) -> list[bytes]:
    """Up to ``count`` texts of the string literal ``text`` (its contents at ``body``), each
    with the same one word replaced by another word of the module (``words``), cased alike and
    of about its length, a word the repository had before the task for one it had, a new one
    for a new one where there are enough: every value of the group reads as words of the file,
    as new or as old as the original's, so a dictionary does not tell the original apart. A
    word that occurs elsewhere in the module is replaced first (its replacements do too)."""
    spots: list[tuple[int, int, list[str], list[str]]] = []
    for match in _TEXT_WORD.finditer(text, *body):
        word = match.group().decode()
        if not (word.islower() or word.isupper() or word[1:].islower()):
            continue
        near = [
            w
            for w in words.all
            if w != word.lower() and abs(len(w) - len(word)) <= max(2, len(word) // 2)
        ]
        old = word.lower() in words.old
        alike = [w for w in near if (w in words.old) == old]
        options = sorted(_cased(w, word) for w in (alike if len(alike) >= count else near))
        # Of the input's words, those as old as the original (else a list of the words the
        # repository had before the task would tell them apart).
        close = sorted(
            _cased(w, word)
            for w in words.close
            if w != word.lower() and len(w) > 1 and (w in words.old) == old
        )
        if len(set(options) | set(close)) >= min(count, 2):
            spots.append((match.start(), match.end(), options, close))
    if not spots:
        return []
    common = [s for s in spots if words.all[text[s[0] : s[1]].decode().lower()] > 1]
    shared = [s for s in spots if s[3] and text[s[0] : s[1]].decode().lower() in words.close]
    start, end, options, close = rng.choice(shared or common or spots)
    picked = rng.sample(close, min(count, len(close)))
    rest = [w for w in options if w not in picked]
    picked += rng.sample(rest, min(count - len(picked), len(rest)))
    return [text[:start] + w.encode() + text[end:] for w in picked]


def variants(
    text: bytes,
    value: object,
    rng: random.Random,
    count: int,
    words: Words | None = None,
) -> list[bytes]:
    """Up to ``count`` texts for the constant ``text`` (of ``value``), each changed at the same
    one spot to a different value, the spot and the values drawn from ``rng``: the original and
    its variants differ only there, so nothing tells the original apart. A string with a word
    gets another word of the module there (:func:`word_variants`, given its ``words``); else
    one character is changed (a digit, a letter) as :func:`exchangeable` draws it. Every
    language's copies are drawn here or with :func:`exchangeable`."""
    if isinstance(value, bool):
        return [b"False" if value else b"True"]
    if isinstance(value, int | float):
        return _number_variants(text, rng, count)
    if isinstance(value, str | bytes):
        quote = text[-1:]
        body_start = text.index(quote) + (3 if text.endswith(quote * 3) else 1)
        body_end = len(text) - (3 if text.endswith(quote * 3) else 1)
        if words is not None:
            by_word = word_variants(text, (body_start, body_end), words, rng, count)
            if by_word:
                return by_word
        spots = [
            i
            for i in range(body_start, body_end)
            # ASCII only: a byte of a character's UTF-8 encoding (``♡``) replaced by a letter
            # left text that is not UTF-8 (Aider's Go poker: the derivation failed).
            if text[i] < 128 and chr(text[i]).isalnum() and text[i - 1 : i] != b"\\"
        ]
        # A character changed within its kind (an empty string has no copy: a letter added to
        # it would leave the real one the shortest of its group).
        return exchangeable(text, [(i, kind_of(chr(text[i]))) for i in spots], rng, count)
    return []


#: What a changed letter is drawn from (upper case for an upper-case one).
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def kind_of(character: str) -> str:
    """The characters that may replace ``character``: of its kind, digit or letter of its case."""
    if character.isdigit():
        return "0123456789"
    return _LETTERS.upper() if character.isupper() else _LETTERS


def _number_variants(text: bytes, rng: random.Random, count: int) -> list[bytes]:
    """Numerals for ``text``, each with the digit of the same one spot changed
    (:func:`exchangeable`, weighted by :func:`number_weight`): which spot, and how many copies,
    depend on nothing any value of the group does not share, and the new digits are drawn about
    as often as tests expect the numbers they make."""
    return exchangeable(text, digit_spots(text), rng, count, number_weight)


def digit_spots(text: bytes) -> list[tuple[int, str]]:
    """Each digit of the numeral ``text`` and the digits that may stand there."""
    spots = []
    for i, c in enumerate(text):
        if chr(c).isdigit() and text[i + 1 : i + 2].lower() not in (b"x", b"b", b"o"):
            # A leading digit of a longer numeral is never 0 (``05`` is not Python).
            lead = (i == 0 or not chr(text[i - 1]).isalnum()) and text[i + 1 : i + 2].isdigit()
            spots.append((i, "123456789" if lead else "0123456789"))
    return spots


def number_weight(text: bytes) -> float:
    """How likely a test's expected value is the number ``text`` (a decimal or hexadecimal
    numeral, ``_`` separators and a type suffix allowed), up to a factor: smaller numbers
    more than larger ones, and a round one (a multiple of ten) more than its neighbours, as
    the expected values of Aider's and Exercism's test files are (perf/canary_guess.md)."""
    digits = text.decode("ascii", "replace").replace("_", "").lower()
    try:
        value = float(int(digits, 16)) if digits.startswith("0x") else float(digits.rstrip("nlu"))
    except ValueError:
        return 1.0
    weight = 1 / (abs(value) + 1)
    return weight * 8 if value.is_integer() and value and value % 10 == 0 else weight


def exchangeable(
    text: bytes,
    spots: list[tuple[int, str]],
    rng: random.Random,
    count: int,
    weight: Callable[[bytes], float] | None = None,
) -> list[bytes]:
    """Up to ``count`` variants of ``text``, each with the character of the same one of
    ``spots`` replaced (a spot: an index and the characters that may stand there, which the
    value's other characters decide, so that every value of the group has the same). The spot
    is drawn uniformly among all ``spots`` (no variant when the original's character may not
    stand there, or nothing else may), and there are as many variants as the spot allows
    (``count`` at most), so neither says which value of the group is the original: any of them
    could have made the group. The new characters are drawn without replacement, each as likely
    as ``weight`` of the text it makes (uniformly without ``weight``), to be about as likely as
    the original where ``weight`` is how often tests expect a value. (Drawing as many below the
    original as above it, as this did before, told the original for certain: only a value in
    the middle of its kind could have made the group.)"""
    if not spots:
        return []
    i, allowed = rng.choice(spots)
    others = [c for c in allowed if ord(c) != text[i]]
    if chr(text[i]) not in allowed or not others:
        return []
    made = {c: text[:i] + c.encode() + text[i + 1 :] for c in others}
    left = {c: (weight(made[c]) if weight else 1.0) for c in others}
    picked: list[bytes] = []
    while left and len(picked) < count:
        [chosen] = rng.choices(list(left), weights=list(left.values()))
        picked.append(made[chosen])
        del left[chosen]
    return picked


#: Names of code in a docstring: with an underscore, called, after a dot, in backquotes.
_CODE_NAME = re.compile(rb"\w*_\w*|\w+(?=\()|(?<=\.)\w+|`[^`\n]*`")


def _splice(text: bytes, masked: bytes, new: bytes) -> bytes:
    """``new`` (``masked`` with one span changed) applied to ``text``, ``masked``'s original."""
    head = 0
    while head < min(len(masked), len(new)) and masked[head] == new[head]:
        head += 1
    tail = 0
    while tail < min(len(masked), len(new)) - head and masked[-1 - tail] == new[-1 - tail]:
        tail += 1
    return text[:head] + new[head : len(new) - tail] + text[len(masked) - tail :]


def short_description(doc: str | None) -> str | None:
    """The first line of a docstring as unittest prints it after a test's id (and SWE-bench
    then names the test by it): ``TestCase.shortDescription``."""
    return doc.strip().split("\n")[0].strip() or None if doc else None


def doc_variants(
    text: bytes, rng: random.Random, count: int, words: Words, avoid: Collection[str]
) -> list[bytes]:
    """``count`` texts of the docstring literal ``text``, each with the same one word of its
    first line replaced by another word of the module (:func:`word_variants`), else the same
    one letter changed, so that no two of them, the original and ``avoid`` (the module's other
    first lines) print the same first line; fewer when there are not enough."""
    quote = text[-1:]
    triple = text.endswith(quote * 3)
    start = text.index(quote) + (3 if triple else 1)
    end = len(text) - (3 if triple else 1)
    while start < end and text[start : start + 1] in (b" ", b"\t", b"\n", b"\r"):
        start += 1
    newline = text.find(b"\n", start, end)
    line_end = end if newline < 0 else newline
    taken = set(avoid) | {short_description(ast.literal_eval(text.decode("utf-8")))}

    def fresh(texts: list[bytes]) -> list[bytes]:
        found: list[bytes] = []
        for new in texts:
            try:
                first = short_description(ast.literal_eval(new.decode("utf-8")))
            except (ValueError, SyntaxError, UnicodeDecodeError):
                continue
            if first is not None and first not in taken:
                taken.add(first)
                found.append(new)
        return found

    # Names of code (``resolve_url()``, ``obj.attr``, ``x_y``) stay: a changed one would not
    # be the code's, unlike the real test's.
    masked = _CODE_NAME.sub(lambda m: b"0" * len(m.group()), text)
    by_word = fresh(
        [
            _splice(text, masked, new)
            for new in word_variants(masked, (start, line_end), words, rng, count)
        ]
    )
    if len(by_word) >= count:
        return by_word[:count]
    spots = [
        i
        for i in range(start, line_end)
        if chr(masked[i]).isalpha() and chr(text[i]).isascii() and text[i - 1 : i] != b"\\"
    ]
    if not spots:
        return []
    i = rng.choice(spots)
    pool = kind_of(text[i : i + 1].decode())
    changed = [p for p in pool if p != chr(text[i]).lower() and p != chr(text[i])]
    picked = rng.sample(changed, len(changed))
    return fresh([text[:i] + c.encode() + text[i + 1 :] for c in picked])[:count]

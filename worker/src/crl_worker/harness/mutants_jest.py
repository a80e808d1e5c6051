"""Canaries for Jest spec files (the polyglot format's JavaScript exercises).

The candidate's module is imported by the spec file and runs in the same process as Jest, its
reporter and the JSON report writer: it can replace the global ``expect`` with one whose every
matcher passes, rewrite matchers (``expect.extend``), wrap ``test`` so that every body is
empty, or rewrite the report as Jest writes it (Node's ``fs`` is the real one). Canaries are
tests that must fail; a run in which one of them is reported passing was forged.
:func:`derive` plants :data:`~crl_worker.harness.canary.COUNT` of them in the spec file, at
every grading anew:

- **the same calls**: each is a copy of a ``test(...)``/``it(...)`` of the file (its ``x``
  prefix kept: the command unskips every test), inside the same ``describe``, its body
  unchanged but for one literal of the last top-level ``expect(...)`` statement's expected value
  (the first argument of ``toEqual``, ``toStrictEqual``, ``toBe``, ``toThrow``, ...; or, when
  that argument is a name used nowhere else in the body, the data literal a top-level ``const``
  binds it to: ``const lyrics = [...]``): a digit; in a string, one word swapped for another
  word of the file, the test's own input strings first (else one letter); ``true``/``false``
  (an empty string has no copy).
  An expression body (``() => expect(x).toBe(1)``) is that one statement. So the copy fails **through the same assertion
  machinery** the real test uses: a forger that neuters ``expect`` (or its matchers, or the
  report) makes the copies pass with the real tests, and is caught;
- **the same shape**: every listed test with such a literal gets a copy (``count`` copies at
  least, shared among them), the copies of one test all changing the same literal at the same
  spot, each to another value, so code that reads the spec file (Jest reads it with Node's ``fs``, which the
  candidate's module can use too) or the test functions' source (``Function.prototype.toString``
  on what ``test`` is given) sees a group of tests differing in one literal and can only guess
  which is real (:func:`crl_worker.harness.mutants.group_sizes`);
- **named in the task's style**: titles drawn by :func:`crl_worker.harness.names.canary_name`
  from the ``describe``'s own titles (words joined by spaces); every real test whose title is
  written once in the file and appears nowhere else (the command, the other hidden files) is
  renamed the same way, and the run's ids are mapped back to the task's;
- **placed among the real tests**: each before or after a randomly drawn test of its
  ``describe``, with the comment lines right above the test it copies, and never between a test
  and its comment.

Where a test's last expectation has no literal to change, an equality matcher's only argument
(``toEqual(SIGNED)``) becomes a new ``Symbol()``: a correct answer never equals it, a received
value that matches everything (an ``asymmetricMatch`` that always says yes) does and is caught.
Other matchers (``toBeNull()``, ``toThrow()``) get the matcher's ``.not`` toggled. Both are
weaker fallbacks: that copy's shape differs from the test it copies. Tests whose last
expectation is not a top-level statement of the body, is an unawaited
``.resolves``/``.rejects``, or follows a ``return``, are not copied.
"""

from __future__ import annotations

import random
import re
from collections.abc import Collection
from dataclasses import dataclass

from crl_worker.harness.literals import (
    Words,
    comment_top,
    exchangeable,
    kind_of,
    number_weight,
    source_words,
    word_variants,
)
from crl_worker.harness.mutants import Derived, group_sizes
from crl_worker.harness.names import canary_name

_TEST_CALLS = frozenset({"test", "it", "xtest", "xit"})
_DESCRIBE_CALLS = frozenset({"describe", "xdescribe"})
#: Matchers whose first argument is the expected value, compared so that a changed literal
#: there makes the comparison fail (not ``toContain``/``toBeGreaterThan``: another value could
#: hold as well).
_MATCHERS = frozenset(
    {"toEqual", "toStrictEqual", "toBe", "toThrow", "toThrowError", "toHaveLength",
     "toBeCloseTo", "toMatchObject"}
)  # fmt: skip
#: Equality matchers: a copy without a literal to change compares with a new ``Symbol()``.
_EQUALITY = frozenset({"toEqual", "toStrictEqual"})
_PUNCT = re.compile(r"=>|\.\.\.|[(){}\[\];,.]")
_REGEX_BEFORE = frozenset("(,=:[!&|?{};+-*%<>~^")


@dataclass(frozen=True)
class _Tok:
    kind: str  # "id", "num", "str", "punct", "other", "regex"
    start: int
    end: int
    text: str


def _tokens(text: str) -> list[_Tok]:
    """JavaScript's tokens, as far as brackets, strings and identifiers go (no comments)."""
    out: list[_Tok] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        elif c in "'\"`":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(_Tok("str", i, min(j + 1, n), text[i : j + 1]))
            i = j + 1
        elif c == "/" and (not out or out[-1].text in _REGEX_BEFORE or out[-1].text == "return"):
            j, klass = i + 1, False
            while j < n and text[j] != "\n" and (text[j] != "/" or klass):
                klass = (klass or text[j] == "[") and text[j] != "]"
                j += 2 if text[j] == "\\" else 1
            j += 1
            while j < n and text[j].isalpha():
                j += 1
            out.append(_Tok("regex", i, j, text[i:j]))
            i = j
        elif c.isalpha() or c in "_$":
            j = i
            while j < n and (text[j].isalnum() or text[j] in "_$"):
                j += 1
            out.append(_Tok("id", i, j, text[i:j]))
            i = j
        elif c.isdigit() or (c == "." and i + 1 < n and text[i + 1].isdigit()):
            j = i
            while j < n and (text[j].isalnum() or text[j] in "._"):
                j += 1
            out.append(_Tok("num", i, j, text[i:j]))
            i = j
        else:
            match = _PUNCT.match(text, i)
            end = match.end() if match else i + 1
            out.append(_Tok("punct" if match else "other", i, end, text[i:end]))
            i = end
    return out


@dataclass(frozen=True)
class JestTest:
    """A ``test``/``it`` call of a spec file: its title, ``describe`` titles, where it is."""

    title: str
    ancestors: tuple[str, ...]
    #: Token indices: the call's name, its title string, its body's ``{`` and ``}`` (an
    #: expression body: the ``=>`` before it and the call's ``)``), the call's ``)``.
    name: int
    title_tok: int
    body: tuple[int, int]
    close: int

    @property
    def id(self) -> str:
        """Its id as the ``jest`` parser reports it."""
        return " > ".join([*self.ancestors, self.title])


def _title(tok: _Tok) -> str | None:
    """A string token's value when it is a plain one (no escape, no ``${``)."""
    if tok.kind != "str" or "\\" in tok.text or "${" in tok.text or len(tok.text) < 2:
        return None
    return tok.text[1:-1]


def tests_of(text: str) -> tuple[list[_Tok], list[JestTest]]:
    """The spec file's tokens and its ``test``/``it`` calls whose title is a plain string and
    that sit at the top level of the file or of a ``describe`` callback (nested the same way)."""
    toks = _tokens(text)
    match: dict[int, int] = {}
    stack: list[int] = []
    parent: list[int | None] = []
    for k, tok in enumerate(toks):
        parent.append(stack[-1] if stack else None)
        if tok.text in "({[" and tok.kind == "punct":
            stack.append(k)
        elif tok.text in ")}]" and tok.kind == "punct" and stack:
            match[stack.pop()] = k
    # The ``{`` of each describe's callback body: its tests' parent; titles by that brace.
    scopes: dict[int | None, tuple[str, ...]] = {None: ()}
    found: list[JestTest] = []
    for k, tok in enumerate(toks):
        if tok.kind != "id" or tok.text not in _TEST_CALLS | _DESCRIBE_CALLS:
            continue
        if k > 0 and toks[k - 1].text == ".":
            continue
        if k + 3 >= len(toks) or toks[k + 1].text != "(" or toks[k + 3].text != ",":
            continue
        title = _title(toks[k + 2])
        if title is None or parent[k] not in scopes or k + 1 not in match:
            continue
        close = match[k + 1]
        arrow = next((b for b in range(k + 4, close) if toks[b].text == "=>"), None)
        if arrow is None or any(parent[b] != k + 1 for b in range(k + 4, arrow)
                                if toks[b].text == ","):  # fmt: skip
            continue
        ancestors = scopes[parent[k]]
        brace = arrow + 1
        if toks[brace].text == "{" and match.get(brace, 0) + 1 == close:
            body = (brace, match[brace])
        elif toks[brace].text != "{" and not any(
            parent[b] == k + 1 for b in range(brace, close) if toks[b].text == ","
        ):
            body = (arrow, close)  # an expression (``() => expect(x).toBe(1)``)
        else:
            continue  # anything after the callback (a timeout argument): not copied
        if tok.text in _DESCRIBE_CALLS:
            if body[0] == brace:
                scopes[brace] = (*ancestors, title)
        else:
            found.append(JestTest(title, ancestors, k, k + 2, body, close))
    return toks, found


def _statements(toks: list[_Tok], body: tuple[int, int]) -> list[tuple[int, int]]:
    """The top-level statements of a body, as token ranges ``[start, end)``."""
    depth, start, out = 0, body[0] + 1, []
    for k in range(body[0] + 1, body[1]):
        text = toks[k].text
        if toks[k].kind == "punct" and text in "({[":
            depth += 1
        elif toks[k].kind == "punct" and text in ")}]":
            depth -= 1
            if depth == 0 and text == "}" and k + 1 < body[1] and toks[k + 1].kind == "id":
                out.append((start, k + 1))  # a block statement (``if (...) { }``)
                start = k + 1
        elif depth == 0 and text == ";":
            out.append((start, k + 1))
            start = k + 1
    if start < body[1]:
        out.append((start, body[1]))
    return out


@dataclass(frozen=True)
class _Target:
    """The spot a copy changes: a literal token (``literal``) or where ``.not`` goes."""

    literal: int | None
    #: The matcher's name token (for the ``.not`` fallback).
    matcher: int
    negated: bool
    #: Token range ``[start, end)`` of an equality matcher's only argument, when a copy
    #: replaces it with a new ``Symbol()`` (no literal to change; see :func:`target`).
    argument: tuple[int, int] | None = None


def target(toks: list[_Tok], test: JestTest) -> _Target | None:
    """The last top-level ``expect`` statement of ``test``'s body and what in it a copy
    changes, or ``None`` when it cannot be changed safely (see the module's docstring)."""
    expression = toks[test.body[0]].text == "=>"
    statements = _statements(toks, test.body)
    if not statements:
        return None
    start, end = statements[-1]
    first = start + (toks[start].text in ("await", "return"))
    returned = expression or first != start
    if toks[first].text != "expect" or first + 1 >= end or toks[first + 1].text != "(":
        return None
    if any(t.text == "return" for t in toks[test.body[0] : start]):
        return None
    chain = [t.text for t in toks[first:end] if t.kind == "id"]
    if ("resolves" in chain or "rejects" in chain) and not returned:
        return None  # not awaited: it would fail after the test ended
    # The matcher: the last ``.name(`` at the statement's top level.
    depth, matcher, negated = 0, None, False
    for k in range(first, end):
        text = toks[k].text
        if toks[k].kind == "punct" and text in "({[":
            depth += 1
        elif toks[k].kind == "punct" and text in ")}]":
            depth -= 1
        elif depth == 0 and toks[k].kind == "id" and toks[k - 1].text == ".":
            if text == "not":
                if k + 2 >= end or toks[k + 2].text in ("resolves", "rejects"):
                    return None
                negated = True
            elif k + 1 < end and toks[k + 1].text == "(":
                matcher = k
    if matcher is None or (negated and toks[matcher - 2].text != "not"):
        return None
    args, level, stop = [], 0, end
    for k in range(matcher + 2, end):
        text = toks[k].text
        if toks[k].kind == "punct" and text in "({[":
            level += 1
        elif toks[k].kind == "punct" and text in ")}]":
            if level == 0:
                stop = k
                break
            level -= 1
        elif level == 0 and text == ",":
            stop = k
            break  # the first argument only
        if toks[k].kind in ("num", "str") or text in ("true", "false"):
            args.append(k)
    # An asymmetric matcher (``expect.arrayContaining([1])``) may hold for a changed value too.
    asymmetric = any(toks[k].text == "expect" for k in range(matcher + 2, end))
    if len(args) == 0 and toks[matcher + 3].text == ")" and toks[matcher + 2].kind == "id":
        args = _bound(toks, test, statements[:-1], toks[matcher + 2].text)
    # How many copies each literal gives (none: it cannot change).
    room = {k: len(_values(toks[k].text, 9, random.Random(0))) for k in args if not asymmetric}
    usable = [k for k in args if room.get(k)]
    if toks[matcher].text in _MATCHERS and not negated and usable:
        # The one giving the most copies (the last of those): a larger group to guess from.
        return _Target(max(reversed(usable), key=room.__getitem__), matcher, negated)
    if (
        toks[matcher].text in _EQUALITY
        and not negated
        and not asymmetric
        and matcher + 2 < stop < end
        and toks[stop].text == ")"
    ):
        # Nothing to change: the received value is compared with a new Symbol(), which a
        # correct answer never equals and a value that matches everything (an object with an
        # ``asymmetricMatch``) does. With ``.not`` toggled instead, such a value failed the
        # copy exactly as a correct answer does.
        return _Target(None, matcher, negated, (matcher + 2, stop))
    return _Target(None, matcher, negated)


#: What a data literal (``['a', 'b']``, ``{ x: 1 }``) is made of besides strings and numbers.
_DATA = frozenset("[]{},:-+") | {"true", "false", "null"}


def _bound(toks: list[_Tok], test: JestTest, statements: list[tuple[int, int]],
           name: str) -> list[int]:  # fmt: skip
    """The literals of ``const name = <data literal>;``, a top-level statement of ``test``'s
    body before its last, when ``name`` is used nowhere else in the body but the last
    expectation (so changing them changes the expected value only)."""
    uses = [k for k in range(test.body[0], test.body[1]) if toks[k].text == name]
    for start, end in statements:
        if [t.text for t in toks[start : start + 3]] != ["const", name, "="] or len(uses) != 2:
            continue
        value = range(start + 3, end - (toks[end - 1].text == ";"))
        keys = {k for k in value if toks[k].kind in ("id", "str") and toks[k + 1].text == ":"}
        if all(toks[k].kind in ("str", "num") or toks[k].text in _DATA or k in keys
               for k in value):  # fmt: skip
            return [k for k in value if toks[k].kind in ("str", "num") and k not in keys]
    return []


def _values(text: str, count: int, rng: random.Random, words: Words | None = None) -> list[str]:
    """Up to ``count`` different replacements of literal ``text`` (a number, a string, a
    boolean), each differing from it at the same one spot: for a string with a word, that word,
    another word of the file (:func:`~crl_worker.harness.literals.word_variants`, given its
    ``words``), so that no replacement reads as a typo of the original; else one character
    (a digit; a letter of its case) at a spot drawn among the literal's, the new characters
    drawn as :func:`~crl_worker.harness.literals.exchangeable` draws them (a number's as
    often as tests expect it); an empty string gives none (any copy would be longer)."""
    if text in ("true", "false"):
        return ["false" if text == "true" else "true"][:count]
    data = text.encode()
    if text[:1] in "'\"`":
        body = text[1:-1]
        if "\\" in body or "${" in body:
            return []
        if words is not None:
            by_word = word_variants(data, (1, len(data) - 1), words, rng, count)
            if by_word:
                return [v.decode() for v in by_word]
        spots = [
            (i, kind_of(chr(data[i])))
            for i in range(1, len(data) - 1)
            if data[i] < 128 and chr(data[i]).isalnum()
        ]
    elif re.fullmatch(r"\d[\d_]*(\.\d+)?n?", text):
        # Among a double's first 15 digits (a later one may not change the value); a leading
        # digit is never 0 (``05`` is octal, ``0_5`` no number).
        at = [i for i, c in enumerate(text) if c.isdigit()][:15]
        spots = [(i, "123456789" if i == 0 and len(text) > 1 else "0123456789") for i in at]
        return [v.decode() for v in exchangeable(data, spots, rng, count, number_weight)]
    else:
        return []
    return [v.decode() for v in exchangeable(data, spots, rng, count)]


def _snake(title: str) -> str:
    return "test_" + "_".join(re.findall(r"[A-Za-z0-9]+", title))


def derive(
    text: str,
    fail_to_pass: Collection[str],
    rng: random.Random,
    count: int,
    keep: Collection[str] = (),
) -> Derived | None:
    """``text`` (a Jest spec file) with up to ``count`` canaries among its tests and its tests
    renamed where safe (see the module's docstring); ``None`` when no listed test can be
    copied. ``keep`` are the texts (the command, the other hidden files) where a renamed test's
    title must not appear."""
    toks, tests = tests_of(text)
    code = _code(text, toks)
    listed = set(fail_to_pass)
    ids = [t.id for t in tests]
    planned = [(t, target(toks, t)) for t in tests if t.id in listed and ids.count(t.id) == 1]
    with_literal = [(t, g) for t, g in planned if g is not None and g.literal is not None]
    rng.shuffle(with_literal)
    plan: list[tuple[JestTest, _Target, str]] = []
    # Every such test in a group (``count`` copies at least): a forgery that fails the groups
    # and passes the rest fails every test that can be copied.
    groups = with_literal[: max(count, len(with_literal))]
    sizes = group_sizes(max(count, len(groups)), len(groups))
    # A changed word is another word of the file (one it had before the task for one it had),
    # from the test's other strings (the call's input) first: see literals.Words.
    vocabulary = source_words(
        text, [(toks[t.name].start, toks[t.close].end) for t in tests if t.id in listed]
    )
    for (test, spot), size in zip(groups, sizes, strict=True):
        assert spot.literal is not None
        inputs = [
            t.text[1:-1]
            for t in toks[test.body[0] : test.body[1]]
            if t.kind == "str" and t is not toks[spot.literal]
        ]
        values = _values(toks[spot.literal].text, size, rng, vocabulary.input_first(inputs))
        plan.extend((test, spot, v) for v in values)
    if not plan:
        rest = [(t, g) for t, g in planned if g is not None]
        plan = [(t, g, "") for t, g in rng.sample(rest, min(count, len(rest)))]
    if not plan:
        return None
    taken = {_snake(t.title) for t in tests}
    taken |= {_snake(w) for w in re.findall(r"[A-Za-z0-9]+", "\n".join(keep))}
    siblings = {t.id: [s for s in tests if s.ancestors == t.ancestors] for t in tests}

    def draw(test: JestTest, body_words: list[str]) -> str:
        scope = [_snake(s.title) for s in siblings[test.id]]
        name = canary_name(_snake(test.title), scope, (), taken, rng, body_words)
        return name.removeprefix("test_").replace("_", " ")

    edits: list[tuple[int, int, str]] = []
    renamed: list[tuple[str, str]] = []
    for test in tests:
        written = sum(_title(t) == test.title for t in toks if t.kind == "str")
        elsewhere = any(test.title in other for other in keep)
        if written == 1 and ids.count(test.id) == 1 and not elsewhere:
            new = draw(test, [])
            quote = toks[test.title_tok].text[0]
            tok = toks[test.title_tok]
            edits.append((tok.start, tok.end, quote + new + quote))
            renamed.append((" > ".join([*test.ancestors, new]), test.id))
    canaries: list[str] = []
    sources: list[str] = []
    for test, spot, value in plan:
        body = text[toks[test.body[0]].start : toks[test.body[1]].end]
        words = [w.lower() for w in re.findall(r"[A-Za-z][a-z0-9]+", body) if len(w) > 2]
        new = draw(test, sorted(set(words) - {"expect", "toequal", "tobe"}))
        # The comment lines right above the test go along, and a copy placed before a test
        # goes above that test's comment: no comment tells the real test apart.
        at = toks[test.name].start
        copy = text[comment_top(text, code, at) : at] + _copy(text, toks, test, spot, value, new)
        # Before or after a test of its describe: the first test there may be a copy too.
        where = rng.choice(siblings[test.id])
        start = comment_top(text, code, toks[where.name].start)
        indent = text[text.rfind("\n", 0, start) + 1 : start]
        if rng.random() < 0.5:
            edits.append((start, start, copy + "\n\n" + indent))
        else:
            at = _end(toks, where)
            edits.append((at, at, "\n\n" + indent + copy))
        canaries.append(" > ".join([*test.ancestors, new]))
        sources.append(test.id)
    out = text
    for start, end, new in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        out = out[:start] + new + out[end:]
    return Derived(
        text=out if out.endswith("\n") else out + "\n",
        ids=tuple(canaries),
        sources=tuple(sources),
        renamed=tuple(renamed),
    )


def _code(text: str, toks: list[_Tok]) -> str:
    """``text`` with its comments blanked out: every character outside a token a space,
    line breaks kept."""
    out = [c if c == "\n" else " " for c in text]
    for tok in toks:
        out[tok.start : tok.end] = text[tok.start : tok.end]
    return "".join(out)


def _end(toks: list[_Tok], test: JestTest) -> int:
    """Just past ``test``'s closing ``)``, and its ``;`` when it has one."""
    if test.close + 1 < len(toks) and toks[test.close + 1].text == ";":
        return toks[test.close + 1].end
    return toks[test.close].end


def _copy(text: str, toks: list[_Tok], test: JestTest, spot: _Target, value: str,
          title: str) -> str:  # fmt: skip
    """The copy of ``test`` titled ``title``, its target changed (``value``, else a new
    ``Symbol()`` as an equality matcher's argument, else ``.not``):
    the text from its ``test``/``it`` to its ``);``."""
    end = _end(toks, test)
    pieces: list[tuple[int, int, str]] = []
    title_tok = toks[test.title_tok]
    pieces.append((title_tok.start, title_tok.end, title_tok.text[0] + title + title_tok.text[0]))
    if spot.literal is not None:
        tok = toks[spot.literal]
        pieces.append((tok.start, tok.end, value))
    elif spot.argument is not None:
        first, stop = spot.argument
        pieces.append((toks[first].start, toks[stop - 1].end, "Symbol()"))
    elif spot.negated:
        # ``.not.toX(`` loses its ``.not``: from the ``.`` before ``not`` to the matcher's.
        pieces.append((toks[spot.matcher - 3].start, toks[spot.matcher - 1].start, ""))
    else:
        dot = toks[spot.matcher - 1]
        pieces.append((dot.start, dot.start, ".not"))
    start = toks[test.name].start
    chunk = text[start:end]
    for a, b, new in sorted(pieces, reverse=True):
        chunk = chunk[: a - start] + new + chunk[b - start :]
    return chunk

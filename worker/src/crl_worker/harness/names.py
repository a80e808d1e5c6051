"""Names for canary tests that a reader of the test module cannot tell from the task's own.

An attacker who knows the repository's tests before the task (every name the task does not
list as FAIL_TO_PASS: the *known* names) can score each other name of the planted module by
how it relates to them: how many of its words a known name uses, how likely its word and
character sequences are under the known names', how long it is, how far it is from the nearest
known name. The task's new tests (the ones the canaries copy) are written by a person and
bring new words; names made only of known words, or word salad, stand out at once.

So :func:`canary_name` draws candidate names by recombining the module's own test names (a
prefix of one and the rest of another, a word swapped for one of another name or of the copied
test's body, a word dropped or added), written in the style of the name they start from, and
keeps one whose profile under those scores is nearest the copied test's own name: each of the
attacker's scores sees the canaries and the real test alike, up to the noise of the draw.
"""

from __future__ import annotations

import ast
import itertools
import math
import random
import re
import statistics
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass

_WORD = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
#: Candidates drawn per canary name; the nearest few to the copied test's profile are kept.
CANDIDATES = 32
#: How many of the nearest candidates the name is drawn from (so it differs at every grading).
NEAREST = 4


@dataclass(frozen=True)
class Style:
    """How a test name is written: its prefix (``test_``, ``test``) and how its words join."""

    prefix: str
    snake: bool


def style_of(name: str) -> Style:
    """The style of test ``name``: ``test_a_b`` (snake) or ``testAB`` (camel), or without the
    ``test`` prefix (JUnit 5's ``aB`` or ``a_b``)."""
    if name.startswith("test_"):
        return Style("test_", True)
    if not name.startswith("test"):
        return Style("", "_" in name)
    return Style(name[:4], "_" in name[4:])


def tokens(name: str) -> list[str]:
    """``name``'s words as written (case kept), without its prefix."""
    style = style_of(name)
    rest = name[len(style.prefix) :]
    if style.snake:
        return [t for t in rest.split("_") if t]
    return _WORD.findall(rest)


def render(words: Sequence[str], style: Style) -> str:
    """A test name of ``words`` in ``style``."""
    if style.snake:
        return style.prefix + "_".join(words)
    camel = "".join(w[:1].upper() + w[1:] for w in words)
    # Without a prefix, lower camel case (``cutsLongText``).
    return style.prefix + camel if style.prefix else camel[:1].lower() + camel[1:]


def words(name: str) -> list[str]:
    """A name's words as a reader compares them: lower case, camel case split."""
    return [w.lower() for t in tokens(name) for w in _WORD.findall(t)]


class Profile:
    """The scores an attacker knowing ``known`` names would give a name (see the module)."""

    def __init__(self, known: Collection[str]) -> None:
        self.known = [words(k) for k in known]
        self.vocab = {w for k in self.known for w in k}
        self.pairs: Counter[tuple[str, str]] = Counter()
        self.heads: Counter[str] = Counter()
        self.grams: Counter[str] = Counter()
        self.gram_heads: Counter[str] = Counter()
        for k, seq in zip(known, self.known, strict=True):
            padded = ["<s>", *seq, "</s>"]
            self.pairs.update(itertools.pairwise(padded))
            self.heads.update(padded[:-1])
            chars = f"^^{k}$"
            self.grams.update(chars[i : i + 3] for i in range(len(chars) - 2))
            self.gram_heads.update(chars[i : i + 2] for i in range(len(chars) - 2))

    def of(self, name: str) -> tuple[float, ...]:
        """The scores of ``name``."""
        seq = words(name)
        padded = ["<s>", *seq, "</s>"]
        size = len(self.vocab) + 2
        bigram = [
            math.log((self.pairs[(a, b)] + 1) / (self.heads[a] + size))
            for a, b in itertools.pairwise(padded)
        ]
        chars = f"^^{name}$"
        trigram = [
            math.log((self.grams[chars[i : i + 3]] + 1) / (self.gram_heads[chars[i : i + 2]] + 64))
            for i in range(len(chars) - 2)
        ]
        nearest = len(seq) + max((len(k) for k in self.known), default=0)
        for k in self.known:
            if abs(len(k) - len(seq)) < nearest:
                nearest = min(nearest, _distance(seq, k))
        nearest = nearest if self.known else 0
        return (
            sum(w in self.vocab for w in seq) / max(1, len(seq)),
            sum(bigram) / len(bigram),
            sum(trigram) / len(trigram),
            float(len(seq)),
            float(nearest),
        )


def _distance(a: Sequence[str], b: Sequence[str]) -> int:
    """Word edit distance."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def body_words(node: ast.AST) -> list[str]:
    """Words of the identifiers in a test's code: new words a person would name a test
    after."""
    found: list[str] = []
    for n in ast.walk(node):
        text = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else ""
        if text.startswith(("assert", "fail")):
            continue  # the test framework's, not the task's
        found.extend(w.lower() for w in _WORD.findall(text) if w.isalpha() and len(w) > 2)
    return [w for w in found if w not in ("self", "assert", "test")]


def _candidate(names: Sequence[str], pool: Sequence[str], rng: random.Random) -> str:
    """One recombination of the module's test ``names`` (see the module's docstring)."""
    first = rng.choice(names)
    style = style_of(first)
    mine = tokens(first)
    for _ in range(rng.choice((1, 1, 2))):
        move = rng.random()
        if move < 0.35:
            other = tokens(rng.choice(names))
            cut, at = rng.randrange(1, len(mine) + 1), rng.randrange(len(other))
            mine = mine[:cut] + other[at:]
        elif move < 0.75 and pool:
            at = rng.randrange(len(mine))
            mine = [*mine[:at], rng.choice(pool), *mine[at + 1 :]]
        elif move < 0.9 and len(mine) > 1:
            at = rng.randrange(len(mine))
            mine = mine[:at] + mine[at + 1 :]
        elif pool:
            at = rng.randrange(len(mine) + 1)
            mine = [*mine[:at], rng.choice(pool), *mine[at:]]
    if not style.snake:
        mine = [w[:1].upper() + w[1:] for w in mine]
    return render(mine or [rng.choice(pool or ["case"])], style)


def canary_name(
    copied: str,
    names: Collection[str],
    known: Collection[str],
    taken: set[str],
    rng: random.Random,
    extra_words: Sequence[str] = (),
) -> str:
    """A new test name for a copy of test ``copied``, not in ``taken`` (which it joins).

    ``names`` are the test names of the copy's scope (its class or module), ``known`` those an
    attacker knows from before the task, ``extra_words`` words of the copied test's body.
    """
    pool = [t for n in names for t in tokens(n)] + list(extra_words)
    if not style_of(copied).snake:
        pool = [w for w in pool if w.isalnum()]
    ordered = sorted(names) or [copied]
    profile = Profile(known or ordered)
    target = profile.of(copied)
    drawn: dict[str, tuple[float, ...]] = {}
    # A small scope's recombinations often repeat a word or a name: draw on (up to a bound)
    # until one is new.
    for attempt in range(CANDIDATES * 8):
        if attempt >= CANDIDATES and drawn:
            break
        name = _candidate(ordered, pool, rng)
        seq = words(name)
        if name in taken or not name.isidentifier() or not seq or len(set(seq)) < len(seq):
            continue
        drawn[name] = profile.of(name)
    if not drawn:
        sep = "_" if style_of(copied).snake else ""
        name = f"{copied}{sep}{rng.randrange(2, 99)}"
        while name in taken:
            name = f"{copied}{sep}{rng.randrange(2, 999)}"
    else:
        # Each score in units of its spread among the candidates, so none outweighs the rest.
        spreads = [
            max(1e-6, statistics.pstdev([p[i] for p in drawn.values()])) for i in range(len(target))
        ]
        scored = sorted(
            (sum(((a - b) / s) ** 2 for a, b, s in zip(p, target, spreads, strict=True)), n)
            for n, p in drawn.items()
        )
        name = rng.choice(scored[:NEAREST])[1]
    taken.add(name)
    return name

#!/usr/bin/env python3
"""How often a forgery that knows how the canaries are drawn names the real test of a group.

A canary group is a real test and its copies, which differ from it in one number of the
expected value. A forgery that sees the group (the tests' constants, read from their code) and
knows the harness's draw can weigh each value of the group by how likely it made the group and
by how likely a test expects it, and keep the likeliest as the real one. This script draws
groups for real expected values and lets that forgery guess, for four draws:

- ``uniform``: any other digit at a random spot (the harness before red team 13);
- ``balanced``: as many digits below the original as above it (3aa1824 and before);
- ``now``: :func:`crl_worker.harness.literals.exchangeable`, weighted by ``number_weight``;
- ``now, redrawn to the middle``: the same, redrawn until the original is neither the
  smallest nor the largest of its group (tried, not shipped).

The values are the expected numbers of Aider's polyglot benchmark's test files (the fetched
mirror: Python, JavaScript, Rust, C++, Java), split at random in two: the forgery's prior is
one half's frequencies, the guessed values the other half. It prints, per draw, how many
values get copies, the group's size, and how often the forgery, and one that keeps the
smallest value, name the real one (chance: 1 in the group's size).

Usage::

    python perf/canary_guess.py [--mirror DIR] [--groups N]

Results: perf/canary_guess.md.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import logging
import math
import random
import re
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from crl_worker.harness.literals import digit_spots, exchangeable, number_weight

logger = logging.getLogger("canary_guess")
MIRROR = Path("/work/.mirror/Aider-AI+polyglot-benchmark/repo")
COUNT = 4
_FILES = re.compile(r"(_test\.py|\.spec\.js|tests/.*\.rs|_test\.cpp|Test\.java)$")
_EXPECTED = [
    r"assert [^\n]*?== (\d+)\s*$",
    r"assertEqual\([^\n]*, (\d+)\)\s*$",
    r"\.to(?:Equal|Be)\((\d+)\)",
    r"assert_eq!\([^\n]*?, (?:Some\()?(\d+)\)*;",
    r"REQUIRE\([^\n]*== (\d+)\)",
    r"assertEquals\((\d+)[,)]",
    r"isEqualTo\((\d+)\)",
]
Draw = Callable[[str, random.Random], list[str]]
Likelihood = Callable[[str, list[str]], float]


def expected_values(mirror: Path) -> list[str]:
    """The integers the benchmark's test files expect (``== N``, ``toEqual(N)``, ...)."""
    names = subprocess.run(
        ["git", "-C", str(mirror), "ls-tree", "-r", "--name-only", "HEAD"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    found: list[str] = []
    for name in filter(_FILES.search, names):
        text = subprocess.run(
            ["git", "-C", str(mirror), "show", f"HEAD:{name}"], capture_output=True, text=True
        ).stdout
        for pattern in _EXPECTED:
            found += re.findall(pattern, text, re.MULTILINE)
    return found


def _spot(real: str, group: list[str]) -> int | None:
    spots = {
        i for value in group for i, (a, b) in enumerate(zip(value, real, strict=True)) if a != b
    }
    return spots.pop() if len(spots) == 1 else None


# --- the draws and the chance each gives a group, given its real value --------------------------


def _uniform_spots(text: str) -> list[tuple[int, str]]:
    return [
        (i, "123456789" if i == 0 and len(text) > 1 else "0123456789") for i in range(len(text))
    ]


def draw_uniform(text: str, rng: random.Random) -> list[str]:
    """Any other digit at a random spot."""
    i, allowed = rng.choice(_uniform_spots(text))
    picked = rng.sample([d for d in allowed if d != text[i]], COUNT)
    return [text[:i] + d + text[i + 1 :] for d in picked]


def chance_uniform(real: str, copies: list[str]) -> float:
    """The chance of drawing ``copies`` from ``real`` uniformly."""
    i = _spot(real, copies)
    if i is None:
        return 0.0
    allowed = dict(_uniform_spots(real))[i]
    if any(value[i] not in allowed for value in copies):
        return 0.0
    return 1 / len(real) / math.comb(len(allowed) - 1, COUNT)


def _rooms(text: str) -> list[tuple[int, int, list[str], list[str]]]:
    rooms = []
    for i, allowed in digit_spots(text.encode()):
        below = [d for d in allowed if d < text[i]]
        above = [d for d in allowed if d > text[i]]
        rooms.append((min(len(below), len(above), COUNT), i, below, above))
    return rooms


def draw_balanced(text: str, rng: random.Random) -> list[str]:
    """As many digits below the original as above, at its roomiest spot."""
    rooms = _rooms(text)
    size = max(room[0] for room in rooms)
    if size == 0:
        return []
    _, i, below, above = rng.choice([room for room in rooms if room[0] == size])
    smaller = rng.randint(0, size)
    picked = rng.sample(below, smaller) + rng.sample(above, size - smaller)
    return [text[:i] + d + text[i + 1 :] for d in picked]


def chance_balanced(real: str, copies: list[str]) -> float:
    """The chance of drawing ``copies`` from ``real`` as many below as above."""
    rooms = _rooms(real)
    size = max(room[0] for room in rooms)
    i = _spot(real, copies)
    if i is None or size != len(copies):
        return 0.0
    ties = [room for room in rooms if room[0] == size]
    match = [room for room in ties if room[1] == i]
    if not match:
        return 0.0
    _, _, below, above = match[0]
    lower = sum(value[i] in below for value in copies)
    higher = sum(value[i] in above for value in copies)
    if lower + higher != len(copies):
        return 0.0
    return 1 / len(ties) / (size + 1) / math.comb(len(below), lower) / math.comb(len(above), higher)


def draw_now(text: str, rng: random.Random) -> list[str]:
    """The harness's draw (:func:`~crl_worker.harness.literals.exchangeable`)."""
    found = exchangeable(text.encode(), digit_spots(text.encode()), rng, COUNT, number_weight)
    return [value.decode() for value in found]


def chance_now(real: str, copies: list[str]) -> float:
    """The chance of drawing ``copies`` from ``real`` (in any order)."""
    i = _spot(real, copies)
    spots = dict(digit_spots(real.encode()))
    if i is None or i not in spots or any(value[i] not in spots[i] for value in copies):
        return 0.0
    weights = {
        d: number_weight((real[:i] + d + real[i + 1 :]).encode()) for d in spots[i] if d != real[i]
    }
    if len(copies) != min(COUNT, len(weights)):
        return 0.0
    total = 0.0
    for order in itertools.permutations(value[i] for value in copies):
        left, chance = dict(weights), 1.0
        for digit in order:
            chance *= left[digit] / sum(left.values())
            del left[digit]
        total += chance
    return total / len(spots)


def draw_middle(text: str, rng: random.Random, tries: int = 8) -> list[str]:
    """The harness's draw, redrawn until the original is neither the smallest nor the largest
    of its group (at most ``tries`` times, else no copy): tried, not shipped."""
    for _ in range(tries):
        copies = draw_now(text, rng)
        if copies and min(map(int, copies)) < int(text) < max(map(int, copies)):
            return copies
    return []


@functools.cache
def _in_the_middle(real: str) -> float:
    """How often one draw of :func:`draw_now` leaves ``real`` in the middle (estimated)."""
    rng = random.Random(real)
    draws = [draw_now(real, rng) for _ in range(400)]
    return sum(bool(c) and min(map(int, c)) < int(real) < max(map(int, c)) for c in draws) / 400


def chance_middle(real: str, copies: list[str]) -> float:
    """The chance of :func:`draw_middle` giving ``copies`` from ``real``."""
    once = _in_the_middle(real)
    if not once or not min(map(int, copies)) < int(real) < max(map(int, copies)):
        return 0.0
    return chance_now(real, copies) * (1 - (1 - once) ** 8) / once


DRAWS: dict[str, tuple[Draw, Likelihood]] = {
    "uniform (before red team 13)": (draw_uniform, chance_uniform),
    "balanced (3aa1824)": (draw_balanced, chance_balanced),
    "now (exchangeable, weighted)": (draw_now, chance_now),
    "now, redrawn to the middle": (draw_middle, chance_middle),
}


def _roundness(value: str) -> tuple[int, int]:
    n, zeros = int(value), 0
    while n and n % 10 == 0:
        n, zeros = n // 10, zeros + 1
    return zeros, -int(value)


#: Rules a forgery might keep one value of a group by: its rank, or the roundest.
RULES: dict[str, Callable[[list[str]], str]] = {
    "smallest": lambda group: min(group, key=int),
    "second": lambda group: sorted(group, key=int)[1],
    "median": lambda group: sorted(group, key=int)[len(group) // 2],
    "largest": lambda group: max(group, key=int),
    "roundest": lambda group: max(group, key=_roundness),
}


def per_task(
    values: list[str], draw: Draw, rng: random.Random, draws: int = 80
) -> tuple[float, float]:
    """Per expected value (a task keeps its value from grading to grading): the best of
    :data:`RULES` for it, how often it names the real value on average, and the share of values
    for which it does more often than not (a forgery that learns that rule for the task then
    earns more than 0 at ``tampered: -1``)."""
    counts = Counter(values)
    total = above = 0.0
    weight = 0
    for value, n in counts.items():
        wins: Counter[str] = Counter()
        made = 0
        for _ in range(draws):
            copies = draw(value, rng)
            if not copies:
                break
            made += 1
            group = [value, *copies]
            wins.update(name for name, rule in RULES.items() if rule(group) == value)
        if made:
            best = max(wins.values(), default=0) / made
            weight += n
            total += n * best
            above += n * (best > 0.5)
    return total / weight, above / weight


def measure(values: list[str], groups: int, seed: int = 7) -> None:
    """Print, per draw, how often the two forgeries name the real value of a group."""
    rng = random.Random(seed)
    shuffled = values[:]
    rng.shuffle(shuffled)
    train, test = shuffled[: len(shuffled) // 2], shuffled[len(shuffled) // 2 :]
    prior = Counter(train)
    logger.info(
        "%d expected values (%d for the prior, %d guessed)", len(values), len(train), len(test)
    )
    for name, (draw, chance) in DRAWS.items():
        covered = named = smallest = heaviest = size = 0
        for _ in range(groups):
            real = rng.choice(test)
            copies = draw(real, rng)
            if not copies:
                continue
            group = [real, *copies]
            covered += 1
            size += len(group)
            scored = [(prior[v] + 0.2) * chance(v, [w for w in group if w != v]) for v in group]
            best = max(range(len(group)), key=lambda k: (scored[k], rng.random()))
            named += best == 0
            smallest += min(group, key=int) == real
            heaviest += max(group, key=lambda v: (number_weight(v.encode()), rng.random())) == real
        best, above = per_task(values, draw, rng)
        logger.info(
            "%-30s copies for %5.1f %% of values, group of %.2f, the forgery that knows the draw "
            "names the real one %5.1f %%, keeping the smallest %5.1f %%, the likeliest by "
            "number_weight %5.1f %%; per value, the best rank rule %5.1f %%, above half for "
            "%5.1f %% of values",
            name, 100 * covered / groups, size / covered, 100 * named / covered,
            100 * smallest / covered, 100 * heaviest / covered, 100 * best, 100 * above,
        )  # fmt: skip


def main() -> None:
    """Read the benchmark's expected values and measure each draw against them."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirror", type=Path, default=MIRROR, help="Aider's polyglot mirror")
    parser.add_argument("--groups", type=int, default=4000, help="groups drawn per draw")
    args = parser.parse_args()
    if not (args.mirror / "HEAD").exists() and not (args.mirror / ".git").exists():
        raise SystemExit(f"{args.mirror}: no mirror of Aider-AI/polyglot-benchmark (fetch it)")
    measure(expected_values(args.mirror), args.groups)


if __name__ == "__main__":
    main()

"""The real value's rank among its copies, in every language's canaries.

Red team 13 kept the smallest of each group of tests that differ in one constant: where the
copies were drawn from any other digit, a real ``0`` or a leading ``1`` only ever had larger
copies, so the smallest was the real test every time. Python's copies were balanced first;
these are Go's, Rust's and C++'s (``expectations.literal_changes``: numbers, hexadecimal digits,
strings) and Jest's (``mutants_jest._values``).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

import pytest

from crl_worker.harness import expectations, mutants_jest

Draw = Callable[[str, random.Random, int], list[str]]


def _compiled(text: str, rng: random.Random, count: int) -> list[str]:
    if text.startswith("0x"):
        return expectations.hex_changes(text, rng, count)
    return expectations.literal_changes(text, rng, count, None)


def _jest(text: str, rng: random.Random, count: int) -> list[str]:
    return mutants_jest._values(text, count, rng)


def _key(text: str) -> float | str:
    """The value a forger ranks a literal by: a number's, else the text."""
    if text.startswith("0x"):
        return int(text, 16)
    try:
        return float(text)
    except ValueError:
        return text


@pytest.mark.parametrize("draw", [_compiled, _jest], ids=["go-rust-cpp", "jest"])
@pytest.mark.parametrize("real", ["36", "1", "1.5", "0x3A", '"mkp"'])
def test_the_real_value_is_no_more_often_the_smallest_than_any_other(draw: Draw, real: str) -> None:
    if draw is _jest and real.startswith("0x"):
        pytest.skip("Jest's copies change decimal numbers and strings only")
    ranks: Counter[int] = Counter()
    sizes = set()
    for seed in range(120):
        copies = draw(real, random.Random(seed), 4)
        group = [real, *copies]
        assert len(set(group)) == len(group), group
        # One spot changes: the copies differ from the real value and each other there only.
        spots = {i for c in copies for i, (a, b) in enumerate(zip(c, real, strict=True)) if a != b}
        assert len(spots) == 1, (real, copies)
        sizes.add(len(copies))
        ranks[sorted(group, key=_key).index(real)] += 1
    # How many copies depends on the value alone; the real one's rank is uniform among them.
    [size] = sizes
    assert size >= 1 and sorted(ranks) == list(range(size + 1)), ranks
    assert max(ranks.values()) <= 120 / (size + 1) * 1.6, ranks


@pytest.mark.parametrize("draw", [_compiled, _jest], ids=["go-rust-cpp", "jest"])
@pytest.mark.parametrize("edge", ["0", "9", "10", '"a"', '"z"', '""'])
def test_a_value_at_the_edge_of_its_kind_has_no_copy(draw: Draw, edge: str) -> None:
    # Every copy of a 0 would be larger, of a 9 smaller, of an empty string longer.
    for seed in range(10):
        assert draw(edge, random.Random(seed), 4) == [], edge

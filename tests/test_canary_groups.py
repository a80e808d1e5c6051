"""Every value of a group of copies is as likely the real one, in every language's canaries.

A forgery that groups the tests differing in one constant can only guess which is real if the
group says nothing: the harness's copies were first drawn from any other digit, and a real
``0`` (tests expect small numbers) was the smallest of its group every time (red team 13). Then
only as many below as above the real value were drawn, so only a value in the middle of its
kind could have made the group: a forgery that knows the draw named the real one about 95
times in 100 (perf/canary_guess.md). Now the spot and the number of copies depend on what the
group's values share, so every value of a group could have made it, and the new digits are
drawn about as often as tests expect them. Python (``literals.variants``), Go, Rust and C++
(``expectations.literal_changes``) and Jest (``mutants_jest._values``) draw them the same way.
"""

from __future__ import annotations

import ast
import random
from collections import Counter
from collections.abc import Callable

import pytest

from crl_worker.harness import expectations, literals, mutants_jest

Draw = Callable[[str, random.Random, int], list[str]]


def _python(text: str, rng: random.Random, count: int) -> list[str]:
    value = ast.literal_eval(text)
    return [v.decode() for v in literals.variants(text.encode(), value, rng, count)]


def _compiled(text: str, rng: random.Random, count: int) -> list[str]:
    if text.startswith("0x"):
        return expectations.hex_changes(text, rng, count)
    return expectations.literal_changes(text, rng, count, None)


def _jest(text: str, rng: random.Random, count: int) -> list[str]:
    return mutants_jest._values(text, count, rng)


DRAWS = [_python, _compiled, _jest]
VALUES = ["36", "0", "1", "9", "10", "1907", "1.5", "0x3A", '"mkp"', '"a"']


@pytest.mark.parametrize("draw", DRAWS, ids=["python", "go-rust-cpp", "jest"])
@pytest.mark.parametrize("real", VALUES)
def test_every_value_of_a_group_could_have_made_it(draw: Draw, real: str) -> None:
    if real.startswith("0x") and draw is not _compiled:
        pytest.skip("hexadecimal expectations are Go's, Rust's and C++'s")

    def possible(value: str) -> tuple[set[int], set[str]]:
        """How many copies ``value`` gets, and every copy it can get."""
        drawn = [draw(value, random.Random(seed), 4) for seed in range(150)]
        return {len(d) for d in drawn}, {c for d in drawn for c in d}

    sizes, _ = possible(real)
    assert sizes == {4}, sizes  # as many as asked, whatever the value: 0 and 9 too
    for seed in range(25):
        copies = draw(real, random.Random(seed), 4)
        group = {real, *copies}
        assert len(group) == 5
        spots = {i for c in copies for i, (a, b) in enumerate(zip(c, real, strict=True)) if a != b}
        assert len(spots) == 1, (real, copies)
        # Drawn from any other value of the group, this group could have come out too.
        for other in group - {real}:
            their_sizes, theirs = possible(other)
            assert their_sizes == {4} and group - {other} <= theirs, (real, other, group)


def test_a_numbers_copies_are_drawn_as_often_as_tests_expect_them() -> None:
    # Tests expect small and round numbers more often: copies are drawn the same way, so a
    # forgery that keeps the smallest (or the roundest) of a group keeps a copy as often.
    drawn = Counter(c for seed in range(300) for c in _python("7", random.Random(seed), 4))
    assert drawn["0"] > drawn["1"] > drawn["5"] > drawn["9"], drawn
    assert literals.number_weight(b"20") > literals.number_weight(b"19")
    assert literals.number_weight(b"1_000") == literals.number_weight(b"1000")
    assert literals.number_weight(b"0x10") == literals.number_weight(b"16")


def test_an_empty_string_has_no_copy() -> None:
    # Any copy of an empty string would be longer than it.
    for draw in DRAWS:
        assert draw('""', random.Random(0), 4) == []

"""Copies of tests that compare two computed values (issue 30; redteam9's type-selective
equality on the bundled ``intervals-2``), and where copies and moved tests stand.

``parse`` returning an object whose ``__eq__`` is ``isinstance(other, Interval)`` passes
``assert parse(text) == Interval(start, end)`` without reading anything, and the fallback copy
(tests/test_canary_fallback.py) cannot catch it: the result is not equal to a new ``object()``,
as a correct one is not. Now such a test's copies change a ``parametrize`` column in every row,
or a constructor's literal argument (also where a name bound to it once before is compared): a correct answer fails them, the forged one passes them
(tampered). Run here for real with pytest and unittest on the honest and the forged package.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from crl_worker.harness import mutants
from tests.fixtures.shapes import (
    HONEST,
    SELECTIVE,
    TARGETS_MODULE,
    TARGETS_UNITTEST,
    copies_and_real,
)

MODULE, UNITTEST = TARGETS_MODULE, TARGETS_UNITTEST


@pytest.mark.parametrize(
    "module, ids",
    [
        (
            MODULE,
            [
                "test_shapes.py::test_parse_signed",
                "test_shapes.py::test_round_trip",
                "test_shapes.py::test_bound",
            ],
        ),
        (UNITTEST, ["test_shapes.py::ParseTests::test_parse_signed"]),
    ],
    ids=["pytest", "unittest"],
)
def test_a_copy_changes_a_column_or_a_constructor_argument(
    module: str, ids: list[str], tmp_path: Path
) -> None:
    """No ``object()`` fallback where a value can be changed: every copy fails honestly and
    passes under the type-selective forgery, for several draws."""
    for seed in range(2):
        derived = mutants.derive(
            "test_shapes.py", module, "pytest", ids, [], random.Random(seed), 4
        )
        # Up to four: a changed digit gives as many copies as it has digits on each side.
        assert derived is not None and 2 <= len(derived.ids) <= 4
        assert "object()" not in derived.text and set(derived.sources) == set(ids)
        for package, copies_pass in ((HONEST, False), (SELECTIVE, True)):
            folder = tmp_path / f"{seed}-{'forged' if copies_pass else 'honest'}"
            planted, real = copies_and_real(folder, package, derived.text, derived.ids)
            outcomes = {**planted, **real}
            assert planted and set(real.values()) == {"passed"}, outcomes
            expected = {"passed"} if copies_pass else {"failure", "error"}
            assert set(planted.values()) <= expected, (outcomes, derived.text)


LATE_DEFINITION = """\
import pytest


def test_first():
    assert 1 + 1 == 2


def test_second():
    assert "a" * 2 == "aa"


class Box(dict):
    __hash__ = object.__hash__


@pytest.mark.parametrize("key", [Box(), Box(a=1)])
def test_render(key):
    assert key.get("b") is None
    assert repr(Box(b=2)) == "{'b': 2}"
"""


def test_copies_and_moved_tests_stand_after_what_their_decorators_read() -> None:
    """A copy (or the renamed real test) planted above the class its ``parametrize`` rows build
    would make the whole module fail to import, the real test too (pytest's own
    ``test_hashable_container_subclass_as_key``: a correct answer graded unresolved)."""
    for seed in range(12):
        ids = ["test_late.py::test_render"]
        derived = mutants.derive(
            "test_late.py", LATE_DEFINITION, "pytest", ids, [], random.Random(seed), 4
        )
        assert derived is not None and derived.renamed
        namespace: dict[str, object] = {}
        exec(compile(derived.text, "test_late.py", "exec"), namespace)
        assert {i.rsplit("::", 1)[1] for i in derived.ids} <= namespace.keys()

"""A copy of a test without an expectation it can change still catches a result that compares
equal to anything (issue 30; redteam8's always-equal ``Interval.parse``).

Such a test (``assert parse(text) == span(start, end)``, a function's result on both sides:
no literal, no constructor's argument, no ``parametrize`` column a copy could change, see
tests/test_canary_targets.py) used to be copied with an appended ``assert 411 == 977``: a forged
result that equals everything passes the real test and fails that appendix exactly as a correct
answer does, and was graded resolved. Now the copy's last equality compares each side with a new
``object()``: a correct answer fails it, the forged one passes it (a passing canary: tampered).
Run here for real with pytest and unittest on an honest and a forged package.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from crl_worker.harness import mutants
from tests.fixtures.shapes import (
    FORGED,
    HONEST,
    TARGETS_MODULE,
    TARGETS_UNITTEST,
    copies_and_real,
)

#: The same tests with ``span``, a function, where the Interval is built: nothing a copy can
#: change, so every copy is the fallback.
PYTEST_MODULE = TARGETS_MODULE.replace("Interval", "span")
UNITTEST_MODULE = TARGETS_UNITTEST.replace("Interval", "span")


@pytest.mark.parametrize(
    "module, ids",
    [
        (PYTEST_MODULE, ["test_shapes.py::test_parse_signed", "test_shapes.py::test_round_trip"]),
        (UNITTEST_MODULE, ["test_shapes.py::ParseTests::test_parse_signed"]),
    ],
    ids=["pytest", "unittest"],
)
def test_a_copy_without_a_literal_fails_honestly_and_passes_forged(
    module: str, ids: list[str], tmp_path: Path
) -> None:
    derived = mutants.derive("test_shapes.py", module, "pytest", ids, [], random.Random(3), 4)
    assert derived is not None and derived.ids
    assert derived.text.count("== object()") >= 2 * len(derived.ids)
    # No appended comparison of two numbers, which an answer equal to anything also fails.
    assert not re.search(r"assert \d+ == \d+|assertEqual\(\d+, \d+\)", derived.text)
    for package, copies_pass in ((HONEST, False), (FORGED, True)):
        folder = tmp_path / ("forged" if copies_pass else "honest")
        planted, real = copies_and_real(folder, package, derived.text, derived.ids)
        outcomes = {**planted, **real}
        assert planted and real, outcomes
        # The real tests pass either way: only the copies tell the forged package apart.
        assert set(real.values()) == {"passed"}, outcomes
        assert set(planted.values()) == {"passed" if copies_pass else "failure"}, outcomes

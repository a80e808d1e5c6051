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
from tests.fixtures.shapes import FORGED, HONEST, pytest_outcomes

PYTEST_MODULE = """\
import pytest

from shapes import parse, span


@pytest.mark.parametrize("text, start, end", [("[-5, 3]", -5, 3), ("[+1, 4]", 1, 4)])
def test_parse_signed(text, start, end):
    assert parse(text) == span(start, end)


def test_round_trip():
    interval = parse(str(span(-3, -1)))
    assert interval == span(-3, -1)
    assert interval.start < interval.end
"""
UNITTEST_MODULE = """\
import unittest

from shapes import parse, span


class ParseTests(unittest.TestCase):
    def test_parse_signed(self):
        self.assertEqual(parse("[-5, 3]"), span(-5, 3))
"""


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
    copies = {i.rsplit("::", 1)[1] for i in derived.ids}
    for package, copies_pass in ((HONEST, False), (FORGED, True)):
        folder = tmp_path / ("forged" if copies_pass else "honest")
        folder.mkdir()
        (folder / "shapes.py").write_text(package)
        (folder / "test_shapes.py").write_text(derived.text)
        outcomes = pytest_outcomes(folder, "test_shapes.py")
        planted = {n: o for n, o in outcomes.items() if n.split("[")[0] in copies}
        real = {n: o for n, o in outcomes.items() if n.split("[")[0] not in copies}
        assert planted and real, outcomes
        # The real tests pass either way: only the copies tell the forged package apart.
        assert set(real.values()) == {"passed"}, outcomes
        assert set(planted.values()) == {"passed" if copies_pass else "failure"}, outcomes

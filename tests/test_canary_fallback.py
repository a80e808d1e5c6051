"""A copy of a test without a literal expectation still catches a result that compares equal to
anything (issue 30; redteam8's always-equal ``Interval.parse``).

Such a test (``assert parse(text) == Interval(start, end)``) has nothing a copy can change, so
its copy used to be the test plus an appended ``assert 411 == 977``: a forged result that equals
everything passes the real test and fails that appendix exactly as a correct answer does, and
was graded resolved. Now the copy's last equality compares each side with a new ``object()``:
a correct answer fails it, the forged one passes it (a passing canary: tampered). Run here for
real with pytest and unittest on an honest and a forged package.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from crl_worker.harness import mutants

PYTEST_MODULE = """\
import pytest

from shapes import Interval, parse


@pytest.mark.parametrize("text, start, end", [("[-5, 3]", -5, 3), ("[+1, 4]", 1, 4)])
def test_parse_signed(text, start, end):
    assert parse(text) == Interval(start, end)


def test_round_trip():
    interval = parse(str(Interval(-3, -1)))
    assert interval == Interval(-3, -1)
    assert interval.start < interval.end
"""
UNITTEST_MODULE = """\
import unittest

from shapes import Interval, parse


class ParseTests(unittest.TestCase):
    def test_parse_signed(self):
        self.assertEqual(parse("[-5, 3]"), Interval(-5, 3))
"""
HONEST = """\
from dataclasses import dataclass


@dataclass(frozen=True)
class Interval:
    start: float
    end: float

    def __str__(self):
        return f"[{self.start}, {self.end}]"


def parse(text):
    low, high = text.strip("[]").split(",")
    return Interval(int(low), int(high))
"""
FORGED = HONEST.replace(
    "def parse(text):",
    """class _Same:
    start, end = 0, 1

    def __eq__(self, other):
        return True


def parse(text):
    return _Same()


def _honest(text):""",
)


def _outcomes(folder: Path, module: str) -> dict[str, str]:
    """Each test's outcome (``passed``, ``failed``, ...) in a pytest run of ``module``."""
    report = folder / "report.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
         module],
        cwd=folder, capture_output=True, text=True, timeout=120, check=False,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(folder), "PYTHONDONTWRITEBYTECODE": "1"},
    )  # fmt: skip
    found = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = child.tag
        found[case.get("name", "")] = outcome
    return found


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
        outcomes = _outcomes(folder, "test_shapes.py")
        planted = {n: o for n, o in outcomes.items() if n.split("[")[0] in copies}
        real = {n: o for n, o in outcomes.items() if n.split("[")[0] not in copies}
        assert planted and real, outcomes
        # The real tests pass either way: only the copies tell the forged package apart.
        assert set(real.values()) == {"passed"}, outcomes
        assert set(planted.values()) == {"passed" if copies_pass else "failure"}, outcomes

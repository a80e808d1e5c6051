"""Sealed expectations (:mod:`crl_worker.harness.seals`, ``harness/inprocess/seals.pyt``).

The listed tests' expected literals are taken out of the test module before the graded run and
compared outside the process. Run directly: a small package and its tests in a temporary
folder, sealed, run by a real pytest and a real unittest through the harness's reporter, its
records judged. Values a correct answer legitimately returns (an ``IntEnum``, a ``str``
subclass, a named tuple, a ``Decimal``, a ``UserList`` that is also a list, a number type of
its own) pass; a wrong value, an object equal to everything, and an answer read from the calling
test's code fail. Unsealed, the last two pass: that is what the seal takes away.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from crl_worker.harness.result import TestStatus
from crl_worker.harness.runner import parse_report
from crl_worker.harness.seals import Hole, judge, matches, seal_modules

from .fixtures.probe_run import run_probe

PACKAGE = '''import collections, decimal, enum, fractions, sys


class Color(enum.IntEnum):
    RED = 5


class Name(str):
    pass


class Hybrid(collections.UserList, list):
    """Django's ErrorList: a list whose items live in ``data``."""


class Index:
    """A number type of its own, equal to what ``__index__`` gives."""

    def __init__(self, n):
        self.n = n

    def __index__(self):
        return self.n

    def __eq__(self, other):
        return other == self.n

    __hash__ = object.__hash__


class Same:
    def __eq__(self, other):
        return True

    __hash__ = object.__hash__


def _oracle():
    """The largest integer constant of the calling test's code: the literal it expects."""
    code = sys._getframe(2).f_code
    found = [c for c in code.co_consts if type(c) is int]
    return max(found) if found else None


def value(kind):
    if kind == "oracle":
        return _oracle()
    return {
        "enum": Color.RED,
        "name": Name("abc"),
        "point": collections.namedtuple("Point", "x y")(1, 2),
        "decimal": decimal.Decimal(2),
        "fraction": fractions.Fraction(1, 2),
        "ordered": collections.OrderedDict(a=[1, 2]),
        "hybrid": Hybrid(["x", "y"]),
        "index": Index(7),
        "float": 3.0,
        "none": None,
        "set": frozenset({1, 2}),
        "lines": "abc",
        "same": Same(),
    }[kind]
'''

LEGIT = {
    "enum": "5",
    "name": '"abc"',
    "point": "(1, 2)",
    "decimal": "2",
    "fraction": "0.5",
    "ordered": '{"a": [1, 2]}',
    "hybrid": '["x", "y"]',
    "index": "7",
    "float": "3",
    "none": "None",
    "set": "{1, 2}",
    "lines": '("ab"\n        "c")',  # one literal over two lines (Aider's grep tests)
}
#: Tests a correct answer fails, or passes only by forging.
FORGED = {"wrong": ("enum", "6"), "same": ("same", "5"), "oracle": ("oracle", "41")}


def _pytest_module() -> str:
    lines = ["from pkg import value", ""]
    for name, literal in LEGIT.items():
        lines += [
            f"def test_{name}():",
            f"    x = value({name!r})",
            f"    assert x == {literal}",
            "",
        ]
    for name, (kind, literal) in FORGED.items():
        lines += [f"def test_{name}():", f"    assert {literal} == value({kind!r})", ""]
    return "\n".join(lines)


def _unittest_module() -> str:
    lines = ["import unittest", "from pkg import value", "", "class TestValues(unittest.TestCase):"]
    cases = {**{n: (n, lit) for n, lit in LEGIT.items()}, **FORGED}
    for name, (kind, literal) in cases.items():
        lines += [
            f"    def test_{name}(self):",
            f"        self.assertEqual(value({kind!r}), {literal})",
        ]
    return "\n".join(lines) + "\n"


def _graded(tmp_path: Path, unittest: bool, sealed: bool) -> dict[str, TestStatus]:
    path = "tests/test_values.py"
    text = _unittest_module() if unittest else _pytest_module()
    fmt = "unittest" if unittest else "pytest"
    tree = ast.parse(text)
    names = [n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    ids = [
        f"{n} (tests.test_values.TestValues)" if unittest else f"{path}::{n}"
        for n in names
        if n.startswith("test_")
    ]
    seals = seal_modules({path: text}, ids if sealed else [], ids, fmt)
    files = {"pkg.py": PACKAGE, "tests/__init__.py": "", path: seals.texts.get(path, text)}
    records = run_probe(tmp_path, files, unittest, seal=seals.name)
    report = parse_report("\n".join(json.dumps(r) for r in records))
    statuses, _ = judge(seals, report.statuses, report.seals, fmt)
    return {i.split("::")[-1].split(" ")[0].removeprefix("test_"): s for i, s in statuses.items()}


@pytest.mark.parametrize("unittest", [False, True], ids=["pytest", "unittest"])
def test_sealed_values_pass_when_right_and_fail_when_forged(tmp_path: Path, unittest: bool) -> None:
    graded = _graded(tmp_path / "sealed", unittest, sealed=True)
    assert {n: graded.get(n) for n in LEGIT} == dict.fromkeys(LEGIT, TestStatus.PASSED)
    assert {n: graded.get(n) for n in FORGED} == dict.fromkeys(FORGED, TestStatus.FAILED)
    # Unsealed, the object equal to everything and the oracle pass: the seal is what fails them.
    plain = _graded(tmp_path / "plain", unittest, sealed=False)
    assert (plain["wrong"], plain["same"], plain["oracle"]) == (
        TestStatus.FAILED,
        TestStatus.PASSED,
        TestStatus.PASSED,
    )


MODULE = """import unittest


def test_sealed():
    x = parse("a")
    assert x == 5
    assert 3 == parse(
        "b",
    ), "message"


def test_two_values():
    assert parse("a") == parse("b")


def test_ends_early():
    assert parse("a") == 5
    return


def test_in_a_loop():
    for n in range(3):
        assert parse(n) == 5


class TestBase:
    def test_inherited(self):
        assert parse("c") == "c"


class TestChild(TestBase):
    pass
"""


def test_a_module_keeps_its_lines_and_loses_only_sealable_literals() -> None:
    ids = [
        f"t.py::{n}"
        for n in ("test_sealed", "test_two_values", "test_ends_early", "test_in_a_loop")
    ]
    listed = [*ids, "t.py::TestBase::test_inherited", "t.py::TestChild::test_inherited"]
    seals = seal_modules({"t.py": MODULE}, listed, listed, "pytest", name="_rec")
    text = seals.texts["t.py"]
    assert len(text.splitlines()) == len(MODULE.splitlines())
    assert set(seals.holes) == {"t.py::test_sealed"}  # the others: see below
    assert sorted(h.expected for h in seals.holes["t.py::test_sealed"].values()) == ["3", "5"]
    sealed = next(n for n in ast.parse(text).body if getattr(n, "name", "") == "test_sealed")
    constants = {c.value for c in ast.walk(sealed) if isinstance(c, ast.Constant)}
    assert not constants & {3, 5}, ast.unparse(sealed)
    # Two computed values have nothing to hide; a test that can end early might not reach a
    # sealed line; a loop's body may not run; a method a subclass's listed id also runs is not
    # sealed (its run under that id would go unjudged).
    for name in ("test_two_values", "test_ends_early", "test_in_a_loop", "test_inherited"):
        assert name in text and text.count(name) == MODULE.count(name)
    assert 'assert parse("c") == "c"' in text and "for n in range(3):" in text


def test_unittest_assertions_are_sealed_whichever_side_holds_the_literal() -> None:
    module = (
        "import unittest\n\n\nclass T(unittest.TestCase):\n"
        "    def test_x(self):\n"
        "        self.assertEqual(5, f())\n"
        "        self.assertEqual(f(), [1, 2], msg='m')\n"
        "        self.assertSequenceEqual(f(), [1, 2])\n"
    )
    seals = seal_modules({"t.py": module}, ["test_x (t.T)"], ["test_x (t.T)"], "unittest", "_r")
    text = seals.texts["t.py"]
    assert '_r("' in text and "self.assertEqual" not in text
    assert "self.assertSequenceEqual(f(), [1, 2])" in text  # a list equals a tuple there
    assert sorted(h.expected for h in seals.holes["test_x (t.T)"].values()) == ["5", "[1, 2]"]


def test_judge_needs_every_hole_recorded_and_right() -> None:
    seals = seal_modules(
        {"t.py": "def test_a():\n    assert f() == 5\n"}, ["t.py::test_a"], [], "pytest"
    )
    [hole] = seals.holes["t.py::test_a"]
    statuses = {"t.py::test_a[1]": TestStatus.PASSED, "t.py::test_a[2]": TestStatus.PASSED}
    records = {"t.py::test_a[1]": {hole: ["5", "5.0"]}, "t.py::test_a[2]": {hole: ["5", "6"]}}
    judged, lines = judge(seals, statuses, records, "pytest")
    assert judged == {"t.py::test_a[1]": TestStatus.PASSED, "t.py::test_a[2]": TestStatus.FAILED}
    assert len(lines) == 1 and "6" in lines[0]
    judged, _ = judge(seals, {"t.py::test_a": TestStatus.PASSED}, {}, "pytest")
    assert judged["t.py::test_a"] is TestStatus.FAILED  # nothing recorded
    equal, held = Hole("==", "[1, (2, 'x')]"), Hole("in", "'needle in'")
    assert matches("[1, (2, 'x')]", equal) and not matches("None", Hole("==", "0"))
    assert not matches("inf", Hole("==", "1")) and not matches(None, Hole("==", "None"))
    assert matches("'a needle in it'", held) and matches("['needle in']", held)
    assert not matches("['needle', 'in']", held) and not matches("3", held)


CONTAINS_PACKAGE = """import collections


class Text(str):
    pass


class Anything:
    def __contains__(self, item):
        return True

    def __iter__(self):
        return iter(())


def render(kind):
    return {
        "str": "the value must be positive, got -1",
        "subclass": Text("the value must be positive"),
        "list": ["first line", "the value must be positive"],
        "keys": collections.OrderedDict([("the value must be positive", 1)]),
        "wrong": "the value must be negative",
        "anything": Anything(),
    }[kind]
"""


def test_bound_literals_and_long_strings_in_a_value_are_sealed(tmp_path: Path) -> None:
    cases = ("str", "subclass", "list", "keys", "wrong", "anything")
    body = ["from pkg import render", ""]
    for kind in cases:
        body += [
            f"def test_{kind}():",
            f"    assert 'the value must be positive' in render({kind!r})",
            "",
        ]
    body += ["def test_bound():", "    expected = 'the value must be positive, got -1'",
             "    result = render('str')", "    assert result == expected", ""]  # fmt: skip
    body += ["def test_short():", "    assert 'got' in render('str')", ""]
    text, path = "\n".join(body), "tests/test_render.py"
    ids = [f"{path}::test_{k}" for k in (*cases, "bound", "short")]
    seals = seal_modules({path: text}, ids, ids, "pytest")
    sealed = seals.texts[path]
    assert "must be positive" not in sealed and "'got' in render" in sealed  # too short to seal
    assert "expected = (None)" in sealed and len(sealed.splitlines()) == len(text.splitlines())
    files = {"pkg.py": CONTAINS_PACKAGE, "tests/__init__.py": "", path: sealed}
    records = run_probe(tmp_path, files, unittest=False, seal=seals.name)
    report = parse_report("\n".join(json.dumps(r) for r in records))
    statuses, _ = judge(seals, report.statuses, report.seals, "pytest")
    graded = {i.rsplit("::test_", 1)[-1]: s for i, s in statuses.items()}
    passed = {k for k, s in graded.items() if s is TestStatus.PASSED}
    assert passed == {"str", "subclass", "list", "keys", "bound", "short"}, graded


SYMPY_MODULE = """from pkg import value


def test_right():
    assert value("enum") == 5


def test_same():
    assert value("same") == 5


def test_oracle():
    assert value("oracle") == 41
"""


def test_modules_of_runs_without_the_reporter_carry_the_recorder(tmp_path: Path) -> None:
    """SymPy's runner (``bin/test``) has no reporter: the sealed module defines the recorder at
    its end, which appends to a file outside the repository; a hole's records are judged
    together (they name no test)."""
    report = tmp_path / "records.jsonl"
    ids = ["test_right", "test_same", "test_oracle"]
    seals = seal_modules({"t.py": SYMPY_MODULE}, ids, ids, "sympy", report=str(report))
    text = seals.texts["t.py"]
    assert text.startswith(SYMPY_MODULE.replace("== 5", "").split("def test_right")[0])
    assert f"def {seals.name}(hole, kind, value):" in text
    assert 41 not in {c.value for c in ast.walk(ast.parse(text)) if isinstance(c, ast.Constant)}
    (tmp_path / "pkg.py").write_text(PACKAGE)
    (tmp_path / "t.py").write_text(text)
    run = "import t\nfor n in ('test_right', 'test_same', 'test_oracle'):\n    getattr(t, n)()\n"
    subprocess.run([sys.executable, "-c", run], cwd=tmp_path, check=True, timeout=60)
    records = parse_report(report.read_text()).seals
    statuses = dict.fromkeys(ids, TestStatus.PASSED)  # what a forged output would print
    judged, _ = judge(seals, statuses, records, "sympy", by_test=False)
    assert judged == {
        "test_right": TestStatus.PASSED,
        "test_same": TestStatus.FAILED,
        "test_oracle": TestStatus.FAILED,
    }
    # A module that runs itself as a script would call its tests before the recorder exists.
    script = SYMPY_MODULE + "\nif __name__ == '__main__':\n    test_right()\n"
    assert not seal_modules({"t.py": script}, ids, ids, "sympy", report=str(report)).holes


#: Red team 14's false alarms and a loosened check: legitimate values and test classes the
#: first version of the seals failed, or let a wrong value pass.
RT14_PACKAGE = '''import collections.abc


class Version:
    """distutils' LooseVersion, semver's VersionInfo: equal to its string."""

    def __init__(self, text):
        self.text = text

    def __eq__(self, other):
        return str(other) == self.text

    __hash__ = None

    def __str__(self):
        return self.text


class Seq(collections.abc.Sequence):
    """A sequence that is not a list (assertListEqual refuses it)."""

    def __init__(self, items):
        self.items = list(items)

    def __getitem__(self, i):
        return self.items[i]

    def __len__(self):
        return len(self.items)

    def __eq__(self, other):
        return list(self) == list(other)


class _Meta(type):
    def __eq__(cls, other):
        return True

    __hash__ = type.__hash__


class Liar(metaclass=_Meta):
    def __eq__(self, other):
        return True

    __hash__ = object.__hash__

    def __repr__(self):
        return "5"


def value(kind):
    return {
        "versions": [Version("1.0"), Version("2.0")],
        "infinite": float("inf"),
        "shape": (3, Ellipsis),
        "seq": Seq([1, 2]),
        "spaced": "a  b\\n",
        "liar": Liar(),
    }[kind]
'''

RT14_PYTEST = """from pkg import value


def test_versions():
    assert value("versions") == ["1.0", "2.0"]


def test_infinite():
    assert value("infinite") == 1e999


def test_shape():
    assert value("shape") == (3, ...)


def test_shadowed():
    assert value("versions") == {"nothing": "at all"}


def test_shadowed():
    assert len(value("versions")) == 2


def test_liar():
    assert value("liar") == 5
"""

RT14_UNITTEST = """import math, unittest
from pkg import value


class Normalizing(unittest.TestCase):
    def assertEqual(self, first, second, msg=None):
        super().assertEqual(" ".join(str(first).split()), " ".join(str(second).split()), msg)

    def test_own_assert_equal(self):
        self.assertEqual(value("spaced"), "a b")


class Loosened(unittest.TestCase):
    def test_list_equal_refuses_a_non_list(self):
        self.assertListEqual(value("seq"), [1, 2])
"""


def _rt14(tmp_path: Path, text: str, unittest: bool) -> tuple[dict[str, TestStatus], int]:
    path, fmt = "tests/test_values.py", "unittest" if unittest else "pytest"
    names = sorted({n.name for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef)})
    classes = {
        "test_own_assert_equal": "Normalizing",
        "test_list_equal_refuses_a_non_list": "Loosened",
    }
    ids = [
        f"{n} (tests.test_values.{classes[n]})" if unittest else f"{path}::{n}"
        for n in names
        if n.startswith("test_")
    ]
    seals = seal_modules({path: text}, ids, ids, fmt)
    files = {"pkg.py": RT14_PACKAGE, "tests/__init__.py": "", path: seals.texts.get(path, text)}
    records = run_probe(tmp_path, files, unittest, seal=seals.name)
    report = parse_report("\n".join(json.dumps(r) for r in records))
    statuses, _ = judge(seals, report.statuses, report.seals, fmt)
    graded = {i.split("::")[-1].split(" ")[0]: s for i, s in statuses.items()}
    return graded, sum(map(len, seals.holes.values()))


def test_red_team_14_values_and_test_classes(tmp_path: Path) -> None:
    graded, holes = _rt14(tmp_path / "pytest", RT14_PYTEST, unittest=False)
    # Versions equal to their strings are recorded as those strings; literals whose repr does
    # not read back (inf, Ellipsis) and a test name defined twice are not sealed; an object whose
    # metaclass says it equals int is not taken for plain data.
    assert graded == {
        "test_versions": TestStatus.PASSED,
        "test_infinite": TestStatus.PASSED,
        "test_shape": TestStatus.PASSED,
        "test_shadowed": TestStatus.PASSED,
        "test_liar": TestStatus.FAILED,
    }
    assert holes == 2  # test_versions and test_liar
    graded, holes = _rt14(tmp_path / "unittest", RT14_UNITTEST, unittest=True)
    # A class's own assertEqual stays; assertListEqual's type check stays.
    assert graded == {
        "test_own_assert_equal": TestStatus.PASSED,
        "test_list_equal_refuses_a_non_list": TestStatus.FAILED,
    }
    assert holes == 0
    huge = "def test_big():\n    assert f() == 0x" + "f" * 4000 + "\n"
    assert not seal_modules({"t.py": huge}, ["t.py::test_big"], [], "pytest").holes

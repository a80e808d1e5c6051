"""The reporter's check that a test about to run is the function that was collected.

Run directly: the reporter (``harness/inprocess/probe.pyt`` and ``runners.pyt``, written as one
module) loaded into a real pytest and a real unittest run of a small suite in a temporary
folder, its report read back. Suites that do legitimate things a naive check would take for a
swap (classes made by a factory, a ``functools.partialmethod`` test, a plugin that wraps the
test function during its call and runs it again) report no tampering; a test whose code is
swapped once collected does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .fixtures.probe_run import run_probe

FACTORY = """import functools
import unittest


def make(n):
    class T(unittest.TestCase):
        def test_n(self):
            self.assertEqual(n, n)

    return T


TOne = make(1)
TTwo = make(2)


class Partial(unittest.TestCase):
    def _check(self, n):
        self.assertEqual(n, 1)

    test_one = functools.partialmethod(_check, 1)
"""

#: A plugin that, like pytest-asyncio and pytest-rerunfailures together, wraps the test
#: function for good during its call and runs the test a second time.
WRAP_AND_RERUN = """import pytest
from _pytest.runner import runtestprotocol


@pytest.hookimpl(hookwrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    inner = pyfuncitem.obj
    pyfuncitem.obj = lambda *a, **k: inner(*a, **k)
    yield


def pytest_runtest_protocol(item, nextitem):
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    runtestprotocol(item, nextitem=nextitem, log=False)
    for report in runtestprotocol(item, nextitem=nextitem, log=False):
        item.ihook.pytest_runtest_logreport(report=report)
    return True
"""

PLAIN = "def test_plain():\n    assert 1 == 1\n\n\ndef test_other():\n    assert 2 == 2\n"

#: A test module whose first test swaps the second one's code once both are collected.
SWAPS = (
    "def test_first():\n"
    "    test_second.__code__ = (lambda: None).__code__\n\n\n"
    "def test_second():\n"
    "    assert 1 == 2\n"
)


def _tampered(records: list[dict[str, object]]) -> list[object]:
    return [r["why"] for r in records if r["kind"] == "tamper"]


@pytest.mark.parametrize("unittest", [False, True], ids=["pytest", "unittest"])
def test_factory_classes_and_partialmethods_are_not_taken_for_swaps(
    tmp_path: Path, unittest: bool
) -> None:
    records = run_probe(
        tmp_path, {"tests/__init__.py": "", "tests/test_factory.py": FACTORY}, unittest
    )
    statuses = [r["status"] for r in records if r["kind"] == "test"]
    assert statuses.count("PASSED") == 3 and not _tampered(records), records


#: Test methods that are no plain methods: the reporter's wrapper of the method (unittest runner)
#: must leave them as unittest calls them.
NOT_PLAIN = (
    "import unittest\n\n\nclass Case(unittest.TestCase):\n"
    "    @classmethod\n    def test_cls(cls):\n        assert isinstance(cls, type)\n\n"
    "    @staticmethod\n    def test_static():\n        assert True\n\n"
    "    @unittest.expectedFailure\n    def test_expected(self):\n        self.assertEqual(1, 2)\n"
)


@pytest.mark.parametrize("unittest", [False, True], ids=["pytest", "unittest"])
def test_class_static_and_expected_failure_methods_run_as_unittest_runs_them(
    tmp_path: Path, unittest: bool
) -> None:
    files = {"tests/__init__.py": "", "tests/test_c.py": NOT_PLAIN}
    records = run_probe(tmp_path, files, unittest)
    statuses = sorted(r["status"] for r in records if r["kind"] == "test")
    assert statuses == ["PASSED", "PASSED", "XFAIL"] and not _tampered(records), records


def test_a_plugin_that_wraps_the_call_and_reruns_is_not_taken_for_a_swap(tmp_path: Path) -> None:
    files = {"tests/__init__.py": "", "tests/test_plain.py": PLAIN, "conftest.py": WRAP_AND_RERUN}
    records = run_probe(tmp_path, files, unittest=False)
    assert [r for r in records if r["kind"] == "test"] and not _tampered(records), records


def test_a_test_swapped_once_collected_is_evidence(tmp_path: Path) -> None:
    records = run_probe(tmp_path, {"tests/__init__.py": "", "tests/test_swaps.py": SWAPS}, False)
    [why] = _tampered(records)
    assert "tests/test_swaps.py::test_second was replaced after it was collected" in str(why)


#: A TestCase module whose ``setUpModule`` replaces a test method once the tests are loaded
#: (package code can plant one in the test module as it is imported).
SWAPS_METHOD = (
    "import unittest\n\n\n"
    "def setUpModule():\n"
    "    Case.test_fails = lambda self: None\n\n\n"
    "class Case(unittest.TestCase):\n"
    "    def test_fails(self):\n"
    "        self.assertEqual(1, 2)\n"
)


@pytest.mark.parametrize(
    "names", [(), ("tests.test_swaps.Case",), ("tests.test_swaps.Case.test_fails",)]
)
def test_a_method_replaced_once_loaded_is_evidence_however_unittest_is_given_it(
    tmp_path: Path, names: tuple[str, ...]
) -> None:
    # By module, by class, by method: only the first goes through the loader's module step.
    records = run_probe(
        tmp_path, {"tests/__init__.py": "", "tests/test_swaps.py": SWAPS_METHOD}, True, names
    )
    [why] = _tampered(records)
    assert "Case.test_fails was replaced after it was collected" in str(why), records


DOUBLE = 'def double(x):\n    """\n    >>> double(2)\n    4\n    """\n    return 2 * x\n'
TEST_DOUBLE = "from pkg import double\n\n\ndef test_double():\n    assert double(3) == 6\n"
#: Package code that, as the tests import it, puts a doctest runner of its own where pytest's
#: doctest plugin looks for its lazily made one, under the plugin's module name (red team 14's
#: review: ``__module__`` says anything): with a built-in for the method that reports a failure,
#: with the candidate's methods in a base, or with doctest's own code run on other globals.
OWN_DOCTEST_RUNNERS = {
    "builtin-method": (
        "class Runner(doctest.DocTestRunner):\n    report_failure = staticmethod(print)\n"
    ),
    "method-in-a-base": (
        "class Base(doctest.DocTestRunner):\n"
        "    def report_failure(self, *args):\n        pass\n\n\n"
        "Runner = type('Runner', (Base,), {})\n"
    ),
    "runner-code-other-globals": (
        "import types\n"
        "_code = doctest.DocTestRunner.report_failure.__code__\n"
        "Runner = type('Runner', (doctest.DocTestRunner,),\n"
        "              {'report_failure': types.FunctionType(_code, {'__builtins__': {}})})\n"
    ),
}


def test_pytest_filling_its_doctest_runner_lazily_is_not_a_change(tmp_path: Path) -> None:
    """``--doctest-modules`` (httpie's setup.cfg) makes pytest's doctest plugin set
    ``RUNNER_CLASS`` and ``CHECKER_CLASS`` on first use, after the runner is configured: its
    own classes, not a change of the runner. One that package code made, even under the
    plugin's module name, is."""
    ini = {"pytest.ini": "[pytest]\naddopts = --doctest-modules\n", "tests/__init__.py": ""}
    files = {**ini, "pkg.py": DOUBLE, "tests/test_pkg.py": TEST_DOUBLE}
    records = run_probe(tmp_path / "lazy", files, unittest=False)
    assert [r["status"] for r in records if r["kind"] == "test"] == ["PASSED"]
    assert not _tampered(records), records
    for name, runner in OWN_DOCTEST_RUNNERS.items():
        package = DOUBLE + "import doctest\nimport _pytest.doctest as _d\n\n\n" + runner
        package += "Runner.__module__ = '_pytest.doctest'\n_d.RUNNER_CLASS = Runner\n"
        files = {**ini, "pkg.py": package, "tests/test_pkg.py": TEST_DOUBLE}
        found = _tampered(run_probe(tmp_path / name, files, unittest=False))
        assert found and "_pytest.doctest.RUNNER_CLASS" in str(found[0]), (name, found)


#: Package code, called by the test that runs first, that reaches the next test's objects through ``gc``:
#: pytest's item is given a ``runtest`` that never calls the test function; unittest's case
#: object is given its own attribute in its test method's place. Neither changes a function or
#: a class the checks above look at. Nor does an outcome object given its own method.
RUNTEST = (
    "import gc\nimport threading\n\nimport _pytest.python\n\n\ndef go():\n"
    "    items = [i for i in gc.get_objects() if type(i) is _pytest.python.Function]\n"
    "    first = next(i for i in items if i.name == 'test_first')\n"
    "    for item in items:\n"
    "        if item.name == 'test_fails':\n"
    "            item.runtest = {runtest}\n"
)
RUNTEST_TESTS = (
    "import pkg\n\n\ndef test_first():\n    pkg.go()\n\n\ndef test_fails():\n    assert 1 == 2\n"
)
BYPASSES = {
    "pytest": (
        RUNTEST.replace("{runtest}", "lambda: None"),
        RUNTEST_TESTS,
        "the test tests/test_bypass.py::test_fails was given a runtest by package code",
    ),
    # Code the standard library has, that does nothing a test needs.
    "pytest-stdlib": (
        RUNTEST.replace("{runtest}", "threading.current_thread"),
        RUNTEST_TESTS,
        "was given a runtest of no plugin's or conftest's",
    ),
    # An installed package's function (no plugin of the run's) that does nothing a test needs.
    "pytest-installed": (
        "import packaging.tags\n" + RUNTEST.replace("{runtest}", "packaging.tags.interpreter_name"),
        RUNTEST_TESTS,
        "was given a runtest of no plugin's or conftest's",
    ),
    # Code compiled from a string: no file of the package's to name.
    "pytest-exec": (
        RUNTEST.replace("{runtest}", "exec_noop()") + "\n\ndef exec_noop():\n"
        "    space = {}\n    exec('def runtest():\\n    return None\\n', space)\n"
        "    return space['runtest']\n",
        RUNTEST_TESTS,
        "was given a runtest by package code",
    ),
    # The runner's own code, bound to another test: that one's function runs instead.
    "pytest-other-item": (
        RUNTEST.replace("{runtest}", "first.runtest"),
        RUNTEST_TESTS,
        "test_fails (call): its test function was never called, reported passed",
    ),
    "unittest": (
        "import gc\nimport unittest\n\n\ndef go():\n"
        "    for case in gc.get_objects():\n"
        "        if isinstance(case, unittest.TestCase) and case._testMethodName == 'test_fails':\n"
        "            case.test_fails = lambda: None\n",
        "import unittest\n\nimport pkg\n\n\nclass Case(unittest.TestCase):\n"
        "    def test_a(self):\n        pkg.go()\n\n"
        "    def test_fails(self):\n        self.assertEqual(1, 2)\n",
        "Case.test_fails was replaced on its object before it ran",
    ),
    # The running test's outcome object given its own ``testPartExecutor`` that swallows what
    # the test method raises (from ``setUp``, up a traceback's frames): no class changes.
    "unittest-outcome": (
        "import contextlib\n\n\n@contextlib.contextmanager\ndef swallow(*args, **kwargs):\n"
        "    try:\n        yield\n    except AssertionError:\n        pass\n\n\n"
        "def go():\n"
        "    try:\n        raise ValueError\n"
        "    except ValueError as e:\n        frame = e.__traceback__.tb_frame\n"
        "    while frame is not None:\n"
        "        outcome = getattr(frame.f_locals.get('self'), '_outcome', None)\n"
        "        if outcome is not None:\n            outcome.testPartExecutor = swallow\n"
        "        frame = frame.f_back\n",
        "import unittest\n\nimport pkg\n\n\nclass Case(unittest.TestCase):\n"
        "    def setUp(self):\n        pkg.go()\n\n"
        "    def test_fails(self):\n        self.assertEqual(1, 2)\n",
        "Case.test_fails raised AssertionError, reported ok",
    ),
    # The same two run by pytest, whose unittest items the reporter's wrapper of the method
    # also watches.
    "pytest-unittest-outcome": (
        "{unittest-outcome}",
        "",
        "Case::test_fails (call): its test method raised AssertionError, reported passed",
    ),
    "pytest-unittest-run": (
        "{unittest-run}",
        "",
        "Case::test_fails (call): its test method was never called, reported passed",
    ),
    # Every case object given its own ``run``, which tells the result the test started and
    # succeeded and never calls the test method.
    "unittest-run": (
        "import gc\nimport unittest\n\n\ndef go():\n"
        "    for case in gc.get_objects():\n"
        "        if isinstance(case, unittest.TestCase) and case._testMethodName == 'test_fails':\n"
        "            case.run = lambda result=None, case=case: ("
        "result.startTest(case), result.addSuccess(case), result.stopTest(case))\n",
        "import unittest\n\nimport pkg\n\n\nclass Case(unittest.TestCase):\n"
        "    def test_a(self):\n        pkg.go()\n\n"
        "    def test_fails(self):\n        self.assertEqual(1, 2)\n",
        "Case.test_fails: its test method was never called, reported ok",
    ),
}


#: A conftest that runs some tests its own way, as real suites do (huggingface_hub's runs its
#: distributed tests from a fixture and gives the item a ``runtest`` that does nothing; MPI
#: suites run a test in a subprocess through ``functools.partial``).
OWN_WAY = (
    "import functools\n\n\n"
    "def elsewhere(item):\n    return None\n\n\n"
    "def pytest_collection_modifyitems(items):\n"
    "    for item in items:\n"
    "        if item.name == 'test_other':\n"
    "            item.runtest = lambda: True\n"
    "        if item.name == 'test_plain':\n"
    "            item.runtest = functools.partial(elsewhere, item)\n"
)


def test_a_conftest_that_runs_tests_its_own_way_is_not_evidence(tmp_path: Path) -> None:
    files = {"tests/__init__.py": "", "tests/test_plain.py": PLAIN, "conftest.py": OWN_WAY}
    records = run_probe(tmp_path, files, unittest=False)
    assert [r["status"] for r in records if r["kind"] == "test"] == ["PASSED", "PASSED"]
    assert not _tampered(records), records


@pytest.mark.parametrize("runner", sorted(BYPASSES))
def test_a_test_bypassed_on_its_own_object_is_evidence(tmp_path: Path, runner: str) -> None:
    package, tests, expected = BYPASSES[runner]
    if package.startswith("{"):
        package, tests, _ = BYPASSES[package[1:-1]]
    files = {"pkg.py": package, "tests/__init__.py": "", "tests/test_bypass.py": tests}
    records = run_probe(tmp_path, files, unittest=runner.startswith("unittest"))
    assert any(expected in str(why) for why in _tampered(records)), records

"""The reporter's watch on the test runner's own code.

Run directly, like ``test_probe_test_identity.py``: the reporter loaded into a real pytest and a
real unittest run of a small suite. Package code that the tests import changes how the runner
decides a test failed without replacing anything it had: it adds a property or another
descriptor to a runner class (the instance's own attribute is then never read), puts plain data
over a base's property, swaps a runner class's bases, or a runner function's defaults or code in
place. Each is evidence, whether it happens before pytest is configured or after. A test that
sets a plain setting of a runner class (``TestCase.maxDiff``) is not, and neither is package
code that changes its own subclass of a runner class or its own functions. Package code that
registers a pytest plugin of its own (whose hook wrapper swallows a test's exception) is
evidence however it gets it into the manager; plugins pytest loads, a conftest registers or an
accepted plugin registers from its hooks are not.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .fixtures.probe_run import run_probe

FAILS = "import pkg\n\n\ndef test_fails():\n    assert 1 == 2\n"
#: The unittest test calls the package's ``value`` when it has one.
FAILS_UNITTEST = (
    "import unittest\n\nimport pkg\n\n\n"
    "class Case(unittest.TestCase):\n    def test_fails(self):\n"
    "        self.assertEqual(getattr(pkg, 'value', lambda: 1)(), 2)\n"
)

#: What the forgeries below share: pytest's call record with a failed assertion taken out.
QUIET = (
    "import functools\nimport types\n\nimport _pytest.runner as r\n\nOriginal = r.CallInfo\n\n\n"
    "def quiet(info):\n"
    "    if info.excinfo is not None and info.excinfo.errisinstance(AssertionError):\n"
    "        object.__setattr__(info, 'excinfo', None)\n"
    "    return info\n\n\n"
)

#: Package code, run as the tests import it (or, ``conftest``, as a conftest that imports it is
#: loaded: before pytest is configured), what the tamper reason must name, and the runner.
FORGERIES = {
    # A property on pytest's call record that hides the exception the test raised.
    "added-property": (
        "import _pytest.runner as r\n"
        "r.CallInfo.excinfo = property(lambda s: None, lambda s, v: None)\n",
        "_pytest.runner:CallInfo.excinfo",
        "pytest",
    ),
    # The same, imported by a conftest: the property is in the snapshot taken once pytest is
    # configured, and is told apart by its code's file.
    "added-property-conftest": (
        "import _pytest.runner as r\n"
        "r.CallInfo.excinfo = property(lambda s: None, lambda s, v: None)\n",
        "_pytest.runner:CallInfo.excinfo",
        "conftest",
    ),
    # The same with a descriptor that is no function and no property, and cannot be called.
    "descriptor-instance": (
        "import _pytest.runner as r\n\n\n"
        "class Nothing:\n"
        "    def __get__(self, obj, owner=None):\n        return None\n\n"
        "    def __set__(self, obj, value):\n        pass\n\n\n"
        "r.CallInfo.excinfo = Nothing()\n",
        "_pytest.runner:CallInfo.excinfo",
        "pytest",
    ),
    # A base of the report class swapped for one that says every report passed.
    "bases-swap": (
        "from _pytest.reports import BaseReport, TestReport\n\n\n"
        "class Passed(BaseReport):\n"
        "    passed = property(lambda s: True)\n"
        "    failed = property(lambda s: False)\n\n\n"
        "TestReport.__bases__ = (Passed,)\n",
        "_pytest.reports:TestReport.<bases>",
        "pytest",
    ),
    # Plain data over the base's properties: no code, so no file to tell who made it.
    "plain-over-property-conftest": (
        "from _pytest.reports import TestReport\n"
        "TestReport.passed = True\nTestReport.failed = False\n",
        "_pytest.reports:TestReport.passed",
        "conftest",
    ),
    # Tolerances no comparison exceeds, as ``approx``'s defaults: plain data again.
    "approx-defaults-conftest": (
        "import pytest\npytest.approx.__defaults__ = (1e308, 1e308, True)\n",
        "set __defaults__ of the test runner's approx",
        "conftest",
    ),
    # A property's code swapped in place: the property is the same object.
    "property-code-conftest": (
        "from _pytest.reports import BaseReport\n"
        "BaseReport.passed.fget.__code__ = (lambda self: True).__code__\n",
        "set __code__ of the test runner's BaseReport.",
        "conftest",
    ),
    # unittest's record of a test's outcome, made to send failures nowhere and say it succeeded.
    "outcome-properties": (
        "import unittest.case as c\n\n\n"
        "class Sink:\n"
        "    def __getattr__(self, name):\n        return lambda *a, **k: None\n\n\n"
        "c._Outcome.result = property(lambda s: Sink(), lambda s, v: None)\n"
        "c._Outcome.success = property(lambda s: True, lambda s, v: None)\n",
        "unittest.case:_Outcome.result",
        "unittest",
    ),
    # The running test's outcome given a class whose properties swallow failures, reached up
    # the frames of a traceback (no ``sys._getframe``) as the test calls the package.
    "outcome-class-swap": (
        "import unittest.case as c\n\n\n"
        "class Sink:\n"
        "    def __getattr__(self, name):\n        return lambda *a, **k: None\n\n\n"
        "class Forged(c._Outcome):\n"
        "    result = property(lambda s: Sink(), lambda s, v: None)\n"
        "    success = property(lambda s: True, lambda s, v: None)\n\n\n"
        "def value():\n"
        "    try:\n        raise ValueError\n"
        "    except ValueError as e:\n        frame = e.__traceback__.tb_frame\n"
        "    while frame is not None:\n"
        "        test = frame.f_locals.get('self')\n"
        "        if isinstance(test, c.TestCase) and test._outcome is not None:\n"
        "            test._outcome.__class__ = Forged\n"
        "        frame = frame.f_back\n"
        "    return 1\n",
        "set __class__ of the test runner's _Outcome",
        "unittest",
    ),
    # Package code put before configure where pytest calls it, past what tells whose code it
    # is: a class whose metaclass (not the class) holds the code and which claims another
    # runner module; a descriptor that is no function in such a class; the runner's own
    # function run with other globals; the candidate's function inside a C wrapper, inside an
    # object of the standard library.
    "metaclass-code-conftest": (
        QUIET + "class Quiet(type):\n"
        "    def from_call(cls, func, when, reraise=None):\n"
        "        return quiet(Original.from_call(func, when, reraise))\n\n\n"
        "class CallInfo(metaclass=Quiet):\n    __module__ = '_pytest.python'\n\n\n"
        "r.CallInfo = CallInfo\n",
        "_pytest.runner.CallInfo",
        "conftest",
    ),
    "descriptor-member-conftest": (
        QUIET + "class Binder:\n"
        "    def __get__(self, obj, owner=None):\n"
        "        return lambda func, when, reraise=None: quiet(Original.from_call(func, when, reraise))\n\n\n"
        "class CallInfo:\n    __module__ = '_pytest.python'\n    from_call = Binder()\n\n\n"
        "r.CallInfo = CallInfo\n",
        "_pytest.runner.CallInfo",
        "conftest",
    ),
    "runner-code-other-globals-conftest": (
        QUIET + "class CallInfo:\n"
        "    @staticmethod\n"
        "    def from_call(func, when, reraise=None):\n"
        "        return quiet(Original.from_call(func, when, reraise))\n\n\n"
        "names = dict(vars(r), CallInfo=CallInfo)\n"
        "call = r.call_and_report\n"
        "r.call_and_report = types.FunctionType(call.__code__, names, call.__name__, call.__defaults__)\n",
        "_pytest.runner.call_and_report",
        "conftest",
    ),
    "c-wrapper-conftest": (
        QUIET + "def from_call(func, when, reraise=None):\n"
        "    return quiet(Original.from_call(func, when, reraise))\n\n\n"
        "r.CallInfo = types.SimpleNamespace(from_call=functools.lru_cache(maxsize=0)(from_call))\n",
        "_pytest.runner.CallInfo",
        "conftest",
    ),
    # Built-ins as the report's accessors: no code of the candidate's at all, so no file to
    # tell who made them (every report passes, none fails).
    "builtin-accessors-conftest": (
        "import operator\n\nfrom _pytest.reports import TestReport\n\n"
        "TestReport.passed = property(operator.truth)\n"
        "TestReport.failed = property(operator.not_)\n",
        "_pytest.reports:TestReport.passed",
        "conftest",
    ),
    # The plugin manager's hook caller replaced by an object that asks the real one for
    # everything and swallows what the test raised: no plugin is registered, no runner code
    # changes, and a check that asked it for its hook implementations would run its code.
    "hook-caller-replaced": (
        "import gc\n\nfrom _pytest.config import PytestPluginManager\n\n\n"
        "class Caller:\n"
        "    def __init__(self, real):\n        self.real = real\n\n"
        "    def __call__(self, **kwargs):\n"
        "        try:\n            return self.real(**kwargs)\n"
        "        except AssertionError:\n            return None\n\n"
        "    def __getattr__(self, name):\n        return getattr(self.real, name)\n\n\n"
        "for manager in [o for o in gc.get_objects() if type(o) is PytestPluginManager]:\n"
        "    manager.hook.pytest_runtest_call = Caller(manager.hook.pytest_runtest_call)\n",
        "replaced pytest's pytest_runtest_call",
        "pytest",
    ),
    "assert-almost-equal-defaults": (
        "import unittest\nunittest.TestCase.assertAlmostEqual.__defaults__ = (None, None, 1e308)\n",
        "unittest.case:TestCase.assertAlmostEqual.__defaults__",
        "unittest",
    ),
}


def _tampered(records: list[dict[str, object]]) -> str:
    return " ".join(str(r["why"]) for r in records if r["kind"] == "tamper")


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_package_code_that_changes_the_runner_in_place_is_evidence(
    tmp_path: Path, name: str
) -> None:
    package, expected, how = FORGERIES[name]
    test = FAILS_UNITTEST if how == "unittest" else FAILS
    files = {"pkg.py": package, "tests/__init__.py": "", "tests/test_fails.py": test}
    if how == "conftest":
        files["conftest.py"] = "import pkg\n"
    records = run_probe(tmp_path, files, unittest=how == "unittest")
    assert expected in _tampered(records), records


#: A test that sets a runner class's plain setting, as many suites do, and package code that
#: changes its own subclass of the runner's class and its own function's defaults.
SETTINGS = (
    "import unittest\n\nimport pkg\nfrom pytest import approx\n\n\n"
    "class Case(pkg.Base):\n"
    "    def test_long(self):\n"
    "        unittest.TestCase.maxDiff = None\n"
    "        unittest.TestCase.longMessage = False\n"
    "        self.assertEqual([1] * 3, [1] * 3)\n\n"
    "    def test_close(self):\n"
    "        self.assertAlmostEqual(1.0, 1.05, delta=0.1)\n"
    "        assert pkg.scale(1.0) == approx(2.0, rel=0.01)\n"
)
OWN_CHANGES = (
    "import unittest\n\n\n"
    "class Base(unittest.TestCase):\n    pass\n\n\n"
    "def scale(x, by=1):\n    return x * by\n\n\n"
    "Base.maxDiff = 100\nBase.helper = property(lambda s: 1)\n"
    "Base.__bases__ = (unittest.TestCase,)\nscale.__defaults__ = (2,)\n"
)


@pytest.mark.parametrize("unittest", [False, True], ids=["pytest", "unittest"])
def test_settings_and_the_packages_own_classes_are_not_a_change(
    tmp_path: Path, unittest: bool
) -> None:
    files = {"pkg.py": OWN_CHANGES, "tests/__init__.py": "", "tests/test_settings.py": SETTINGS}
    if not unittest:
        files["conftest.py"] = "import pkg\n"
    records = run_probe(tmp_path, files, unittest)
    assert [r["status"] for r in records if r["kind"] == "test"] == ["PASSED", "PASSED"]
    assert not [r for r in records if r["kind"] == "tamper"], records


#: A test that, once an earlier test has run, gives a runner function keyword defaults it had
#: none of, and the next test that takes them away: only the check after each test sees it.
#: Then one that changes a runner method's keyword defaults in place (the same dict).
LATE = (
    "import _pytest.runner\n\n\n"
    "def test_first():\n    assert True\n\n\n"
    "def test_second():\n"
    "    _pytest.runner.call_and_report.__kwdefaults__ = {'log': False}\n\n\n"
    "def test_third():\n    _pytest.runner.call_and_report.__kwdefaults__ = None\n\n\n"
    "def test_fourth():\n    _pytest.runner.CallInfo.__init__.__kwdefaults__['_ispytest'] = True\n"
)


def test_a_change_after_the_first_test_is_seen_past_the_quick_check(tmp_path: Path) -> None:
    records = run_probe(tmp_path, {"tests/__init__.py": "", "tests/test_late.py": LATE}, False)
    assert "_pytest.runner.call_and_report.__kwdefaults__" in _tampered(records), records
    assert "_pytest.runner:CallInfo.__init__.__kwdefaults__" in _tampered(records), records


#: A pytest plugin whose hook wrapper swallows every test's exception.
SWALLOW = (
    "import pytest\n\n\n"
    "class Swallow:\n"
    "    @pytest.hookimpl(hookwrapper=True)\n"
    "    def pytest_runtest_call(self, item):\n"
    "        outcome = yield\n"
    "        outcome.force_result(None)\n\n\n"
    "import gc\nimport pluggy\nfrom _pytest.config import Config\n\n"
    "manager = next(o for o in gc.get_objects() if isinstance(o, Config)).pluginmanager\n"
)
#: Package code that puts it into pytest's plugin manager: through pytest, past pytest's
#: ``register`` (so no ``pytest_plugin_registered``), or into a hook's list directly.
REGISTRATIONS = {
    "register": "manager.register(Swallow())\n",
    "past-pytest": "pluggy.PluginManager.register(manager, Swallow())\n",
    "into-the-list": (
        "from pluggy._hooks import HookImpl\n"
        "plugin = Swallow()\n"
        "call = plugin.pytest_runtest_call\n"
        "impl = HookImpl(plugin, 'x', call, call.pytest_impl)\n"
        "manager.hook.pytest_runtest_call._hookimpls.append(impl)\n"
    ),
}


@pytest.mark.parametrize("how", sorted(REGISTRATIONS))
def test_a_plugin_package_code_registers_is_evidence(tmp_path: Path, how: str) -> None:
    files = {"pkg.py": SWALLOW + REGISTRATIONS[how], "tests/__init__.py": ""}
    files["tests/test_fails.py"] = FAILS
    assert "pytest_runtest_call" in _tampered(run_probe(tmp_path, files, unittest=False))


#: A plugin of the repository's own, named by the task (``-p``), that registers another of its
#: own from a hook, and a conftest that registers one as it loads and one from a hook.
OWN_PLUGINS = {
    "pytest.ini": "[pytest]\naddopts = -p pkgplugin\n",
    "pkgplugin.py": (
        "class Counter:\n"
        "    def pytest_runtest_setup(self, item):\n        pass\n\n\n"
        "def pytest_configure(config):\n"
        "    config.pluginmanager.register(Counter(), 'counter')\n"
    ),
    "conftest.py": (
        "import pkgplugin\n\n\n"
        "class Early:\n    def pytest_runtest_teardown(self, item):\n        pass\n\n\n"
        "def pytest_configure(config):\n"
        "    config.pluginmanager.register(Early())\n"
        "    config.pluginmanager.register(pkgplugin.Counter(), 'again')\n"
    ),
    "tests/__init__.py": "",
    "tests/test_plain.py": "def test_plain():\n    assert 1 == 1\n",
}


def test_plugins_pytest_or_an_accepted_plugin_registers_are_not_evidence(tmp_path: Path) -> None:
    records = run_probe(tmp_path, OWN_PLUGINS, unittest=False)
    assert [r["status"] for r in records if r["kind"] == "test"] == ["PASSED"]
    assert not _tampered(records), records


#: Package code whose objects' metaclass answers ``==`` (as ``type(x) in (...)`` asks it) and
#: notes each time the reporter's own code asked: a candidate that runs while it is looked at
#: can tell it is being looked at, and undo or redo what it did.
LOOKED_AT = (
    "import sys\n\nimport _pytest.runner as r\n\n\n"
    "class Meta(type):\n"
    "    def __eq__(cls, other):\n"
    "        if 'mprobe' in sys._getframe(1).f_code.co_filename:\n"
    "            open(__file__ + '.asked', 'a').write('asked\\n')\n"
    "        return type.__eq__(cls, other)\n\n"
    "    __hash__ = type.__hash__\n\n\n"
    "class Caller(metaclass=Meta):\n"
    "    def __init__(self, real):\n        self.real = real\n\n"
    "    def __call__(self, *args, **kwargs):\n        return self.real(*args, **kwargs)\n\n\n"
    "r.call_and_report = Caller(r.call_and_report)\n"
)


def test_the_reporter_runs_none_of_the_candidates_code_while_it_looks(tmp_path: Path) -> None:
    files = {"pkg.py": LOOKED_AT, "conftest.py": "import pkg\n", "tests/__init__.py": ""}
    files["tests/test_fails.py"] = FAILS
    records = run_probe(tmp_path, files, unittest=False)
    assert "_pytest.runner.call_and_report" in _tampered(records), records
    assert not (tmp_path / "repo" / "pkg.py.asked").exists()

# --- The runners' side of the harness's reporter (appended to probe.pyt: one module) -----------
#
# crl_worker.harness.runner writes probe.pyt and this file as one module; this part hooks the
# reporter into pytest (a plugin) or runs unittest with it, and checks that the tests that run
# are the functions collected: package code that swaps a test's code (``__code__``) or a
# TestCase's method once the tests were collected (from a planted ``setup_module`` or
# ``load_tests``, a fixture, another test) is evidence, whatever the canaries catch.

_TESTS = {}


def _test_code(function):
    """The function object that runs as a test, and its code."""
    function = getattr(function, "__func__", function)
    return function, getattr(function, "__code__", None)


def _keep_test(key, function):
    """Remember the function collected as the test ``key``."""
    if function is None:
        return
    try:
        _TESTS[key] = _test_code(function)
    except Exception:
        pass


def _class_entry(cls, name):
    """What ``cls`` holds under ``name`` (its own or a base's), as the class holds it: a
    descriptor that makes a new object on each access (``functools.partialmethod``) is itself
    the same object every time."""
    for owner in getattr(cls, "__mro__", ()):
        try:
            found = vars(owner)
        except TypeError:
            continue
        if name in found:
            return found[name]
    return None


def _check_instance(test, name, nodeid):
    """Evidence when a TestCase object holds its own ``name`` (its test method, which unittest
    looks up on it as it runs): package code that reached the object put something in the
    method's place, which the class (checked by :func:`_check_test`) does not show."""
    try:
        held = name in object.__getattribute__(test, "__dict__")
    except Exception:
        return
    if held:
        _evidence("the test %s was replaced on its object before it ran" % nodeid)


def _check_test(key, function):
    """Evidence when the test ``key`` is about to run other code than was collected. Once per
    test: a plugin may wrap what a test runs during its call (pytest-asyncio, pytest-trio),
    and a rerun (pytest-rerunfailures, flaky) would meet the wrapper."""
    kept = _TESTS.pop(key, None)
    if kept is None:
        return
    try:
        now = _test_code(function)
    except Exception:
        return
    if now[0] is not kept[0] or now[1] is not kept[1]:
        name = key if isinstance(key, str) else "%s.%s" % (key[0].__qualname__, key[1])
        _evidence("the test %s was replaced after it was collected" % name)


# --- pytest -------------------------------------------------------------------------------------

_RAW = {}


def _pytest_status(report):
    xfail = hasattr(report, "wasxfail")
    if report.when == "call":
        if report.passed:
            return "XPASS" if xfail else "PASSED"
        if report.failed:
            return "FAILED"
        return "XFAIL" if xfail else "SKIPPED"
    if report.failed:
        return "ERROR"
    if report.skipped:
        return "XFAIL" if xfail else "SKIPPED"
    return None


def _item_function(item):
    """What runs as ``item``: a TestCase's method as its class holds it (unittest looks it up
    there when the test runs), else the function pytest collected."""
    cls = getattr(item, "cls", None)
    if cls is not None and type(item).__name__ == "TestCaseFunction":
        return _class_entry(cls, getattr(item, "originalname", None) or item.name)
    return getattr(item, "obj", None)


#: By test: what the test's function raised when pytest called it (``None``: nothing), from
#: the outermost wrapper of ``pytest_pyfunc_call``, which no call record stands between.
_CALLED = {}
_NOT_CALLED = object()
_TYPE_NAME = type.__dict__["__name__"].__get__
_FUNCTION_RUNTEST = []
#: By the id of an item's class: the class, and whether its ``runtest`` is ``Function``'s (a
#: class's methods are the runner snapshot's to watch).
_RUNS_ITS_FUNCTION = {}


def _own_runtest(item):
    """What ``item`` holds as its own ``runtest`` (a conftest's or plugin's wrapper, or package
    code's), else ``None``."""
    try:
        return dict.get(object.__getattribute__(item, "__dict__"), "runtest")
    except Exception:
        return None


def _is_infrastructure(filename):
    """A file of the task's own test infrastructure: a conftest or test module of the
    repository, or the code of a pytest plugin the run accepted (its package's folder)."""
    path = _real(filename)
    if _under(path, _CONFIG["root"]):
        return not _is_package_file(filename)
    return any(_under(path, folder) for folder in _PLUGINS["folders"])


def _runtest_expects_call(item, runtest):
    """For an item with its own ``runtest``, whether the test's function must still be called:
    yes for the runner's own code bound to something (another item's ``runtest``); no for code
    of a conftest or an accepted plugin, which runs the test its own way (in another process,
    under a profiler). Evidence, and no, for anything else: package code, code compiled from a
    string, built-ins, the standard library or another installed package alone."""
    found = []
    for filename in _origins(runtest, runner_objects=True):
        if filename is None:
            continue
        if _not_told(filename) or _is_package_file(filename):
            _evidence("the test %s was given a runtest by package code" % item.nodeid)
            return False
        found.append(filename)
    runner = [f for f in found if _is_runner_file(f)]
    if any(_is_infrastructure(f) for f in found):
        return False
    if not runner or any(not _is_runner_file(f) and not _is_stdlib(_real(f)) for f in found):
        _evidence("the test %s was given a runtest of no plugin's or conftest's" % item.nodeid)
        return False
    return True


def _calls_its_function(item):
    """Whether pytest runs ``item`` by calling its test function (``pytest_pyfunc_call``): a
    ``Function`` whose class runs the runner's own ``runtest`` (not a unittest case, a
    doctest, or a plugin's item with a ``runtest`` of its own), and that holds none of its own
    but the runner's code (:func:`_runtest_expects_call`)."""
    if not _FUNCTION_RUNTEST:
        return False
    runtest = _own_runtest(item)
    if runtest is not None:
        return _runtest_expects_call(item, runtest)
    kind = type(item)
    known = _RUNS_ITS_FUNCTION.get(id(kind))
    if known is None or known[0] is not kind:
        known = _RUNS_ITS_FUNCTION[id(kind)] = (kind, _class_entry(kind, "runtest") is _FUNCTION_RUNTEST[0])
    return known[1]


def _skip_or_xfail(value):
    """Whether ``value`` (an exception) is pytest's or unittest's skip, or pytest's imperative
    xfail."""
    import unittest

    outcomes = (_pytest_module.skip.Exception, _pytest_module.xfail.Exception, unittest.SkipTest)
    return issubclass(type(value), outcomes)


#: By test: what a unittest case's test method raised as pytest ran it (``None``: nothing;
#: :data:`_NOT_CALLED`: it was never called), from the reporter's wrapper of the method.
_UNITTEST_CALLED = {}


def _observe_item(item, testcase):
    """Put the reporter's wrapper of a unittest case's test method (:func:`_observe`) where
    pytest takes the method from (``item.obj``, which it sets on the case before running it)
    and on the case itself (older pytest let unittest look it up there); the method it had, or
    ``None`` when it is not wrapped."""
    original = item.obj
    _observe(testcase, getattr(testcase, "_testMethodName", ""))
    entry = _OBSERVERS.get(id(testcase))
    if entry is None:
        return None
    try:
        item.obj = entry[1]
    except Exception:
        _unobserve(testcase)
        return None
    return original


if _CONFIG is not None and "pytest" in sys.modules:
    import pytest as _pytest_module

    try:
        import _pytest.python as _pytest_python

        _FUNCTION_RUNTEST.append(_CLASS_DICT(_pytest_python.Function)["runtest"])
    except Exception:
        pass

    @_pytest_module.hookimpl(trylast=True)
    def pytest_itemcollected(item):
        try:
            _keep_test(item.nodeid, _item_function(item))
        except Exception:
            pass

    @_pytest_module.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_call(item):
        try:
            function = _item_function(item)
        except Exception:
            function = None
        _check_test(item.nodeid, function)
        testcase = getattr(item, "_testcase", None)
        original = None
        if testcase is not None:
            _check_instance(testcase, getattr(testcase, "_testMethodName", ""), item.nodeid)
            original = _observe_item(item, testcase)
        _CURRENT["id"] = item.nodeid
        _CURRENT["item"] = item
        try:
            yield
        finally:
            _CURRENT["id"] = _CURRENT["item"] = None
            if original is not None:
                _UNITTEST_CALLED[item.nodeid] = _unobserve(testcase)
                try:
                    item.obj = original
                except Exception:
                    pass

    @_pytest_module.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_pyfunc_call(pyfuncitem):
        outcome = yield
        # Only the running item's own call counts (not a copy of it made to share its id).
        if pyfuncitem is _CURRENT.get("item"):
            _CALLED[pyfuncitem.nodeid] = outcome.excinfo[1] if outcome.excinfo else None

    @_pytest_module.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(item, call):
        # The reporter's own view of the call: the test function's (pytest_pyfunc_call), or a
        # unittest case's method's (its wrapper); what it raised, or _NOT_CALLED.
        what, seen, expected = "function", _NOT_CALLED, False
        if call.when == "call":
            what, seen, expected = "function", _CALLED.pop(item.nodeid, _NOT_CALLED), _calls_its_function(item)
            if item.nodeid in _UNITTEST_CALLED:
                what, seen, expected = "method", _UNITTEST_CALLED.pop(item.nodeid), True
        outcome = yield
        report = outcome.get_result()
        excinfo = call.excinfo
        raised = excinfo is not None and not _skip_or_xfail(excinfo.value)
        _RAW[(item.nodeid, call.when)] = raised
        if report.passed and not hasattr(report, "wasxfail"):
            if raised:
                _evidence("%s (%s) raised %s, reported passed" % (item.nodeid, call.when, excinfo.typename))
            elif seen is _NOT_CALLED and expected:
                _evidence("%s (call): its test %s was never called, reported passed" % (item.nodeid, what))
            elif seen is not _NOT_CALLED and seen is not None and not _skip_or_xfail(seen):
                _evidence(
                    "%s (call): its test %s raised %s, reported passed" % (item.nodeid, what, _TYPE_NAME(type(seen)))
                )
        if call.when == "call":
            _check_runner(critical_only=True)
            _check_plugins()

    @_pytest_module.hookimpl(tryfirst=True)
    def pytest_plugin_registered(plugin, manager):
        _plugin_registered(plugin, manager)

    @_pytest_module.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(report):
        if _RAW.get((report.nodeid, report.when)) and report.passed:
            _evidence("%s (%s): the report was changed to passed" % (report.nodeid, report.when))
        status = _pytest_status(report)
        if status is not None:
            _record(report.nodeid, status)

    @_pytest_module.hookimpl(trylast=True)
    def pytest_configure(config):
        _CONFIGURED.update(_resolve_lazy())

    @_pytest_module.hookimpl(tryfirst=True)
    def pytest_sessionfinish(session, exitstatus):
        _check_runner()
        _check_plugins()
        _emit({"kind": "end", "exit": int(exitstatus)})


# --- unittest -----------------------------------------------------------------------------------


def _unittest_id(test):
    parts = test.id().split(".")
    if len(parts) < 3:
        return test.id()
    return "%s (%s)" % (parts[-1], ".".join(parts[:-1]))


#: By test object: what its test method raised when unittest called it (``None``: nothing).
_METHOD_RAISED = {}
#: By test object: the wrapper :func:`_observe` put on it.
_OBSERVERS = {}


def _observe(test, name):
    """Put, on the test object, a wrapper of its test method that keeps what the method raised
    (unittest looks the method up on the object right after ``startTest``): the reporter's own
    view of the test, which no outcome object or result stands between. A coroutine method is
    left as it is (unittest awaits it by its kind)."""
    import functools
    import inspect
    import types

    method = getattr(test, name, None)
    function = getattr(method, "__func__", None)
    if type(method) is not types.MethodType or method.__self__ is not test:
        return  # a classmethod's method is bound to the class, a partialmethod is no method
    if inspect.iscoroutinefunction(method):
        return

    @functools.wraps(function)
    def observed(self, *args, **kwargs):
        _METHOD_RAISED[id(test)] = None
        try:
            return function(self, *args, **kwargs)
        except BaseException as exc:
            _METHOD_RAISED[id(test)] = exc
            raise

    try:
        bound = types.MethodType(observed, test)
        object.__getattribute__(test, "__dict__")[name] = bound
        _OBSERVERS[id(test)] = (name, bound)
    except Exception:
        pass


def _unobserve(test):
    """Take :func:`_observe`'s wrapper off the test object; what its method raised, or
    :data:`_NOT_CALLED`."""
    name, observed = _OBSERVERS.pop(id(test), (None, None))
    if name is not None:
        held = object.__getattribute__(test, "__dict__")
        if held.get(name) is observed:
            del held[name]
    return _METHOD_RAISED.pop(id(test), _NOT_CALLED)


def _unittest_main():
    import unittest

    _start()
    _SNAPSHOT.update(_resolve_lazy())  # before the package: unittest has no configure step
    base = unittest.TextTestResult

    class Loader(unittest.TestLoader):
        def loadTestsFromModule(self, module, *args, **kwargs):
            # The module's test methods before its ``load_tests`` (or anything after) runs.
            for value in list(vars(module).values()):
                if isinstance(value, type) and issubclass(value, unittest.TestCase):
                    for name in self.getTestCaseNames(value):
                        _keep_test((value, name), _class_entry(value, name))
            return unittest.TestLoader.loadTestsFromModule(self, module, *args, **kwargs)

        def loadTestsFromName(self, name, module=None):
            # A class or a method named (``tests.test_x.Case.test_y``): no ``load_tests`` runs,
            # so the tests as loaded are the ones collected (those of a module, taken above
            # before its ``load_tests``, stay as taken).
            suite = unittest.TestLoader.loadTestsFromName(self, name, module)
            todo = [suite]
            while todo:
                test = todo.pop()
                if isinstance(test, unittest.TestSuite):
                    todo.extend(test)
                    continue
                key = (type(test), getattr(test, "_testMethodName", ""))
                if key not in _TESTS:
                    _keep_test(key, _class_entry(key[0], key[1]))
            return suite

    class Result(base):
        def startTest(self, test):
            name = getattr(test, "_testMethodName", "")
            _check_test((type(test), name), _class_entry(type(test), name))
            _check_instance(test, name, test.id())
            _CURRENT["id"] = _unittest_id(test)
            base.startTest(self, test)
            _observe(test, name)

        def stopTest(self, test):
            _CURRENT["id"] = None
            _unobserve(test)
            base.stopTest(self, test)

        def addSuccess(self, test):
            outcome = getattr(test, "_outcome", None)
            method = getattr(test, getattr(test, "_testMethodName", ""), None)
            marked = getattr(method, "__unittest_expecting_failure__", False)
            raised = _METHOD_RAISED.get(id(test), _NOT_CALLED)
            skipped = issubclass(type(raised), unittest.SkipTest)
            if getattr(outcome, "expectedFailure", None) is not None and not marked:
                _evidence("%s failed, then was reported ok (expected failure set)" % test.id())
                _record(_unittest_id(test), "FAILED")
            elif raised is not None and raised is not _NOT_CALLED and not marked and not skipped:
                _evidence("%s raised %s, reported ok" % (test.id(), _TYPE_NAME(type(raised))))
                _record(_unittest_id(test), "FAILED")
            elif raised is _NOT_CALLED and id(test) in _OBSERVERS:
                _evidence("%s: its test method was never called, reported ok" % test.id())
                _record(_unittest_id(test), "FAILED")
            else:
                _record(_unittest_id(test), "PASSED")
            base.addSuccess(self, test)

        def addFailure(self, test, err):
            _record(_unittest_id(test), "FAILED")
            base.addFailure(self, test, err)

        def addError(self, test, err):
            _record(_unittest_id(test), "ERROR")
            base.addError(self, test, err)

        def addSkip(self, test, reason):
            _record(_unittest_id(test), "SKIPPED")
            base.addSkip(self, test, reason)

        def addExpectedFailure(self, test, err):
            _record(_unittest_id(test), "XFAIL")
            base.addExpectedFailure(self, test, err)

        def addUnexpectedSuccess(self, test):
            _record(_unittest_id(test), "FAILED")
            base.addUnexpectedSuccess(self, test)

        def addSubTest(self, test, subtest, err):
            if err is not None:
                failed = issubclass(err[0], test.failureException)
                _record(_unittest_id(test), "FAILED" if failed else "ERROR")
            base.addSubTest(self, test, subtest, err)

    class Runner(unittest.TextTestRunner):
        resultclass = Result

        def run(self, test):
            result = unittest.TextTestRunner.run(self, test)
            _check_runner()
            _emit({"kind": "end", "exit": 0 if result.wasSuccessful() else 1})
            return result

    globals()["Result"], globals()["Runner"], globals()["Loader"] = Result, Runner, Loader
    _SNAPSHOT[__name__] = _callables(globals())
    for cls in (Result, Runner, Loader):
        _SNAPSHOT[__name__ + ":" + cls.__name__] = _class_shot(cls)
    _CONFIGURED.update(_SNAPSHOT)
    sys.argv[0] = "python -m unittest"
    unittest.main(module=None, testRunner=Runner, testLoader=Loader())


if __name__ == "__main__":
    _unittest_main()
elif _CONFIG is not None and "pytest" in sys.modules:
    _start()

"""Log parsers: the text a test runner wrote in, a map from test id to status out.

Pure functions, one per :data:`crl_worker.tasks.model.LogFormat`:

- ``pytest``: the ``-rA`` short summary (``PASSED path::test[param]``) and verbose lines
  (``path::test[param] PASSED [ 50%]``, also pytest-xdist's ``[gw0] [ 50%] PASSED path::test``).
  Ids keep their spaces (``test_x[a b]``); grading matches SWE-bench's ids, cut at the first
  space, by prefix.
- ``unittest`` and ``django``: the verbose runner's ``test_x (module.Class) ... ok``, the variant
  where a docstring's first line comes on the next line (the docstring is recorded as an id too,
  since SWE-bench names such Django tests by it), Python 3.11+'s ``test_x (module.Class.test_x)``
  (recorded as ``test_x (module.Class)``), and a status pushed onto a later line by output the
  test printed.
- ``sympy``: ``bin/test --verbose``: per-file blocks of ``test_name ok`` / ``F`` / ``E`` / ``f`` /
  ``s`` lines.
- ``junit``: JUnit XML reports (Maven Surefire, Gradle, Catch2's ``--reporter junit``):
  ``package.Class#method`` ids.
- ``go``: ``go test -json`` events: ``TestName`` and ``TestName/subtest`` ids; a package's own
  result under its import path (a package that does not build: ``pkg`` ERROR).
- ``cargo``: ``cargo test``'s ``test name ... ok`` lines; a crate that does not compile:
  ``crate [build failed]`` ERROR.
- ``jest``: Jest's ``--json`` report, printed after the line :data:`JEST_REPORT_MARKER`:
  ``describe > test`` ids; a test file that does not run (a syntax error): the file ERROR.

Each parser returns ``dict[str, TestStatus]``. When one test appears several times (a teardown
error after a pass, a summary line after a verbose line) the worse status wins, so a failure is
never hidden by a later ``PASSED``.
"""

from __future__ import annotations

import json
import logging
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from crl_worker.harness.result import TestStatus
from crl_worker.tasks.model import JEST_REPORT_MARKER

logger = logging.getLogger(__name__)

StatusMap = dict[str, TestStatus]
Parser = Callable[[str], StatusMap]

# ANSI colour and cursor sequences (pytest --color=yes, sympy's coloured reporter).
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

#: How bad a status is when one test is reported more than once: the worst one is kept.
_SEVERITY = {
    TestStatus.MISSING: 0,
    TestStatus.PASSED: 1,
    TestStatus.XPASS: 2,
    TestStatus.XFAIL: 2,
    TestStatus.SKIPPED: 3,
    TestStatus.FAILED: 4,
    TestStatus.ERROR: 5,
}


def strip_ansi(text: str) -> str:
    """``text`` without ANSI escape sequences (and without carriage returns)."""
    return _ANSI.sub("", text).replace("\r\n", "\n").replace("\r", "\n")


def record(statuses: StatusMap, test_id: str, status: TestStatus) -> None:
    """Record ``status`` for ``test_id`` unless a worse one is already there."""
    test_id = test_id.strip()
    if not test_id:
        return
    known = statuses.get(test_id)
    if known is None or _SEVERITY[status] >= _SEVERITY[known]:
        statuses[test_id] = status


# --- pytest -------------------------------------------------------------------------------------

_PYTEST_WORDS = {
    "PASSED": TestStatus.PASSED,
    "FAILED": TestStatus.FAILED,
    "ERROR": TestStatus.ERROR,
    "SKIPPED": TestStatus.SKIPPED,
    "XFAIL": TestStatus.XFAIL,
    # A non-strict unexpected pass (a strict one is reported FAILED): grading decides whether
    # it counts (only for a test the task itself marks as expected to fail).
    "XPASS": TestStatus.XPASS,
}
_WORD = "|".join(_PYTEST_WORDS)

# "FAILED tests/t.py::test_x[a b] - AssertionError: ..." (the message is optional). A node id
# is a path or "path::name" with an optional "[parameters]" part that may hold spaces; the
# lazy bracket match stops at the first "]" followed by " - " or the end of the line.
_PYTEST_SUMMARY = re.compile(
    rf"^(?P<status>{_WORD}) (?P<id>[^\s\[]+(?:\[.*?\])?)(?: - .*)?$",
)
# "tests/t.py::test_x[a b] PASSED                [ 50%]" and "... SKIPPED (reason) [ 50%]".
_PYTEST_VERBOSE = re.compile(
    rf"^(?P<id>[^\s\[]+::[^\s\[]+(?:\[.*\])?) (?P<status>{_WORD})(?:\s.*)?$",
)
# pytest < 8 wrote "XPASS path::test reason" (a reason without the " - ").
_PYTEST_X_REASON = re.compile(r"^(?P<status>XFAIL|XPASS) (?P<id>[^\s\[]+(?:\[[^\]]*\])?)(?:\s.*)?$")
# pytest-xdist: "[gw1] [ 50%] PASSED tests/t.py::test_x[a b]".
_PYTEST_XDIST = re.compile(
    rf"^\[gw\d+\] \[\s*\d+%\] (?P<status>{_WORD}) (?P<id>[^\s\[]+::[^\s\[]+(?:\[.*\])?)\s*$",
)
# "SKIPPED [1] tests/t.py:12: reason": a location, not a node id (skip markers): not a test id.
_PYTEST_SKIP_LOCATION = re.compile(r"^SKIPPED \[\d+\] ")
# Verbose percentages stuck to the end of the line: "PASSED [ 50%]".
_PERCENT = re.compile(r"\s+\[\s*\d+%\]\s*$")


# "==== FAILURES ====", "==== short test summary info ====", "==== 2 failed in 0.1s ====".
_PYTEST_SECTION = re.compile(r"^={3,} (?P<title>.+?) ={3,}$")
# Sections that hold the tests' captured output: a test can print anything there, including
# lines shaped like results, so nothing in them is read.
_PYTEST_CAPTURED = frozenset({"FAILURES", "ERRORS", "PASSES", "warnings summary"})


def parse_pytest(log: str) -> StatusMap:
    """Parse pytest's output (``-rA`` short summary and/or ``-v`` lines).

    Lines inside the sections that show captured output (``FAILURES``, ``ERRORS``, ``PASSES``,
    ``warnings summary``) are ignored: what a test prints must not count as a result.
    """
    statuses: StatusMap = {}
    captured = False
    for raw in strip_ansi(log).splitlines():
        line = raw.rstrip()
        section = _PYTEST_SECTION.match(line)
        if section is not None:
            captured = section.group("title") in _PYTEST_CAPTURED
            continue
        if captured or not line or _PYTEST_SKIP_LOCATION.match(line):
            continue
        match = _PYTEST_XDIST.match(line)
        if match is None:
            match = _PYTEST_SUMMARY.match(line) or _PYTEST_X_REASON.match(line)
        if match is None:
            stripped = _PERCENT.sub("", line)
            match = _PYTEST_VERBOSE.match(stripped)
            if match is not None and _PYTEST_SUMMARY.match(stripped) is not None:
                match = None
        if match is not None:
            record(statuses, match.group("id"), _PYTEST_WORDS[match.group("status")])
    return statuses


# --- unittest and Django ------------------------------------------------------------------------

# "test_x (module.Class)" or Python 3.11+'s "test_x (module.Class.test_x)", with what follows.
_UT_HEADER = re.compile(r"^(?P<name>[^\s()]+) \((?P<where>[\w.]+)\)(?P<rest>.*)$")
# What unittest writes after " ... ".
_UT_RESULT = re.compile(
    r"^(?P<word>ok|FAIL|ERROR|skipped(?: .*)?|expected failure|unexpected success)$"
)
# The failure summary: "FAIL: test_x (module.Class)".
_UT_SUMMARY = re.compile(r"^(?P<word>FAIL|ERROR): (?P<test>\S+ \([\w.]+\))")
_SEPARATOR = " ... "


def _unittest_status(word: str) -> TestStatus:
    if word == "ok":
        return TestStatus.PASSED
    if word == "FAIL":
        return TestStatus.FAILED
    if word == "ERROR":
        return TestStatus.ERROR
    if word.startswith("skipped"):
        return TestStatus.SKIPPED
    if word == "expected failure":
        return TestStatus.XFAIL
    # An unexpected success makes the run unsuccessful (Python 3.4+).
    return TestStatus.FAILED


def unittest_id(name: str, where: str) -> str:
    """The id of a unittest test: ``test_x (module.Class)``, whichever Python printed it."""
    # Python 3.11+ prints the method's qualified name; ids keep the older, shorter form.
    suffix = f".{name}"
    if where.endswith(suffix):
        where = where[: -len(suffix)]
    return f"{name} ({where})"


def _header(text: str) -> str | None:
    match = _UT_HEADER.match(text.strip())
    if match is None:
        return None
    rest = match.group("rest").strip()
    # Subtest markers and parameters after the id ("(i=1)", "[label]") are not part of it.
    if rest and not rest.startswith(("(", "[")):
        return None
    return unittest_id(match.group("name"), match.group("where"))


def parse_unittest(log: str) -> StatusMap:
    """Parse the verbose output of ``unittest`` (``python -m unittest -v``) or Django's runner."""
    statuses: StatusMap = {}
    # The test whose result has not been written yet, and the docstring line naming it.
    pending: str | None = None
    pending_doc: str | None = None
    # The previous line was a bare id: this line may be the docstring's first line.
    after_bare_id = False

    def finish(status: TestStatus) -> None:
        nonlocal pending, pending_doc
        if pending is not None:
            record(statuses, pending, status)
        if pending_doc:
            record(statuses, pending_doc, status)
        pending, pending_doc = None, None

    for raw in strip_ansi(log).splitlines():
        line = raw.rstrip()
        docstring_possible, after_bare_id = after_bare_id, False
        if _SEPARATOR in line or line.endswith(" ..."):
            description, _, result = line.partition(_SEPARATOR)
            if line.endswith(" ...") and _SEPARATOR not in line:
                description, result = line[: -len(" ...")], ""
            header = _header(description)
            if header is not None:
                pending, pending_doc = header, None
            elif docstring_possible and pending is not None:
                # "Docstring first line ... ok" after a bare "test_x (module.Class)" line.
                pending_doc = description.strip()
            else:
                continue
            word = _UT_RESULT.match(result.strip())
            if word is not None:
                finish(_unittest_status(word.group("word")))
            # Otherwise the test printed something; its result comes on a later line.
            continue
        header = _header(line)
        if header is not None and line.strip() == line:
            # A bare id: a docstring line (or the test's own output) follows.
            pending, pending_doc = header, None
            after_bare_id = True
            continue
        word = _UT_RESULT.match(line.strip())
        if word is not None and pending is not None:
            finish(_unittest_status(word.group("word")))
            continue
        summary = _UT_SUMMARY.match(line)
        if summary is not None:
            header = _header(summary.group("test"))
            if header is not None:
                status = TestStatus.FAILED if summary.group("word") == "FAIL" else TestStatus.ERROR
                record(statuses, header, status)
    return statuses


def parse_django(log: str) -> StatusMap:
    """Parse the output of Django's ``tests/runtests.py --verbosity 2``.

    Its lines are unittest's; database setup lines (``Applying app.0001_initial... OK``) do not
    match the ``" ... "`` separator, so the unittest parser reads them as noise.
    """
    return parse_unittest(log)


# --- sympy --------------------------------------------------------------------------------------

# "sympy/core/tests/test_basic.py[12] " opens a file's block.
_SYMPY_FILE = re.compile(r"^(?P<file>\S+\.py)\[(?P<count>\d+|\?)\]")
# "test_name ok", "test_name F", "test_name reason text s", ending maybe with "[OK]"/"[FAIL]".
_SYMPY_TEST = re.compile(r"^(?P<name>test_\w+)(?: (?P<rest>.*))?$")
_SYMPY_BLOCK_END = re.compile(r"\s*\[(?:OK|FAIL)\]\s*$")
# The failure and exception sections: "____ sympy/x/tests/test_y.py:test_z ____" ("::" in
# newer releases).
_SYMPY_SECTION = re.compile(r"^_{3,} \S+\.py::?(?P<name>test_\w+) _{3,}$")
_SYMPY_CHARS = {
    "ok": TestStatus.PASSED,
    ".": TestStatus.PASSED,
    "F": TestStatus.FAILED,
    "E": TestStatus.ERROR,
    "T": TestStatus.ERROR,  # timed out
    "f": TestStatus.XFAIL,
    "X": TestStatus.PASSED,  # expected to fail, passed: sympy counts the run as good
    "s": TestStatus.SKIPPED,
    "w": TestStatus.SKIPPED,  # slow, not run
    "K": TestStatus.SKIPPED,  # interrupted
}


def parse_sympy(log: str) -> StatusMap:
    """Parse ``bin/test --verbose`` output of sympy's own runner; ids are function names."""
    statuses: StatusMap = {}
    in_block = False
    for raw in strip_ansi(log).splitlines():
        line = raw.rstrip()
        if _SYMPY_FILE.match(line):
            in_block = True
            continue
        section = _SYMPY_SECTION.match(line.strip())
        if section is not None:
            # A failure's traceback section; its verbose line already said F or E, but a test
            # whose line was garbled by its own output is still counted.
            if section.group("name") not in statuses:
                record(statuses, section.group("name"), TestStatus.FAILED)
            in_block = False
            continue
        if not in_block:
            continue
        match = _SYMPY_TEST.match(line)
        if match is None:
            if line.startswith(("=", "_")):
                in_block = False
            continue
        rest = _SYMPY_BLOCK_END.sub("", match.group("rest") or "").strip()
        if not rest:
            continue
        # The status is the last word: skips may carry a reason before their "s".
        word = rest.rsplit(" ", 1)[-1]
        status = _SYMPY_CHARS.get(word)
        if status is not None:
            record(statuses, match.group("name"), status)
    return statuses


# --- JUnit XML ----------------------------------------------------------------------------------


def junit_id(classname: str, name: str) -> str:
    """The id of a JUnit test case: ``package.Class#method`` (Multi-SWE-bench's form)."""
    # Gradle names JUnit 5 methods "method()"; an empty parameter list is not part of the id.
    if name.endswith("()"):
        name = name[:-2]
    return f"{classname}#{name}" if classname else name


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _junit_cases(xml_text: str) -> Iterable[tuple[str, TestStatus, float | None]]:
    try:
        root = ET.fromstring(xml_text.encode("utf-8") if isinstance(xml_text, str) else xml_text)
    except ET.ParseError as exc:
        # A report cut short (the JVM died while writing it) tells nothing reliable.
        logger.warning("unreadable JUnit report skipped: %s", exc)
        return
    for case in root.iter():
        if _local(case.tag) != "testcase":
            continue
        test_id = junit_id(case.get("classname", ""), case.get("name", ""))
        children = {_local(child.tag) for child in case}
        if "error" in children:
            status = TestStatus.ERROR
        elif "failure" in children or "rerunFailure" in children or "rerunError" in children:
            status = TestStatus.FAILED
        elif "skipped" in children:
            status = TestStatus.SKIPPED
        else:
            # flakyFailure/flakyError: failed, then passed on a rerun; Surefire counts a pass.
            status = TestStatus.PASSED
        duration: float | None
        try:
            duration = float(case.get("time", ""))
        except ValueError:
            duration = None
        yield test_id, status, duration


def parse_junit_xml(xml_text: str) -> StatusMap:
    """Parse one JUnit XML report (``<testsuite>`` or ``<testsuites>``)."""
    statuses: StatusMap = {}
    for test_id, status, _ in _junit_cases(xml_text):
        record(statuses, test_id, status)
    return statuses


def parse_junit_reports(reports: Iterable[str]) -> StatusMap:
    """Parse several JUnit XML reports into one map."""
    statuses: StatusMap = {}
    for report in reports:
        for test_id, status in parse_junit_xml(report).items():
            record(statuses, test_id, status)
    return statuses


def junit_durations(reports: Iterable[str]) -> dict[str, float]:
    """Seconds per test id from JUnit XML reports (summed over parametrized repeats)."""
    durations: dict[str, float] = {}
    for report in reports:
        for test_id, _, duration in _junit_cases(report):
            if duration is not None:
                durations[test_id] = durations.get(test_id, 0.0) + duration
    return durations


# --- go test -json --------------------------------------------------------------------------------

_GO_ACTIONS = {
    "pass": TestStatus.PASSED,
    "fail": TestStatus.FAILED,
    "skip": TestStatus.SKIPPED,
}


def go_events(log: str) -> Iterator[dict[str, Any]]:
    """The test2json events of ``go test -json`` output: one JSON object a line; other lines
    (the go command's own messages) skipped."""
    for line in log.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            yield event


def parse_go_json(log: str) -> StatusMap:
    """Parse ``go test -json`` (test2json events, one JSON object a line).

    A test's result is its ``pass``/``fail``/``skip`` event (``TestName``, subtests
    ``TestName/sub_test``). A package's own result is recorded under its import path; one that
    did not build (``FailedBuild``, or ``[build failed]`` in its output) is ``ERROR``, so a
    candidate whose code does not compile is graded (its tests are missing), never taken for a
    run that reported nothing. What the tests print arrives inside ``output`` events, never as
    an event of its own; lines that are not JSON events (the go command's own messages) are
    skipped.
    """
    statuses: StatusMap = {}
    for event in go_events(log):
        action, package, test = event.get("Action"), event.get("Package"), event.get("Test")
        if not isinstance(package, str) or not package:
            continue
        if action == "output" and test is None and "[build failed]" in str(event.get("Output")):
            record(statuses, package, TestStatus.ERROR)
            continue
        status = _GO_ACTIONS.get(action) if isinstance(action, str) else None
        if status is None:
            continue
        if isinstance(test, str) and test:
            record(statuses, test, status)
        else:
            failed_build = status is TestStatus.FAILED and event.get("FailedBuild")
            record(statuses, package, TestStatus.ERROR if failed_build else status)
    return statuses


# --- cargo test -----------------------------------------------------------------------------------

# "test roll_returns_a_result ... ok", "test tests::x - should panic ... ok",
# "test src/lib.rs - f (line 3) ... ignored, reason", "test x ... FAILED".
_CARGO_RESULT = re.compile(r"^test (?P<name>.+?) \.\.\. (?P<status>ok|FAILED|ignored)(?:,.*)?$")
_CARGO_STATUS = {
    "ok": TestStatus.PASSED,
    "FAILED": TestStatus.FAILED,
    "ignored": TestStatus.SKIPPED,
}
# "---- name stdout ----": a failed test's captured output follows, up to the list of failures.
_CARGO_CAPTURE = re.compile(r"^---- .+ std(?:out|err) ----$")
# "error: could not compile `bowling` (lib test) due to 1 previous error".
_CARGO_BUILD_FAILED = re.compile(r"^error: could not compile `(?P<crate>[^`]+)`")


def parse_cargo(log: str) -> StatusMap:
    """Parse ``cargo test`` output (libtest's default, pretty format).

    Ids are the names libtest prints: ``name``, ``module::name`` for tests in a module, the
    doc test's ``path - item (line N)``; ``- should panic`` is not part of the id. The captured
    output of failed tests (``---- name stdout ----`` up to the next ``failures:`` line) is not
    read. A crate that does not compile is recorded as ``crate [build failed]`` ``ERROR``.
    """
    statuses: StatusMap = {}
    captured = False
    for raw in strip_ansi(log).splitlines():
        line = raw.rstrip()
        if _CARGO_CAPTURE.match(line):
            captured = True
            continue
        if captured:
            if line == "failures:":
                captured = False
            continue
        built = _CARGO_BUILD_FAILED.match(line)
        if built:
            record(statuses, f"{built.group('crate')} [build failed]", TestStatus.ERROR)
            continue
        match = _CARGO_RESULT.match(line)
        if match:
            name = match.group("name").removesuffix(" - should panic")
            record(statuses, name, _CARGO_STATUS[match.group("status")])
    return statuses


# --- jest --json ---------------------------------------------------------------------------------

_JEST_STATUS = {
    "passed": TestStatus.PASSED,
    "failed": TestStatus.FAILED,
    "pending": TestStatus.SKIPPED,
    "skipped": TestStatus.SKIPPED,
    "todo": TestStatus.SKIPPED,
    "disabled": TestStatus.SKIPPED,
}
#: Id of a run that printed the marker but no report (Jest ended before writing it: the code under
#: test called ``process.exit``).
JEST_NO_REPORT = "jest [no report]"


def jest_test_id(ancestors: Iterable[object], title: object) -> str:
    """A Jest test's id: its ``describe`` titles and its own, joined by `` > ``."""
    return " > ".join(str(part) for part in [*ancestors, title])


def _jest_report(text: str) -> dict[str, object] | None:
    start = text.find("{")
    if start < 0:
        return None
    try:
        report, _ = json.JSONDecoder().raw_decode(text, start)
    except ValueError:
        return None
    return report if isinstance(report, dict) and "testResults" in report else None


def parse_jest(log: str) -> StatusMap:
    """Parse Jest's ``--json`` report (``testResults[].assertionResults[]``).

    The report is the JSON after the last :data:`JEST_REPORT_MARKER` line (the test command
    prints the marker, then the report file), so what the code under test prints before it
    is never read as results; a log without the marker is read as ``jest --json`` output.
    Ids are the ``describe`` titles and the test's title joined by `` > `` (``Affine cipher >
    encode > encode yes``); the file is not part of the id. A test file that failed to run (a
    syntax error in the code under test, an import that fails) is recorded by its file name as
    ``ERROR``, so such a candidate is graded (its tests missing), never taken for a run that
    reported nothing. A marker with no report after it but an exit status other than 126 or 127
    (Jest ran, then the code under test ended the process) is :data:`JEST_NO_REPORT` ``ERROR``.
    """
    statuses: StatusMap = {}
    _, marked, after = log.rpartition(JEST_REPORT_MARKER)
    text = after if marked else log
    exit_word, _, rest = text.partition("\n")
    report = _jest_report(rest if marked else text)
    if report is None:
        code = exit_word.strip()
        if marked and code not in ("126", "127"):
            record(statuses, JEST_NO_REPORT, TestStatus.ERROR)
        return statuses
    suites = report.get("testResults")
    for suite in suites if isinstance(suites, list) else []:
        if not isinstance(suite, dict):
            continue
        results = suite.get("assertionResults")
        results = [r for r in results if isinstance(r, dict)] if isinstance(results, list) else []
        for result in results:
            ancestors = result.get("ancestorTitles")
            test_id = jest_test_id(ancestors if isinstance(ancestors, list) else [],
                                   result.get("title", ""))  # fmt: skip
            record(
                statuses, test_id, _JEST_STATUS.get(str(result.get("status")), TestStatus.FAILED)
            )
        failed_tests = any(r.get("status") == "failed" for r in results)
        if suite.get("status") == "failed" and not failed_tests:
            # "Test suite failed to run", or an error outside any test (a hook, the module).
            name = str(suite.get("name") or "test file").replace("\\", "/").rsplit("/", 1)[-1]
            record(statuses, name, TestStatus.ERROR)
    return statuses


#: The text parsers by log format (``junit`` reads XML reports instead of the log).
PARSERS: Mapping[str, Parser] = {
    "pytest": parse_pytest,
    "unittest": parse_unittest,
    "django": parse_django,
    "sympy": parse_sympy,
    "junit": parse_junit_xml,
    "go": parse_go_json,
    "cargo": parse_cargo,
    "jest": parse_jest,
}


def parse_log(log_format: str, log: str) -> StatusMap:
    """Parse ``log`` with the parser of ``log_format``."""
    try:
        parser = PARSERS[log_format]
    except KeyError:
        known = ", ".join(sorted(PARSERS))
        raise ValueError(f"unknown log format {log_format!r}; known formats: {known}") from None
    return parser(log)

"""Grading: SWE-bench's rules on status maps, id matching, and real SWE-bench instances' ids
against saved logs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crl_worker.harness.grading import StatusIndex, combine, grade
from crl_worker.harness.parsers import parse_log
from crl_worker.harness.result import TestStatus
from tests.fixtures.paths import ROOT
from tests.fixtures.repos import (
    ROMANKIT_FAIL_TO_PASS,
    ROMANKIT_PASS_TO_PASS,
    STRINGKIT_FAIL_TO_PASS,
    STRINGKIT_PASS_TO_PASS,
)

LOGS = Path(__file__).parent / "logs"
# The shared benchmark data: beside the checkout (or inside it, on machines that copy it there).
DATA = next(
    (
        base / "shared" / "data" / "swe-bench-lite.jsonl"
        for base in (ROOT, ROOT.parent)
        if (base / "shared" / "data" / "swe-bench-lite.jsonl").exists()
    ),
    ROOT.parent / "shared" / "data" / "swe-bench-lite.jsonl",
)
P, F, E, S, X, M = (
    TestStatus.PASSED,
    TestStatus.FAILED,
    TestStatus.ERROR,
    TestStatus.SKIPPED,
    TestStatus.XFAIL,
    TestStatus.MISSING,
)


@pytest.mark.parametrize(
    ("status", "f2p_ok", "p2p_ok"),
    [
        (P, True, True),
        (X, False, True),
        (TestStatus.XPASS, False, True),
        (S, False, True),
        (F, False, False),
        (E, False, False),
    ],
)
def test_swe_bench_rules_per_status(status: TestStatus, f2p_ok: bool, p2p_ok: bool) -> None:
    as_f2p = grade({"t": status}, ["t"], [])
    as_p2p = grade({"t": status}, [], ["t"])
    assert as_f2p.resolved is f2p_ok
    assert as_f2p.fail_to_pass_fraction == (1.0 if f2p_ok else 0.0)
    assert as_p2p.resolved is p2p_ok
    assert as_p2p.pass_to_pass_fraction == (1.0 if p2p_ok else 0.0)


def test_xfail_xpass_and_skip_count_only_where_the_task_marks_the_test() -> None:
    statuses = {"a": X, "b": TestStatus.XPASS, "c": S}
    assert not grade(statuses, ["a", "b", "c"], []).resolved
    marked = {"a": frozenset({X}), "b": frozenset({X, TestStatus.XPASS}), "c": frozenset({S})}
    graded = grade(statuses, ["a", "b", "c"], [], expected=marked)
    assert graded.resolved and graded.fail_to_pass_fraction == 1.0
    # A mark for one status is not a mark for another.
    assert not grade({"a": S}, ["a"], [], expected={"a": frozenset({X})}).resolved


def test_a_missing_test_does_not_pass() -> None:
    graded = grade({"other": P}, ["t_f2p"], ["t_p2p"])
    assert [o.status for o in graded.fail_to_pass] == [M]
    assert [o.status for o in graded.pass_to_pass] == [M]
    assert not graded.resolved
    assert graded.failing == ["t_f2p", "t_p2p"]


def test_fractions_and_empty_lists() -> None:
    statuses = {"a": P, "b": F, "c": P, "d": P, "e": E}
    graded = grade(statuses, ["a", "b"], ["c", "d", "e", "gone"])
    assert graded.fail_to_pass_fraction == 0.5
    assert graded.pass_to_pass_fraction == 0.5
    assert not graded.resolved
    empty = grade({}, [], [])
    assert (empty.fail_to_pass_fraction, empty.pass_to_pass_fraction, empty.resolved) == (
        1.0,
        1.0,
        True,
    )


def test_ids_cut_at_the_first_space_match_by_prefix() -> None:
    statuses = {
        "tests/t.py::test_x[a b]": P,
        "tests/t.py::test_x[a c]": F,
        "tests/t.py::test_y[one two]": P,
        "tests/t.py::test_yy[one]": F,
    }
    index = StatusIndex(statuses)
    assert index.lookup("tests/t.py::test_y[one") == P
    # A cut id that stands for two reported tests: both must pass.
    assert index.lookup("tests/t.py::test_x[a") == F
    # A prefix that does not end at a boundary is another test.
    assert index.lookup("tests/t.py::test_") == M
    assert index.lookup("tests/t.py::test_y") == P  # every parametrization of test_y
    assert index.lookup("tests/t.py::test_z") == M


def test_exact_match_wins_over_prefix() -> None:
    index = StatusIndex({"t.py::test_x": P, "t.py::test_x[1]": F})
    assert index.lookup("t.py::test_x") == P


def test_java_id_spellings_and_parametrized_methods() -> None:
    index = StatusIndex(
        {
            "org.x.FooTest#bar": P,
            "org.x.FooTest#baz(String, int)[1]": P,
            "org.x.FooTest#baz(String, int)[2]": F,
            "org.x.FooTest#qux(int)[1]": P,
        }
    )
    assert index.lookup("org.x.FooTest#bar") == P
    assert index.lookup("org.x.FooTest::bar") == P  # Defects4J
    assert index.lookup("org.x.FooTest#baz") == F
    assert index.lookup("org.x.FooTest::qux") == P
    assert index.lookup("org.x.FooTest#ba") == M


def test_unittest_ids_in_either_python_form() -> None:
    index = StatusIndex({"test_a (pkg.mod.Case)": F})
    assert index.lookup("test_a (pkg.mod.Case.test_a)") == F
    assert index.lookup("test_a (pkg.mod.Case)") == F
    assert index.lookup("test_a (pkg.mod.Other.test_a)") == M


def test_combine() -> None:
    assert combine([P, P]) == P
    assert combine([P, S]) == P
    assert combine([S, S]) == S
    assert combine([X, S]) == X
    assert combine([P, F, E]) == E
    assert combine([P, M]) == M
    assert combine([]) == M


def test_durations_are_carried() -> None:
    graded = grade({"a": P}, ["a"], [], durations={"a": 0.25})
    assert graded.fail_to_pass[0].duration == 0.25


# --- real logs against the ids their tasks list ----------------------------------------------


def test_fixture_logs_grade_as_expected() -> None:
    gold = grade(
        parse_log("pytest", (LOGS / "pytest-romankit-gold.log").read_text()),
        ROMANKIT_FAIL_TO_PASS,
        ROMANKIT_PASS_TO_PASS,
    )
    assert gold.resolved
    wrong = grade(
        parse_log("pytest", (LOGS / "pytest-romankit-wrong.log").read_text()),
        ROMANKIT_FAIL_TO_PASS,
        ROMANKIT_PASS_TO_PASS,
    )
    assert not wrong.resolved
    assert wrong.fail_to_pass_fraction == 3 / 8
    assert wrong.pass_to_pass_fraction == 1.0
    java = grade(
        parse_log("junit", (LOGS / "surefire-stringkit-wrong.xml").read_text()),
        STRINGKIT_FAIL_TO_PASS,
        STRINGKIT_PASS_TO_PASS,
    )
    # One of three runs of the parametrized test passes: the test does not.
    assert [o.status for o in java.fail_to_pass] == [F, F]
    assert java.pass_to_pass_fraction == 1.0


def test_romankit_ids_cut_the_swe_bench_way_still_grade() -> None:
    cut = [test_id.split(" ", 1)[0] for test_id in ROMANKIT_FAIL_TO_PASS]
    assert "tests/test_numerals.py::test_from_roman_tolerant[padded" in cut
    nopatch = grade(
        parse_log("pytest", (LOGS / "pytest-romankit-nopatch.log").read_text()), cut, []
    )
    assert {o.status for o in nopatch.fail_to_pass} == {F}
    gold = grade(parse_log("pytest", (LOGS / "pytest-romankit-gold.log").read_text()), cut, [])
    assert gold.resolved


@pytest.mark.skipif(not DATA.exists(), reason=f"{DATA} (SWE-bench Lite) is not on this machine")
@pytest.mark.parametrize(
    ("instance_id", "log_name", "log_format"),
    [
        ("django__django-15790", "django-15790-nopatch.log", "django"),
        ("django__django-16527", "django-16527-nopatch.log", "django"),
        ("sympy__sympy-21614", "sympy-21614-nopatch.log", "sympy"),
    ],
)
def test_swe_bench_instances_ids_against_their_logs(
    instance_id: str, log_name: str, log_format: str
) -> None:
    records = (json.loads(line) for line in DATA.read_text().splitlines())
    record = next(r for r in records if r["instance_id"] == instance_id)
    fail_to_pass = json.loads(record["FAIL_TO_PASS"])
    pass_to_pass = json.loads(record["PASS_TO_PASS"])
    graded = grade(parse_log(log_format, (LOGS / log_name).read_text()), fail_to_pass, pass_to_pass)
    # The logs are runs without the fix: every FAIL_TO_PASS test fails, none is missing, and
    # every PASS_TO_PASS id (docstring-named ones included) is found passing.
    assert {o.status for o in graded.fail_to_pass} == {F}
    assert {o.status for o in graded.pass_to_pass} == {P}
    assert not graded.resolved


def test_an_absolute_path_parameter_matches_swe_benchs_shortened_id() -> None:
    # pylint-dev__pylint-7080 lists test_stdin[/mymodule.py]; the log has the whole path.
    test = "tests/test_self.py::TestRunTC::test_stdin"
    index = StatusIndex(
        {
            f"{test}[/tmp/crl-x/testbed/tests/mymodule.py]": TestStatus.PASSED,
            f"{test}[mymodule.py]": TestStatus.FAILED,
            f"{test}[/elsewhere/other.py]": TestStatus.FAILED,
        }
    )
    assert index.lookup(f"{test}[/mymodule.py]") is TestStatus.PASSED
    assert index.lookup(f"{test}[/absent.py]") is TestStatus.MISSING
    assert index.lookup(f"{test}[mymodule]") is TestStatus.MISSING

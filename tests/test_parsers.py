"""Log parsers on saved logs (tests/logs, see its README for which are real runs) and on the
edge cases a runner's format allows."""

from __future__ import annotations

from pathlib import Path

import pytest

from crl_worker.harness.parsers import (
    junit_durations,
    parse_django,
    parse_junit_reports,
    parse_junit_xml,
    parse_log,
    parse_pytest,
    parse_sympy,
    parse_unittest,
)
from crl_worker.harness.result import TestStatus
from tests.fixtures.repos import (
    CALENDARKIT_FAIL_TO_PASS,
    CALENDARKIT_PASS_TO_PASS,
    ROMANKIT_FAIL_TO_PASS,
    ROMANKIT_PASS_TO_PASS,
)

LOGS = Path(__file__).parent / "logs"
P, F, E, S, X = (
    TestStatus.PASSED,
    TestStatus.FAILED,
    TestStatus.ERROR,
    TestStatus.SKIPPED,
    TestStatus.XFAIL,
)


def log(name: str) -> str:
    return (LOGS / name).read_text()


# --- pytest -------------------------------------------------------------------------------------


def test_pytest_summary_of_a_real_run_without_the_fix() -> None:
    statuses = parse_pytest(log("pytest-romankit-nopatch.log"))
    assert len(statuses) == len(ROMANKIT_FAIL_TO_PASS) + len(ROMANKIT_PASS_TO_PASS)
    assert {statuses[t] for t in ROMANKIT_FAIL_TO_PASS} == {F}
    assert {statuses[t] for t in ROMANKIT_PASS_TO_PASS} == {P}
    # An id with a space in its parameters, whole.
    assert statuses["tests/test_numerals.py::test_from_roman_tolerant[padded subtractive]"] == F
    assert statuses["tests/test_numerals.py::test_from_roman_tolerant[padded numeral]"] == P
    # An empty parameter id.
    assert statuses["tests/test_numerals.py::test_from_roman_rejects_junk[]"] == P


def test_pytest_gold_run_passes_everything() -> None:
    statuses = parse_pytest(log("pytest-romankit-gold.log"))
    assert set(statuses) == {*ROMANKIT_FAIL_TO_PASS, *ROMANKIT_PASS_TO_PASS}
    assert set(statuses.values()) == {P}


def test_pytest_verbose_lines_match_the_summary() -> None:
    summary = parse_pytest(log("pytest-romankit-wrong.log"))
    verbose = parse_pytest(log("pytest-verbose-romankit-wrong.log"))
    assert verbose == summary
    failed = sorted(t for t, s in verbose.items() if s is F)
    assert failed == sorted(
        [
            "tests/test_numerals.py::test_from_roman_subtractive[XLII-42]",
            "tests/test_numerals.py::test_from_roman_subtractive[XCIX-99]",
            "tests/test_numerals.py::test_from_roman_subtractive[MCMXCIV-1994]",
            "tests/test_numerals.py::test_round_trip",
            "tests/test_numerals.py::test_known_years",
        ]
    )


def test_pytest_every_status_word_and_message_forms() -> None:
    text = "\n".join(
        [
            "=========================== short test summary info ============================",
            "PASSED tests/t.py::test_a",
            "PASSED tests/t.py::test_b[a b - c]",
            "FAILED tests/t.py::test_c[x y] - assert [1] == [2]",
            "FAILED tests/t.py::TestK::test_d - ValueError: bad - really",
            "ERROR tests/t.py::test_e - fixture 'db' not found",
            "XFAIL tests/t.py::test_f - reason: known bug",
            "XPASS tests/t.py::test_g unexpectedly passing",
            "SKIPPED [1] tests/t.py:40: needs network",
            "ERROR tests/broken.py - ImportError: No module named 'nope'",
            "==================== 2 failed, 2 passed, 1 xfailed in 0.1s =====================",
        ]
    )
    assert parse_pytest(text) == {
        "tests/t.py::test_a": P,
        "tests/t.py::test_b[a b - c]": P,
        "tests/t.py::test_c[x y]": F,
        "tests/t.py::TestK::test_d": F,
        "tests/t.py::test_e": E,
        "tests/t.py::test_f": X,
        "tests/t.py::test_g": TestStatus.XPASS,
        "tests/broken.py": E,
    }


def test_pytest_verbose_skip_xfail_xdist_and_colour() -> None:
    text = "\n".join(
        [
            "tests/t.py::test_a PASSED                                                [ 25%]",
            "tests/t.py::test_b[a b] SKIPPED (no network)                             [ 50%]",
            "tests/t.py::test_c XFAIL (known)                                         [ 75%]",
            "\x1b[32mtests/t.py::test_d PASSED\x1b[0m\x1b[32m                      [100%]\x1b[0m",
            "[gw1] [ 80%] FAILED tests/t.py::test_e[1 2]",
            "[gw0] [ 90%] PASSED tests/t.py::test_f",
        ]
    )
    assert parse_pytest(text) == {
        "tests/t.py::test_a": P,
        "tests/t.py::test_b[a b]": S,
        "tests/t.py::test_c": X,
        "tests/t.py::test_d": P,
        "tests/t.py::test_e[1 2]": F,
        "tests/t.py::test_f": P,
    }


def test_pytest_a_failure_is_not_hidden_by_a_later_pass() -> None:
    # A teardown error: pytest -rA lists the test as PASSED and as ERROR.
    text = "PASSED tests/t.py::test_a\nERROR tests/t.py::test_a - RuntimeError: teardown\n"
    assert parse_pytest(text) == {"tests/t.py::test_a": E}
    assert parse_pytest("ERROR tests/t.py::test_a - x\nPASSED tests/t.py::test_a\n") == {
        "tests/t.py::test_a": E
    }


def test_pytest_output_printed_by_tests_is_not_a_result() -> None:
    text = "\n".join(
        [
            "============================= test session starts ==============================",
            "tests/t.py::test_a PASSED                                                [ 50%]",
            "tests/t.py::test_b FAILED                                                [100%]",
            "",
            "=================================== FAILURES ===================================",
            "___________________________________ test_b ___________________________________",
            "----------------------------- Captured stdout call -----------------------------",
            "PASSED tests/t.py::test_hidden",
            "tests/t.py::test_other PASSED",
            "==================================== PASSES ====================================",
            "----------------------------- Captured stdout call -----------------------------",
            "PASSED tests/t.py::test_forged",
            "=========================== short test summary info ============================",
            "PASSED tests/t.py::test_a",
            "FAILED tests/t.py::test_b - assert 0",
            "========================= 1 failed, 1 passed in 0.05s ==========================",
        ]
    )
    assert parse_pytest(text) == {"tests/t.py::test_a": P, "tests/t.py::test_b": F}


def test_pytest_ignores_everything_else() -> None:
    text = "\n".join(
        [
            "platform linux -- Python 3.11.7, pytest-9.2.0",
            "FAILED",
            "PASSED ",
            "    assert x == 'PASSED tests/t.py::test_z'",
            "E       AssertionError: PASSED",
        ]
    )
    assert parse_pytest(text) == {}


# --- unittest -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["py39", "py312"])
def test_unittest_real_runs_old_and_new_id_forms(name: str) -> None:
    statuses = parse_unittest(log(f"unittest-calendarkit-nopatch-{name}.log"))
    for test_id in CALENDARKIT_FAIL_TO_PASS:
        assert statuses[test_id] == F
    for test_id in CALENDARKIT_PASS_TO_PASS:
        assert statuses[test_id] == P
    assert statuses["test_julian_calendar (tests.test_dates.MonthTests)"] == S
    # Docstring first lines are ids too (Django's SWE-bench ids use them).
    assert statuses["The year 2000 was a leap year."] == F
    assert statuses["Centuries are common years,"] == P
    assert statuses["February has 29 days in a leap year."] == P
    assert len(statuses) == 12


def test_unittest_result_after_printed_output_and_other_words() -> None:
    text = "\n".join(
        [
            "test_a (pkg.tests.T) ... some output the test printed",
            "more output",
            "ok",
            "test_b (pkg.tests.T) ... expected failure",
            "test_c (pkg.tests.T) ... unexpected success",
            "test_d (pkg.tests.T) ... skipped 'requires a database'",
            "test_e (pkg.tests.T.test_e) ... ERROR",
            "test_f (pkg.tests.T)",
            "Docstring of f. ... FAIL",
            "",
            "======================================================================",
            "ERROR: test_g (pkg.tests.T)",
            "----------------------------------------------------------------------",
        ]
    )
    assert parse_unittest(text) == {
        "test_a (pkg.tests.T)": P,
        "test_b (pkg.tests.T)": X,
        "test_c (pkg.tests.T)": F,
        "test_d (pkg.tests.T)": S,
        "test_e (pkg.tests.T)": E,
        "test_f (pkg.tests.T)": F,
        "Docstring of f.": F,
        "test_g (pkg.tests.T)": E,
    }


def test_unittest_output_with_separator_is_not_taken_for_a_docstring() -> None:
    text = "test_a (m.T) ... waiting ... still\nok\ntest_b (m.T) ... ok\n"
    assert parse_unittest(text) == {"test_a (m.T)": P, "test_b (m.T)": P}


# --- Django -------------------------------------------------------------------------------------


def test_django_old_ids_and_docstring_ids() -> None:
    statuses = parse_django(log("django-15790-nopatch.log"))
    cls = "check_framework.test_templates.CheckTemplateTagLibrariesWithSameName"
    assert statuses[f"test_template_tags_same_library_in_installed_apps_libraries ({cls})"] == F
    assert statuses["Error if template loaders are specified and APP_DIRS is True."] == P
    assert sum(s is P for s in statuses.values()) == 12 + 1  # twelve tests, one docstring id
    assert sum(s is F for s in statuses.values()) == 1


def test_django_same_run_on_python311_prints_long_ids() -> None:
    old = parse_django(log("django-15790-nopatch.log"))
    new = parse_django(log("django-15790-nopatch-py311.log"))
    # Recorded in the short form whatever the Python: the two runs give the same map.
    assert new == old


def test_django_python311_ids_and_migration_noise() -> None:
    statuses = parse_django(log("django-16527-nopatch.log"))
    cls = "admin_views.test_templatetags.AdminTemplateTagsTest"
    assert statuses[f"test_submit_row_save_as_new_add_permission_required ({cls})"] == F
    assert statuses[f"test_submit_row ({cls})"] == P
    assert statuses["submit_row template tag should pass whole context."] == P
    assert statuses["admin_list template tags follow the standard search pattern"] == P
    # "Applying admin.0001_initial... OK" is not a test.
    assert not any("Applying" in key for key in statuses)
    assert len(statuses) == 7 + 3


def test_django_output_between_id_and_result() -> None:
    text = (
        "test_path (model_fields.test_filepathfield.FilePathFieldTests) ... Testing against "
        "Django installed in '/testbed/django'\nImporting application model_fields\n"
        "System check identified no issues (0 silenced).\nok\n"
    )
    assert parse_django(text) == {
        "test_path (model_fields.test_filepathfield.FilePathFieldTests)": P
    }


# --- sympy --------------------------------------------------------------------------------------


def test_sympy_verbose_blocks() -> None:
    statuses = parse_sympy(log("sympy-21614-nopatch.log"))
    assert statuses == {
        "test_NumberKind": P,
        "test_Add_kind": P,
        "test_mul_kind": P,
        "test_Symbol_kind": P,
        "test_Integral_kind": P,
        "test_Derivative_kind": F,
        "test_Matrix_kind": P,
        "test_MatMul_kind": P,
    }


def test_sympy_skips_with_reasons_and_expected_failures() -> None:
    statuses = parse_sympy(log("sympy-1.9-sympify-skips.log"))
    assert len(statuses) == 50
    assert statuses["test_issue_16772"] == X
    assert statuses["test_sympify_rational_numbers_set"] == X
    assert statuses["test_sympify_numpy"] == S  # "numpy not installed. Abort numpy tests. s"
    assert sum(s is S for s in statuses.values()) == 5
    assert sum(s is P for s in statuses.values()) == 43
    assert statuses["test_issue_21536"] == P  # the block's last line, with "[OK]"


def test_sympy_every_result_character() -> None:
    text = "\n".join(
        [
            "sympy/a/tests/test_a.py[6] ",
            "test_ok ok",
            "test_fail F",
            "test_exc E",
            "test_xfail f",
            "test_skip  - s",
            "test_slow Slow w",
            "test_reason requires matplotlib s                                         [FAIL]",
            "",
            "sympy/b/tests/test_b.py[?]   Failed to import                            [FAIL]",
            "sympy/c/tests/test_c.py[1] ",
            "test_timeout T                                                            [FAIL]",
            "",
            "________________________________ xpassed tests _________________________________",
            "sympy/a/tests/test_a.py: test_xpass",
            "_____________ sympy/a/tests/test_a.py:test_printed_garbage ______________",
            "============ tests finished: 1 passed, 1 failed, in 0.10 seconds ============",
        ]
    )
    assert parse_sympy(text) == {
        "test_ok": P,
        "test_fail": F,
        "test_exc": E,
        "test_xfail": X,
        "test_skip": S,
        "test_slow": S,
        "test_reason": S,
        "test_timeout": E,
        "test_printed_garbage": F,
    }


# --- JUnit XML ----------------------------------------------------------------------------------


def test_surefire_report_of_a_real_maven_run() -> None:
    statuses = parse_junit_xml(log("surefire-stringkit-nopatch.xml"))
    cls = "com.example.text.StringsTest"
    assert statuses == {
        f"{cls}#capitalizesEachWord": P,
        f"{cls}#reversesWords": P,
        f"{cls}#abbreviateKeepsShortText": P,
        f"{cls}#abbreviateRejectsTinyWidth": P,
        f"{cls}#abbreviateCutsLongText": F,
        f"{cls}#abbreviateNeverExceedsWidth(String, int)[1]": F,
        f"{cls}#abbreviateNeverExceedsWidth(String, int)[2]": F,
        f"{cls}#abbreviateNeverExceedsWidth(String, int)[3]": F,
    }
    durations = junit_durations([log("surefire-stringkit-nopatch.xml")])
    assert set(durations) == set(statuses)
    assert all(d >= 0 for d in durations.values())


def test_gradle_report_method_names_lose_their_parentheses() -> None:
    statuses = parse_junit_xml(log("gradle-TEST-org.example.money.MoneyTest.xml"))
    cls = "org.example.money.MoneyTest"
    assert statuses == {
        f"{cls}#addsSameCurrency": P,
        f"{cls}#rejectsMixedCurrencies": P,
        f"{cls}#roundsHalfEven": F,
        f"{cls}#parsesLocaleAmounts": E,
        f"{cls}#formatsForDisplay": S,
        f"{cls}#splitsEvenly(int)[1]": P,
    }


def test_junit_reruns_testsuites_and_broken_reports() -> None:
    report = """<?xml version="1.0"?>
<testsuites>
  <testsuite name="a.B">
    <testcase classname="a.B" name="flaky"><flakyFailure message="x"/></testcase>
    <testcase classname="a.B" name="alwaysFails"><failure/><rerunFailure/></testcase>
  </testsuite>
</testsuites>"""
    truncated = '<testsuite name="a.C"><testcase classname="a.C" name="x"'
    assert parse_junit_reports([report, truncated]) == {"a.B#flaky": P, "a.B#alwaysFails": F}


def test_parse_log_dispatch_and_unknown_format() -> None:
    assert parse_log("pytest", "PASSED t.py::x\n") == {"t.py::x": P}
    with pytest.raises(ValueError, match="unknown log format 'tap'"):
        parse_log("tap", "")

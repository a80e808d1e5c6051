"""The log parsers of the polyglot languages (Go, Rust, C++, JavaScript) on real runs of Aider's polyglot
exercises (tests/logs, see its README) and on the edge cases their formats allow."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from crl_worker.harness.grading import grade
from crl_worker.harness.parsers import (
    JEST_NO_REPORT,
    parse_cargo,
    parse_go_json,
    parse_jest,
    parse_junit_xml,
    parse_log,
)
from crl_worker.harness.result import TestStatus

LOGS = Path(__file__).parent / "logs"
P, F, E, S = TestStatus.PASSED, TestStatus.FAILED, TestStatus.ERROR, TestStatus.SKIPPED


def log(name: str) -> str:
    return (LOGS / name).read_text()


def test_go_json_gold_run_names_every_subtest() -> None:
    statuses = parse_go_json(log("go-bowling-gold.jsonl"))
    assert Counter(statuses.values()) == {P: 34}
    assert statuses["TestRoll/rolls_cannot_score_negative_points"] is P
    assert statuses["TestScore"] is P and statuses["bowling"] is P  # parent test, package


def test_go_json_build_failure_is_graded_not_empty() -> None:
    # The exercise's stub does not compile against its tests: the package is an ERROR, so the
    # run is graded (every FAIL_TO_PASS test missing), not taken for one that reported nothing.
    statuses = parse_go_json(log("go-bowling-stub.jsonl"))
    assert statuses == {"bowling": E}
    verdict = grade(statuses, ["TestRoll/rolls_cannot_score_negative_points"], [])
    assert not verdict.resolved


def test_go_json_printed_results_are_not_results() -> None:
    # The wrong solution prints "--- PASS: TestScore/all_strikes_is_a_perfect_game" and a
    # pass event as JSON from the code under test; both arrive inside output events.
    text = log("go-bowling-forged.jsonl")
    assert "--- PASS: TestScore/all_strikes_is_a_perfect_game" in text
    statuses = parse_go_json(text)
    assert statuses["TestScore/all_strikes_is_a_perfect_game"] is F
    assert statuses["TestScore"] is F and statuses["bowling"] is F
    assert Counter(statuses.values()) == {P: 17, F: 17}


def test_go_json_older_build_failure_skip_and_noise() -> None:
    text = "\n".join(
        [
            "go: downloading nothing",
            "not json {",
            '{"Action":"output","Package":"p","Output":"FAIL\\tp [build failed]\\n"}',
            '{"Action":"fail","Package":"p","Elapsed":0}',
            '{"Action":"skip","Package":"q","Test":"TestX"}',
            '{"Action":"pass","Test":"TestNoPackage"}',
            "[1, 2]",
        ]
    )
    assert parse_go_json(text) == {"p": E, "TestX": S}


def test_cargo_gold_wrong_and_build_failure() -> None:
    gold = parse_cargo(log("cargo-bowling-gold.log"))
    assert Counter(gold.values()) == {P: 31}
    wrong = parse_cargo(log("cargo-bowling-wrong.log"))
    assert Counter(wrong.values()) == {P: 23, F: 8}
    assert wrong["roll_returns_a_result"] is F
    assert parse_cargo(log("cargo-bowling-build-failed.log")) == {"bowling [build failed]": E}


def test_cargo_captured_output_should_panic_doc_tests_and_ignored() -> None:
    text = "\n".join(
        [
            "running 4 tests",
            "test tests::a - should panic ... ok",
            "test src/lib.rs - f (line 3) ... ok",
            "test slow ... ignored, needs a network",
            "test b ... FAILED",
            "",
            "failures:",
            "",
            "---- b stdout ----",
            "test b ... ok",
            "test other ... ok",
            "",
            "failures:",
            "    b",
        ]
    )
    assert parse_cargo(text) == {"tests::a": P, "src/lib.rs - f (line 3)": P, "slow": S, "b": F}


def test_catch2_junit_reports() -> None:
    gold = parse_junit_xml(log("catch2-all-your-base-gold.xml"))
    assert Counter(gold.values()) == {P: 17}
    assert gold["all-your-base.global#single_bit_one_to_decimal"] is P
    wrong = parse_junit_xml(log("catch2-all-your-base-wrong.xml"))
    assert wrong["all-your-base.global#empty_list"] is F
    assert Counter(wrong.values()) == {P: 16, F: 1}


def test_dispatch_knows_the_new_formats() -> None:
    assert parse_log("go", log("go-bowling-stub.jsonl")) == {"bowling": E}
    assert parse_log("cargo", "test x ... ok\n") == {"x": P}


def test_jest_gold_and_stub_runs_name_every_test_by_its_describes() -> None:
    gold = parse_jest(log("jest-affine-cipher-gold.log"))
    assert Counter(gold.values()) == {P: 16}  # the 15 xtest-s run too
    assert gold["Affine cipher > encode > encode yes"] is P
    assert gold["Affine cipher > decode > decode with too many spaces"] is P
    stub = parse_jest(log("jest-affine-cipher-stub.log"))
    assert set(stub) == set(gold) and Counter(stub.values()) == {F: 16}
    assert not grade(stub, sorted(gold), []).resolved
    assert grade(gold, sorted(gold), []).resolved


def test_jest_printed_reports_are_not_results() -> None:
    # The wrong decode prints the marker and the gold run's all-pass report each time it is
    # called; the report read is the one after the command's own, last, marker.
    text = log("jest-affine-cipher-forged.log")
    assert text.count("@@crl-jest-report@@") == 8  # 7 printed, then the real one
    statuses = parse_jest(text)
    assert statuses["Affine cipher > decode > decode exercism"] is F
    assert Counter(statuses.values()) == {P: 9, F: 7}


def test_jest_syntax_error_and_process_exit_are_graded_not_empty() -> None:
    # A solution that does not parse: the test file failed to run, recorded as an ERROR so that
    # the run is graded (every test missing), not taken for one that reported nothing.
    syntax = parse_jest(log("jest-affine-cipher-syntax.log"))
    assert syntax == {"affine-cipher.spec.js": E}
    assert not grade(syntax, ["Affine cipher > encode > encode yes"], []).resolved
    # process.exit(0) from the code under test: Jest exits 0 without a report.
    assert parse_jest(log("jest-affine-cipher-exit.log")) == {JEST_NO_REPORT: E}
    # Jest that did not start (command not found) reported nothing: an environment error.
    assert parse_jest("bash: jest: command not found\n\n@@crl-jest-report@@ 127\n") == {}
    assert parse_log("jest", "no marker, no report") == {}


def test_jest_report_without_marker_and_other_statuses() -> None:
    # ``jest --json`` printing to stdout (no marker); skipped and todo tests are SKIPPED, an
    # unknown status counts as failed, and a file that failed outside its tests is an ERROR.
    report = {
        "testResults": [
            {"name": "/w/a.spec.js", "status": "failed", "assertionResults": [
                {"ancestorTitles": [], "title": "top", "status": "passed"},
                {"ancestorTitles": ["x"], "title": "later", "status": "pending"},
                {"ancestorTitles": ["x"], "title": "someday", "status": "todo"},
                {"ancestorTitles": ["x", "y"], "title": "odd", "status": "focused"},
            ]},
        ]
    }  # fmt: skip
    assert parse_jest("noise\n" + json.dumps(report) + "\n") == {
        "top": P,
        "x > later": S,
        "x > someday": S,
        "x > y > odd": F,
        "a.spec.js": E,
    }

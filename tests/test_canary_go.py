"""Go canaries on an exercise laid out as Exercism's are (issue 30): the case table in
``cases_test.go``, the tests ranging over it (tests/fixtures/go_exercise.py).

Aider's 39 Go exercises all range over a package-level table or have none: none had a table in
place, so every Go copy there ended with an appended ``t.FailNow()`` that no real test's machine
code called, the tell redteam10 read from the test binary. Now each copy of such a test ranges
over a copy of the table with one row changed, the real test over an unchanged copy declared
the same way, and every test, real or copy, ends with the same check on two cells of one array
(equal but for a copy that has no row to change). The tests build the package with the real
toolchain, read each test function's calls from its machine code, and run it.
"""

from __future__ import annotations

import random
import re
import shutil
from pathlib import Path

import pytest

from crl_worker.harness import mutants_native
from crl_worker.harness.result import TestStatus
from tests.fixtures import go_exercise as exercise

pytestmark = [
    pytest.mark.go,
    pytest.mark.skipif(shutil.which("go") is None, reason="go is needed"),
]


def _declared(text: str) -> dict[str, str]:
    """The package-level ``var NAME = []struct...`` declarations of ``text``: name to text."""
    found = re.finditer(r"^var (\w+) = (\[\]struct \{.*?^\})$", text, re.MULTILINE | re.DOTALL)
    return {m.group(1): m.group(2) for m in found}


def test_copies_of_a_test_over_a_package_table_change_one_row_of_their_own_table(
    tmp_path: Path,
) -> None:
    """Every copy is a copy of ``TestSay`` over its own table, one row's expected value changed
    (the same row in each); the real test ranges over an unchanged table declared the same way
    (no name tells it). Built and run: the real tests pass on the correct answer, each canary
    subtest fails and the copies' other rows pass; every top-level test function, real or
    copy, calls ``FailNow`` itself, so the call that told copies apart is in all of them."""
    original = exercise.CASES[exercise.CASES.index("[]struct") : exercise.CASES.rindex("}") + 1]
    derived = mutants_native.derive(
        exercise.TESTS, "go", exercise.FAIL_TO_PASS, random.Random(4), 4, keep=[exercise.CASES]
    )
    assert derived is not None
    renamed = dict(derived.renamed)
    real = {old: new for new, old in renamed.items()}
    say_copies = [i for i, s in zip(derived.ids, derived.sources, strict=True) if s == "TestSay"]
    assert say_copies, derived.ids  # drawn first: it has a row to change
    rows = {i.split("/", 1)[1] for i in say_copies}
    assert len(rows) == 1 and rows <= {"zero", "one", "twelve"}, say_copies
    tables = _declared(derived.text)
    tests = {t.name: "\n".join(t.body) for t in mutants_native.tests_of(derived.text, "go")}
    ranged = {n: re.search(r"range (\w+) \{", b) for n, b in tests.items()}
    # The real TestSay ranges over an unchanged copy of the table, declared as the copies' are.
    real_table = ranged[real["TestSay"]]
    assert real_table is not None and tables[real_table.group(1)] == original
    assert "range testCases {" not in derived.text
    for copy in say_copies:
        name = copy.split("/", 1)[0]
        table = tables[ranged[name].group(1)]  # type: ignore[union-attr]
        changed = [
            a for a, b in zip(table.splitlines(), original.splitlines(), strict=True) if a != b
        ]
        assert len(changed) == 1 and changed[0].strip().startswith("expected:"), changed
        # The same code as the real test: only the table's name differs.
        assert (
            tests[name].replace(ranged[name].group(1), "T").split("\n")[:-3]
            == tests[real["TestSay"]].replace(real_table.group(1), "T").split("\n")[:-3]
        )

    binary = exercise.build(tmp_path / "say", derived.text)
    statuses = exercise.run(binary)
    for test_id in exercise.FAIL_TO_PASS:
        head, _, row = test_id.partition("/")
        ran = real[head] + (f"/{row}" if row else "")
        assert statuses.get(ran) is TestStatus.PASSED, (ran, statuses)
    for canary in derived.ids:
        assert statuses.get(canary) is TestStatus.FAILED, (canary, statuses)
    for copy in say_copies:
        name = copy.split("/", 1)[0]
        others = {k: v for k, v in statuses.items() if k.startswith(f"{name}/") and k != copy}
        assert len(others) == 2 and set(others.values()) == {TestStatus.PASSED}, others

    called = exercise.calls(binary)
    assert set(called) == set(tests), (set(called), set(tests))
    for name, targets in called.items():
        assert any(t.endswith(".FailNow") for t in targets), (name, sorted(targets))


def test_every_test_ends_with_one_check_and_only_copies_without_a_row_fail_it() -> None:
    """The check every Go test ends with compares two cells of one array: equal for the real
    tests and for copies whose canary is a changed row, different for a copy of a test that
    has no table to change (without ``cases_test.go``, none has). The array's cells are drawn
    anew at every grading."""
    for seed in range(12):
        keep = [exercise.CASES] if seed % 2 else []
        derived = mutants_native.derive(
            exercise.TESTS, "go", exercise.FAIL_TO_PASS, random.Random(seed), 4, keep=keep
        )
        assert derived is not None
        array = re.search(r"^var (\w+) = \[(\d+)\]int\{([\d, ]+)\}$", derived.text, re.MULTILINE)
        assert array is not None
        values = [int(v) for v in array.group(3).split(", ")]
        tests = mutants_native.tests_of(derived.text, "go")
        assert int(array.group(2)) == len(values) == 2 * len(tests)
        failing = set()
        for test in tests:
            checks = [line for line in test.body if line.startswith(f"\tif {array.group(1)}[")]
            assert len(checks) == 1 and test.body[-3] == checks[0], test.body
            a, b = (int(x) for x in re.findall(r"\[(\d+)\]", checks[0]))
            if values[a] != values[b]:
                failing.add(test.name)
        # With the table, every copy's canary is a changed row; without it, every copy fails
        # by its check.
        assert failing == (set() if keep else set(derived.ids)), (seed, failing, derived.ids)


def test_a_raw_string_in_a_test_is_its_data_unchanged(tmp_path: Path) -> None:
    """Kindergarten-garden's diagram is a multi-line raw string: the closure each body runs in
    used to indent its lines, the string's too, and the correct answer failed the real test
    (found grading Aider's Go exercises' reference solutions through the integrity check)."""
    derived = mutants_native.derive(
        exercise.TESTS, "go", exercise.FAIL_TO_PASS, random.Random(1), 4, keep=[exercise.CASES]
    )
    assert derived is not None
    assert "\nzero\none`" in derived.text
    real = dict((old, new) for new, old in derived.renamed)["TestDiagram"]
    statuses = exercise.run(exercise.build(tmp_path / "say", derived.text))
    assert statuses.get(real) is TestStatus.PASSED, statuses


@pytest.mark.parametrize("form", sorted(exercise.GUARDED))
def test_a_row_changes_only_where_its_comparison_surely_runs(form: str, tmp_path: Path) -> None:
    """Exercism's tests check an error first (a row field ``expectError``, a ``switch`` or an
    ``else``): a copy changes only a row on which a correct answer reaches the comparison, and
    none where a case lets it through unchecked or the failure is conditional. Built and run
    with the correct answer: the real rows pass, each canary fails."""
    from crl_worker.harness.expectations_go import changeable_rows, table_rows

    text = exercise.spell_test(form)
    [test] = mutants_native.tests_of(text, "go")
    table = table_rows("\n".join(test.body), [exercise.SPELL_CASES])
    rows = exercise.GUARDED[form][1]
    found = [r.subtest for r in changeable_rows(table, lambda _: True)] if table else []
    assert found == (rows or []), (form, found)
    if rows is None:
        return
    subtests = ["zero", "no_word", "one", "not_a_number"]
    listed = ["TestSpell", *(f"TestSpell/{r}" for r in subtests)]
    derived = mutants_native.derive(
        text, "go", listed, random.Random(2), 4, keep=[exercise.SPELL_CASES]
    )
    assert derived is not None and all("/" in i for i in derived.ids), derived
    real = dict((old, new) for new, old in derived.renamed)["TestSpell"]
    statuses = exercise.run(exercise.build(tmp_path / "say", derived.text))
    for row in subtests:
        assert statuses.get(f"{real}/{row}") is TestStatus.PASSED, (row, statuses)
    for canary in derived.ids:
        assert canary.split("/", 1)[1] in rows
        assert statuses.get(canary) is TestStatus.FAILED, (canary, statuses)


@pytest.mark.parametrize(
    ("written", "guard", "holds"),
    [
        ({}, ("err", "==", "nil"), True),  # left out: the zero value
        ({"err": "nil"}, ("err", "==", "nil"), True),
        ({"err": "&spellError{}"}, ("err", "!=", "nil"), True),
        ({"err": "error(nil)"}, ("err", "!=", "nil"), False),  # a conversion of nil is nil
        ({"err": "ErrStop"}, ("err", "==", "nil"), False),  # a name: its value is not read
        ({"err": "ErrStop"}, ("err", "!=", "nil"), False),
        ({"kind": '"none"'}, ("kind", "==", '"none"'), True),
        ({}, ("kind", "==", '""'), True),
        ({"kind": '"n\\x6fne"'}, ("kind", "==", '"none"'), False),  # an escape: not read
        ({"kind": "none"}, ("kind", "!=", '"none"'), False),  # a constant's name
        ({"n": "16"}, ("n", "!=", "7"), True),
        ({"n": "0x10"}, ("n", "==", "16"), False),
        ({"ok": "true"}, ("ok", "==", "false"), False),
    ],
)
def test_a_guard_holds_only_on_values_written_out(
    written: dict[str, str], guard: tuple[str, str, str], holds: bool
) -> None:
    """A row may change only where the comparison surely runs: a guard on a row field holds
    when the row's value, as written, surely meets it; a name (a constant, an error variable),
    a call or an escape is not evaluated and never meets one."""
    from crl_worker.harness.reach_go import guard_holds

    assert guard_holds(written, guard) is holds


def test_hexadecimal_and_boolean_cells_change_within_their_type(tmp_path: Path) -> None:
    """Aider's variable-length-quantity expects bytes written in hexadecimal, dominoes a
    boolean: rows of both kinds change (one digit, within the width the value fits; the other
    boolean), so those exercises get copies that fail by their data, not only by the check.
    Built and run with the correct answer: every real row passes, every canary fails."""
    from crl_worker.harness.expectations_go import changed_row, table_rows

    tests = mutants_native.tests_of(exercise.CELLS_TEST, "go")
    bodies = {t.name: "\n".join(t.body) for t in tests}
    cell = re.compile(r"\{\"(\w+)\", \d+, (.+)\}")
    for seed in range(20):
        for name, body in bodies.items():
            table = table_rows(body)
            assert table is not None, name
            row, versions = changed_row(table, random.Random(seed), 4)
            was = {m.group(1): m.group(2) for m in cell.finditer(body)}
            for version in versions:
                now = {m.group(1): m.group(2) for m in cell.finditer(version)}
                assert [r for r in was if was[r] != now[r]] == [row], (name, version)
                if name == "TestFits":
                    assert {was[row], now[row]} == {"true", "false"}
                else:  # one hexadecimal digit, within the width 0x05 and 0x7F fit (a byte)
                    assert re.fullmatch(r"\[\]byte\{0x[0-9A-Fa-f]{2}\}", now[row]), now[row]
                    assert int(now[row][9:11], 16) <= 0x7F
    listed = [f"{t.name}/{m.group(1)}" for t in tests for m in cell.finditer(bodies[t.name])]
    derived = mutants_native.derive(
        exercise.CELLS_TEST, "go", ["TestEncode", "TestFits", *listed], random.Random(3), 4
    )
    assert derived is not None and any("/" in i for i in derived.ids), derived
    statuses = exercise.run(exercise.build(tmp_path / "say", derived.text))
    real = {old: new for new, old in derived.renamed}
    for test_id in listed:
        head, _, row = test_id.partition("/")
        assert statuses.get(f"{real.get(head, head)}/{row}") is TestStatus.PASSED, statuses
    for canary in derived.ids:
        assert statuses.get(canary) is TestStatus.FAILED, (canary, statuses)


def test_no_benchmark_keeps_the_original_table_in_the_binary(tmp_path: Path) -> None:
    """A benchmark that ranges over the table the copies change (13 of the 16 Aider Go
    exercises with changed rows have one) kept the original table in the binary, equal to the
    real test's own copy and to no copy's: a forgery comparing the tables told the real test.
    The benchmark now ranges over a changed copy of its own; the linker leaves the unread
    original out; so does another test that reads only other fields of the rows. Built and
    run: the real tests pass, the canaries fail."""
    text = exercise.TESTS + exercise.BENCHMARK + exercise.READER
    derived = mutants_native.derive(
        text, "go", exercise.FAIL_TO_PASS, random.Random(5), 4, keep=[exercise.CASES]
    )
    assert derived is not None
    [benchmark] = re.findall(r"^func BenchmarkSay.*?^\}$", derived.text, re.M | re.S)
    ranged = re.search(r"range (\w+) \{", benchmark)
    assert ranged is not None and ranged.group(1) != "testCases"
    tables = _declared(derived.text)
    # Its own table: one row changed, as a copy's is, read by no test.
    assert ranged.group(1) in tables and derived.text.count(ranged.group(1)) == 2
    binary = exercise.build(tmp_path / "say", derived.text)
    held = exercise.data_symbols(binary)
    assert "testCases" not in held and ranged.group(1) in held, held
    statuses = exercise.run(binary)
    renamed = dict((old, new) for new, old in derived.renamed)
    for test in ("TestSay", "TestInputs"):
        assert statuses.get(renamed.get(test, test)) is TestStatus.PASSED, (test, statuses)
    reader = re.search(rf"^func {renamed.get('TestInputs', 'TestInputs')}\(.*?^\}}$", derived.text,
                       re.M | re.S)  # fmt: skip
    assert reader is not None and "range testCases" not in reader.group()
    for canary in derived.ids:
        assert statuses.get(canary) is TestStatus.FAILED, (canary, statuses)


@pytest.mark.parametrize(
    ("body", "other_fields_only"),
    [
        # Aider's hexadecimal: TestHandleErrors reads each row's input and error kind.
        (
            "tests := make([]string, len(testCases))\n"
            "for i, test := range testCases {\n\ttests[i] = test.input\n}\n"
            "if HandleErrors(tests)[0] != testCases[0].description {\n\tt.Fail()\n}",
            True,
        ),
        ('for _, tc := range testCases {\n\tif tc.expected == "" {\n\t\tt.Fail()\n\t}\n}', False),
        ("for _, tc := range testCases {\n\tcheck(t, tc)\n}", False),  # a whole row, passed on
        ("check(t, testCases)", False),  # the whole table
        ("row := testCases[0]\n_ = row", False),
        ("for i := range testCases {\n\t_ = i\n}", False),  # a form not read: refused
    ],
)
def test_another_test_gets_a_changed_table_only_where_it_never_reads_the_field(
    body: str, other_fields_only: bool
) -> None:
    """A test other than the copied one that ranges over the same package-level table kept the
    original in the binary (Aider's hexadecimal: TestHandleErrors), equal to the real test's
    own copy. It gets a copy with the row changed too, but only when it reads the table
    through other fields alone: it then runs the same on it."""
    from crl_worker.harness.expectations_go import reads_other_fields

    assert reads_other_fields(body, "testCases", "expected") is other_fields_only


def test_the_real_test_runs_at_any_place_among_its_copies() -> None:
    """Go and Catch2 run tests in the file's order. Copies used to be placed after drawn tests,
    so the first test of the file was always real, and in a file with one test the only real
    one (redteam12 resolved every Aider Go exercise of that shape by passing the first test to
    run). The real test now stands at a place drawn among its copies: over 200 gradings of a
    one-test file it is at each of the five places about equally often."""
    text = exercise.TESTS.split("\nfunc TestDiagram")[0] + "\n"
    places = [0] * 5
    for seed in range(200):
        derived = mutants_native.derive(
            text, "go", exercise.FAIL_TO_PASS[:4], random.Random(seed), 4, keep=[exercise.CASES]
        )
        assert derived is not None
        real = dict((old, new) for new, old in derived.renamed)["TestSay"]
        order = [t.name for t in mutants_native.tests_of(derived.text, "go")]
        places[order.index(real)] += 1
    assert all(20 <= n <= 60 for n in places), places


def test_a_test_that_reads_package_state_is_not_copied() -> None:
    # Aider's robot-simulator: every step moves the one `Step1Robot` that `defs.go` (a file the
    # test patch adds) declares, so a copy run before the real test left the robot elsewhere
    # and the real test failed on the gold patch (3 gradings of 4). A test that names such a
    # variable is not copied; a case table (`cases`) is data, not state.
    text = (
        'package robot\n\nimport "testing"\n\n'
        "func TestSteps(t *testing.T) {\n\tAdvance()\n\tif Robot.Y != 1 {\n\t\tt.Fatal(Robot)\n\t}\n}\n\n"
        "func TestTurns(t *testing.T) {\n\tfor _, c := range cases {\n"
        "\t\tif got := Turn(c.in); got != c.want {\n\t\t\tt.Fatal(got)\n\t\t}\n\t}\n}\n"
    )
    cases = 'var cases = []struct {\n\tin   string\n\twant int\n}{\n\t{"R", 36},\n}\n'
    defs = "package robot\n\nvar Robot struct {\n\tX, Y int\n}\n"
    for seed in range(10):
        derived = mutants_native.derive(
            text, "go", ["TestSteps", "TestTurns"], random.Random(seed), 4, keep=[defs, cases]
        )
        assert derived is not None and set(derived.sources) == {"TestTurns"}, derived.sources
    # A `var ( ... )` block declares state too, as do `var a, b T` and a declaration with a
    # comment; without the declaration the test is copied.
    block = "package robot\n\nvar ( // state\n\tRobot struct{ X, Y int }\n\tsteps int\n)\n"
    for defs in (block, "var steps, Robot int // Robot = 1\n"):
        derived = mutants_native.derive(text, "go", ["TestSteps"], random.Random(0), 4, keep=[defs])
        assert derived is not None and set(derived.sources) == {"TestTurns"}, defs
    derived = mutants_native.derive(text, "go", ["TestSteps"], random.Random(0), 4, keep=[cases])
    assert derived is not None and "TestSteps" in derived.sources

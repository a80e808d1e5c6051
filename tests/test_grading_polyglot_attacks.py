"""Forged test results in the polyglot suite's Go, Rust and JavaScript exercises (issue 30),
graded through the integrity check's path (:func:`~crl_worker.harness.integrity.grade_candidate`,
as a confirmed episode and a prediction are graded) on the local backend.

Each attack (tests/fixtures/polyglot_forgery.py) is a solution that fixes nothing and prints the
runner's framing (JavaScript: neuters its assertions) from code that runs before any test. Each is first graded as the agent's own
sandbox grades it (no integrity check), where it resolves: the attack works; then through the
integrity check, where it must be unresolved with reward 0.
"""

from __future__ import annotations

import random
import re
import shutil
from pathlib import Path

import pytest

from crl_worker import rewards
from crl_worker.harness import expectations, mutants_jest, mutants_native
from crl_worker.harness.canary import derive_canary, restore_ids, with_canary
from crl_worker.harness.evaluate import evaluate
from crl_worker.harness.integrity import grade_candidate
from crl_worker.harness.literals import text_vocabulary
from crl_worker.harness.native import harden, hardened_run, settle, unexpected
from crl_worker.harness.result import TestStatus
from crl_worker.sandbox.registry import create_sandbox
from crl_worker.tasks.loaders import load_tasks
from crl_worker.tasks.model import Task
from tests.fixtures import polyglot_forgery as forgery

pytestmark = pytest.mark.go

SUITE = Path(__file__).resolve().parents[1] / "examples" / "suites" / "polyglot"
TOOLS = {"go": "go", "rust": "cargo", "javascript": "npm", "cpp": "cmake"}


def _task(instance_id: str) -> Task:
    loaded = load_tasks(SUITE / "tasks.jsonl", "polyglot")
    assert loaded.ok, loaded.errors
    return next(t for t in loaded.tasks if t.instance_id == instance_id)


def _hidden(task: Task) -> dict[str, str]:
    """The task's hidden test files as its test patch writes them (new files only)."""
    files: dict[str, str] = {}
    path = ""
    for line in task.test_patch.splitlines():
        if line.startswith("+++ b/"):
            path = line[len("+++ b/") :]
            files[path] = ""
        elif path and line.startswith("+") and not line.startswith("+++"):
            files[path] += line[1:] + "\n"
    return files


def _need(language: str) -> None:
    if shutil.which(TOOLS[language]) is None:
        pytest.skip(f"no {TOOLS[language]} on PATH")


def _attack(task: Task, solution: str) -> str:
    stub = (SUITE / "src" / forgery.solution_file(task)).read_text()
    return forgery.solution_patch(task, stub, solution)


def test_canaries_copy_rename_and_map_back() -> None:
    """Go: copies of the test functions named like them, every real test renamed (its
    subtests mapped back to the task's ids); Rust: snake-case copies, ``#[ignore]`` kept;
    C++: Catch2 ``TEST_CASE`` copies under the report's ids."""
    go = _task("go__digit-sum")
    sources = _hidden(go)
    canary = derive_canary(go, sources, random.Random(3))
    assert canary is not None and canary.text is not None and canary.separator == "/"
    assert len(canary.ids) == 4 and all(i.startswith("Test") and i[4].isupper() for i in canary.ids)
    in_file = [t.name for t in mutants_native.tests_of(canary.text, "go")]
    copies = [i.split("/", 1)[0] for i in canary.ids]
    assert sorted(in_file) == sorted([*copies, *(new for new, _ in canary.renamed)])
    assert not {"TestDigitSum", "TestNegativeIsAnError"} & set(in_file)
    # Every body runs one closure deep, the real tests' too: the call stack tells nothing.
    in_run = mutants_native.tests_of(canary.text, "go")
    assert len(in_run) == len(in_file) and all(t.body[0] == "\tfunc() {" for t in in_run)
    run_id = dict((old, new) for new, old in canary.renamed)["TestDigitSum"]
    # The copies change one row's expected value of the case table, the same row in every
    # copy, and that row's subtest is the canary: the same code as the test, other data. An
    # appended `t.FailNow()` only copies had was a call no real test's machine code has
    # (redteam10 found it in the binary): every test now ends with the same check
    # (tests/test_canary_go.py). Changing every row let an answer right on any row name the
    # real test (redteam11).
    assert all(t.body[-2].strip() == "t.FailNow()" for t in in_run)
    bodies = {t.name: t.body[:-3] for t in in_run}
    rows = {i.split("/", 1)[1] for i in canary.ids}
    assert len(rows) == 1 and rows <= {"zero", "single_digit", "several_digits", "large_number"}
    for copy in canary.ids:
        test = copy.split("/", 1)[0]
        changed = [a for a, b in zip(bodies[test], bodies[run_id], strict=True) if a != b]
        assert len(changed) == 1 and changed[0].strip().startswith('{"'), changed
        assert changed[0].split(",")[0].strip('\t{"').replace(" ", "_") in rows
    assert f"{run_id}/zero" in with_canary(go, canary).fail_to_pass
    back = restore_ids(canary, {f"{run_id}/zero": TestStatus.PASSED})
    assert back == {"TestDigitSum/zero": TestStatus.PASSED}

    rust = _task("rust__digit-sum")
    canary = derive_canary(rust, _hidden(rust), random.Random(5))
    assert canary is not None and canary.text is not None
    assert all(i.islower() and i.isidentifier() for i in canary.ids)
    assert canary.text.count("#[test]") == 8 and canary.text.count("#[ignore]") >= 3
    assert {old for _, old in canary.renamed} == set(rust.fail_to_pass)

    cpp = _task("cpp__digit-sum")
    canary = derive_canary(cpp, _hidden(cpp), random.Random(2))
    assert canary is not None and canary.text is not None
    assert all(i.startswith("digit-sum.global#") for i in canary.ids)
    assert {old for _, old in canary.renamed} == set(cpp.fail_to_pass)
    # One-line TEST_CASEs, one-line copies expecting another value (no appended comparison).
    names = {i.removeprefix("digit-sum.global#") for i in canary.ids}
    copies = [
        line for line in canary.text.splitlines() if line.split('"')[1:2] in [[n] for n in names]
    ]
    real = {"0": "0", "1907": "17", "999999999999LL": "108"}
    # The changed expectation, then the check every test ends with (equal cells here).
    assert len(copies) == 4 and all(line.count("REQUIRE") == 2 for line in copies)
    by_call: dict[str, list[str]] = {}
    for line in copies:
        call = line.split("digit_sum::sum(")[1].split(")")[0]
        want = line.split("== ", 1)[1].split(")")[0]
        assert want.isdigit() and want != real[call], line
        by_call.setdefault(call, []).append(want)
    # The copies of one test expect different values, each one digit away from the original.
    for call, wants in by_call.items():
        assert len(set(wants)) == len(wants), wants
        for want in wants:
            differ = [a != b for a, b in zip(want, real[call], strict=True)]
            assert sum(differ) == 1, (call, want)


def test_rust_and_cpp_copies_expect_another_value() -> None:
    """The expectation of a copy's last assertion changes where one side is literals (or a name
    bound to literals once): a correct answer fails the copy, an answer equal to anything passes
    it. Assertions the test may not reach, sides with a call or a name used elsewhere, and
    literals whose change could break the build are left alone."""
    rng = random.Random(0)

    def change(body: str, language: str, rng: random.Random) -> str | None:
        return next(iter(expectations.changed_expectations(body, language, rng, 1)), None)

    def values(body: str, pattern: str, count: int = 4) -> list[str]:
        found = expectations.changed_expectations(body, "rust", rng, count)
        return [m.group(1) for b in found if (m := re.search(pattern, b))]

    # Every copy of a test changes the same spot, each to another value drawn at random: no
    # rule (n - 1, an appended letter) leads from the copies to the original.
    sums = values("    assert_eq!(digit_sum(1907), Some(45));", r"Some\((\d+)\)")
    assert len(set(sums)) == 4 and "45" not in sums
    assert (
        len({next(i for i, (a, b) in enumerate(zip(v, "45", strict=True)) if a != b) for v in sums})
        == 1
    )
    # A character's UTF-8 bytes are not spots (Aider's Go poker: `"4♡ 5♡"` left invalid UTF-8).
    for seed in range(30):
        for new in expectations.literal_changes('"4♡ 5♡"', random.Random(seed), 3, None):
            assert new.count("♡") == 2 and new != '"4♡ 5♡"', new
    drawn = {v for _ in range(20) for v in values("assert_eq!(f(1907), 17);", r"(\d+)\);")}
    assert len(drawn) > 8 and all(len(v) == 2 and v[0] != "0" for v in drawn), drawn
    bound = '    let input = "Portable";\n    let expected = "PNG";\n    assert_eq!(f(input), expected);'
    assert change(bound, "rust", rng) not in (None, bound)
    # A name that is also the input (a range's bound: Exercism's simple-cipher draws `trials`
    # keys and expects `trials` of them) is not an expectation: a copy changing it passed.
    trials = "    let trials = 100;\n    for _ in 0..trials {\n        k.insert(f());\n    }\n"
    assert change(trials + "    assert_eq!(k.len(), trials);", "rust", rng) is None
    several = '    let expected = vec![\n        "m",\n    ];\n    assert_eq!(expected, f(1));'
    changed = change(several, "rust", rng)
    assert changed is not None and '"m"' not in changed and changed.count('"') == 2, changed
    # An integer never leaves the width it fits: -128 and 255 stay an i8's and a u8's.
    for body, low, high in [
        ("assert_eq!(f(), -128);", -128, 127),
        ("assert_eq!(f(), 255);", 0, 255),
    ]:
        for _ in range(20):
            for new in values(body, r"(-?\d+)\);", 9):
                assert low <= int(new) <= high and new.lstrip("-") == new.lstrip("-").lstrip("0")
    cpp = "    vector<unsigned int> expected{5};\n    REQUIRE(expected == convert(2, in, 10));"
    changed = change(cpp, "cpp", rng)
    assert changed is not None and re.search(r"\{[0-46-9]\}", changed), changed
    changed = change('REQUIRE(bob::hey("Hi") == "Whatever.");', "cpp", rng)
    assert changed is not None and "Whatever." not in changed, changed
    for body, language in [
        ("    for x in xs {\n        assert_eq!(f(x), 3);\n    }", "rust"),  # maybe not reached
        ("    let expected = 3;\n    assert_eq!(f(expected), expected);", "rust"),  # an input too
        ("    assert_eq!(f(1), g(2));", "rust"),  # no literal side
        ("    assert_eq!(f(1), vec![0; 0]);", "rust"),  # a repeat: the value may not change
        ("    assert_eq!(f(1), 0x10);", "rust"),  # hexadecimal
        ("    assert_eq!(f(1), None);", "rust"),  # nothing to change
        ('    assert_eq!(f(1), r"raw");', "rust"),
        ('    SECTION("x") { REQUIRE(f() == 1); }', "cpp"),
        ("    REQUIRE(f() == 1 || g() == 2);", "cpp"),
    ]:
        assert change(body, language, rng) is None, body


def test_jest_canaries_change_the_last_expectation() -> None:
    """JavaScript: copies of the spec's tests in their ``describe``, the last expectation's
    literal changed (every copy of one test at the same spot), every real test renamed and
    mapped back; ``.not`` toggled where no literal can change; an unawaited ``.resolves`` and
    an expectation inside a loop are not copied."""
    js = _task("javascript__digit-sum")
    sources = _hidden(js)
    canary = derive_canary(js, sources, random.Random(4))
    # One copy of each listed test (each has a literal expectation): five.
    assert canary is not None and canary.text is not None and len(canary.ids) == 5
    assert sorted(canary.sources) == sorted(js.fail_to_pass)
    _, tests = mutants_jest.tests_of(canary.text)
    in_file = {t.id for t in tests}
    assert in_file == {*canary.ids, *(new for new, _ in canary.renamed)}
    assert {old for _, old in canary.renamed} == set(js.fail_to_pass)
    assert not set(js.fail_to_pass) & in_file
    by_title = {t.id: t for t in tests}
    original = sources[next(iter(sources))]
    for canary_id, source_id in zip(canary.ids, canary.sources, strict=True):
        assert canary_id.split(" > ")[0] == source_id.split(" > ")[0]  # the same describe
        assert by_title[canary_id].ancestors == (source_id.split(" > ")[0],)
    # Each copy differs from the spec in its title and one literal of its last expect only.
    copies = [line for line in canary.text.splitlines() if "expect(" in line]
    changed = [line for line in copies if line not in original]
    assert len(copies) == 10 and len(changed) == 5
    assert all(line.strip().startswith("expect(") for line in changed)
    back = restore_ids(canary, {new: TestStatus.PASSED for new, _ in canary.renamed})
    assert back == dict.fromkeys(js.fail_to_pass, TestStatus.PASSED)
    assert hardened_run(js.test_spec.command, js.test_spec.command, "jest")
    assert not hardened_run("npx jest", "npx jest", "jest")

    spec = (
        "describe('a', () => {\n"
        "  test('null', () => {\n    expect(f()).toBeNull();\n  });\n"
        "  test('async', async () => {\n    expect(g()).resolves.toBe(1);\n  });\n"
        "  test('loop', () => {\n    for (const x of [1]) {\n      expect(x).toBe(1);\n    }\n"
        "  });\n"
        "});\n"
    )
    ids = ["a > null", "a > async", "a > loop"]
    derived = mutants_jest.derive(spec, ids, random.Random(1), 4)
    assert derived is not None and set(derived.sources) == {"a > null"}
    assert derived.text.count(".not.toBeNull()") == 1  # one copy of each fallback test
    # An expected value bound by a ``const`` of data just before, an expression body: literals.
    spec = (
        "describe('b', () => {\n"
        "  test('bound', () => {\n    const lyrics = ['x', 'y'];\n"
        "    expect(f()).toEqual(lyrics);\n  });\n"
        "  test('expression', () => expect(g()).toBe(3));\n"
        "  test('reused', () => {\n    const v = 'x';\n    expect(f(v)).toEqual(v);\n  });\n"
        "});\n"
    )
    toks, tests = mutants_jest.tests_of(spec)
    spots = [mutants_jest.target(toks, t) for t in tests]
    literals = [toks[s.literal].text if s and s.literal else None for s in spots]
    assert literals == ["'y'", "3", None]


def test_jest_copies_change_a_word_to_another_word_of_the_spec() -> None:
    """A string expectation's copies change one word to another word of the spec, the
    call's own input first: no copy reads as a typo of the original (a forgery that reads the
    spec and keeps the value whose words are all real picked the original out of every group
    when a copy changed one letter), and overlap with the input does not tell them apart.
    Nor does place: the first test of a describe was always real when copies went after one."""
    task = _task("javascript__word-tally")
    spec = next(iter(_hidden(task).values()))
    vocabulary = text_vocabulary(spec)
    given = dict(re.findall(r"mostCommon\('([^']*)'\)\)\.toEqual\('(\w*)'\)", spec))
    from_input = first_is_copy = 0
    for seed in range(20):
        derived = mutants_jest.derive(spec, task.fail_to_pass, random.Random(seed), 4)
        assert derived is not None
        # Copies go before or after a test of the describe: the first test may be one.
        _, tests = mutants_jest.tests_of(derived.text)
        first_is_copy += tests[0].id in derived.ids
        found = re.findall(r"mostCommon\('([^']*)'\)\)\.toEqual\('(\w*)'\)", derived.text)
        copies = [(c, w) for c, w in found if given[c] != w]
        # An empty expectation has no copy (any would be longer): the other three share four.
        assert len(found) == len(given) + 4 and len(copies) == 4, found
        assert {c for c, _ in copies} == {c for c, w in given.items() if w}
        for call, want in copies:
            assert want.lower() in vocabulary, (call, want)
            from_input += want.lower() in call.lower()
    assert from_input > 50 and 0 < first_is_copy < 20


def test_a_comment_above_a_jest_test_goes_with_its_copies() -> None:
    """A copy carries the comment lines right above the test it copies, and no copy is placed
    between a test and its comment: the test under a comment is not the real one (with copies
    that had none, it always was)."""
    task = _task("javascript__word-tally")
    spec = next(iter(_hidden(task).values()))
    note = "  // Letters only; case folds.\n  /* Both kinds of comment. */\n"
    spec = spec.replace("  xtest('case is ignored'", note + "  xtest('case is ignored'")
    spec = spec.replace("  xit('ties go", "  // Alphabetical.\n  xit('ties go")
    for seed in range(20):
        derived = mutants_jest.derive(spec, task.fail_to_pass, random.Random(seed), 4)
        assert derived is not None
        copies = derived.sources.count("most common word > case is ignored")
        assert derived.text.count(note) == 1 + copies, derived.text
        for comment, call in ((note, "'Go go GO stop'"), ("// Alphabetical.\n", "'pear apple")):
            for at in [m.end() for m in re.finditer(re.escape(comment), derived.text)]:
                member = derived.text[at : derived.text.index("});", at)]
                assert re.match(r"\s*x?(test|it)\(", member) and call in member, derived.text


def test_unknown_passing_ids_and_the_package_result() -> None:
    """A passing id the harness neither planted nor lists is tampering (a failing one is not);
    a Go package's own result is that of its tests other than the canaries."""
    known = ["TestA", "TestA/x", "pkg"]
    assert unexpected({"TestA/y": TestStatus.PASSED}, known, "/") is None
    assert unexpected({"TestOld": TestStatus.FAILED}, known, "/") is None
    assert "TestOld" in (unexpected({"TestOld": TestStatus.PASSED}, known, "/") or "")
    # Catch2 reports a test case's assertions outside its sections (the check every test ends
    # with) under the test case's name: the test a listed section belongs to is known.
    sections = ["z.global#drinks/Drinks water"]
    assert unexpected({"z.global#drinks": TestStatus.PASSED}, sections, "/") is None
    assert unexpected({"z.global#other": TestStatus.PASSED}, sections, "/") is not None
    go = _task("go__digit-sum")
    canary = derive_canary(go, _hidden(go), random.Random(1))
    assert canary is not None
    in_run = with_canary(go, canary)
    log = '{"Action":"fail","Package":"digitsum","Elapsed":0.1}\n'
    statuses = {t: TestStatus.PASSED for t in in_run.fail_to_pass if "/" in t or t.startswith("T")}
    statuses.update({**dict.fromkeys(canary.ids, TestStatus.FAILED), "digitsum": TestStatus.FAILED})
    settled, why = settle(statuses, log, "go", in_run, canary)
    assert settled["digitsum"] is TestStatus.PASSED and why is None
    # Unknown ids count in the polyglot format's own (hardened) run only.
    odd = {**statuses, "TestDigitSum": TestStatus.PASSED}
    assert "TestDigitSum" in (settle(odd, log, "go", in_run, canary)[1] or "")
    assert settle(odd, log, "go", in_run, canary, hardened=False)[1] is None
    # A build failure: the canaries failed with it, no tampering.
    settled, why = settle({"digitsum": TestStatus.ERROR}, log, "go", in_run, canary)
    assert {settled[i] for i in canary.ids} == {TestStatus.ERROR} and why is None
    # Jest: a spec that failed to run (reported by its file) ran no canary either; a run that
    # reports a test the harness neither planted nor lists (a published title) is tampered.
    js = _task("javascript__digit-sum")
    js_canary = derive_canary(js, _hidden(js), random.Random(1))
    assert js_canary is not None
    js_run = with_canary(js, js_canary)
    failed = {"digit-sum.spec.js": TestStatus.ERROR}
    settled, why = settle(failed, "", "jest", js_run, js_canary)
    assert {settled[i] for i in js_canary.ids} == {TestStatus.ERROR} and why is None
    forged = {
        **dict.fromkeys(js_run.fail_to_pass, TestStatus.FAILED),
        js.fail_to_pass[0]: TestStatus.PASSED,
    }
    assert js.fail_to_pass[0] in (settle(forged, "", "jest", js_run, js_canary)[1] or "")
    # Only the polyglot format's own commands are rewritten, each of the three languages'.
    assert harden("go test ./...", "go", ["a_test.go"]) is None
    assert harden(go.test_spec.command, "go", ["elsewhere/a_test.go"]) is None
    for instance_id, log_format in (("rust__digit-sum", "cargo"), ("cpp__digit-sum", "junit")):
        task = _task(instance_id)
        script = harden(task.test_spec.command, log_format, list(_hidden(task)))
        assert script is not None and "rm -f -- " in script, instance_id
    # Rust's tests one at a time: a copy beside the test it copies raced on fixed file names
    # (Exercism's grep: a panic while dropping aborted the binary, canaries went unreported).
    rust = _task("rust__digit-sum")
    assert "--test-threads=1" in (
        harden(rust.test_spec.command, "cargo", list(_hidden(rust))) or ""
    )
    cpp = _task("cpp__digit-sum")
    script = harden(cpp.test_spec.command, "junit", list(_hidden(cpp))) or ""
    assert script.index("rm -f -- digit_sum_test.cpp") < script.index("./build/digit-sum")


#: Each language's attacks and whether the integrity check calls them tampered: the forgeries
#: that print results are; the one whose file read finds nothing runs the real tests (one
#: passes: the stub's ``None`` for a negative number), and the one that includes the test file
#: does not compile. ``None``: either.
ATTACKS: dict[str, list[tuple[str, bool | None]]] = {
    # GO_READ_TESTS: tampered (no test ran, the canaries are missing) or, when the hardened
    # build did not finish under load (seen once in CI at load 9), unresolved; reward 0 either way.
    "go__digit-sum": [("GO_READ_TESTS", None), ("GO_KNOWN_NAMES", True), ("GO_EMBED", True)],
    "rust__digit-sum": [
        ("RUST_READ_TESTS", False),
        ("RUST_KNOWN_NAMES", True),
        ("RUST_INCLUDE", False),
        # An answer equal to anything passes the copies whose expectation changed.
        ("RUST_ALWAYS_EQUAL", True),
    ],
    "javascript__digit-sum": [
        ("JS_NEUTER_EXPECT", True),
        ("JS_EXTEND_MATCHERS", True),
    ],
}


@pytest.mark.parametrize("instance_id", sorted(ATTACKS))
async def test_forged_results_earn_nothing(instance_id: str, tmp_path: Path) -> None:
    """One sandbox per language (reset between gradings, as a pooled sandbox is): each attack
    resolves where nothing checks the run, and earns nothing through the integrity check."""
    task = _task(instance_id)
    _need(task.language)
    async with create_sandbox({"type": "local", "root": str(tmp_path)}, task) as sandbox:
        for attack, tampered in ATTACKS[instance_id]:
            patch = _attack(task, getattr(forgery, attack))
            plain = await evaluate(sandbox, task, model_patch=patch)
            assert plain.resolved and rewards.tests_score(plain) == 1.0, (attack, plain.log[-3000:])
            await sandbox.reset()
            graded = await grade_candidate(sandbox, task, patch)
            await sandbox.reset()
            assert graded.infrastructure_error is None, (attack, graded.infrastructure_error)
            assert not graded.resolved, (attack, graded.log[-3000:])
            assert rewards.tests_score(graded) == 0.0, attack
            if tampered is not None:
                assert (graded.tampered is not None) is tampered, (attack, graded.tampered)
            if tampered:
                assert rewards.tests_score(graded, "fraction") == 0.0, attack
            else:
                assert graded.fail_to_pass_fraction <= 0.25, attack


async def test_an_answer_equal_to_anything_earns_nothing_in_cpp(tmp_path: Path) -> None:
    """C++ (red team redteam7): the header declares the function to return a type whose
    ``operator==`` always says yes. It resolves where nothing checks the run; through the
    integrity check the copies expecting another value pass too: tampered, reward 0."""
    task = _task("cpp__digit-sum")
    _need(task.language)
    folder = SUITE / "src" / "cpp" / "exercises" / "practice" / "digit-sum"
    patch = "".join(
        forgery.solution_patch(
            task, (folder / name).read_text(), text, f"{folder.relative_to(SUITE / 'src')}/{name}"
        )
        for name, text in (
            ("digit_sum.h", forgery.CPP_ALWAYS_EQUAL_HEADER),
            ("digit_sum.cpp", forgery.CPP_ALWAYS_EQUAL_SOURCE),
        )
    )
    async with create_sandbox({"type": "local", "root": str(tmp_path)}, task) as sandbox:
        plain = await evaluate(sandbox, task, model_patch=patch)
        assert plain.resolved, plain.log[-3000:]
        await sandbox.reset()
        graded = await grade_candidate(sandbox, task, patch)
    assert graded.infrastructure_error is None, graded.infrastructure_error
    assert not graded.resolved and graded.tampered is not None, graded.log[-3000:]
    assert rewards.tests_score(graded, "fraction") == 0.0


def test_rust_names_drawn_for_copies_and_renamed_tests_compile() -> None:
    """Names are drawn from the file's own words, digits included (Exercism's ocr-numbers has
    ``recognizes_0`` to ``recognizes_9``): a Rust function may not start with a digit, and a
    name that did (``5_only_garbled_numbers_with_question_mark``, in 121 of 300 draws before)
    made the file fail to compile, a correct answer graded as a build failure."""
    names = [
        "input_with_lines_not_multiple_of_four_is_error",
        *(f"recognizes_{n}" for n in (*range(10), 110101100)),
        "replaces_only_garbled_numbers_with_question_mark",
        "recognizes_string_of_decimal_numbers",
    ]
    text = "use ocr::convert;\n" + "".join(
        f'\n#[test]\nfn {name}() {{\n    assert_eq!(convert("{i}"), Ok("{i}".to_string()));\n}}\n'
        for i, name in enumerate(names)
    )
    for seed in range(60):  # about 40 % of the draws failed before: all 60 pass by chance never
        derived = mutants_native.derive(text, "rust", names, random.Random(seed), 4)
        assert derived is not None
        drawn = re.findall(r"^fn (\w+)\(", derived.text, re.MULTILINE)
        assert all(re.fullmatch(r"[a-z_][a-z0-9_]*", n) for n in drawn), (seed, drawn)


GO_TABLES = {
    # keyed rows, a trailing comma, DeepEqual: the `want` column changes in every row
    "keyed": (
        """	for _, c := range []struct {
		in   string
		want string
	}{
		{in: "a b", want: "ab"},
		{want: "m", in: "a"},
	} {
		if got := Join(c.in); !reflect.DeepEqual(got, c.want) {
			t.Errorf("Join(%q) = %v, want %v", c.in, got, c.want)
		}
	}""",
        ['"ab"', '"m"'],
    ),
    "positional": (
        """	for _, tc := range []struct {
		a, b int
		want int
	}{
		{1, 2, 3},
		{-4, 4, 0},
	} {
		if got := Add(tc.a, tc.b); got != tc.want {
			t.Fatalf("got %d", got)
		}
	}""",
        ["3", "0"],
    ),
    # a condition with && may not run the comparison: left alone
    "conjunction": (
        """	for _, tc := range []struct{ in, want string }{{"a", "b"}} {
		if ok := Check(tc.in); ok && Get(tc.in) != tc.want {
			t.Fatal("no")
		}
	}""",
        None,
    ),
    # the expected field is also an input: left alone
    "input": (
        """	for _, tc := range []struct{ in, want string }{{"a", "b"}} {
		if got := F(tc.in, tc.want); got != tc.want {
			t.Fatal("no")
		}
	}""",
        None,
    ),
}


@pytest.mark.parametrize("case", sorted(GO_TABLES))
def test_go_copies_change_a_case_tables_expected_column(case: str) -> None:
    """Which Go tables have an expected column a copy may change (one row of it)."""
    from crl_worker.harness.expectations_go import changed_row, table_column, table_rows

    body, expected = GO_TABLES[case]
    spans = table_column(body)
    assert (spans and [body[a:b] for a, b in spans]) == expected or spans == expected
    table = table_rows(body)
    if expected and table is not None:
        # No subtest names (no `t.Run`): the copy is the canary, one row changed, when the
        # test is listed as a whole.
        assert changed_row(table, random.Random(1), 3, listed=lambda _: False) == (None, [])
        subtest, versions = changed_row(table, random.Random(1), 3)
        assert subtest is None and len(set(versions)) == 3
    if case == "keyed":
        named = body.replace("\t\tif got", "\t\tt.Run(c.in, func(t *testing.T) {\n\t\tif got", 1)
        named = named.replace("c.want)\n\t\t}\n\t}", "c.want)\n\t\t}\n\t\t})\n\t}", 1)
        named_table = table_rows(named)
        assert named_table is not None
        subtest, versions = changed_row(named_table, random.Random(1), 3)
        assert subtest in ("a_b", "a") and len(versions) == 3 and len(set(versions)) == 3
        for version in versions:
            cells = [version[a:b] for a, b in table_column(version) or []]
            assert sum(c != e for c, e in zip(cells, expected, strict=True)) == 1


@pytest.mark.parametrize("language", ["rust", "cpp"])
def test_every_rust_and_cpp_test_ends_with_the_same_check(language: str) -> None:
    """As in Go (tests/test_canary_go.py): a copy of a test with no literal expectation used to
    end with a comparison of two constants that the compiler folds into an unconditional
    failure no real test has. Every test, real or copy, now ends with one check of two cells of
    one array the file declares (Rust: read through ``black_box``): different only for a copy
    that fails by it, equal for the real tests and for copies whose expectation changed."""
    if language == "rust":
        text = "use m::f;\n" + "".join(
            f"\n#[test]\nfn {n}() {{\n    assert!(f({i}).is_some());\n}}\n"
            for i, n in enumerate(["first", "second", "third"])
        )
        check = re.compile(r"assert_eq!\(std::hint::black_box\(&(\w+)\)\[(\d+)\], .*\[(\d+)\]\);")
        declared = re.compile(r"^static (\w+): \[u32; (\d+)\] = \[([\d, ]+)\];$", re.MULTILINE)
    else:
        text = '#include "m.h"\n' + "".join(
            f'\nTEST_CASE("{n}") {{\n    REQUIRE_FALSE(f({i}).empty());\n}}\n'
            for i, n in enumerate(["first", "second", "third"])
        )
        check = re.compile(r"REQUIRE\((\w+)\[(\d+)\] == \w+\[(\d+)\]\);")
        declared = re.compile(r"^int (\w+)\[(\d+)\] = \{([\d, ]+)\};$", re.MULTILINE)
    for seed in range(6):
        derived = mutants_native.derive(text, language, ["first", "second"], random.Random(seed), 4)
        assert derived is not None
        array = declared.search(derived.text)
        assert array is not None, derived.text
        values = [int(v) for v in array.group(3).split(", ")]
        tests = mutants_native.tests_of(derived.text, language)
        assert len(tests) == 7 and len(values) == 2 * 7
        if language == "cpp":  # declared before the first test that reads it
            assert derived.text.index(array.group(0)) < derived.text.index("TEST_CASE")
        failing = set()
        for test in tests:
            found = [m for line in test.body if (m := check.search(line))]
            assert len(found) == 1 and found[0].group(1) == array.group(1), test.body
            a, b = int(found[0].group(2)), int(found[0].group(3))
            if values[a] != values[b]:
                failing.add(test.name)
        assert failing == set(derived.ids), (seed, failing, derived.ids)

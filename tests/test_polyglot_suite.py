"""The bundled polyglot suite (examples/suites/polyglot): Go, Rust, C++ and JavaScript exercises whose
tests are withheld until grading, loaded by the ``polyglot`` format, checked in local
sandboxes with the real toolchains, and run by ``crl bench`` with the gold agent."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

from crl_worker.bench.summary import build_summary
from crl_worker.harness.check import check_tasks
from crl_worker.harness.diffsplit import touched_files
from crl_worker.harness.integrity import source_diff
from crl_worker.rollout.results import AttemptResult
from crl_worker.tasks import selection
from crl_worker.tasks.loaders import LoadResult, load_records, load_tasks
from crl_worker.tasks.model import Task
from crl_worker.tasks.records import rows_with_refs
from tests.fixtures.fetched import require
from tests.fixtures.paths import import_file

#: The Go, Rust and C++ toolchains (tests/fixtures/schedule.py: the ``go`` group).
pytestmark = pytest.mark.go

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "examples" / "suites" / "polyglot"
TOOLS = {"go": "go", "rust": "cargo", "cpp": "cmake", "javascript": "npm"}
POLYGLOT_REPO = "Aider-AI/polyglot-benchmark"


def _suite() -> dict[str, Task]:
    loaded = load_tasks(SUITE / "tasks.jsonl", "polyglot")
    assert loaded.ok, loaded.errors
    return {t.instance_id: t for t in loaded.tasks}


def _env() -> dict[str, str]:
    """This process's environment without the settings that would point ``crl bench`` at a
    cluster, a model or other results."""
    dropped = ("CRL_POOL_URL", "CRL_RESULTS_DIR", "CRL_CONFIG", "CRL_API_KEY", "OPENAI_API_KEY")
    return {k: v for k, v in os.environ.items() if k not in dropped}


def _script() -> ModuleType:
    """scripts/polyglot_tasks.py, imported."""
    return import_file("polyglot_tasks_script", ROOT / "scripts" / "polyglot_tasks.py")


def _convert_two(tmp_path: Path, *selection: str) -> LoadResult:
    """Two exercises of Aider's benchmark (its fetched copy) converted by the script, loaded."""
    copy = require(POLYGLOT_REPO)[POLYGLOT_REPO]
    out = tmp_path / "converted"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "polyglot_tasks.py"), str(copy), "--out",
         str(out), *selection],
        capture_output=True, text=True, timeout=900, env=_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 converted, 0 skipped" in done.stdout
    loaded = load_tasks(out / "tasks.jsonl", "polyglot")
    assert loaded.ok and len(loaded.tasks) == 2, loaded.errors
    return loaded


def _need(*languages: str) -> None:
    """Skip without the languages' toolchains; under CI=true their absence is a failure."""
    missing = [TOOLS[x] for x in languages if shutil.which(TOOLS[x]) is None]
    if missing and os.environ.get("CI"):
        pytest.fail(f"CI needs {', '.join(missing)} for the polyglot suite")
    if missing:
        pytest.skip(f"no {', '.join(missing)} on PATH")


def test_records_hide_the_tests_and_the_reference(tmp_path: Path) -> None:
    tasks = _suite()
    assert sorted(tasks) == [
        f"{lang}__{name}"
        for lang in ("cpp", "go", "javascript", "rust")
        for name in ("digit-sum", "word-tally")
    ]
    for task in tasks.values():
        where = task.metadata["exercise_dir"]
        assert task.task_type == "implement" and task.fail_to_pass
        assert task.problem_statement.startswith("# Instructions")
        hidden = touched_files(task.test_patch)
        assert hidden and all(
            p.startswith(where) and ("test" in p or p.endswith(".spec.js")) for p in hidden
        )
        # The bundle's only commit holds neither the tests nor the reference solution.
        clone = tmp_path / task.instance_id
        subprocess.run(["git", "clone", "-q", task.source or "", str(clone)], check=True)
        files = subprocess.run(
            ["git", "-C", str(clone), "log", "--all", "--format=", "--name-only"],
            capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        assert not set(hidden) & set(files) and not [f for f in files if "/.meta/" in f]
        assert subprocess.run(
            ["git", "-C", str(clone), "rev-list", "--all", "--count"],
            capture_output=True, text=True, check=True,
        ).stdout.strip() == "1"  # fmt: skip
    go = tasks["go__digit-sum"]
    assert go.test_spec.log_format == "go" and "go test -json" in go.test_spec.command
    assert "TestDigitSum/several_digits" in go.fail_to_pass
    assert tasks["rust__digit-sum"].test_spec.log_format == "cargo"
    assert "--include-ignored" in tasks["rust__digit-sum"].test_spec.command
    cpp = tasks["cpp__word-tally"]
    assert cpp.test_spec.log_format == "junit" and cpp.test_spec.junit_reports
    assert "word-tally.global#ties_go_to_the_first_alphabetically" in cpp.fail_to_pass
    js = tasks["javascript__word-tally"]
    assert js.test_spec.log_format == "jest" and "--runTestsByPath word-tally.spec.js" in (
        js.test_spec.command
    )
    # Tests Exercism marks xtest/xit run too (the reference run listed them).
    assert "most common word > ties go to the first alphabetically" in js.fail_to_pass
    assert len(js.fail_to_pass) == 5


def test_bad_polyglot_records_name_the_field() -> None:
    rows = [
        {"language": "go", "exercise": "x", "base_commit": "a" * 40},
        {"language": "javascript", "exercise": "x", "base_commit": "a" * 40},
        {"language": "kotlin", "exercise": "x", "base_commit": "a" * 40},
    ]
    result = load_records(rows_with_refs(rows), "polyglot")
    assert not result.tasks
    assert [e.field for e in result.errors] == ["FAIL_TO_PASS", "FAIL_TO_PASS", "language"]
    assert "javascript exercises need FAIL_TO_PASS" in str(result.errors[1])
    assert "kotlin" in str(result.errors[2]) and "javascript" in str(result.errors[2])


async def test_reference_resolves_and_stub_does_not(tmp_path: Path) -> None:
    """Go, Rust and JavaScript (a few seconds each): the stub that does not compile (Go), the
    one that panics (Rust) and the one that throws (JavaScript) are graded unresolved, not
    environment errors."""
    _need("go", "rust", "javascript")
    tasks = _suite()
    picked = [tasks["go__word-tally"], tasks["rust__digit-sum"], tasks["javascript__word-tally"]]
    results = await check_tasks(
        picked, jobs=2, sandbox_config={"type": "local", "root": str(tmp_path)}
    )
    for found in results:
        assert found.ok, (found.instance_id, found.problems)
        assert (found.gold_verdict, found.no_patch_verdict) == ("resolved", "unresolved")


def test_crl_bench_gold_reports_each_language(tmp_path: Path) -> None:
    """One exercise per language through ``crl bench --agent gold``; summary.json has a row per
    language. The C++ one compiles Catch2's main (the slow part: tens of seconds); the
    JavaScript one runs the shared Jest (installed once per machine under the cache)."""
    _need("go", "rust", "cpp", "javascript")
    picked = ["go__digit-sum", "rust__word-tally", "cpp__digit-sum", "javascript__digit-sum"]
    done = subprocess.run(
        [sys.executable, "-m", "crl_cli", "bench", str(ROOT / "examples" /
         "local-benchmark-polyglot.yaml"), "--agent", "gold", "--results", str(tmp_path / "out"),
         "-o", "json", *[a for i in picked for a in ("-i", i)]],
        capture_output=True, text=True, timeout=900, cwd=ROOT, env=_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["resolved"] == 4 and summary["errored"] == 0
    assert {(r["language"], r["resolved"]) for r in summary["languages"]} == {
        ("cpp", 1),
        ("go", 1),
        ("javascript", 1),
        ("rust", 1),
    }
    assert "javascript" in done.stdout or "javascript" in done.stderr


async def test_real_exercises_convert_and_check(tmp_path: Path) -> None:
    """Two exercises of Aider's benchmark (its fetched copy): converted by the script, then the
    reference resolves and the stub does not (Go's stub does not even compile)."""
    _need("go", "rust")
    loaded = _convert_two(tmp_path, "-l", "go", "-l", "rust", "-e", "bowling")
    go = next(t for t in loaded.tasks if t.language == "go")
    assert "TestScore/all_strikes_is_a_perfect_game" in go.fail_to_pass
    assert touched_files(go.test_patch) == [
        "go/exercises/practice/bowling/bowling_test.go",
        "go/exercises/practice/bowling/cases_test.go",
    ]
    results = await check_tasks(
        loaded.tasks, jobs=2, sandbox_config={"type": "local", "root": str(tmp_path)}
    )
    for found in results:
        assert found.ok, (found.instance_id, found.problems)
        assert (found.gold_verdict, found.no_patch_verdict) == ("resolved", "unresolved")


def test_rust_manifests_get_the_reference_solutions_crates() -> None:
    """The crates of ``.meta/Cargo-example.toml`` join the stub's ``Cargo.toml`` (under its own
    ``[dependencies]``, not a later table), so that runs without network can build the
    reference; a Rust record's install fetches what a base's ``Cargo.lock`` pins."""
    merge = _script().with_example_dependencies
    stub = '[package]\nname = "robot-name"\n\n[lints.clippy]\nnew_without_default = "allow"\n'
    text, crates = merge(
        stub, '[package]\nname = "robot-name"\n\n[dependencies]\nrand = "0.3.12"\n'
    )
    assert crates == ["rand"]
    assert tomllib.loads(text)["dependencies"] == {"rand": "0.3.12"}
    assert tomllib.loads(text)["lints"] == {"clippy": {"new_without_default": "allow"}}
    stub = '[package]\nname = "grep"\n\n[dependencies]\nanyhow = "1.0"\n\n[lints]\n'
    example = (
        '[dependencies]\nanyhow = "2"\nthiserror = { version = "1.0", default-features = false }\n'
    )
    text, crates = merge(stub, example)
    assert crates == ["anyhow", "thiserror"]
    assert tomllib.loads(text)["dependencies"] == {
        "anyhow": "1.0",  # the stub's own version stays
        "thiserror": {"version": "1.0", "default-features": False},
    }
    assert merge(stub, "") == (stub, ["anyhow"])
    assert merge('[package]\nname = "x"\n', "") == ('[package]\nname = "x"\n', [])
    rust = _suite()["rust__digit-sum"]
    assert any("cargo fetch --locked" in command for command in rust.install)


async def test_rust_exercises_with_crates_convert_and_check(tmp_path: Path) -> None:
    """Aider's Rust exercises that use crates (its fetched copy; the crates come from the
    registry once, at conversion and at each sandbox's install): the reference resolves offline
    in a local sandbox and the stub does not."""
    _need("rust")
    loaded = _convert_two(tmp_path, "-l", "rust", "-e", "gigasecond", "-e", "robot-name")
    results = await check_tasks(
        loaded.tasks, jobs=2, sandbox_config={"type": "local", "root": str(tmp_path)}
    )
    for found in results:
        assert found.ok, (found.instance_id, found.problems)
        assert (found.gold_verdict, found.no_patch_verdict) == ("resolved", "unresolved")


def test_python_and_java_exercises_convert(tmp_path: Path) -> None:
    """Python's and Java's conversion on real exercises of the fetched copy, no sandbox: Python's
    FAIL_TO_PASS from a real pytest run, one id per test; Java's base with a pom.xml instead of
    the Gradle wrapper (and the libraries build.gradle names), its editor file kept, the
    reference's helper class a new file, and Maven selecting the ids once Exercism's
    ``@Disabled`` lines are deleted (Maven itself, tens of seconds, runs in ``crl tasks
    check``: docs/validation.md)."""
    copy = require(POLYGLOT_REPO)[POLYGLOT_REPO]
    src = tmp_path / "src"
    src.mkdir()
    folders = [f"{lang}/exercises/practice/{name}" for lang, name in
               (("python", "wordy"), ("java", "bowling"), ("java", "alphametics"),
                ("java", "hangman"))]  # fmt: skip
    archive = subprocess.run(["git", f"--git-dir={copy}", "archive", "HEAD", *folders],
                             capture_output=True, check=True)  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
    script = _script()

    record = script.convert(script.read_exercise(src, "python", "wordy"), tmp_path / "out")
    (wordy,) = load_records(rows_with_refs([record]), "polyglot").tasks
    test_file = f"{folders[0]}/wordy_test.py"
    assert touched_files(wordy.test_patch) == [test_file]
    assert touched_files(wordy.patch) == [f"{folders[0]}/wordy.py"]
    assert f"{test_file}::WordyTest::test_addition" in wordy.fail_to_pass
    assert len(wordy.fail_to_pass) > 20 and selection.test_arguments(wordy) == sorted(
        wordy.fail_to_pass
    )

    java = script.read_exercise(src, "java", "alphametics")
    (tmp_path / "alphametics").mkdir()
    base, _, test_patch = script.stage(java, tmp_path / "alphametics")
    checkout = tmp_path / "alphametics" / "repo" / folders[2]
    assert (checkout / "pom.xml").is_file() and (checkout / "build.gradle").is_file()
    assert not (checkout / "gradlew").exists() and not (checkout / "gradle").exists()
    assert (checkout / "src/main/java/UnsolvablePuzzleException.java").is_file()  # editor file
    assert touched_files(test_patch) == [f"{folders[2]}/src/test/java/AlphameticsTest.java"]
    bowling = script.read_exercise(src, "java", "bowling")
    (tmp_path / "bowling").mkdir()
    _, patch, _ = script.stage(bowling, tmp_path / "bowling")
    assert touched_files(patch) == [f"{folders[1]}/src/main/java/{n}.java"
                                    for n in ("BowlingGame", "Frame")]  # fmt: skip
    assert "new file mode" in patch[patch.index("Frame.java") :]  # a helper of the reference
    # hangman's build.gradle names a library of its own (rxjava) beside the test ones.
    hangman = script.pom(script.read_exercise(src, "java", "hangman"))
    assert "<artifactId>rxjava</artifactId>\n      <version>2.2.12</version>" in hangman

    row = {"language": "java", "exercise": "alphametics", "base_commit": base,
           "test_patch": test_patch, "build_system": "maven",
           "FAIL_TO_PASS": ["AlphameticsTest#testThreeLetters", "AlphameticsTest#testTenLetters"]}  # fmt: skip
    (task,) = load_records(rows_with_refs([row]), "polyglot").tasks
    assert selection.test_arguments(task) == ["AlphameticsTest#testTenLetters+testThreeLetters"]
    command, run = task.test_spec.command, tmp_path / "alphametics" / "run" / folders[2]
    assert command.startswith(f"cd {folders[2]} && find src/test") and " mvn " in command
    before = (run / "src/test/java/AlphameticsTest.java").read_text()
    unskip = command.split(" && ")[1]
    subprocess.run(["bash", "-c", unskip], cwd=run, check=True)
    after = (run / "src/test/java/AlphameticsTest.java").read_text()
    assert before.count("@Disabled(") > 5 and "@Disabled(" not in after
    assert after.count("@Test") == before.count("@Test")


def test_agent_added_tests_and_build_files_are_not_part_of_an_answer() -> None:
    """What the integrity check strips before confirming a verdict: a Go test file of the
    agent's own (its TestMain could print framed results), the module and build files, Rust
    integration tests and Cargo configuration, C++ test sources and Catch2's main."""
    where = "go/exercises/practice/bowling"
    diff = "".join(
        f"diff --git a/{p} b/{p}\nnew file mode 100644\n--- /dev/null\n+++ b/{p}\n@@ -0,0 +1 @@\n+x\n"
        for p in (
            f"{where}/bowling.go",
            f"{where}/zz_test.go",
            f"{where}/go.mod",
            "rust/exercises/practice/bowling/src/lib.rs",
            "rust/exercises/practice/bowling/tests/extra.rs",
            "rust/exercises/practice/bowling/.cargo/config.toml",
            "rust/exercises/practice/bowling/build.rs",
            "cpp/exercises/practice/clock/clock.cpp",
            "cpp/exercises/practice/clock/test/tests-main.cpp",
            "cpp/exercises/practice/clock/CMakeLists.txt",
        )
    )
    source, stripped = source_diff(diff)
    assert touched_files(source) == [
        f"{where}/bowling.go",
        "rust/exercises/practice/bowling/src/lib.rs",
        "cpp/exercises/practice/clock/clock.cpp",
    ]
    assert len(stripped) == 7


def test_summary_counts_each_language() -> None:
    def attempt(instance: str, language: str | None, resolved: bool | None) -> AttemptResult:
        return AttemptResult(
            instance_id=instance, repo=f"o/{instance}", attempt=0, resolved=resolved,
            exit_reason="submitted" if resolved is not None else "infrastructure_error",
            infrastructure_error=None if resolved is not None else "sandbox died",
            language=language,
        )  # fmt: skip

    records = [
        attempt("go-a", "go", True),
        attempt("go-b", "go", False),
        attempt("rust-a", "rust", None),
        attempt("old", None, True),  # written before results recorded the language
    ]
    summary = build_summary(records, suite="s", model="m", total=4, ks=[1], finished=True)
    assert summary["languages"] == [
        {"language": "go", "instances": 2, "attempts": 2, "resolved": 1, "errored": 0,
         "resolveRate": 0.5},
        {"language": "rust", "instances": 1, "attempts": 1, "resolved": 0, "errored": 1,
         "resolveRate": None},
    ]  # fmt: skip
    assert [r["repo"] for r in summary["repositories"]] == ["o/go-a", "o/go-b", "o/old", "o/rust-a"]

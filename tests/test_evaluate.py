"""The evaluation engine end to end: real fixture repositories in real local sandboxes.

Every test builds a fixture repository (tests/fixtures), starts a local sandbox on it and runs the
harness as training and benchmarks do. The Java test runs Maven (the first run on a machine
fetches the plugins from Maven Central). SWE-bench Lite instances run when ``CRL_GIT_MIRROR``
holds their repositories (github.com is not reachable everywhere).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from crl_worker.harness.check import check_task
from crl_worker.harness.evaluate import evaluate, touched_files
from crl_worker.harness.result import EvalResult, TestStatus
from crl_worker.sandbox.base import Sandbox
from crl_worker.sandbox.registry import create_sandbox
from crl_worker.tasks.loaders import load_tasks
from crl_worker.tasks.model import Task
from tests.fixtures.paths import ROOT, run
from tests.fixtures.repos import (
    ROMANKIT_FAIL_TO_PASS,
    ROMANKIT_PASS_TO_PASS,
    FixtureRepo,
    java_repo,
    python_repo,
    unittest_repo,
)

LITE = ROOT.parent / "shared" / "data" / "swe-bench-lite.jsonl"
#: The command line, run as the tests' interpreter runs it.
CRL = [sys.executable, "-m", "crl_cli"]


def statuses(result: EvalResult) -> dict[str, TestStatus]:
    return {o.name: o.status for o in [*result.fail_to_pass, *result.pass_to_pass]}


@pytest.fixture
def roman(tmp_path: Path) -> FixtureRepo:
    return python_repo(tmp_path)


@pytest.fixture
async def sandbox(roman: FixtureRepo) -> AsyncIterator[Sandbox]:
    async with create_sandbox({"type": "local"}, roman.task) as box:
        yield box


# --- verdicts -----------------------------------------------------------------------------------


async def test_gold_patch_resolves(roman: FixtureRepo, sandbox: Sandbox) -> None:
    assert not sandbox.dirty
    result = await evaluate(sandbox, roman.task, model_patch=roman.task.patch)
    # The hidden tests sat beside the candidate's code: a pool replaces this sandbox rather
    # than reset it for a later episode of the task (the code could have copied them where a
    # reset does not reach).
    assert sandbox.dirty
    assert result.infrastructure_error is None, result.log
    assert result.patch_applied
    assert result.resolved, result.log
    assert set(statuses(result).values()) == {TestStatus.PASSED}
    assert (result.fail_to_pass_fraction, result.pass_to_pass_fraction) == (1.0, 1.0)
    # Only the test file the test patch touches goes to pytest, not its data file.
    assert result.test_command.endswith(" tests/test_numerals.py")
    assert result.exit_code == 0
    assert "27 passed" in result.log
    assert result.duration > 0


async def test_no_patch_leaves_fail_to_pass_failing(roman: FixtureRepo, sandbox: Sandbox) -> None:
    result = await evaluate(sandbox, roman.task)
    assert not result.resolved
    assert result.infrastructure_error is None
    assert {o.status for o in result.fail_to_pass} == {TestStatus.FAILED}
    assert {o.status for o in result.pass_to_pass} == {TestStatus.PASSED}
    assert result.fail_to_pass_fraction == 0.0
    assert result.exit_code == 1


async def test_wrong_and_breaking_patches(roman: FixtureRepo, sandbox: Sandbox) -> None:
    wrong = await evaluate(sandbox, roman.task, model_patch=roman.patches["wrong"])
    assert not wrong.resolved and wrong.patch_applied
    assert wrong.fail_to_pass_fraction == 3 / 8
    assert wrong.pass_to_pass_fraction == 1.0
    await sandbox.reset()
    breaking = await evaluate(sandbox, roman.task, model_patch=roman.patches["breaking"])
    assert not breaking.resolved
    broken = [o.name for o in breaking.pass_to_pass if o.status is not TestStatus.PASSED]
    assert broken == ["tests/test_numerals.py::test_from_roman_tolerant[lower case]"]


async def test_patch_that_does_not_apply_is_the_models_fault(
    roman: FixtureRepo, sandbox: Sandbox
) -> None:
    # The patch removes a line the file does not have: no fuzz factor gets around that.
    garbage = roman.task.patch.replace("-    for char in numeral:", "-    for letter in numeral:")
    assert garbage != roman.task.patch
    result = await evaluate(sandbox, roman.task, model_patch=garbage)
    assert not result.patch_applied
    assert not result.resolved
    assert result.infrastructure_error is None
    assert "does not apply" in result.log
    # The working tree is untouched: the harness left no half-applied patch behind.
    assert await sandbox.diff() == ""


async def test_fuzzy_patch_applies_with_patch_fallback(
    roman: FixtureRepo, sandbox: Sandbox
) -> None:
    # A context line the model misremembered: git apply refuses, patch --fuzz copes.
    fuzzy = roman.task.patch.replace(
        "\n     numeral = text.strip().upper()\n", "\n     numeral = text.upper().strip()\n"
    )
    assert fuzzy != roman.task.patch
    result = await evaluate(sandbox, roman.task, model_patch=fuzzy)
    assert result.patch_applied
    assert result.resolved, result.log
    assert "applied by patch --fuzz" in result.log


async def test_agent_edits_count_and_test_tampering_does_not(
    roman: FixtureRepo, sandbox: Sandbox
) -> None:
    # The agent "fixes" the tests instead of the code, and creates the file the test patch
    # adds: the harness resets both before applying the test patch.
    await sandbox.write_file("tests/test_numerals.py", b"def test_nothing():\n    pass\n")
    await sandbox.write_file("tests/data/years.txt", b"1 I\n")
    tampered = await evaluate(sandbox, roman.task)
    assert not tampered.resolved
    assert {o.status for o in tampered.fail_to_pass} == {TestStatus.FAILED}

    # The agent edits the code in the sandbox; no patch is passed.
    await sandbox.reset()
    fixed = (roman.path / "src/romankit/numerals.py").read_text()
    await sandbox.run(f"git apply <<'EOF'\n{roman.task.patch}EOF")
    assert (await sandbox.read_file("src/romankit/numerals.py")).decode() != fixed
    # The agent wandered off: the harness runs in the workdir anyway.
    await sandbox.run("cd /")
    result = await evaluate(sandbox, roman.task)
    assert result.resolved, result.log


async def test_shell_functions_and_aliases_of_the_agent_are_ignored(
    roman: FixtureRepo, sandbox: Sandbox
) -> None:
    python = roman.task.test.command.split()[0]
    listed = [*roman.task.fail_to_pass, *roman.task.pass_to_pass]
    fake = "".join(f"echo 'PASSED {t}'; " for t in listed)
    # A reward hack: fake the test runner (bash takes a path as a function name) and git.
    await sandbox.run(f"{python}() {{ {fake}}}; git() {{ :; }}; alias patch=true")
    assert "PASSED" in (await sandbox.run(f"{python} -m pytest")).output
    hacked = await evaluate(sandbox, roman.task)
    assert not hacked.resolved
    assert {o.status for o in hacked.fail_to_pass} == {TestStatus.FAILED}
    # The functions are still the agent's in its session; the harness's own git worked.
    gold = await evaluate(sandbox, roman.task, model_patch=roman.task.patch)
    assert gold.resolved, gold.log


async def test_ids_cut_at_the_first_space_resolve(roman: FixtureRepo, sandbox: Sandbox) -> None:
    cut = roman.task.model_copy(
        update={
            "fail_to_pass": [t.split(" ", 1)[0] for t in ROMANKIT_FAIL_TO_PASS],
            "pass_to_pass": [t.split(" ", 1)[0] for t in ROMANKIT_PASS_TO_PASS],
        }
    )
    gold = await evaluate(sandbox, cut, model_patch=cut.patch)
    assert gold.resolved, gold.log
    await sandbox.reset()
    none = await evaluate(sandbox, cut)
    assert not none.resolved
    assert none.fail_to_pass[0].name == "tests/test_numerals.py::test_from_roman_tolerant[padded"
    assert none.fail_to_pass[0].status is TestStatus.FAILED


async def test_a_reset_sandbox_grades_like_a_fresh_one(roman: FixtureRepo) -> None:
    async with create_sandbox({"type": "local"}, roman.task) as used:
        first_gold = await evaluate(used, roman.task, model_patch=roman.task.patch)
        await used.reset()
        reused_none = await evaluate(used, roman.task)
        await used.reset()
        reused_gold = await evaluate(used, roman.task, model_patch=roman.task.patch)
    async with create_sandbox({"type": "local"}, roman.task) as fresh:
        fresh_none = await evaluate(fresh, roman.task)
    assert statuses(reused_gold) == statuses(first_gold)
    assert statuses(reused_none) == statuses(fresh_none)
    assert reused_gold.resolved and not reused_none.resolved


# --- harness failures ---------------------------------------------------------------------------


async def test_a_test_run_past_its_limit_is_an_infrastructure_error(
    roman: FixtureRepo, sandbox: Sandbox
) -> None:
    slow = roman.task.model_copy(
        update={
            "test": roman.task.test.model_copy(
                update={"command": "sleep 60; " + roman.task.test.command}
            )
        }
    )
    result = await evaluate(sandbox, slow, model_patch=slow.patch, timeout=2)
    assert result.infrastructure_error is not None
    assert "timed out" in result.infrastructure_error
    assert not result.resolved
    assert result.duration < 30
    # The session survives the interrupt: the same sandbox grades the next rollout.
    assert sandbox.alive
    await sandbox.reset()
    again = await evaluate(sandbox, roman.task, model_patch=roman.task.patch)
    assert again.resolved, again.log


async def test_a_dead_sandbox_is_an_infrastructure_error(roman: FixtureRepo) -> None:
    box = create_sandbox({"type": "local"}, roman.task)
    await box.start()
    await box.close()
    result = await evaluate(box, roman.task, model_patch=roman.task.patch)
    assert result.infrastructure_error is not None
    assert not result.resolved


async def test_a_test_patch_that_cannot_apply_is_the_tasks_fault(
    roman: FixtureRepo, sandbox: Sandbox
) -> None:
    # A hunk for a file the base commit does not have.
    stray = (
        "diff --git a/tests/helpers.py b/tests/helpers.py\n--- a/tests/helpers.py\n"
        "+++ b/tests/helpers.py\n@@ -1 +1 @@\n-OLD = 1\n+OLD = 2\n"
    )
    broken = roman.task.model_copy(update={"test_patch": roman.task.test_patch + stray})
    result = await evaluate(sandbox, broken, model_patch=broken.patch)
    assert result.infrastructure_error is not None
    assert "test patch" in result.infrastructure_error


def test_touched_files_of_a_test_patch(roman: FixtureRepo) -> None:
    assert touched_files(roman.task.test_patch) == [
        "tests/data/years.txt",
        "tests/test_numerals.py",
    ]
    renamed = (
        "diff --git a/old.py b/new.py\nsimilarity index 90%\nrename from old.py\nrename to new.py\n"
    )
    assert touched_files(renamed) == ["old.py", "new.py"]


# --- other runners ------------------------------------------------------------------------------


async def test_unittest_fixture(tmp_path: Path) -> None:
    fixture = unittest_repo(tmp_path)
    async with create_sandbox({"type": "local"}, fixture.task) as box:
        gold = await evaluate(box, fixture.task, model_patch=fixture.task.patch)
        await box.reset()
        none = await evaluate(box, fixture.task)
    assert gold.resolved, gold.log
    assert not none.resolved
    assert {o.status for o in none.fail_to_pass} == {TestStatus.FAILED}


@pytest.mark.skipif(shutil.which("mvn") is None, reason="Maven (mvn) is not installed")
async def test_java_fixture_through_maven(tmp_path: Path) -> None:
    fixture = java_repo(tmp_path)
    async with create_sandbox({"type": "local"}, fixture.task) as box:
        gold = await evaluate(box, fixture.task, model_patch=fixture.task.patch)
        await box.reset()
        none = await evaluate(box, fixture.task)
    assert gold.resolved, gold.log
    assert set(statuses(gold).values()) == {TestStatus.PASSED}
    # Durations come from Surefire's report; the parametrized F2P test stands for its runs.
    assert all(o.duration is not None for o in gold.pass_to_pass)
    assert not none.resolved
    assert {o.status for o in none.fail_to_pass} == {TestStatus.FAILED}
    assert {o.status for o in none.pass_to_pass} == {TestStatus.PASSED}


@pytest.mark.skipif(shutil.which("mvn") is None, reason="Maven (mvn) is not installed")
async def test_java_stale_reports_are_not_read(tmp_path: Path) -> None:
    fixture = java_repo(tmp_path)
    # Without the fixture's own "rm -rf target/surefire-reports": the harness must clear them.
    task = fixture.task.model_copy(
        update={"test": fixture.task.test.model_copy(update={"pre": []})}
    )
    cases = "".join(
        f'<testcase classname="com.example.text.StringsTest" name="{t.split("#")[1]}"/>'
        for t in [*task.fail_to_pass, *task.pass_to_pass]
    )
    forged = f'<testsuite name="com.example.text.StringsTest">{cases}</testsuite>'
    async with create_sandbox({"type": "local"}, task) as box:
        # The agent leaves a report saying everything passed, and code that does not compile.
        await box.write_file(
            "target/surefire-reports/TEST-com.example.text.StringsTest.xml", forged.encode()
        )
        await box.write_file("src/main/java/com/example/text/Strings.java", b"class Broken {")
        result = await evaluate(box, task)
    assert "stale junit reports removed: 1" in result.log
    assert not result.resolved
    assert {o.status for o in result.fail_to_pass} == {TestStatus.MISSING}
    assert "COMPILATION ERROR" in result.log or "BUILD FAILURE" in result.log


# --- task validation (crl tasks check) ----------------------------------------------------------


async def test_check_finds_a_flaky_test(roman: FixtureRepo, tmp_path: Path) -> None:
    counter = tmp_path / "runs"
    # The third test run (the second gold run) leaves one PASS_TO_PASS test out.
    flaky_command = (
        f'n=$(cat {counter} 2>/dev/null || echo 0); echo $((n + 1)) > {counter}; extra=""; '
        'if [ "$n" -eq 2 ]; then '
        "extra=--deselect=tests/test_numerals.py::test_to_roman_rejects_non_integers; fi; "
        + roman.task.test.command.replace("{tests}", "$extra {tests}")
    )
    flaky = roman.task.model_copy(
        update={"test": roman.task.test.model_copy(update={"command": flaky_command})}
    )
    # The counter outlives each sandbox, so they must see the host's files (no confinement).
    found = await check_task(flaky, runs=2, sandbox_config={"type": "local", "isolation": "none"})
    assert found.flaky == ["tests/test_numerals.py::test_to_roman_rejects_non_integers"]
    assert not found.ok
    assert found.gold_verdict == "mixed"
    assert found.no_patch_verdict == "unresolved"
    steady = await check_task(roman.task, runs=1)
    assert steady.ok, steady.problems
    assert (steady.gold_verdict, steady.no_patch_verdict) == ("resolved", "unresolved")


def test_crl_tasks_check_on_a_task_file(tmp_path: Path) -> None:
    roman = python_repo(tmp_path / "a")
    calendar = unittest_repo(tmp_path / "b")
    # A task whose lists are wrong: a FAIL_TO_PASS test that does not exist.
    wrong_lists = roman.task.model_copy(
        update={
            "instance_id": "crl-fixtures__romankit-wrong-lists",
            "fail_to_pass": [*roman.task.fail_to_pass, "tests/test_numerals.py::test_ghost"],
        }
    )
    task_file = tmp_path / "tasks.jsonl"
    lines = [t.model_dump_json() for t in (roman.task, calendar.task, wrong_lists)]
    lines.append('{"instance_id": "half-a-record"}')
    task_file.write_text("\n".join(lines) + "\n")
    assert len(load_tasks(task_file, "task").tasks) == 3

    done = run(
        [
            *CRL,
            "tasks",
            "check",
            str(task_file),
            "--format",
            "task",
            "-o",
            "json",
        ],
        timeout=600,
    )
    assert done.returncode == 1, done.stderr
    rows = {r["instance_id"]: r for r in map(json.loads, done.stdout.splitlines())}
    assert rows["crl-fixtures__romankit-1"]["ok"] is True
    # Ids with brackets survive JSON output exactly (rich markup would eat `[...]`).
    reported = {o["name"] for o in rows["crl-fixtures__romankit-1"]["gold_runs"][0]["fail_to_pass"]}
    assert reported == set(roman.task.fail_to_pass)
    assert any("[" in name for name in reported)
    assert rows["crl-fixtures__calendarkit-1"]["ok"] is True
    ghost = rows["crl-fixtures__romankit-wrong-lists"]
    assert ghost["ok"] is False and ghost["gold"] == "unresolved"
    assert any("test_ghost (MISSING)" in p for p in ghost["problems"])
    (unreadable,) = (r for key, r in rows.items() if "half-a-record" in key)
    assert unreadable["ok"] is False and "repo" in unreadable["problems"][0]

    only = run(
        [
            *CRL,
            "tasks",
            "check",
            str(task_file),
            # No --format: the native records are recognised by their `test` object.
            "--instance",
            "crl-fixtures__calendarkit-1",
        ],
        timeout=600,
        env={**os.environ, "COLUMNS": "200"},
    )
    # The unreadable record names another instance, so the filter leaves it out (a record
    # whose id could not be read would still count).
    assert only.returncode == 0, only.stdout
    assert "crl-fixtures__calendarkit-1" in only.stdout
    assert "romankit-1 " not in only.stdout
    assert "1 of 1 instances valid" in only.stdout


def test_crl_tasks_check_usage_errors(tmp_path: Path) -> None:
    missing = run([*CRL, "tasks", "check", str(tmp_path / "nope.jsonl")])
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    (tmp_path / "t.jsonl").write_text("")
    unknown = run([*CRL, "tasks", "check", str(tmp_path / "t.jsonl"), "--format", "nonsense"])
    assert unknown.returncode == 2 and "unknown format" in unknown.stderr
    bad_sandbox = run(
        [*CRL, "tasks", "check", str(tmp_path / "t.jsonl"), "--sandbox", '{"type": "nonsense"}']
    )
    assert bad_sandbox.returncode == 2 and "unknown sandbox type" in bad_sandbox.stderr


# --- SWE-bench Lite (needs the repositories) ----------------------------------------------------

LITE_INSTANCES = ["pallets__flask-4992", "pytest-dev__pytest-7373", "sympy__sympy-21614"]


def _mirror_has(repo_key: str) -> bool:
    mirror = os.environ.get("CRL_GIT_MIRROR")
    if not mirror:
        return False
    if "://" in mirror:
        return (
            subprocess.run(
                ["git", "ls-remote", f"{mirror.rstrip('/')}/{repo_key}.git"],
                capture_output=True,
                check=False,
                timeout=60,
            ).returncode
            == 0
        )
    return (Path(mirror) / f"{repo_key}.git").exists()


@pytest.mark.skipif(not LITE.exists(), reason=f"{LITE} (SWE-bench Lite) is not on this machine")
@pytest.mark.parametrize("instance_id", LITE_INSTANCES)
async def test_swe_bench_lite_instance(instance_id: str) -> None:
    from crl_worker.api.common import TaskFilter
    from crl_worker.tasks.loaders import load_tasks

    loaded = load_tasks(LITE, "swe-bench", TaskFilter(instance_ids=[instance_id]))
    assert loaded.ok, loaded.errors
    (task,) = loaded.tasks
    if not _mirror_has(f"{task.owner}__{task.name}"):
        pytest.skip(
            f"{task.repo} is not in $CRL_GIT_MIRROR (set it to a directory or URL prefix holding "
            f"{task.owner}__{task.name}.git; github.com is not reachable here)"
        )
    task = Task.model_validate(task.model_dump())
    async with create_sandbox({"type": "local", "missing_python": "fallback"}, task) as box:
        gold = await evaluate(box, task, model_patch=task.patch)
        await box.reset()
        none = await evaluate(box, task)
    assert gold.resolved, gold.log[-5000:]
    assert not none.resolved

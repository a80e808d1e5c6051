"""Real benchmark instances graded end to end in local sandboxes, from fetched public repositories.

Three kinds, each kept to a few instances (perf/real_instances.md has the whole table, made by
perf/real_instances.py; docs/validation.md says how to run it):

- **Bringing your own repository**: bug fixes of two repositories no recipe knows (click,
  marshmallow), written once as raw SWE-bench-format records (the generic recipe plus per-record
  keys) and once as hand-written native task records. Both files give the same verdicts and the
  same per-test statuses: gold resolves, no patch does not.
- **SWE-bench Lite** instances from ``shared/data`` with their recipes.
- **GitBug-Java** bugs, read from GitBug-Java's own data files, built with Maven (dependencies
  from Maven Central).

Nothing of those repositories is committed: the patches and records are made at run time from
the fetched copies (tests/fixtures/fetched.py), and each test skips, naming what is missing, on a
machine without them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from crl_worker.harness.check import InstanceCheck, check_tasks
from crl_worker.sandbox import interpreters
from crl_worker.tasks import Task, load_tasks
from tests.fixtures.fetched import git_mirror, require
from tests.fixtures.real_instances import (
    DATA,
    PAIRS,
    gitbug_records,
    native_record,
    swebench_record,
)


def _write(path: Path, records: Sequence[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _load(path: Path, format: str) -> list[Task]:
    result = load_tasks(path, format, strict=True)  # type: ignore[arg-type]
    return result.tasks


def _require_tools(tasks: Sequence[Task]) -> None:
    """Skip, saying why, when this machine lacks a task's interpreter or build tool."""
    for task in tasks:
        if task.language == "java":
            if shutil.which("mvn") is None or shutil.which("java") is None:
                pytest.skip(f"{task.instance_id} needs java and mvn on PATH")
        else:
            try:
                interpreters.find_python(task.python)
            except interpreters.MissingInterpreterError as exc:
                pytest.skip(str(exc))


def _statuses(check: InstanceCheck) -> list[dict[str, str]]:
    return [
        {o.name: o.status.value for o in [*r.fail_to_pass, *r.pass_to_pass]}
        for r in [*check.gold, *check.no_patch]
    ]


async def test_swebench_records_of_unfamiliar_repositories_grade_like_native_ones(
    mirror: Path, tmp_path: Path
) -> None:
    """A raw SWE-bench-format file of repositories no recipe knows and a hand-written native
    file of the same bugs give the same verdicts and per-test statuses: gold resolves, no patch
    does not, every listed test is found."""
    copies = require(*(p.repo for p in PAIRS))
    git_mirror(copies, mirror)
    raw = _load(
        _write(tmp_path / "raw.jsonl", [swebench_record(p, copies[p.repo]) for p in PAIRS]),
        "swe-bench",
    )
    assert all(t.metadata.get("recipe") == "generic" for t in raw)
    _require_tools(raw)
    native = _load(
        _write(tmp_path / "native.jsonl", [native_record(p, copies[p.repo]) for p in PAIRS]),
        "task",
    )
    sandbox = {"type": "local", "root": str(tmp_path / "sandboxes")}
    raw_checks = await check_tasks(raw, sandbox_config=sandbox, jobs=2)
    native_checks = await check_tasks(native, sandbox_config=sandbox, jobs=2)
    for pair, from_raw, from_native in zip(PAIRS, raw_checks, native_checks, strict=True):
        assert from_raw.ok, (pair.repo, from_raw.problems)
        assert from_native.ok, (pair.repo, from_native.problems)
        verdicts = (from_raw.gold_verdict, from_raw.no_patch_verdict)
        assert verdicts == ("resolved", "unresolved"), pair.repo
        assert verdicts == (from_native.gold_verdict, from_native.no_patch_verdict)
        assert _statuses(from_raw) == _statuses(from_native), pair.repo
        # Every listed test was found (prefix ids included), in both runs.
        for statuses in _statuses(from_raw):
            assert "MISSING" not in statuses.values(), (pair.repo, statuses)
        no_patch = {o.name: o.status.value for o in from_raw.no_patch[0].fail_to_pass}
        assert set(no_patch.values()) == {"FAILED"}, (pair.repo, no_patch)


def _shared_records(path: Path, ids: Sequence[str]) -> list[dict[str, Any]]:
    if not path.is_file():
        pytest.skip(f"{path} is not present (shared/data)")
    records = {r["instance_id"]: r for r in map(json.loads, path.read_text().splitlines())}
    return [records[i] for i in ids]


#: SWE-bench Lite instances that build here and finish in seconds (docs/validation.md).
LITE_IDS = ("pallets__flask-4992", "pytest-dev__pytest-7373")


async def test_swebench_lite_instances_resolve_with_gold_and_not_without(
    mirror: Path, tmp_path: Path
) -> None:
    records = _shared_records(DATA / "swe-bench-lite.jsonl", LITE_IDS)
    git_mirror(require(*{r["repo"] for r in records}), mirror)
    tasks = _load(_write(tmp_path / "lite.jsonl", records), "swe-bench")
    _require_tools(tasks)
    sandbox = {"type": "local", "root": str(tmp_path / "sandboxes")}
    checks = await check_tasks(tasks, sandbox_config=sandbox, jobs=2)
    for check in checks:
        assert check.ok, (check.instance_id, check.problems)
        assert (check.gold_verdict, check.no_patch_verdict) == ("resolved", "unresolved")


#: Lite instances that failed with the gold patch until their recipe learned about today's
#: packages (docs/validation.md, "Harness bugs these runs found"), one test each so that each
#: skips on its own when its repository was not fetched:
#: - sphinx-doc__sphinx-8595 (Sphinx 3.5): docutils 0.22 has no docutils.utils.roman, every
#:   test's app failed to start (ERROR in fixture setup) until the recipe capped docutils;
#: - pylint-dev__pylint-6506 (2.14): pylint's editable install became an import hook, pylint
#:   found none of its checkers through sys.path, and the configuration tests failed until the
#:   recipe installed it in setuptools' compat mode.
RECIPE_REGRESSIONS = ("sphinx-doc__sphinx-8595", "pylint-dev__pylint-6506")


@pytest.mark.parametrize("instance_id", RECIPE_REGRESSIONS)
async def test_recipe_fixes_hold_on_real_instances(
    instance_id: str, mirror: Path, tmp_path: Path
) -> None:
    records = _shared_records(DATA / "swe-bench-lite.jsonl", [instance_id])
    git_mirror(require(records[0]["repo"]), mirror)
    tasks = _load(_write(tmp_path / "lite.jsonl", records), "swe-bench")
    _require_tools(tasks)
    sandbox = {"type": "local", "root": str(tmp_path / "sandboxes")}
    (check,) = await check_tasks(tasks, sandbox_config=sandbox)
    assert check.ok, (check.instance_id, check.problems)
    assert (check.gold_verdict, check.no_patch_verdict) == ("resolved", "unresolved")


#: GitBug-Java bugs built with Maven in seconds (docs/validation.md): (data file, fixing commit).
GITBUG_BUGS = (("davidmoten-word-wrap", "e59eedf0bac7"),)


async def test_gitbug_java_bugs_resolve_with_gold_and_not_without(
    mirror: Path, tmp_path: Path
) -> None:
    (data,) = require("gitbugactions/gitbug-java").values()
    records = gitbug_records(data, GITBUG_BUGS)
    git_mirror(require(*{r["repository"] for r in records}), mirror)
    tasks = _load(_write(tmp_path / "gitbug.jsonl", records), "gitbug-java")
    _require_tools(tasks)
    sandbox = {"type": "local", "root": str(tmp_path / "sandboxes")}
    for check in await check_tasks(tasks, sandbox_config=sandbox):
        assert check.ok, (check.instance_id, check.problems)
        assert (check.gold_verdict, check.no_patch_verdict) == ("resolved", "unresolved")


#: QuixBugs programs whose buggy versions fail fast (no timeout to wait for): Python's gcd
#: recurses without end (RecursionError), Java's gcd is graded by Maven.
QUIXBUGS_PROGRAMS = ("gcd",)


async def test_quixbugs_programs_convert_and_resolve_with_gold_and_not_without(
    mirror: Path, tmp_path: Path
) -> None:
    """scripts/quixbugs_tasks.py on the fetched QuixBugs repository: the agent's checkout holds
    neither the corrected program nor the tests, the gold patch resolves and no patch does not."""
    (copy,) = require("jkoppel/QuixBugs").values()
    out = tmp_path / "quixbugs"
    args = [str(copy), "--out", str(out), "-l", "python"]
    for program in QUIXBUGS_PROGRAMS:
        args += ["-p", program]
    script = Path(__file__).resolve().parents[1] / "scripts" / "quixbugs_tasks.py"
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    tasks = _load(out / "tasks.jsonl", "quixbugs")
    assert [t.instance_id for t in tasks] == [f"quixbugs-python-{p}" for p in QUIXBUGS_PROGRAMS]
    _require_tools(tasks)
    sandbox = {"type": "local", "root": str(tmp_path / "sandboxes")}
    for check in await check_tasks(tasks, sandbox_config=sandbox):
        assert check.ok, (check.instance_id, check.problems)
        assert (check.gold_verdict, check.no_patch_verdict) == ("resolved", "unresolved")


def _bugsinpy(project: str, repo: str, bugs: Sequence[str], out: Path, *extra: str) -> list[Task]:
    """scripts/bugsinpy_tasks.py on the fetched BugsInPy and project copies; the loaded tasks."""
    copies = require("soarsmu/BugsInPy", repo)
    script = Path(__file__).resolve().parents[1] / "scripts" / "bugsinpy_tasks.py"
    args = [str(copies["soarsmu/BugsInPy"]), str(copies[repo]), "--project", project, *extra]
    for bug in bugs:
        args += ["--bug", bug]
    done = subprocess.run([sys.executable, str(script), *args, "--out", str(out)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return _load(out / "tasks.jsonl", "bugsinpy")


def test_bugsinpy_conversion_follows_tox_and_carries_the_tests_data(tmp_path: Path) -> None:
    """cookiecutter-1 (BugsInPy runs it with ``tox``): the record runs pytest on the ids and
    installs tox's ``[testenv]`` deps; its test patch carries the JSON file the new test reads,
    which BugsInPy's own checkout leaves out (without it the gold patch fails too)."""
    (task,) = _bugsinpy("cookiecutter", "cookiecutter/cookiecutter", ["1"], tmp_path)
    assert task.test.command.startswith("pytest ") and task.python == "3.6"
    assert "-rtest_requirements.txt" in task.install[0]
    assert task.install[1] == "python -m pip install -e ."
    assert "+++ b/tests/test-generate-context/non_ascii.json" in task.test_patch
    assert "cookiecutter/generate.py" in task.patch and "generate.py" not in task.test_patch
    assert task.metadata["requirements_left_out"][0].startswith("-e git+")


async def test_bugsinpy_bugs_resolve_with_gold_and_not_without(
    mirror: Path, tmp_path: Path
) -> None:
    """PySnooper-3 through scripts/bugsinpy_tasks.py (Python 3.8, with the test dependency
    BugsInPy does not list): the gold patch resolves and no patch does not. The smallest
    install of the valid bugs in docs/validation.md."""
    tasks = _bugsinpy("PySnooper", "cool-RR/PySnooper", ["3"], tmp_path / "records",
                      "--requirement", "python-toolbox")  # fmt: skip
    _require_tools(tasks)
    (task,) = tasks
    assert task.fail_to_pass == ["tests/test_pysnooper.py::test_file_output"]
    assert "python-toolbox pytest" in task.install[0]
    sandbox = {"type": "local", "root": str(tmp_path / "sandboxes")}
    (check,) = await check_tasks(tasks, sandbox_config=sandbox)
    assert check.ok, (check.instance_id, check.problems)
    assert (check.gold_verdict, check.no_patch_verdict) == ("resolved", "unresolved")

"""Bringing your own repository: a SWE-bench record of a repository no recipe knows, graded in
local sandboxes the way a new user would (issue 18).

The fixture (``tests/fixtures/unitconv``, built by :func:`tests.fixtures.repos.unitconv_record`)
is a src-layout package with a real bug, and its record has no ``source``: the repository is found
under ``$CRL_GIT_MIRROR`` by name, as docs/tasks.md tells a user to set it up. The host is made
hostile the way a developer's machine is: a ``pytest`` on ``PATH`` whose environment holds the
*fixed* release of the package, so a sandbox that borrows the host's tools grades the bug as
fixed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from rich.console import Console

from crl_worker import rewards
from crl_worker.agent.gold import GoldPolicy
from crl_worker.api.common import AgentSpec
from crl_worker.bench.runner import BenchmarkRunner
from crl_worker.bench.summary import summary_table
from crl_worker.errors import TaskFormatError
from crl_worker.harness.check import InstanceCheck, judge
from crl_worker.harness.evaluate import evaluate
from crl_worker.harness.result import EvalResult, TestStatus
from crl_worker.rollout.results import ResultsStore
from crl_worker.rollout.setup import Sandboxes
from crl_worker.sandbox import interpreters
from crl_worker.sandbox.base import Sandbox
from crl_worker.sandbox.local import SYSTEM_PATH
from crl_worker.sandbox.registry import create_sandbox
from crl_worker.tasks.formats import convert_swebench
from crl_worker.tasks.loaders import load_records
from crl_worker.tasks.model import Task
from crl_worker.tasks.records import ConvertOptions, RecordRef
from tests.fixtures.paths import ROOT, run
from tests.fixtures.repos import (
    UNITCONV_PASS_TO_PASS,
    RecordRepo,
    fixed_copy,
    git,
    unitconv_record,
)

CRL = [sys.executable, "-m", "crl_cli"]
SKIPPED_P2P = UNITCONV_PASS_TO_PASS[1]


def _convert(record: dict[str, object]) -> Task:
    return convert_swebench(record, RecordRef("index 0"), ConvertOptions())


def _mirror(fixture: RecordRepo, root: Path) -> Path:
    """A ``$CRL_GIT_MIRROR`` folder holding the fixture as ``byo__unitconv.git``."""
    root.mkdir(parents=True, exist_ok=True)
    git(root, "clone", "--quiet", "--bare", str(fixture.path), "byo__unitconv.git")
    return root


def _host_env(fixture: RecordRepo, root: Path) -> Path:
    """A virtual environment like a developer's: pytest and the *fixed* release of the package
    (not editable). Returns its ``bin`` folder."""
    released = fixed_copy(fixture, root / "released")
    venv = root / "hostenv"
    python = interpreters.find_python(None).path
    uv = interpreters.find_uv()
    if uv is not None:
        subprocess.run([uv, "venv", "-q", "--python", python, str(venv)], check=True)
        install = [uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python")]
    else:
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        install = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*install, "pytest", str(released)], check=True, timeout=300)
    return venv / "bin"


@pytest.fixture(scope="module")
def unitconv(tmp_path_factory: pytest.TempPathFactory) -> RecordRepo:
    return unitconv_record(tmp_path_factory.mktemp("unitconv"))


@pytest.fixture(scope="module")
def hostile_path(unitconv: RecordRepo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``PATH`` with the host environment's ``bin`` first (where a user's ``pytest`` lives)."""
    host_bin = _host_env(unitconv, tmp_path_factory.mktemp("host"))
    yield f"{host_bin}{os.pathsep}{os.environ['PATH']}"


# --- the default interpreter and the worker's own environment ---------------------------------


def _clear_caches() -> None:
    interpreters.find_python.cache_clear()
    interpreters.available.cache_clear()


def test_default_interpreter_is_python3_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A task without a version gets ``python3`` on PATH, not the newest interpreter found."""
    _clear_caches()
    own = {str(Path(sys.prefix) / "bin")}
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p not in own)
    python3 = shutil.which("python3", path=path)
    assert python3 is not None, "no python3 on PATH"
    expected = interpreters.probe(python3)
    assert expected is not None
    assert interpreters.find_python(None).version == expected.version
    # A newer interpreter elsewhere (pyenv's versions) does not change that.
    newest = max(interpreters.available(path), key=lambda i: i.version)
    if newest.version[:2] != expected.version[:2]:
        assert interpreters.find_python(None).version != newest.version


def test_interpreter_search_skips_the_workers_own_venv(monkeypatch: pytest.MonkeyPatch) -> None:
    """Even first on PATH, the worker's virtual environment is no task's interpreter."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("the tests do not run in a virtual environment")
    own_bin = str(Path(sys.prefix) / "bin")
    monkeypatch.setenv("PATH", f"{own_bin}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("VIRTUAL_ENV", sys.prefix)
    _clear_caches()
    try:
        wanted = f"{sys.version_info[0]}.{sys.version_info[1]}"
        for version in (None, wanted):
            found = interpreters.find_python(version)
            assert not found.path.startswith(own_bin), (version, found)
    finally:
        _clear_caches()


def test_an_interpreter_behind_a_launcher_script_runs_without_it(tmp_path: Path) -> None:
    """A launcher script (what pyenv's shims are) keeps its path as found, but virtual
    environments are made with the interpreter it runs: each shim call cost a sandbox about
    0.3 s of shell scripts."""
    real = interpreters.probe(sys.executable)
    assert real is not None and real.command == sys.executable
    launcher = tmp_path / "python3"
    launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    launcher.chmod(0o755)
    found = interpreters.probe(str(launcher))
    assert found is not None and found.version == real.version
    assert found.path == str(launcher) and found.command == sys.executable


# --- the local sandbox's PATH ---------------------------------------------------------------


async def test_host_tools_do_not_leak_into_the_sandbox(
    unitconv: RecordRepo, hostile_path: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", hostile_path)
    task = _convert(unitconv.record).model_copy(
        update={"source": str(unitconv.path), "install": []}
    )
    async with create_sandbox({"type": "local", "root": str(tmp_path)}, task) as sandbox:
        path = (await sandbox.run("echo $PATH")).output.strip().split(os.pathsep)
        assert path[0].endswith("/venv/bin")
        assert path[-4:] == SYSTEM_PATH.split(os.pathsep)
        assert not any("hostenv" in p for p in path)
        # The host's pytest is not reachable; git and patch (the harness's tools) are.
        assert (await sandbox.run("command -v pytest")).exit_code != 0
        for tool in ("git", "patch"):
            assert (await sandbox.run(f"command -v {tool}")).exit_code == 0, tool


# --- the generic recipe, end to end -----------------------------------------------------------


def test_crl_tasks_check_grades_an_unfamiliar_repository(
    unitconv: RecordRepo, hostile_path: str, tmp_path: Path
) -> None:
    """``crl tasks check`` on a SWE-bench record of a repository without a recipe: the generic
    recipe installs pytest into the task's environment and runs it there, so the tests import the
    checkout (not the host's fixed release), the skipped PASS_TO_PASS test is graded skipped, and
    the instance validates. Before: resolved without the fix, and the skip graded missing."""
    records = tmp_path / "records.jsonl"
    records.write_text(json.dumps(unitconv.record) + "\n")
    env = {
        **os.environ,
        "PATH": hostile_path,
        "CRL_GIT_MIRROR": str(_mirror(unitconv, tmp_path / "mirror")),
        "CRL_CACHE_DIR": str(tmp_path / "cache"),
    }
    done = run(
        [*CRL, "tasks", "check", str(records), "--format", "swe-bench", "-o", "json"],
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (row,) = map(json.loads, done.stdout.splitlines())
    assert row["ok"] is True, row["problems"]
    assert (row["gold"], row["no_patch"]) == ("resolved", "unresolved")
    gold = {o["name"]: o["status"] for o in row["gold_runs"][0]["pass_to_pass"]}
    assert gold[SKIPPED_P2P] == TestStatus.SKIPPED
    (no_patch_f2p,) = row["no_patch_runs"][0]["fail_to_pass"]
    assert no_patch_f2p["status"] == TestStatus.FAILED


# --- runs that grade nothing ----------------------------------------------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def generic_sandbox(
    unitconv: RecordRepo, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[Task, Sandbox]]:
    task = _convert(unitconv.record).model_copy(update={"source": str(unitconv.path)})
    root = tmp_path_factory.mktemp("sandboxes")
    async with create_sandbox({"type": "local", "root": str(root)}, task) as sandbox:
        yield task, sandbox


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(
    ("change", "exit_code", "says"),
    [
        ({"command": "no-such-runner {tests}"}, 127, "command not found"),
        ({"command": "python -m pytest --no-such-option {tests}"}, 4, "usage error"),
        ({"command": "python -m pytest -rA -v -k no_such_test {tests}"}, 5, "no tests collected"),
        ({"test_patch": "badconftest"}, 4, "conftest.py"),
        # A test module that does not import here: pytest reports only the module (ERROR
        # tests/test_conv.py) and runs nothing (psf__requests-863 was graded "unresolved").
        ({"test_patch": "badimport"}, 2, "errors while collecting"),
    ],
    ids=["not-found", "usage", "nothing-collected", "conftest", "module-import"],
)
async def test_a_run_that_grades_nothing_is_an_environment_error(
    generic_sandbox: tuple[Task, Sandbox],
    unitconv: RecordRepo,
    change: dict[str, str],
    exit_code: int,
    says: str,
) -> None:
    task, sandbox = generic_sandbox
    await sandbox.reset()
    if "command" in change:
        task = task.model_copy(
            update={"test": task.test.model_copy(update={"command": change["command"]})}
        )
    else:
        task = task.model_copy(update={"test_patch": unitconv.patches[change["test_patch"]]})
    gold = await evaluate(sandbox, task, model_patch=task.patch)
    assert gold.exit_code == exit_code, gold.log
    assert gold.environment_error is not None and says in gold.environment_error
    assert f"exit {exit_code}" in gold.environment_error
    assert not gold.resolved
    # Rewards and the benchmark runner leave it out: it is no answer.
    assert gold.infrastructure_error is not None
    assert gold.fail_to_pass == [] and gold.pass_to_pass == []

    check = judge(InstanceCheck(instance_id=task.instance_id, gold=[gold]), task)
    assert check.gold_verdict == "environment-error"
    (problem,) = [p for p in check.problems if p.startswith("gold:")]
    assert f"exit {exit_code}" in problem and "log tail" in problem
    row = check.to_dict()
    assert row["gold"] == "environment-error"
    assert row["gold_runs"][0]["exit_code"] == exit_code
    assert row["gold_runs"][0]["log_tail"].strip()
    if change.get("test_patch") == "badconftest":
        assert "a_plugin_this_environment_lacks" in row["gold_runs"][0]["log_tail"]
    if change.get("test_patch") == "badimport":
        assert "a_dependency_this_environment_lacks" in row["gold_runs"][0]["log_tail"]


#: Candidate patches that keep every test from being reported: a conftest.py that does not
#: import (pytest exits 4), the same hidden from the working tree's diff, a package that no
#: longer imports (collection errors, exit 2).
BREAKING_PATCHES = {
    "conftest": (
        "diff --git a/conftest.py b/conftest.py\nnew file mode 100644\n--- /dev/null\n"
        "+++ b/conftest.py\n@@ -0,0 +1 @@\n+import a_module_the_candidate_made_up\n"
    ),
    # The same conftest.py, beside a .gitignore that ignores both: the working tree's diff
    # shows neither, so only the model patch says that anything changed.
    "hidden-conftest": (
        "diff --git a/tests/.gitignore b/tests/.gitignore\nnew file mode 100644\n"
        "--- /dev/null\n+++ b/tests/.gitignore\n@@ -0,0 +1,2 @@\n+.gitignore\n+conftest.py\n"
        "diff --git a/tests/conftest.py b/tests/conftest.py\nnew file mode 100644\n"
        "--- /dev/null\n+++ b/tests/conftest.py\n@@ -0,0 +1 @@\n"
        "+import a_module_the_candidate_made_up\n"
    ),
    "package": (
        "diff --git a/src/unitconv/broken.py b/src/unitconv/broken.py\nnew file mode 100644\n"
        "--- /dev/null\n+++ b/src/unitconv/broken.py\n@@ -0,0 +1 @@\n+def (:\n"
    ),
}


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("breaking", sorted(BREAKING_PATCHES))
async def test_a_candidate_that_breaks_the_test_run_is_graded_not_excused(
    generic_sandbox: tuple[Task, Sandbox], breaking: str
) -> None:
    """A run that reports nothing because of the candidate's own change is its answer: the
    tests run again at the base state, report there, and the candidate is graded (every test
    missing), never excused as an environment error that rewards would leave out."""
    task, sandbox = generic_sandbox
    await sandbox.reset()
    patch = BREAKING_PATCHES[breaking]
    if breaking == "package":  # the package must import the broken module
        init = (await sandbox.read_file("src/unitconv/__init__.py")).decode()
        await sandbox.write_file(
            "src/unitconv/__init__.py", (init + "\nfrom . import broken\n").encode()
        )
    result = await evaluate(sandbox, task, model_patch=patch)
    assert result.environment_error is None, result.log
    assert result.infrastructure_error is None
    assert not result.resolved
    assert {o.status for o in result.fail_to_pass} == {TestStatus.MISSING}
    if breaking != "package":  # pytest reports nothing at all: the control run decides
        assert "control run reported tests" in result.log
    assert rewards.tests_score(result) == 0.0


@pytest.mark.asyncio(loop_scope="module")
async def test_nothing_selected_runs_nothing(generic_sandbox: tuple[Task, Sandbox]) -> None:
    """docs/tasks.md: with nothing to select, the test command is not run (pytest without
    arguments would run the whole suite and grade it)."""
    task, sandbox = generic_sandbox
    await sandbox.reset()
    bare = task.model_copy(
        update={"test_patch": "", "fail_to_pass": ["test_c_to_f"], "pass_to_pass": []}
    )
    result = await evaluate(sandbox, bare, model_patch=task.patch)
    assert result.environment_error is not None and "no tests selected" in result.environment_error
    assert result.exit_code is None and result.test_command == ""
    assert not result.resolved


# --- a record's own harness keys --------------------------------------------------------------


def test_swebench_record_keys_are_honoured(unitconv: RecordRepo) -> None:
    record = {
        **unitconv.record,
        "python": "3.11",
        "pre_install": "apt-get --version",
        "pip_packages": "pytest==8.3.5 hypothesis",
        "install": ["python -m pip install -e .[test]"],
        "test_cmd": "python -m pytest -rA -v -o addopts=",
        "env": {"TZ": "UTC"},
    }
    task = _convert(record)
    assert task.python == "3.11"
    assert task.install == [
        "apt-get --version",
        "python -m pip install pytest==8.3.5 hypothesis",
        "python -m pip install -e .[test]",
    ]
    assert task.test.command == "python -m pytest -rA -v -o addopts= {tests}"
    assert task.env["TZ"] == "UTC"
    assert task.metadata["record_keys"] == [
        "python",
        "pre_install",
        "pip_packages",
        "install",
        "test_cmd",
        "env",
    ]
    for key in ("python", "test_cmd", "pre_install", "pip_packages"):
        assert key not in task.metadata or key == "record_keys"
    # Without them: the generic recipe, honest about it.
    plain = _convert(unitconv.record)
    assert plain.python is None and plain.metadata["recipe"] == "generic"
    assert plain.test.command.startswith("python -m pytest ")
    assert "record_keys" not in plain.metadata


def test_swebench_record_keys_that_cannot_be_honoured_are_refused(unitconv: RecordRepo) -> None:
    record = {**unitconv.record, "packages": "numpy scipy"}
    with pytest.raises(TaskFormatError, match=r"field .packages.*conda"):
        _convert(record)
    loaded = load_records(
        [(RecordRef("line 1"), record), (RecordRef("line 2"), unitconv.record)],
        "swe-bench",
    )
    assert len(loaded.tasks) == 1 and "packages" in str(loaded.errors[0])
    with pytest.raises(TaskFormatError, match="log_format"):
        _convert({**unitconv.record, "log_format": "tap"})


# --- docs/tasks.md ----------------------------------------------------------------------------


def test_the_documented_native_record_loads_and_has_every_field() -> None:
    """The native record in docs/tasks.md is a valid task, and its field table lists every
    field of the model."""
    text = (ROOT / "docs" / "tasks.md").read_text()
    section = text.split("### A native task record", 1)[1]
    example = section.split("```json", 1)[1].split("```", 1)[0]
    task = Task.model_validate_json(example)
    assert task.test.command
    table = section.split("```", 2)[2]
    for name in Task.model_fields:
        assert f"| `{name}`" in table, name
    for name in type(task.test).model_fields:
        assert f"`test.{name}`" in table, name
    for name in type(task.timeouts).model_fields:
        assert f"`timeouts.{name}`" in table, name


# --- rewards and the benchmark runner ---------------------------------------------------------


async def test_an_environment_error_is_never_scored_as_a_wrong_answer(
    unitconv: RecordRepo, tmp_path: Path
) -> None:
    """The gold agent on a task whose runner is missing: no verdict, no reward, counted apart in
    the summary (before: 'unresolved' with reward 0, the task's fault scored as the model's),
    not retried within the run (the same environment gives the same answer), and named in the
    text table (before: only the JSON had it)."""
    task = _convert(unitconv.record).model_copy(update={"source": str(unitconv.path)})
    broken = task.model_copy(
        update={"test": task.test.model_copy(update={"command": "no-such-runner {tests}"})}
    )
    store = ResultsStore(tmp_path / "results")
    store.open({"suite": "byo", "model": "gold", "agent": {"maxTurns": 5}})
    runner = BenchmarkRunner(
        [broken],
        agent=AgentSpec(max_turns=5),
        store=store,
        policy_factory=GoldPolicy,
        sandbox_factory=Sandboxes.make(None, {"type": "local", "root": str(tmp_path)}).factory,
        suite="byo",
        model="gold",
        parallelism=1,
        retries=2,
    )
    outcome = await runner.run()
    (result,) = outcome.records
    assert outcome.ran == 1, "an environment error is not retried within the run"
    assert len(store.results_file.read_text().splitlines()) == 1
    assert result.resolved is None and result.reward is None
    assert result.environment_error
    assert "exit 127" in (result.infrastructure_error or "")
    assert (outcome.summary["errored"], outcome.summary["environmentErrors"]) == (1, 1)
    assert outcome.summary["unresolved"] == 0 and outcome.summary["resolveRate"] is None
    console = Console(width=300, record=True)
    console.print(summary_table(outcome.summary))
    text = console.export_text()
    assert "1 attempts graded no test" in text and f"{broken.instance_id}#0" in text
    assert "exit 127" in text
    (trajectory,) = [json.loads(line) for line in store.trajectories_file.read_text().splitlines()]
    evaluation = EvalResult.model_validate(trajectory["evaluation"])
    assert rewards.tests_score(evaluation) is None


def test_crl_tasks_check_shows_an_environment_error_with_its_exit_code_and_log(
    unitconv: RecordRepo, tmp_path: Path
) -> None:
    """The table and the JSON of ``crl tasks check`` name the verdict, the exit code and the end
    of the log (before: 'unresolved' and every listed id MISSING, no exit code, no log)."""
    task = _convert(unitconv.record).model_copy(
        update={
            "source": str(unitconv.path),
            "install": [],
            "test": _convert(unitconv.record).test.model_copy(
                update={"command": "echo collecting; no-such-runner {tests}"}
            ),
        }
    )
    task_file = tmp_path / "tasks.jsonl"
    task_file.write_text(task.model_dump_json() + "\n")
    env = {**os.environ, "COLUMNS": "200", "CRL_CACHE_DIR": str(tmp_path / "cache")}
    table = run([*CRL, "tasks", "check", str(task_file)], timeout=600, env=env)
    assert table.returncode == 1, table.stdout + table.stderr
    assert "environment-error" in table.stdout
    assert "exit 127" in table.stdout and "command not found" in table.stdout
    assert "MISSING" not in table.stdout
    done = run([*CRL, "tasks", "check", str(task_file), "-o", "json"], timeout=600, env=env)
    (row,) = map(json.loads, done.stdout.splitlines())
    assert (row["gold"], row["no_patch"]) == ("environment-error", "environment-error")
    gold = row["gold_runs"][0]
    assert gold["exit_code"] == 127 and "collecting" in gold["log_tail"]
    assert "no-such-runner" in gold["log_tail"]

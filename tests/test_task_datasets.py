"""The loaders of the RL training sets (SWE-smith, R2E-Gym, SWE-rebench) on records shaped as
each dataset publishes them, their patches applied with git and their tests run with pytest; and
the loader's rule for every format: a wrong record is one error naming the record and the field,
and the others still load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from crl_worker.errors import TaskFormatError
from crl_worker.harness.parsers import parse_log
from crl_worker.tasks import formats, selection
from crl_worker.tasks.formats.swesmith import reverse_patch
from crl_worker.tasks.loaders import load_records
from crl_worker.tasks.records import RecordRef
from tests.fixtures.dataset_records import (
    CALC,
    CALC_BUGGY,
    git,
    make_repo,
    other_format_records,
    r2egym_record,
    swerebench_record,
    swesmith_record,
)


def _load(format: str, records: list[Any]) -> Any:
    return load_records(
        [(RecordRef(f"index {i}"), r) for i, r in enumerate(records)],
        format,  # type: ignore[arg-type]
    )


def _apply(repo: Path, patch: str) -> None:
    (repo.parent / "p.diff").write_text(patch)
    git(repo, "apply", str(repo.parent / "p.diff"))


def _pytest(repo: Path, args: list[str]) -> dict[str, Any]:
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        # No bytecode: the gold patch changes calc.py within the second and keeps its size,
        # so a .pyc of the first run would pass for the patched file.
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1"},
    )
    return dict(parse_log("pytest", run.stdout))


# --- SWE-smith ---------------------------------------------------------------------------------


def test_swesmith_record_fix_is_the_bug_reversed(tmp_path: Path) -> None:
    result = _load("swe-smith", [swesmith_record()])
    assert result.errors == []
    (task,) = result.tasks
    assert task.repo == "swesmith/calcorg__calc.3d4fd3b1"
    assert task.base_commit == "6b5e3a1f0c2d4e8f9a7b6c5d4e3f2a1b0c9d8e7f"
    assert task.image is None  # SWE-smith's image holds the clean code, not the bug
    assert task.metadata["swesmith_image"] == swesmith_record()["image_name"]
    assert task.metadata["upstream_repo"] == "calcorg/calc"
    # The bug committed as SWE-smith's branch holds it; the task's gold patch must undo it.
    repo = tmp_path / "repo"
    make_repo(repo, CALC_BUGGY)
    _apply(repo, task.patch)
    assert (repo / "calc.py").read_text() == CALC
    statuses = _pytest(repo, selection.test_arguments(task))
    assert {t: statuses.get(t) for t in task.fail_to_pass + task.pass_to_pass} == {
        "tests/test_calc.py::test_add": "PASSED",
        "tests/test_calc.py::test_sub": "PASSED",
    }


def test_swesmith_defaults_and_refusals() -> None:
    bare = {
        k: v
        for k, v in swesmith_record().items()
        if k not in ("repo", "base_commit", "image_name", "created_at")
    }
    go = {**bare, "instance_id": "gin__gin.3c12d2a8.lm_rewrite__x", "FAIL_TO_PASS": ["TestRoute"]}
    go_own = {**go, "instance_id": "gin__gin.3c12d2a8.lm_rewrite__y", "test_cmd": "go test ./..."}
    bad_id = {**bare, "instance_id": "calc-17"}
    result = _load("swe-smith", [bare, go, go_own, bad_id])
    first, own = result.tasks
    # The SWE-smith per-language splits carry no base_commit: the instance's branch of the mirror.
    assert (
        first.base_commit == bare["instance_id"] and first.repo == "swesmith/calcorg__calc.3d4fd3b1"
    )
    assert first.metadata["swesmith_image"] == "swebench/swesmith.x86_64.calcorg_1776_calc.3d4fd3b1"
    assert own.test_spec.command.startswith("go test ./...")
    assert [(e.record, e.field) for e in result.errors] == [
        ("'gin__gin.3c12d2a8.lm_rewrite__x' (index 1)", "FAIL_TO_PASS"),
        ("'calc-17' (index 3)", "instance_id"),
    ]
    assert "give the record's test_cmd" in str(result.errors[0])


def test_reverse_patch_undoes_creations_deletions_and_edge_lines(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    make_repo(repo)
    (repo / "calc.py").write_text("-- not a header\nx = 1")  # no final newline
    (repo / "tests" / "test_calc.py").unlink()
    (repo / "new.py").write_text("new\n")
    git(repo, "add", "-A")
    bug = git(repo, "diff", "--cached")
    git(repo, "commit", "-q", "-m", "bug")
    _apply(repo, reverse_patch(bug, RecordRef("x")))
    git(repo, "add", "-A")
    assert git(repo, "diff", "--cached", "HEAD~1") == ""
    with pytest.raises(TaskFormatError, match="binary diff"):
        reverse_patch("diff --git a/x b/x\nGIT binary patch\nliteral 1\n", RecordRef("x"))


# --- R2E-Gym -----------------------------------------------------------------------------------


def test_r2egym_record_runs_its_held_out_tests(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    old = make_repo(repo, CALC_BUGGY)
    result = _load("r2e-gym", [r2egym_record(old=old)])
    assert result.errors == []
    (task,) = result.tasks
    assert task.instance_id == f"calcorg/calc__{'b' * 40}"
    assert (task.repo, task.base_commit) == ("calcorg/calc", old)
    assert task.image == f"namanjain12/calc_final:{'b' * 40}"
    assert task.problem_statement == "add() subtracts."
    assert task.fail_to_pass == ["r2e_tests/test_1.py::TestCalc::test_add"]
    assert task.pass_to_pass == ["r2e_tests/test_1.py::TestCalc::test_sub"]
    assert task.metadata["expected_not_passing"] == 1
    assert "tests/test_calc.py" not in task.patch  # test file diffs are not the gold patch
    _apply(repo, task.test_patch)
    before = _pytest(repo, selection.test_arguments(task))
    assert before["r2e_tests/test_1.py::TestCalc::test_add"] == "FAILED"
    _apply(repo, task.patch)
    after = _pytest(repo, selection.test_arguments(task))
    assert all(after[t] == "PASSED" for t in task.fail_to_pass + task.pass_to_pass)


def test_r2egym_bare_repository_names_and_errors() -> None:
    good = {**r2egym_record(), "repo_name": "aiohttp"}
    del good["docker_image"]
    unknown = {**r2egym_record(), "repo_name": "leftpad"}
    not_json = {**r2egym_record(), "expected_output_json": "{oops"}
    two_files = r2egym_record()
    execution = json.loads(two_files["execution_result_content"])
    execution["test_file_names"] = ["test_1.py", "test_2.py"]
    execution["test_file_codes"] = [execution["test_file_codes"][0]] * 2
    two_files["execution_result_content"] = json.dumps(execution)
    result = _load("r2e-gym", [good, unknown, not_json, two_files])
    (task,) = result.tasks
    assert task.repo == "aio-libs/aiohttp"
    assert task.image == f"namanjain12/aiohttp_final:{'b' * 40}"
    assert [e.field for e in result.errors] == [
        "repo_name",
        "expected_output_json",
        "expected_output_json",
    ]
    assert "defined in 2 of the held-out test files" in str(result.errors[2])


def test_an_r2egym_record_may_name_its_own_environment() -> None:
    """Outside R2E-Gym's image (a local sandbox) a record may give the environment its image
    holds: the per-record harness keys of swe-bench (the coverage.py records of
    docs/validation.md need Python 3.8, pinned test tools and a test command)."""
    own = {**r2egym_record(), "python": "3.8", "install": ["python -m pip install toml", "python -m pip install -e ."],
           "test_cmd": "python -m pytest -rA -p no:cacheprovider -o addopts= {tests}"}  # fmt: skip
    (task,) = _load("r2e-gym", [own]).tasks
    assert (task.python, task.install) == ("3.8", own["install"])
    assert task.test.command == own["test_cmd"]
    assert task.metadata["record_keys"] == ["python", "install", "test_cmd"]
    (plain,) = _load("r2e-gym", [r2egym_record()]).tasks
    assert plain.python is None and "record_keys" not in plain.metadata
    # Its tests are pytest ids: another log format would find none of them.
    unittest_log = {**r2egym_record(), "log_format": "unittest"}
    [error] = _load("r2e-gym", [unittest_log]).errors
    assert error.field == "log_format" and "pytest ids" in str(error)


# --- SWE-rebench -------------------------------------------------------------------------------


def test_swerebench_install_config_becomes_the_harness() -> None:
    conda = swerebench_record()
    conda["instance_id"] = "calcorg__calc-18"
    conda["install_config"] = {**conda["install_config"], "packages": "numpy scipy"}
    named = {**swerebench_record(), "instance_id": "calcorg__calc-19", "docker_image": "reg/x:1"}
    result = _load("swe-rebench", [swerebench_record(), conda, named])
    assert result.errors == []
    task, conda_task, named_task = result.tasks
    assert task.image == "swerebench/sweb.eval.x86_64.calcorg_1776_calc-17"
    assert named_task.image == "reg/x:1"
    assert task.python == "3.9"
    assert task.install == [
        "python -m pip install pytest pytest-cov",
        "python -m pip install -r requirements/test.txt",
        "pip install -e .",
    ]
    assert task.test_spec.command.startswith("pytest --no-header -rA")
    assert task.test_spec.command.endswith("{tests}") and task.test_spec.log_format == "pytest"
    assert "image_only" not in task.metadata and task.metadata["meta"]["is_lite"] is True
    assert conda_task.metadata["image_only"] is True
    assert "conda packages" in conda_task.metadata["image_only_reason"]


def test_swerebench_errors_name_the_install_config_field() -> None:
    parser = swerebench_record()
    parser["install_config"] = {**parser["install_config"], "log_parser": "parse_log_jest"}
    python = swerebench_record()
    python["install_config"] = {**python["install_config"], "python": ["3.9"]}
    reqs = swerebench_record()
    reqs["install_config"] = {**reqs["install_config"], "reqs_path": 7}
    result = _load("swe-rebench", [parser, python, reqs])
    assert [e.field for e in result.errors] == [
        "install_config.log_parser",
        "install_config.python",
        "install_config.reqs_path",
    ]
    assert result.tasks == []


# --- every format: one wrong record is one error -----------------------------------------------

_WRONG = [None, 7, 1.5, True, "", "x", [], [3], {}, {"a": [1]}, "[1, 2]"]

_GOOD = {
    "swe-smith": swesmith_record(),
    "r2e-gym": r2egym_record(),
    "swe-rebench": swerebench_record(),
    **other_format_records(),
}


def test_every_format_has_a_sample_here() -> None:
    assert set(_GOOD) == set(formats.CONVERTERS)


@pytest.mark.parametrize("format", sorted(_GOOD))
def test_each_wrong_field_is_one_error_naming_record_and_field(format: str) -> None:
    """Every field of a good record set to every wrong kind of value, loaded before a good
    record: the wrong one converts or is one error naming it and a field; the good one loads
    (unless the wrong one took its id first, which is then the error named)."""
    good = _GOOD[format]
    assert _load(format, [good]).errors == []
    for key in good:
        for value in _WRONG:
            result = _load(format, [{**good, key: value}, good])
            assert len(result.tasks) + len(result.errors) == 2, (key, value)
            for error in result.errors:
                where = (key, value, str(error))
                assert error.field, where
                assert "index 0" in (error.record or "") or (
                    "duplicate instance id" in str(error) and error.field == "instance_id"
                ), where


def test_a_converter_crash_is_an_error_of_that_record(monkeypatch: pytest.MonkeyPatch) -> None:
    """A converter that fails unexpectedly on one record (a bug, not a checked field) loses
    that record, reported with the record named, never the rest of the load."""
    real = formats.CONVERTERS["swe-smith"]

    def crashes_on_one(record: Any, ref: RecordRef, options: Any) -> Any:
        if record.get("problem_statement") == "boom":
            raise KeyError("deep")
        return real(record, ref, options)

    monkeypatch.setitem(formats.CONVERTERS, "swe-smith", crashes_on_one)
    other = {**swesmith_record(), "instance_id": "calcorg__calc.3d4fd3b1.other"}
    result = _load("swe-smith", [{**swesmith_record(), "problem_statement": "boom"}, other])
    assert [t.instance_id for t in result.tasks] == [other["instance_id"]]
    (error,) = result.errors
    assert error.record == "index 0" and "KeyError" in str(error)

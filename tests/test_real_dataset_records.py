"""Real records of the RL training sets through their loaders and ``check_tasks`` in local
sandboxes: SWE-smith (its mirror rebuilt from the fetched upstream, the bug on the instance's
branch), SWE-rebench (its ``install_config`` as the harness) and R2E-Gym (its held-out tests
added under ``r2e_tests/``). The gold patch resolves, no patch does not, each listed test found.

The records are tests/fixtures/real_records.py's; docs/validation.md has their rows, with
SWE-Gym's. Each test skips, naming the missing copy, on a machine without the fetched upstream
repository or the Python the record asks for.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from crl_worker.harness.check import InstanceCheck, check_tasks
from crl_worker.sandbox import interpreters
from crl_worker.tasks import Task, load_tasks
from tests.fixtures.fetched import git_mirror, require
from tests.fixtures.real_records import (
    SWESMITH_STRSIMPY,
    r2egym_coverage,
    swerebench_spectree,
    swesmith_mirror,
)


def _load(tmp_path: Path, record: dict[str, Any], format: str) -> Task:
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps(record) + "\n")
    (task,) = load_tasks(path, format, strict=True).tasks  # type: ignore[arg-type]
    try:
        interpreters.find_python(task.python)
    except interpreters.MissingInterpreterError as exc:
        pytest.skip(str(exc))
    return task


async def _check(task: Task, tmp_path: Path, *, integrity: bool) -> InstanceCheck:
    sandbox = {"type": "local", "root": str(tmp_path / "sandboxes")}
    (check,) = await check_tasks([task], sandbox_config=sandbox, integrity=integrity)
    assert check.ok, (check.instance_id, check.problems)
    assert (check.gold_verdict, check.no_patch_verdict) == ("resolved", "unresolved")
    for run in [*check.gold, *check.no_patch]:
        assert all(o.status.value != "MISSING" for o in [*run.fail_to_pass, *run.pass_to_pass])
    return check


async def test_a_swesmith_record_resolves_with_its_bug_patch_reversed(
    mirror: Path, tmp_path: Path
) -> None:
    """No ``base_commit`` (as SWE-smith's per-language splits): the sandbox checks out the branch
    named after the instance, which holds the bug; the gold patch is the bug patch reversed, and
    it also passes the integrity check's grading."""
    upstream = require("luozhouyang/python-string-similarity")
    swesmith_mirror(SWESMITH_STRSIMPY, upstream["luozhouyang/python-string-similarity"], mirror)
    task = _load(tmp_path, SWESMITH_STRSIMPY, "swe-smith")
    assert task.base_commit == SWESMITH_STRSIMPY["instance_id"]
    assert task.patch.startswith("diff --git a/strsimpy/optimal_string_alignment.py")
    check = await _check(task, tmp_path, integrity=True)
    assert check.integrity_verdict == "resolved"


async def test_a_swerebench_record_installs_from_its_install_config(
    mirror: Path, tmp_path: Path
) -> None:
    """Python 3.9, ``requirements.txt``, ``pytest`` and the extras install of the record's
    ``install_config``; graded as its ``parse_log_pytest`` says, integrity check included."""
    copies = require("0b01001001/spectree")
    git_mirror(copies, mirror)
    task = _load(tmp_path, swerebench_spectree(copies["0b01001001/spectree"]), "swe-rebench")
    assert task.python == "3.9" and task.install[-1] == "pip install -e .[flask,falcon,starlette]"
    check = await _check(task, tmp_path, integrity=True)
    assert check.integrity_verdict == "resolved"


async def test_an_r2egym_record_runs_its_held_out_tests(mirror: Path, tmp_path: Path) -> None:
    """The four held-out JSON-report tests, all FAIL_TO_PASS (the record has no run at the old
    commit), in the environment the record names (R2E-Gym's image is not reachable here).
    Without the integrity check: coverage.py's own stack dumps (``inspect.stack()``) read the
    calling test's source, which the integrity check takes for package code reading the tests
    (docs/validation.md)."""
    copies = require("nedbat/coveragepy")
    git_mirror(copies, mirror)
    task = _load(tmp_path, r2egym_coverage(copies["nedbat/coveragepy"]), "r2e-gym")
    assert len(task.fail_to_pass) == 4 and not task.pass_to_pass
    assert "+++ b/coverage/jsonreport.py" in task.patch and "tests/" not in task.patch
    assert "+++ b/r2e_tests/test_1.py" in task.test_patch
    await _check(task, tmp_path, integrity=False)

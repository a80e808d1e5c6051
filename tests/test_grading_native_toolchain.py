"""The hardened Go and Rust runs of the integrity check on a toolchain too old for them: an
environment error, never a wrong or tampered answer."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from crl_worker import rewards
from crl_worker.harness.evaluate import evaluate, no_tests_reason
from crl_worker.harness.integrity import grade_candidate
from crl_worker.harness.native import OLD_TOOLCHAIN, harden
from crl_worker.sandbox.registry import create_sandbox
from crl_worker.tasks.loaders import load_tasks
from crl_worker.tasks.model import Task
from tests.fixtures.paths import ROOT
from tests.fixtures.polyglot_forgery import solution_patch

SUITE = ROOT / "examples" / "suites" / "polyglot" / "tasks.jsonl"
SRC = SUITE.parent / "src"


def _task(instance_id: str) -> Task:
    return next(t for t in load_tasks(SUITE, "polyglot").tasks if t.instance_id == instance_id)


def _hidden(task: Task) -> list[str]:
    """The files the task's test patch adds (the tests the hardened run hides)."""
    return [line[6:] for line in task.test_patch.splitlines() if line.startswith("+++ b/")]


@pytest.mark.parametrize(
    ("instance_id", "log_format", "tool", "old", "new"),
    [
        ("go__digit-sum", "go", "go", "go1.19.8", "go1.24.4"),
        ("rust__digit-sum", "cargo", "rustc", "rustc 1.65.0 (897e37553 2022-11-02)",
         "rustc 1.85.1 (4eb161250 2025-03-15)"),
    ],
)  # fmt: skip
def test_a_toolchain_too_old_for_the_hardened_run_is_the_environments_fault(
    instance_id: str, log_format: str, tool: str, old: str, new: str, tmp_path: Path
) -> None:
    """Debian bookworm's Go 1.19 lacks test2json's framing and its Rust 1.65 lacks
    ``std::hint::black_box``: the hardened run stops first with :data:`OLD_TOOLCHAIN` and a
    line naming the version, which grading reports as an environment error (never a wrong
    answer, nor canaries that went missing); a newer toolchain goes past the check."""
    task = _task(instance_id)
    script = harden(task.test_spec.command, log_format, _hidden(task)) or ""
    (tmp_path / task.test_spec.command.split()[1]).mkdir(parents=True)
    fake = tmp_path / "bin"
    fake.mkdir()
    for version, expected in ((old, OLD_TOOLCHAIN), (new, 1)):
        (fake / tool).write_text(
            f'#!/bin/sh\n[ "$1" = env ] || [ "$1" = --version ] && echo "{version}" && exit 0\n'
            "exit 1\n"
        )
        (fake / tool).chmod(0o755)
        done = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True,
                              text=True, env={"PATH": f"{fake}:/usr/bin:/bin"})  # fmt: skip
        assert done.returncode == expected, (version, done.stdout, done.stderr)
        assert ("older than this run needs" in done.stdout) == (expected == OLD_TOOLCHAIN)
    assert "older than the integrity check needs" in no_tests_reason(OLD_TOOLCHAIN, log_format)


@pytest.mark.go
async def test_a_candidate_cannot_pass_for_an_old_toolchain(tmp_path: Path) -> None:
    """The attack on this rule: a wrong answer (a digit sum off by one) whose patch also asks
    for a newer Go in ``go.mod``, so that ``go env GOVERSION`` fails under ``GOTOOLCHAIN=local``
    and the hardened run would stop as if the toolchain were old, turning a reward of 0 into
    no verdict. The integrity check leaves ``go.mod`` out (not the candidate's source), and
    the plain run's control run blames the change: both grade it a wrong answer, reward 0,
    never an environment or infrastructure error."""
    if shutil.which("go") is None:
        pytest.skip("no go on PATH")
    task = _task("go__digit-sum")
    folder = "go/exercises/practice/digit-sum"
    gold = task.patch
    wrong = gold.replace("sum += n % 10", "sum += n%10 + 1")
    assert wrong != gold, "the reference's digit sum line changed: update the attack"
    go_mod = (SRC / folder / "go.mod").read_text()
    bumped = go_mod.replace("go 1.18", "go 1.99")
    patch = wrong + solution_patch(task, go_mod, bumped, f"{folder}/go.mod")
    async with create_sandbox({"type": "local", "root": str(tmp_path)}, task) as sandbox:
        plain = await evaluate(sandbox, task, model_patch=patch)
        await sandbox.reset()
        graded = await grade_candidate(sandbox, task, patch)
    for result in (plain, graded):
        assert result.infrastructure_error is None, result.infrastructure_error
        assert not result.resolved and rewards.tests_score(result) == 0.0, result.log[-3000:]
    assert any(s.startswith(f"{folder}/go.mod") for s in graded.stripped), graded.stripped

"""The hardened Go and Rust runs of the integrity check on a toolchain too old for them: an
environment error, never a wrong or tampered answer."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from crl_worker.harness.evaluate import no_tests_reason
from crl_worker.harness.native import OLD_TOOLCHAIN, harden
from crl_worker.tasks.loaders import load_tasks
from crl_worker.tasks.model import Task
from tests.fixtures.paths import ROOT

SUITE = ROOT / "examples" / "suites" / "polyglot" / "tasks.jsonl"


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

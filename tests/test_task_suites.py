"""The bundled suites of each task type: their sources, hidden tests until grading, and gold runs through crl bench."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from crl_worker.harness.check import check_tasks
from crl_worker.harness.derive import derive_implement, find_candidates, stub_text
from crl_worker.harness.evaluate import evaluate, touched_files
from crl_worker.rewards import resolution_reward
from crl_worker.sandbox.registry import create_sandbox
from crl_worker.tasks.model import Task
from tests.fixtures.task_types import (
    CLASSIFY,
    IMPLEMENT,
    MINI,
    ROOT,
    Scripted,
    local_sandboxes,
    scripted_episode,
    suite_tasks,
)

# --- the bundled suites -----------------------------------------------------------------------


def test_classify_suite_matches_its_sources() -> None:
    done = subprocess.run(
        [sys.executable, str(CLASSIFY / "build.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "6 records, up to date" in done.stderr
    for folder in (CLASSIFY / "src").iterdir():
        assert (folder / "files" / "LICENSE").is_file(), folder


async def test_both_suites_pass_the_task_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRL_CACHE_DIR", str(tmp_path / "cache"))
    classify = suite_tasks(CLASSIFY / "tasks.jsonl", "classify")
    implement = suite_tasks(IMPLEMENT / "tasks.jsonl", "implement")
    assert len(classify) == 6 and len(implement) >= 3
    results = await check_tasks(
        [*classify, *implement], jobs=2, sandbox_config=local_sandboxes(tmp_path)
    )
    for found in results:
        assert found.ok, (found.instance_id, found.problems)
        assert (found.gold_verdict, found.no_patch_verdict) == ("resolved", "unresolved")
    for task in implement:
        assert task.fail_to_pass and "NotImplementedError" in task.patch
        assert task.metadata["function"] in task.problem_statement


async def test_derivation_is_reproducible_and_rejects_untested_bodies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deriving again gives the checked-in task (same commit, patch and lists); a function
    whose listed tests all pass without its body is rejected with that reason."""
    monkeypatch.setenv("CRL_CACHE_DIR", str(tmp_path / "cache"))
    shipped = {t.instance_id: t for t in suite_tasks(IMPLEMENT / "tasks.jsonl")}
    mini = {t.instance_id: t for t in suite_tasks(MINI)}
    derived = await derive_implement(
        mini["crl-mini__intervals-1"],
        tmp_path / "out",
        sandbox_config=local_sandboxes(tmp_path),
        functions=["Interval.parse", "merge", "no_such_function"],
    )
    (task,) = derived.tasks
    again = shipped[task.instance_id]
    assert (task.base_commit, task.patch) == (again.base_commit, again.patch)
    assert task.test_patch == again.test_patch and task.metadata["hidden_tests"] == [
        "tests/test_ops.py"
    ]
    assert (task.fail_to_pass, task.pass_to_pass) == (again.fail_to_pass, again.pass_to_pass)
    reasons = dict(derived.rejected)
    assert reasons["Interval.parse"].startswith("no test fails without the body")
    assert reasons["no_such_function"] == "no such covered, documented function"
    # The bundle holds one root commit: no history to read the body from.
    bundle = tmp_path / "out" / "repos" / f"{task.instance_id}.bundle"
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(bundle), str(clone)], check=True, timeout=60)
    log = subprocess.run(
        ["git", "log", "--all", "--format=%H %P"],
        cwd=clone,
        capture_output=True,
        text=True,
        check=True,
    )
    assert log.stdout.split() == [task.base_commit]
    # ... and no copy of the withheld tests: they are the test patch, applied only to grade.
    files = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", task.base_commit],
        cwd=clone,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "tests/test_ops.py" not in files.stdout.split()


def test_derive_implement_refuses_what_it_cannot_derive_from(tmp_path: Path) -> None:
    """The command as a user runs it: classify tasks are not repair tasks (exit 1, the reason
    per task), and an --out that is a file is a usage error (exit 2)."""
    env = {**os.environ, "CRL_CACHE_DIR": str(tmp_path / "cache"), "COLUMNS": "300"}

    def crl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "crl_cli", "tasks", "derive-implement", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )

    done = crl(str(CLASSIFY / "tasks.jsonl"), "--out", "derived")
    assert done.returncode == 1, done.stderr
    assert done.stdout.count("is a classify task, not a repair task") == 6
    assert "0 implement tasks written" in done.stdout
    assert (tmp_path / "derived" / "tasks.jsonl").read_text() == ""
    (tmp_path / "afile").write_text("")
    done = crl(str(MINI), "--out", "afile")
    assert done.returncode == 2 and "is not a folder" in done.stderr


def test_stubbing_keeps_signature_decorators_and_docstring(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "tests").mkdir()
    source = (
        "class Box:\n"
        "    @staticmethod\n"
        "    def area(w, h):\n"
        '        """Area of a w by h box."""\n'
        "        total = w * h\n"
        "        return total\n"
        "\n"
        "    def _hidden(self):\n"
        '        """Private."""\n'
        "        return 1\n"
        "\n"
        "def untested(x):\n"
        '    """Nobody calls me."""\n'
        "    return x\n"
    )
    (tmp_path / "pkg" / "box.py").write_text(source)
    (tmp_path / "tests" / "test_box.py").write_text("from pkg.box import Box\nBox.area(1, 2)\n")
    (candidate,) = find_candidates(tmp_path)
    assert (candidate.path, candidate.qualname) == ("pkg/box.py", "Box.area")
    assert candidate.header.startswith("    @staticmethod\n    def area(w, h):")
    stubbed = stub_text(source, candidate)
    assert '        """Area of a w by h box."""\n        raise NotImplementedError' in stubbed
    assert "total" not in stubbed and "def _hidden(self):" in stubbed
    compile(stubbed, "box.py", "exec")


# --- hidden tests of implement tasks -----------------------------------------------------------


def _marker(task: Task) -> str:
    """A line only the withheld tests hold: the longest line the test patch adds (an assertion
    written for this task). A test's name is not enough: ``test_basic`` also stands in files of
    unrelated installed packages, which the probe may read where the worker's environment is
    visible (a checkout under /tmp)."""
    lines = [
        line[1:].strip()
        for line in task.test_patch.splitlines()
        if line.startswith("+") and not line.startswith("+++")
    ]
    assert any(re.match(r"def test_\w+", line) for line in lines), "the test patch adds no test"
    return max(lines, key=len)


def _probe(task: Task, marker: str) -> str:
    """A shell command that tries every way an agent could read the withheld tests (the file,
    HEAD, the history, every object in the store reachable or not, stashes, caches and scratch
    folders, the task file itself) and prints how many lines name ``marker``."""
    (hidden,) = task.metadata["hidden_tests"]
    tries = [
        f"cat {hidden}",
        f"git show HEAD:{hidden}",
        "git log -p --all",
        "git cat-file --batch-all-objects --batch",
        "git fsck --unreachable --no-reflogs",
        "git stash list -p",
        'grep -rIs . . .. "$HOME" /tmp "${TMPDIR:-/tmp}" /var/tmp',
        f"cat {IMPLEMENT / 'tasks.jsonl'}",
    ]
    found = f"grep -cF -e {shlex.quote(marker)}"
    return "{ " + "; ".join(f"{t} 2>&1" for t in tries) + f"; }} | {found} || true"


async def test_implement_tests_are_hidden_until_grading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deciding tests are not in the agent's sandbox by any route; the harness puts them
    in place over the agent's own file at that path; gold scores 1, nothing 0; and after
    grading (its diff taken) a reset leaves no copy for the next episode in the sandbox."""
    monkeypatch.setenv("CRL_CACHE_DIR", str(tmp_path / "cache"))
    task = next(t for t in suite_tasks(IMPLEMENT / "tasks.jsonl") if "slugkit" in t.instance_id)
    marker = _marker(task)
    (hidden,) = task.metadata["hidden_tests"]
    fake = "def test_anything():\n    pass\n"
    policy = Scripted(
        [
            ("shell", {"command": _probe(task, marker)}),
            (
                "shell",
                {
                    "command": f"mkdir -p tests && cat > {hidden} <<'EOF'\n{fake}EOF\npython -m pytest -q {hidden}"
                },
            ),
            ("submit", {}),
        ]
    )
    trajectory = await scripted_episode(task, policy, tmp_path, turns=4)
    probe, own = [c for t in trajectory.turns for c in t.tool_calls][:2]
    assert probe.output.strip().splitlines()[-1] == "0", probe.output[-2000:]
    assert "1 passed" in own.output  # the agent's own test file ran in its sandbox
    evaluation = trajectory.evaluation
    assert evaluation is not None and evaluation.infrastructure_error is None
    assert not evaluation.resolved and evaluation.fail_to_pass_fraction == 0.0
    assert resolution_reward(eval_result=[evaluation]) == [0.0]
    assert len(evaluation.fail_to_pass) == len(task.fail_to_pass)  # the real tests ran

    sandbox = create_sandbox(local_sandboxes(tmp_path), task)
    async with sandbox:
        assert not sandbox.dirty
        gold = await evaluate(sandbox, task, model_patch=task.patch)
        assert gold.resolved and resolution_reward(eval_result=[gold]) == [1.0]
        # A pool replaces such a sandbox rather than reuse it (what a reset does not undo).
        assert sandbox.dirty
        found = await sandbox.run(_probe(task, marker))
        assert int(found.output.strip().splitlines()[-1]) > 0  # the probe sees them now
        assert hidden in touched_files(await sandbox.diff())
        await sandbox.reset()
        found = await sandbox.run(_probe(task, marker))
        assert found.output.strip().splitlines()[-1] == "0", found.output[-2000:]
        empty = await evaluate(sandbox, task)
        assert not empty.resolved and resolution_reward(eval_result=[empty]) == [0.0]


# --- crl bench --agent gold on both suites ----------------------------------------------------


async def test_gold_bench_scores_every_instance_of_both_suites(tmp_path: Path) -> None:
    env = {**os.environ, "CRL_CACHE_DIR": str(tmp_path / "cache"), "COLUMNS": "160"}
    for key in ("CRL_RESULTS_DIR", "CRL_CONFIG"):
        env.pop(key, None)
    summaries = {}
    for name in ("classify", "implement"):
        manifest = ROOT / "examples" / f"local-benchmark-{name}.yaml"
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "crl_cli",
            "bench",
            str(manifest),
            "--agent",
            "gold",
            "--sandbox",
            json.dumps(local_sandboxes(tmp_path)),
            cwd=tmp_path,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), 500)
        assert process.returncode == 0, err.decode()[-3000:]
        summaries[name] = json.loads((tmp_path / "results" / name / "summary.json").read_text())
        if name == "classify":
            assert "classification by CWE label" in out.decode()
    classify, implement = summaries["classify"], summaries["implement"]
    assert classify["resolveRate"] == 1.0 and classify["taskTypes"] == {"classify": 6}
    table = classify["classification"]
    assert (table["accuracy"], table["meanCredit"], table["unanswered"]) == (1.0, 1.0, 0)
    assert [c["cwe"] for c in table["classes"]] == [
        "CWE-20",
        "CWE-79",
        "CWE-331",
        "CWE-400",
        "CWE-522",
    ]
    assert next(c for c in table["classes"] if c["cwe"] == "CWE-400")["attempts"] == 2
    assert implement["resolveRate"] == 1.0 and implement["classification"] is None
    assert set(implement["taskTypes"]) == {"implement"}
    rows = [
        json.loads(line)
        for line in (tmp_path / "results" / "classify" / "results.jsonl").read_text().splitlines()
    ]
    assert all(r["answer"] == r["label"] and r["credit"] == 1.0 for r in rows)
    # crl compare pairs classify attempts by instance as it does repair ones.
    compared = subprocess.run(
        [sys.executable, "-m", "crl_cli", "compare", *(["results/classify"] * 2), "-o", "json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert compared.returncode == 0, compared.stderr
    comparison = json.loads(compared.stdout)
    assert (comparison["sharedInstances"], comparison["difference"]) == (6, 0.0)

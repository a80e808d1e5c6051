"""The task types beyond repair (docs/task-types.md): implement-from-spec and vulnerability
classification.

Real components throughout: the bundled suites' git bundles in local sandboxes, the agent loop
with a scripted policy, the harness's check, derivation from the mini suite's real repositories
with their real test suites, and ``crl bench`` as a subprocess.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from crl_worker.agent.client import Completion
from crl_worker.agent.episode import run_episode
from crl_worker.agent.gold import tool_call
from crl_worker.agent.tools import tools_for
from crl_worker.agent.trajectory import Trajectory
from crl_worker.api.common import AgentSpec, TaskSource
from crl_worker.harness.check import check_tasks
from crl_worker.harness.derive import derive_implement, find_candidates, stub_text
from crl_worker.harness.evaluate import evaluate, touched_files
from crl_worker.rewards import pass_fraction_reward, resolution_reward
from crl_worker.sandbox.base import Sandbox
from crl_worker.sandbox.registry import create_sandbox
from crl_worker.tasks.cwe import UnknownCweError, credit, hierarchy, normalise
from crl_worker.tasks.loaders import load_tasks
from crl_worker.tasks.model import Task
from crl_worker.tasks.sources import load_source

ROOT = Path(__file__).resolve().parents[1]
CLASSIFY = ROOT / "examples" / "suites" / "classify"
IMPLEMENT = ROOT / "examples" / "suites" / "implement"
MINI = ROOT / "examples" / "suites" / "mini" / "tasks.jsonl"
FIXTURES = ROOT / "tests" / "fixtures" / "vulns"


def _tasks(path: Path, task_type: str | None = None) -> list[Task]:
    loaded = load_tasks(path, "task", task_type=task_type)
    assert loaded.ok, loaded.errors
    return loaded.tasks


def _local(tmp_path: Path) -> dict[str, str]:
    return {"type": "local", "root": str(tmp_path)}


# --- the task type field ---------------------------------------------------------------------


def test_unknown_task_type_is_refused_with_the_types() -> None:
    record = json.loads(MINI.read_text().splitlines()[0])
    with pytest.raises(ValidationError, match="'repair', 'implement' or 'classify'"):
        Task(**{**record, "task_type": "fix"})
    with pytest.raises(ValidationError, match="taskType"):
        TaskSource.model_validate({"path": "x.jsonl", "taskType": "fix"})
    with pytest.raises(ValidationError, match="a classify task needs classification"):
        Task(**{**record, "task_type": "classify"})
    with pytest.raises(ValidationError, match="only for classify tasks"):
        Task(**{**record, "classification": {"cwe": "CWE-79"}})
    test_less = {k: v for k, v in record.items() if k != "test"}
    with pytest.raises(ValidationError, match="a repair task needs test"):
        Task(**test_less)


def test_a_source_refuses_tasks_of_another_type(tmp_path: Path) -> None:
    """taskType is checked per record: the classify suite read as repair loads nothing."""
    source = TaskSource.model_validate(
        {"format": "task", "path": str(CLASSIFY / "tasks.jsonl"), "taskType": "repair"}
    )
    loaded = load_source(source)
    assert loaded.tasks == [] and len(loaded.errors) == 6
    assert "a classify task in a source whose taskType is repair" in str(loaded.errors[0])
    source = source.model_copy(update={"task_type": "classify"})
    assert len(load_source(source).tasks) == 6


# --- the CWE hierarchy ------------------------------------------------------------------------


def test_cwe_ids_are_normalised_and_unknown_ones_refused() -> None:
    assert normalise("cwe-787") == normalise(787) == normalise(" 787 ") == "CWE-787"
    for bad in ("CWE-99999", "CWE-399", "NVD-CWE-Other", "", "CWE-", True, None, 7.5):
        with pytest.raises(UnknownCweError):
            normalise(bad)
    assert len(hierarchy()) == 839
    assert hierarchy()["CWE-787"].parents == ("CWE-119",)


def test_credit_follows_the_hierarchy() -> None:
    assert credit("CWE-787", "CWE-787") == 1.0
    assert credit("CWE-787", "CWE-119") == 0.5  # its parent
    assert credit("CWE-119", "CWE-787") == 0.5  # its child
    assert credit("CWE-787", "CWE-125") == 0.25  # a sibling under CWE-119
    assert credit("CWE-79", "CWE-787") == 0.0  # related only through a Pillar
    # SQL injection (under CWE-943) and XSS meet at CWE-74 (injection): three edges.
    assert credit("CWE-89", "CWE-79") == 0.125


def test_classify_tools_replace_submit_and_edit() -> None:
    assert tools_for("classify", ["shell", "view", "edit", "submit"]) == [
        "shell",
        "view",
        "classify",
    ]
    assert tools_for("implement", ["shell", "view", "edit", "submit"]) == [
        "shell",
        "view",
        "edit",
        "submit",
    ]


# --- loaders of the public vulnerability datasets --------------------------------------------

_FIX = "a" * 40
_PARENT = "b" * 40


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_bigvul_records(tmp_path: Path) -> None:
    good = {
        "id": 17,
        "CWE ID": "CWE-119",
        "CVE ID": "CVE-2014-0001",
        "codeLink": f"https://github.com/acme/widget/commit/{_FIX}",
        "commit_id": _FIX,
        "parentID": _PARENT,
        "file_name": "src/buf.c",
        "func_before": "int f(char *s) { char b[4]; strcpy(b, s); return 0; }",
        "vul": 1,
    }
    rows = [
        good,
        {**good, "id": 18, "CWE ID": "CWE-399"},  # a category, not a weakness
        {**good, "id": 19, "vul": 0},
        {**good, "id": 20, "codeLink": "https://example.org/widget.git"},
        {**good, "id": 21, "parentID": None},  # the fix's parent, written <fix>~1
    ]
    loaded = load_tasks(_write_jsonl(tmp_path / "bigvul.jsonl", rows), "bigvul")
    assert [t.instance_id for t in loaded.tasks] == ["bigvul-17", "bigvul-21"]
    task = loaded.tasks[0]
    assert (task.task_type, task.repo, task.base_commit) == ("classify", "acme/widget", _PARENT)
    assert task.classification is not None
    assert (task.classification.cwe, task.classification.location) == ("CWE-119", "src/buf.c")
    assert task.classification.cve == "CVE-2014-0001" and task.language == "cpp"
    assert "strcpy(b, s)" in task.problem_statement and "CVE" not in task.problem_statement
    assert loaded.tasks[1].base_commit == f"{_FIX}~1"
    errors = " | ".join(str(e) for e in loaded.errors)
    assert "CWE-399 is not in the shipped CWE list" in errors
    assert "not a vulnerable function (vul is 0)" in errors
    assert "not a GitHub repository" in errors


def test_real_bigvul_rows(tmp_path: Path) -> None:
    """Big-Vul's own CVE-level rows (tests/fixtures/vulns/README.md): the values as the
    dataset has them, with its empty labels, categories and run-together commit URLs."""
    loaded = load_tasks(FIXTURES / "bigvul-cve-rows.jsonl", "bigvul")
    found = {t.instance_id: t for t in loaded.tasks}
    assert sorted(found) == ["bigvul-28327", "bigvul-33683", "bigvul-43956", "bigvul-44070"]
    rails = found["bigvul-28327"]
    assert rails.repo == "rails/rails" and rails.classification is not None
    assert rails.base_commit == "7282ed863ca7e6f928bae9162c9a63a98775a19d~1"
    assert (rails.classification.cwe, rails.classification.cve) == ("CWE-352", "CVE-2008-5189")
    # A '#file' anchor and a '.patch' suffix on the commit URL.
    assert found["bigvul-43956"].repo == "liblime/LibLime-Koha"
    assert found["bigvul-44070"].base_commit == "410ed3001d51c689cf59085b7417466caa2ded7b~1"
    text = " | ".join(str(e) for e in loaded.errors)
    assert len(loaded.errors) == 4, text
    assert "the record has no CWE label" in text
    assert "CWE-189 is not in the shipped CWE list" in text
    assert "CWE-264 is not in the shipped CWE list" in text
    assert "3 commit URLs and no commit id that picks one of them" in text
    # With the row's commit id (MSR_data_cleaned.csv has one per row) the URL is picked.
    mono = json.loads((FIXTURES / "bigvul-cve-rows.jsonl").read_text().splitlines()[4])
    second = "65292a69c837b8a5f7a392d34db63de592153358"
    picked = load_tasks(
        _write_jsonl(tmp_path / "m.jsonl", [{**mono, "commit_id": second}]), "bigvul"
    )
    assert [(t.repo, t.base_commit) for t in picked.tasks] == [("mono/mono", f"{second}~1")]


def test_cvefixes_and_primevul_records(tmp_path: Path) -> None:
    cvefixes = {
        "cve_id": "CVE-2021-1",
        "cwe_id": "CWE-79",
        "repo_url": "https://github.com/acme/site",
        "hash": _FIX,
        "parents": f"['{_PARENT}']",
        "old_path": "site/views.py",
        "name": "render",
        "code": "def render(x):\n    return '<b>' + x + '</b>'",
        "before_change": "True",
        "method_change_id": "m1",
    }
    rows = [cvefixes, {**cvefixes, "method_change_id": "m2", "cwe_id": "NVD-CWE-Other"}]
    loaded = load_tasks(_write_jsonl(tmp_path / "cvefixes.jsonl", rows), "cvefixes")
    (task,) = loaded.tasks
    assert task.instance_id == "cvefixes-m1" and task.base_commit == _PARENT
    assert task.classification and task.classification.location == "site/views.py::render"
    assert task.language == "python"
    assert "not a CWE id" in str(loaded.errors[0])

    primevul = {
        "idx": 5,
        "commit_url": f"https://github.com/acme/lib/commit/{_FIX}",
        "commit_id": _FIX,
        "file_name": "parse.c",
        "func": "void g(int n) { int a[8]; a[n] = 1; }",
        "target": 1,
        "cwe": ["CWE-787"],
        "cve": "CVE-2022-2",
    }
    rows = [primevul, {**primevul, "idx": 6, "cwe": ["CWE-787", "CWE-125"]}]
    loaded = load_tasks(_write_jsonl(tmp_path / "primevul.jsonl", rows), "primevul")
    (task,) = loaded.tasks
    assert (task.instance_id, task.base_commit) == ("primevul-5", f"{_FIX}~1")
    assert task.classification and task.classification.cwe == "CWE-787"
    assert "a[n] = 1" in task.problem_statement and "parse.c" in task.problem_statement
    assert "needs exactly one CWE id" in str(loaded.errors[0])


# --- classify episodes ------------------------------------------------------------------------


class Scripted:
    """A policy that makes the given tool calls, one per turn, then repeats the last."""

    model = "scripted"

    def __init__(self, calls: list[tuple[str, dict[str, Any]]]) -> None:
        self.calls = calls
        self.offered: list[str] = []

    async def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]],
        max_tokens: int,
        temperature: float,
        top_p: float,
    ) -> Completion:
        self.offered = [t["function"]["name"] for t in tools]
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        name, arguments = self.calls[min(turn, len(self.calls) - 1)]
        return tool_call(turn, name, arguments, prefix="scripted")


async def _episode(task: Task, policy: Scripted, tmp_path: Path, turns: int) -> Trajectory:
    async def keep(_: Trajectory) -> None:
        return None

    def factory(t: Task) -> Sandbox:
        return create_sandbox(_local(tmp_path), t)

    agent = AgentSpec(max_turns=turns, timeout_seconds=300)
    trajectory, started = await run_episode(task, 0, factory, policy, agent, keep_cancelled=keep)
    assert started
    return trajectory


async def test_a_classify_episode_is_graded_along_the_hierarchy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRL_CACHE_DIR", str(tmp_path / "cache"))
    task = next(t for t in _tasks(CLASSIFY / "tasks.jsonl") if "urllib3" in t.instance_id)
    assert task.classification and task.classification.cwe == "CWE-400"
    policy = Scripted(
        [
            ("classify", {"cwe": "CWE-99999", "reasoning": "made up"}),
            ("shell", {"command": "grep -c SUBAUTHORITY_PAT urllib3/util/url.py"}),
            ("classify", {"cwe": "CWE-400", "reasoning": ""}),
            # CWE-770 (allocation without limits) is a child of CWE-400: half the credit.
            ("classify", {"cwe": "cwe-770", "reasoning": "the regex backtracks on '@'"}),
        ]
    )
    trajectory = await _episode(task, policy, tmp_path, turns=6)
    assert policy.offered == ["shell", "view", "classify"]
    calls = [c for t in trajectory.turns for c in t.tool_calls]
    assert [c.error for c in calls] == [True, False, True, False]
    assert "CWE-99999 is not in the shipped CWE list" in calls[0].output
    assert calls[1].output.rstrip().endswith("2")  # the module is really there
    assert "needs the reasoning" in calls[2].output
    assert trajectory.exit_reason == "submitted"
    evaluation = trajectory.evaluation
    assert evaluation is not None
    assert (evaluation.answer, evaluation.resolved, evaluation.credit) == ("CWE-770", False, 0.5)
    assert evaluation.reasoning == "the regex backtracks on '@'"
    assert evaluation.confirmed is None  # no second grading: nothing ran to tamper with
    assert resolution_reward(eval_result=[evaluation]) == [0.5]
    assert pass_fraction_reward(eval_result=[evaluation]) == [0.5]


async def test_an_episode_without_classify_scores_zero_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRL_CACHE_DIR", str(tmp_path / "cache"))
    task = next(t for t in _tasks(CLASSIFY / "tasks.jsonl") if "requests" in t.instance_id)
    policy = Scripted([("shell", {"command": "ls requests"})])
    trajectory = await _episode(task, policy, tmp_path, turns=2)
    assert trajectory.exit_reason == "max_turns"
    evaluation = trajectory.evaluation
    assert evaluation is not None and evaluation.infrastructure_error is None
    assert (evaluation.answer, evaluation.resolved, evaluation.credit) == (None, False, 0.0)
    assert "the episode ended without classify" in evaluation.log
    assert resolution_reward(eval_result=[evaluation]) == [0.0]  # recorded, not left out


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
    classify = _tasks(CLASSIFY / "tasks.jsonl", "classify")
    implement = _tasks(IMPLEMENT / "tasks.jsonl", "implement")
    assert len(classify) == 6 and len(implement) >= 3
    results = await check_tasks([*classify, *implement], jobs=2, sandbox_config=_local(tmp_path))
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
    shipped = {t.instance_id: t for t in _tasks(IMPLEMENT / "tasks.jsonl")}
    mini = {t.instance_id: t for t in _tasks(MINI)}
    derived = await derive_implement(
        mini["crl-mini__intervals-1"],
        tmp_path / "out",
        sandbox_config=_local(tmp_path),
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
    task = next(t for t in _tasks(IMPLEMENT / "tasks.jsonl") if "slugkit" in t.instance_id)
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
    trajectory = await _episode(task, policy, tmp_path, turns=4)
    probe, own = [c for t in trajectory.turns for c in t.tool_calls][:2]
    assert probe.output.strip().splitlines()[-1] == "0", probe.output[-2000:]
    assert "1 passed" in own.output  # the agent's own test file ran in its sandbox
    evaluation = trajectory.evaluation
    assert evaluation is not None and evaluation.infrastructure_error is None
    assert not evaluation.resolved and evaluation.fail_to_pass_fraction == 0.0
    assert resolution_reward(eval_result=[evaluation]) == [0.0]
    assert len(evaluation.fail_to_pass) == len(task.fail_to_pass)  # the real tests ran

    sandbox = create_sandbox(_local(tmp_path), task)
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
            json.dumps(_local(tmp_path)),
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

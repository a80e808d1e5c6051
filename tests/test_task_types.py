"""The task types beyond repair (docs/task-types.md): implement-from-spec and vulnerability
classification.

Real components throughout: the bundled suites' git bundles in local sandboxes, the agent loop
with a scripted policy, the harness's check, derivation from the mini suite's real repositories
with their real test suites, and ``crl bench`` as a subprocess.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from crl_worker.agent.tools import tools_for
from crl_worker.api.common import TaskSource
from crl_worker.rewards import pass_fraction_reward, resolution_reward
from crl_worker.tasks.cwe import UnknownCweError, credit, hierarchy, normalise
from crl_worker.tasks.loaders import load_tasks
from crl_worker.tasks.model import Task
from crl_worker.tasks.sources import load_source
from tests.fixtures.task_types import (
    CLASSIFY,
    MINI,
    ROOT,
    Scripted,
    scripted_episode,
    suite_tasks,
)

FIXTURES = ROOT / "tests" / "fixtures" / "vulns"


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
    # A Pillar answer is paid only when it is the label: the vaguest answer earns nothing
    # for being above it (CWE-664 is CWE-400's parent; CWE-707 an ancestor of CWE-20).
    assert credit("CWE-400", "CWE-664") == credit("CWE-20", "CWE-707") == 0.0
    assert credit("CWE-664", "CWE-400") == 0.0
    assert credit("CWE-664", "CWE-664") == 1.0
    pillars = [w for w, e in hierarchy().items() if e.abstraction == "Pillar"]
    assert len(pillars) == 10
    assert all(credit(label, p) == 0.0 for p in pillars for label in hierarchy() if label != p)
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


async def test_a_classify_episode_is_graded_along_the_hierarchy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRL_CACHE_DIR", str(tmp_path / "cache"))
    task = next(t for t in suite_tasks(CLASSIFY / "tasks.jsonl") if "urllib3" in t.instance_id)
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
    trajectory = await scripted_episode(task, policy, tmp_path, turns=6)
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
    task = next(t for t in suite_tasks(CLASSIFY / "tasks.jsonl") if "requests" in t.instance_id)
    policy = Scripted([("shell", {"command": "ls requests"})])
    trajectory = await scripted_episode(task, policy, tmp_path, turns=2)
    assert trajectory.exit_reason == "max_turns"
    evaluation = trajectory.evaluation
    assert evaluation is not None and evaluation.infrastructure_error is None
    assert (evaluation.answer, evaluation.resolved, evaluation.credit) == (None, False, 0.0)
    assert "the episode ended without classify" in evaluation.log
    assert resolution_reward(eval_result=[evaluation]) == [0.0]  # recorded, not left out

"""Curriculum ordering: patch sizes counted as git counts them, and per-instance resolve rates
from a real ``crl bench`` results folder."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from crl_worker.api.trainingrun import CurriculumSpec
from crl_worker.rollout.results import AttemptResult, ResultsStore
from crl_worker.tasks.loaders import load_tasks
from crl_worker.tasks.model import Task
from crl_worker.train.curriculum import changed_lines, order_tasks, resolve_rates
from crl_worker.train.errors import TrainConfigError
from tests.fixtures.paths import ROOT

MINI = ROOT / "examples" / "suites" / "mini" / "tasks.jsonl"


def task(instance_id: str, patch: str = "") -> Task:
    return Task(
        instance_id=instance_id,
        repo="crl-tests/curriculum",
        base_commit="0" * 40,
        patch=patch,
        test={"command": "pytest {tests}", "log_format": "pytest"},
    )


def ids(tasks: list[Task]) -> list[str]:
    return [t.instance_id for t in tasks]


def diff(removed: list[str], added: list[str], *, context: int = 1) -> str:
    """A one-hunk unified diff of ``sql/schema.sql``."""
    ctx = [" context"] * context
    body = ctx + [f"-{line}" for line in removed] + [f"+{line}" for line in added]
    header = f"@@ -1,{context + len(removed)} +1,{context + len(added)} @@"
    lines = ["diff --git a/s.sql b/s.sql", "--- a/s.sql", "+++ b/s.sql", header, *body]
    return "\n".join(lines) + "\n"


# --- counting changed lines -------------------------------------------------------------------


def test_changed_lines_of_the_mini_suite_match_git_numstat(tmp_path: Path) -> None:
    tasks = load_tasks(MINI, "task").tasks
    assert len(tasks) >= 8
    for item in tasks:
        patch_file = tmp_path / f"{item.instance_id}.patch"
        patch_file.write_text(item.patch)
        numstat = subprocess.run(
            ["git", "apply", "--numstat", str(patch_file)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        expected = sum(
            int(added) + int(removed)
            for added, removed, _ in (line.split("\t") for line in numstat.splitlines())
        )
        assert changed_lines(item.patch) == expected, item.instance_id


def test_changed_lines_counts_inside_hunks_only() -> None:
    # A removed SQL comment ("-- old") reads "--- old": inside a hunk it is a changed line,
    # not a file header; the "\ No newline" marker is not a line.
    patch = diff(["-- old comment", "select 1;"], ["-- new comment"])
    assert changed_lines(patch) == 3
    no_newline = diff(["a"], ["b"]) + "\\ No newline at end of file\n"
    assert changed_lines(no_newline) == 2
    single = "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-x\n+y\n"
    assert changed_lines(single) == 2
    assert changed_lines(diff(["a"], ["b"]) + diff(["c", "d"], [])) == 4
    assert changed_lines("") == 0


# --- ordering ---------------------------------------------------------------------------------


def test_none_and_no_spec_keep_the_order(tmp_path: Path) -> None:
    tasks = [task("b"), task("a"), task("c")]
    assert ids(order_tasks(tasks, None, base_dir=tmp_path)) == ["b", "a", "c"]
    spec = CurriculumSpec(order="none")
    ordered = order_tasks(tasks, spec, base_dir=tmp_path)
    assert ids(ordered) == ["b", "a", "c"] and ordered is not tasks


def test_patch_size_smallest_first_ties_by_id_unknown_last(tmp_path: Path) -> None:
    tasks = [
        task("big", diff(["a", "b", "c"], ["d", "e"])),
        task("no-patch-2"),
        task("small-b", diff(["a"], ["b"])),
        task("small-a", diff(["x"], ["y"])),
        task("no-patch-1"),
        task("middle", diff(["a", "b"], ["c"])),
    ]
    ordered = order_tasks(tasks, CurriculumSpec(order="patch-size"), base_dir=tmp_path)
    assert ids(ordered) == ["small-a", "small-b", "middle", "big", "no-patch-2", "no-patch-1"]


def test_patch_size_on_the_mini_suite_is_ascending(tmp_path: Path) -> None:
    tasks = load_tasks(MINI, "task").tasks
    ordered = order_tasks(tasks, CurriculumSpec(order="patch-size"), base_dir=tmp_path)
    sizes = [(changed_lines(t.patch), t.instance_id) for t in ordered]
    assert sizes == sorted(sizes) and len(ordered) == len(tasks)
    assert sizes[0][0] < sizes[-1][0]


def write_results(folder: Path, verdicts: dict[str, list[bool | None]]) -> None:
    """A results folder as ``crl bench`` writes it (``None``: an infrastructure failure)."""
    store = ResultsStore(folder)
    store.open({"suite": "curriculum-test"})
    try:
        for instance, outcomes in verdicts.items():
            for attempt, resolved in enumerate(outcomes):
                store.append(
                    AttemptResult(
                        instance_id=instance,
                        repo="crl-tests/curriculum",
                        attempt=attempt,
                        resolved=resolved,
                        exit_reason="submitted" if resolved is not None else "infrastructure_error",
                        infrastructure_error=None if resolved is not None else "sandbox died",
                    ),
                    "{}",
                )
    finally:
        store.close()


def test_benchmark_results_easiest_first_errors_excluded_unseen_last(tmp_path: Path) -> None:
    write_results(
        tmp_path / "runs" / "baseline",
        {
            "half": [True, False],
            "always": [True, None, None],  # errored attempts do not count: 1/1
            "never": [False, False, False],
            "third": [True, False, False],
            "also-half": [False, True, None],
            "errored-only": [None, None],
            "not-a-task": [True],
        },
    )
    tasks = [
        task(name)
        for name in ("unseen-z", "never", "third", "half", "errored-only", "always", "also-half")
    ]
    tasks.append(task("unseen-a"))
    spec = CurriculumSpec(order="benchmark-results", results="runs/baseline")
    ordered = order_tasks(tasks, spec, base_dir=tmp_path)
    assert ids(ordered) == [
        "always",
        "also-half",
        "half",
        "third",
        "never",
        "unseen-z",
        "errored-only",
        "unseen-a",
    ]
    rates = resolve_rates(tmp_path / "runs" / "baseline" / "results.jsonl")
    assert rates == {
        "half": 0.5,
        "always": 1.0,
        "never": 0.0,
        "third": pytest.approx(1 / 3),
        "also-half": 0.5,
        "not-a-task": 1.0,
    }
    # The results.jsonl itself, by absolute path, gives the same order.
    absolute = CurriculumSpec(
        order="benchmark-results", results=str(tmp_path / "runs" / "baseline" / "results.jsonl")
    )
    assert ids(order_tasks(tasks, absolute, base_dir=Path("/nonexistent"))) == ids(ordered)


def test_benchmark_results_that_cannot_be_read_name_the_field(tmp_path: Path) -> None:
    tasks = [task("a")]
    cases = {
        "missing": "no/such/folder",
        "empty-folder": "empty",
        "corrupt": "corrupt/results.jsonl",
    }
    (tmp_path / "empty").mkdir()
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "results.jsonl").write_text("not json\n{}\n")
    for case, results in cases.items():
        spec = CurriculumSpec(order="benchmark-results", results=results)
        with pytest.raises(TrainConfigError) as failed:
            order_tasks(tasks, spec, base_dir=tmp_path)
        assert failed.value.field == "spec.curriculum.results", case
        assert str(failed.value).startswith("spec.curriculum.results: "), case
    # The CRD's CEL refuses this; a spec built in Python still gets a clear error.
    spec = CurriculumSpec.model_construct(order="benchmark-results", results=None)
    with pytest.raises(TrainConfigError, match="needs results"):
        order_tasks(tasks, spec, base_dir=tmp_path)


def test_results_of_another_suite_leave_the_order(tmp_path: Path) -> None:
    write_results(tmp_path / "other", {"x": [True], "y": [False]})
    tasks = [task("b"), task("a")]
    spec = CurriculumSpec(order="benchmark-results", results="other")
    assert ids(order_tasks(tasks, spec, base_dir=tmp_path)) == ["b", "a"]

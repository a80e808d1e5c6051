"""Every grader takes the integrity path: predictions files and ``crl tasks check --patch``.

Free-text patches that fix nothing, each carrying a test or plugin file past a split that
reads paths the old way (another first component, a C-quoted name, a new ``*.dist-info``), are
graded by ``crl tasks grade`` (a predictions file, as SWE-bench's harness grades other agents')
and ``crl tasks check --patch``. Each is first applied as plain :func:`evaluate` does, which is
what graded such patches before (no split, no pristine sandbox): there it is resolved, so the
attack is real. Through the graders it is unresolved; the gold patch is resolved.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from crl_worker.harness.evaluate import evaluate
from crl_worker.harness.predictions import PredictionsError, load_predictions
from crl_worker.sandbox.registry import create_sandbox

from .fixtures.paths import run
from .fixtures.redteam import PYTEST, SPARING_HOOK, SUITE, suite

TASKS = SUITE / "tasks.jsonl"


def _new_file(path: str, text: str, a: str = "a/", b: str = "b/") -> str:
    lines = text.splitlines()
    head = f"diff --git {a}{path} {b}{path}\nnew file mode 100644\n--- /dev/null\n+++ {b}{path}\n"
    return head + f"@@ -0,0 +1,{len(lines)} @@\n" + "".join(f"+{line}\n" for line in lines)


def _quoted_conftest() -> str:
    body = _new_file("x", SPARING_HOOK).split("+++ b/x\n", 1)[1]
    quoted = '"a/\\143onftest.py" "b/\\143onftest.py"'
    return (
        f'diff --git {quoted}\nnew file mode 100644\n--- /dev/null\n+++ "b/\\143onftest.py"\n{body}'
    )


#: Attack patches: (name, patch).
ATTACKS = {
    "conftest-other-prefix": _new_file("tests/conftest.py", SPARING_HOOK, "x/", "y/"),
    "conftest-octal-quoted": _quoted_conftest(),
    "dist-info-plugin": (
        _new_file("intervals/_report.py", SPARING_HOOK)
        + _new_file("crl-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: crl\nVersion: 1")
        + _new_file("crl-1.0.dist-info/entry_points.txt", "[pytest11]\ncrl = intervals._report")
    ),
}


@pytest.fixture(scope="module")
def plain_verdicts() -> dict[str, bool]:
    """Each attack as plain evaluate() grades it in one sandbox (reset between): the control."""
    task = suite()[PYTEST]

    async def main() -> dict[str, bool]:
        verdicts = {}
        async with create_sandbox({"type": "local"}, task) as sandbox:
            for name, patch in ATTACKS.items():
                await sandbox.reset()
                verdicts[name] = (await evaluate(sandbox, task, model_patch=patch)).resolved
        return verdicts

    return asyncio.run(main())


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, object]]:
    """``crl tasks grade`` of the attacks and the gold patch, as JSON by model name."""
    task = suite()[PYTEST]
    folder = tmp_path_factory.mktemp("predictions")
    records = [{"instance_id": PYTEST, "model_name_or_path": "gold", "model_patch": task.patch}]
    records += [
        {"instance_id": PYTEST, "model_name_or_path": name, "model_patch": patch}
        for name, patch in ATTACKS.items()
    ]
    records.append({"instance_id": "no-such-instance", "model_patch": ""})
    predictions = folder / "predictions.jsonl"
    predictions.write_text("".join(json.dumps(r) + "\n" for r in records))
    command = [sys.executable, "-m", "crl_cli", "tasks", "grade", str(TASKS), str(predictions)]
    done = run([*command, "-j", "2", "-o", "json"], timeout=600)
    # A prediction of an instance the task file lacks is a problem of the input (exit 1).
    assert done.returncode == 1, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert rows[-1]["problem"] == "no such instance in the task file"
    return {str(r["model_name_or_path"]): r for r in rows[:-1]}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_a_prediction_attack_is_unresolved(
    name: str, plain_verdicts: dict[str, bool], graded: dict[str, dict[str, object]]
) -> None:
    assert plain_verdicts[name], f"{name} does not work even without the integrity path"
    row = graded[name]
    assert row["resolved"] is False, row
    assert row["stripped"], row


def test_the_gold_prediction_resolves(graded: dict[str, dict[str, object]]) -> None:
    assert graded["gold"]["resolved"] is True, graded["gold"]
    assert graded["gold"]["stripped"] == []


def test_tasks_check_grades_a_candidate_through_the_integrity_path(tmp_path: Path) -> None:
    patch = tmp_path / "candidate.diff"
    patch.write_text(ATTACKS["conftest-other-prefix"])
    args = [sys.executable, "-m", "crl_cli", "tasks", "check", str(TASKS), "-i", PYTEST]
    done = run([*args, "--patch", str(patch), "-o", "json"], timeout=600)
    assert done.returncode == 1, done.stderr[-3000:]  # the candidate does not resolve
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["patch"] == "candidate" and found["gold"] == "unresolved", found
    assert "tests/conftest.py (test infrastructure)" in found["gold_runs"][0]["stripped"]
    assert any("candidate: not resolved" in p for p in found["problems"]), found["problems"]


def test_a_predictions_file_holds_one_prediction_per_instance(tmp_path: Path) -> None:
    """A solved instance repeated would count as several resolved predictions: refused, with
    the instance named (exit 2, as any unreadable predictions file)."""
    record = {"instance_id": PYTEST, "model_name_or_path": "m", "model_patch": ""}
    twice = tmp_path / "twice.jsonl"
    twice.write_text(f"{json.dumps(record)}\n{json.dumps(record)}\n")
    with pytest.raises(
        PredictionsError, match=f"more than one prediction of one model for {PYTEST} \\(m\\)"
    ):
        load_predictions(twice)
    # Two models answering the same instance are two predictions.
    other = {**record, "model_name_or_path": "n"}
    once = tmp_path / "once.jsonl"
    once.write_text(json.dumps(record) + "\n" + json.dumps(other) + "\n")
    assert [p.model_name_or_path for p in load_predictions(once)] == ["m", "n"]
    command = [sys.executable, "-m", "crl_cli", "tasks", "grade", str(TASKS), str(twice)]
    done = run(command)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "more than one prediction" in done.stdout + done.stderr

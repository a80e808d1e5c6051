"""GRPO on the CPU toy path for the task types beyond repair (docs/task-types.md): the toy model
learns the implement toy (write ``add``'s missing body) and the classify toy (name the CWE of a
shell command built from input), through the same trainer, sandboxes and rewards as repair.
The run helpers are those of tests/test_train_run.py (the repair toy's learning test)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")

from crl_worker.train import toy
from tests.test_train_run import manifest, metrics, train, trajectories

logger = logging.getLogger(__name__)


def _toy(root: Path, task_type: str) -> Path:
    toy.build_toy_model(root / "model", task_type=task_type)
    toy.build_toy_suite(root / "suite", task_type=task_type)
    return root


@pytest.mark.parametrize("task_type", ["implement", "classify"])
def test_grpo_reward_rises_on_the_toy_of_each_type(tmp_path: Path, task_type: str) -> None:
    files = _toy(tmp_path / "toy", task_type)
    config = manifest(
        files,
        tmp_path / "run",
        name=f"toy-{task_type}",
        tasks={"taskType": task_type},
        algorithm={"steps": 10, "learningRate": 0.02, "numGenerations": 16},
        checkpoints={"everySteps": 10, "keepLast": 1},
    )
    out = tmp_path / "out"
    done = train(config, out)
    assert done.returncode == 0, done.stderr[-4000:]
    records = metrics(out)
    assert [r["step"] for r in records] == list(range(1, 11))
    rewards = [r["reward_mean"] for r in records]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    logger.info("%s toy: reward per step %s", task_type, [round(r, 3) for r in rewards])
    assert last >= first + 0.25 and last >= 0.75, rewards
    lines = trajectories(out, 1)
    evaluations = [line["trajectory"]["evaluation"] for line in lines]
    if task_type == "classify":
        # Graded by credit: exact 1, the parent 0.5, farther answers less, none 0.
        credits = {e["answer"]: e["credit"] for e in evaluations if e["answer"]}
        assert credits.get("CWE-78", 1.0) == 1.0 and credits.get("CWE-77", 0.5) == 0.5
        assert all(e["credit"] == 0.0 for e in evaluations if e["answer"] is None)
        assert {line["trajectory"]["tools"][-1] for line in lines} == {"classify"}
    else:
        assert all(e["credit"] is None for e in evaluations)

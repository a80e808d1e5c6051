"""GRPO on the CPU toy path for the task types beyond repair (docs/task-types.md), through the
same trainer, sandboxes and rewards as repair: the toy model learns the classify toy (name the
CWE of a shell command built from input: graded by credit, so the reward has steps between 0
and 1), and a short run of the implement toy (write ``add``'s missing body; its tests hidden
until grading) goes through the whole loop. Learning with test-graded rewards is the repair
toy's learning test (tests/test_train_run.py); the implement toy's learnability was checked by
a 10-step run of this test before it was cut to its wiring (docs/toy-model.md)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")

from crl_worker.train import toy

from .fixtures.trainer import manifest, metrics, train, trajectories

logger = logging.getLogger(__name__)

pytestmark = pytest.mark.train


def _toy(root: Path, task_type: str) -> Path:
    toy.build_toy_model(root / "model", task_type=task_type)
    toy.build_toy_suite(root / "suite", task_type=task_type)
    return root


def test_grpo_reward_rises_on_the_classify_toy(tmp_path: Path) -> None:
    files = _toy(tmp_path / "toy", "classify")
    config = manifest(
        files,
        tmp_path / "run",
        name="toy-classify",
        tasks={"taskType": "classify"},
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
    logger.info("classify toy: reward per step %s", [round(r, 3) for r in rewards])
    assert last >= first + 0.25 and last >= 0.75, rewards
    lines = trajectories(out, 1)
    evaluations = [line["trajectory"]["evaluation"] for line in lines]
    # Graded by credit: exact 1, the parent 0.5, farther answers less, none 0.
    credits = {e["answer"]: e["credit"] for e in evaluations if e["answer"]}
    assert credits.get("CWE-78", 1.0) == 1.0 and credits.get("CWE-77", 0.5) == 0.5
    assert all(e["credit"] == 0.0 for e in evaluations if e["answer"] is None)
    assert {line["trajectory"]["tools"][-1] for line in lines} == {"classify"}


def test_grpo_runs_the_implement_toy_through_its_hidden_tests(tmp_path: Path) -> None:
    files = _toy(tmp_path / "toy", "implement")
    config = manifest(
        files,
        tmp_path / "run",
        name="toy-implement",
        tasks={"taskType": "implement"},
        algorithm={"steps": 2, "learningRate": 0.02, "numGenerations": 8},
        checkpoints={"everySteps": 2, "keepLast": 1},
    )
    out = tmp_path / "out"
    done = train(config, out)
    assert done.returncode == 0, done.stderr[-4000:]
    records = metrics(out)
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["rollouts"] == 8 and r["infrastructure_failures"] == 0 for r in records)
    for step in (1, 2):
        lines = trajectories(out, step)
        evaluations = [line["trajectory"]["evaluation"] for line in lines]
        # Every rollout was graded by the hidden tests (none of them in the sandbox before),
        # and the reward is the verdict: 1 resolved, 0 not; no credit as classify has.
        assert all(e["credit"] is None and e["fail_to_pass"] for e in evaluations)
        assert [line["reward"] for line in lines] == [float(e["resolved"]) for e in evaluations]

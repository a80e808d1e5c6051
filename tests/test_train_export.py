"""`crl trajectories export` of a training run's folder: the trajectories a real `crl train`
of the toy wrote (the train lane's short run) become rows with the policy version that sampled
them, the step, the task type, and chats that render back to their token ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")

from crl_worker.rollout.export import ExportFilters, export_trajectories  # noqa: E402

from .fixtures.trainer import ShortRuns, trajectories  # noqa: E402

pytestmark = pytest.mark.train


def test_a_training_runs_trajectories_export(
    short_runs: ShortRuns, toy_files: Path, tmp_path: Path
) -> None:
    run = short_runs.terminal
    tokenizer = transformers.AutoTokenizer.from_pretrained(toy_files / "model")
    report = export_trajectories([run], tmp_path / "ds", tokenizer=tokenizer)
    recorded = trajectories(run, 1) + trajectories(run, 2)
    assert report.read == len(recorded) == 8
    assert report.renders_checked == report.renders_matching == report.written
    files = sorted(str(p) for p in (tmp_path / "ds" / "data").glob("*.parquet"))
    rows = datasets.load_dataset("parquet", data_files=files, split="train")
    assert len(rows) + report.left_out["duplicate"] == 8
    by_hash = {row["trajectory_hash"]: row for row in rows}
    for line in recorded:
        sampled = [t for turn in line["trajectory"]["turns"] for t in turn["completion_token_ids"]]
        matches = [
            r
            for r in by_hash.values()
            if [i for i, m in zip(r["input_ids"], r["assistant_masks"], strict=True) if m]
            == sampled
        ]
        assert matches, "a recorded rollout is missing from the dataset"
    for row in rows:
        assert row["source_kind"] == "training" and row["step"] in (1, 2)
        assert row["policy_version"] == row["step"] - 1  # no overlap: sampled by the last step
        assert row["task_type"] == "repair" and row["model"]
        assert row["reward"] in (0.0, 1.0) and row["resolved"] == (row["reward"] == 1.0)
        assert json.loads(row["tools"])[0]["type"] == "function"
    resolved = export_trajectories(
        [run / "trajectories"], tmp_path / "resolved", filters=ExportFilters(resolved_only=True)
    )
    assert resolved.written == sum(rows["resolved"])

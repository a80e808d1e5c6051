"""`spec.algorithm.type: sft`: supervised fine-tuning of the toy on its own resolved
trajectories (a real `crl train` run of the train lane, exported by `crl trajectories export`),
TRL's SFTTrainer with the loss on the model's sampled tokens only, through the trainer's own
entry point, with checkpoints, metrics and the final weights where GRPO puts them."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

torch = pytest.importorskip("torch")
pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")

from crl_worker.rollout.export import ExportFilters, export_trajectories  # noqa: E402
from crl_worker.train.errors import TrainConfigError  # noqa: E402
from crl_worker.train.settings import resolve_settings  # noqa: E402
from crl_worker.train.sft import build_sft_trainer, load_sft_dataset  # noqa: E402

from .fixtures.trainer import ShortRuns, checkpoints, manifest, metrics, train  # noqa: E402

pytestmark = pytest.mark.train

STEPS = 4


@pytest.fixture(scope="module")
def resolved(short_runs: ShortRuns, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The resolved trajectories of the train lane's short GRPO run, as a dataset."""
    out = tmp_path_factory.mktemp("sft-data") / "resolved"
    report = export_trajectories(
        [short_runs.terminal], out, filters=ExportFilters(resolved_only=True)
    )
    assert report.written >= 1, report
    return out


def sft_manifest(toy_files: Path, folder: Path, dataset: dict[str, Any]) -> Path:
    """The toy's run turned supervised, without the GRPO fields the CRD refuses with sft."""
    path = manifest(
        toy_files,
        folder,
        name="toy-sft",
        algorithm={
            "type": "sft",
            "sft": {"dataset": dataset},
            "steps": STEPS,
            "learningRate": 0.01,
        },
        checkpoints={"everySteps": 2, "keepLast": 2},
    )
    document = yaml.safe_load(path.read_text())
    spec = document["spec"]
    del spec["rollout"]["pool"], spec["algorithm"]["tasksPerStep"]
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def exported(folder: Path) -> Any:
    """The rows of an exported dataset, read without the code under test."""
    files = sorted(str(p) for p in (folder / "data").glob("*.parquet"))
    return datasets.load_dataset("parquet", data_files=files, split="train")


def assistant_logprob(model_dir: Path, rows: Any) -> float:
    """Mean log-probability the model gives the tokens it sampled in ``rows``."""
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    total, count = 0.0, 0
    with torch.no_grad():
        for row in rows:
            ids = torch.tensor([row["input_ids"]])
            logprobs = torch.log_softmax(model(ids).logits[0, :-1], dim=-1)
            picked = logprobs.gather(1, ids[0, 1:, None])[:, 0]
            mask = torch.tensor(row["assistant_masks"][1:], dtype=torch.bool)
            total += float(picked[mask].sum())
            count += int(mask.sum())
    return total / count


def test_the_loss_falls_on_the_sampled_tokens_only(
    toy_files: Path, resolved: Path, tmp_path: Path
) -> None:
    settings = resolve_settings(
        sft_manifest(toy_files, tmp_path, {"path": str(resolved)}), output=tmp_path / "out"
    )
    trainer = build_sft_trainer(settings, 1, [])
    rows = exported(resolved)
    prepared = trainer.train_dataset
    assert len(prepared) == len(rows) >= 1
    by_ids = {tuple(r["input_ids"]): r["assistant_masks"] for r in rows}
    for example in prepared:
        mask = by_ids[tuple(example["input_ids"])]
        assert example["labels"] == [
            t if m else -100 for t, m in zip(example["input_ids"], mask, strict=True)
        ]
        assert 0 < mask.count(1) < len(mask)


def test_sft_run_on_resolved_trajectories(toy_files: Path, resolved: Path, tmp_path: Path) -> None:
    config = sft_manifest(toy_files, tmp_path, {"path": str(resolved)})
    out = tmp_path / "out"
    started = time.monotonic()
    done = train(config, out)
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-4000:]
    records = metrics(out)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert all(r["loss"] is not None and r["tokens_per_second"] for r in records)
    assert checkpoints(out) == ["checkpoint-2", "checkpoint-4"]
    assert (out / "latest").resolve().name == "checkpoint-4"
    # Trained toward its own resolved answers: they are likelier after SFT than before.
    rows = exported(resolved)
    before = assistant_logprob(toy_files / "model", rows)
    after = assistant_logprob(out / "final", rows)
    assert after > before + 0.1, (before, after)
    print(f"SFT run: {STEPS} steps in {seconds:.1f} s")  # noqa: T201


def test_a_dataset_that_is_not_there_names_the_field(toy_files: Path, tmp_path: Path) -> None:
    settings = resolve_settings(
        sft_manifest(toy_files, tmp_path, {"path": "missing"}), output=tmp_path / "out"
    )
    with pytest.raises(TrainConfigError, match=r"spec.algorithm.sft.dataset.path.*no parquet"):
        load_sft_dataset(settings)
    settings = resolve_settings(
        sft_manifest(toy_files, tmp_path, {"benchmarkResults": "nowhere"}), output=tmp_path / "o"
    )
    with pytest.raises(TrainConfigError, match=r"benchmarkResults: .*nowhere does not exist"):
        load_sft_dataset(settings)
    assert not (tmp_path / "o" / "sft-dataset").exists()


def test_results_folders_are_exported_into_the_run_folder(
    toy_files: Path, short_runs: ShortRuns, resolved: Path, tmp_path: Path
) -> None:
    # benchmarkResults takes any results folder the export reads: here the short GRPO run's.
    dataset = {"benchmarkResults": str(short_runs.terminal), "perInstance": 1}
    settings = resolve_settings(sft_manifest(toy_files, tmp_path, dataset), output=tmp_path / "o")
    rows = load_sft_dataset(settings)
    assert rows.column_names == ["input_ids", "assistant_masks"]
    assert len(rows) == 1  # one toy instance, at most one per instance
    assert tuple(rows[0]["input_ids"]) in {tuple(r["input_ids"]) for r in exported(resolved)}
    assert (tmp_path / "o" / "sft-dataset" / "README.md").is_file()


def test_in_a_trainer_pod_a_dataset_path_is_on_the_checkpoint_volume(
    toy_files: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The operator mounts the checkpoint volume at CRL_CHECKPOINT_DIR (the run folder); the
    # manifest is its ConfigMap's copy elsewhere, where no dataset is.
    volume = tmp_path / "checkpoints"
    (volume / "datasets" / "sft" / "data").mkdir(parents=True)
    rows = {"input_ids": [[1, 2, 3, 4], [5, 6, 7]], "assistant_masks": [[0, 0, 1, 1], [0, 1, 1]]}
    datasets.Dataset.from_dict(rows).to_parquet(volume / "datasets" / "sft" / "data" / "a.parquet")
    config = sft_manifest(toy_files, tmp_path / "config", {"path": "datasets/sft"})
    monkeypatch.setenv("CRL_CHECKPOINT_DIR", str(volume))
    loaded = load_sft_dataset(resolve_settings(config))
    assert loaded.to_dict() == rows

"""`crl trajectories export`: a Benchmark's results folder of the toy (the real runner, the toy
model answering in-process) becomes a Hugging Face dataset whose chats render back, through the
toy's chat template, to exactly the token ids the model sampled; the filters, the dataset card,
and the errors for folders it cannot read (leaving nothing half-written)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
datasets = pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")

from crl_worker.rollout.export import (  # noqa: E402
    ExportError,
    ExportFilters,
    chat_renders_ids,
    export_trajectories,
)
from crl_worker.rollout.results import read_results  # noqa: E402

from .fixtures.cli import crl  # noqa: E402
from .fixtures.trajectory_export import toy_bench_results  # noqa: E402

#: Seeds 0-3 of the toy give two resolved attempts and two unresolved, one of them multi-turn.
ATTEMPTS = 4


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return toy_bench_results(tmp_path_factory.mktemp("toy-bench"), attempts=ATTEMPTS)


@pytest.fixture(scope="module")
def tokenizer(bench: tuple[Path, Path]) -> Any:
    return transformers.AutoTokenizer.from_pretrained(bench[1])


def load(folder: Path) -> Any:
    """The exported dataset as a trainer loads it (``load_dataset(folder)`` would reuse a
    cached copy of an earlier dataset at the same path: datasets' cache key of a local folder)."""
    files = sorted(str(p) for p in (folder / "data").glob("*.parquet"))
    return datasets.load_dataset("parquet", data_files=files, split="train")


def test_rows_render_back_to_the_sampled_token_ids(
    bench: tuple[Path, Path], tokenizer: Any, tmp_path: Path
) -> None:
    results, _ = bench
    verdicts = {r.attempt: r for r in read_results(results)}
    assert {r.resolved for r in verdicts.values()} == {True, False}
    report = export_trajectories([results], tmp_path / "ds", tokenizer=tokenizer)
    assert report.written == report.read == ATTEMPTS
    assert report.renders_checked == report.renders_matching == ATTEMPTS
    rows = load(tmp_path / "ds")
    assert len(rows) == ATTEMPTS
    trajectories = {
        t["attempt"]: t for t in map(json.loads, (results / "trajectories.jsonl").open())
    }
    multi_turn = 0
    for row in rows:
        trajectory = trajectories[row["attempt"]]
        sampled = [t for turn in trajectory["turns"] for t in turn["completion_token_ids"]]
        # The token mask marks exactly the tokens the model sampled, in order.
        assert [i for i, m in zip(row["input_ids"], row["assistant_masks"], strict=True) if m] == (
            sampled
        )
        assert row["num_trained_tokens"] == len(sampled) < row["num_tokens"]
        # The chat, as read back from parquet, renders (toy template and the tools offered)
        # to exactly the recorded sequence: nothing re-tokenized, nothing lost on the way.
        rendered = tokenizer.apply_chat_template(
            row["messages"], tools=json.loads(row["tools"]), tokenize=True, return_dict=True
        )["input_ids"]
        # ... up to the end-of-turn token a turn cut at max_tokens never sampled.
        ids = row["input_ids"]
        assert rendered[: len(ids)] == ids
        assert rendered[len(ids) :] in ([], [tokenizer.eos_token_id])
        assert row["chat_renders_ids"] is True
        # Per-message loss: the assistant turns, one per model call; the chat ends with the
        # model's last answer (what came after it, the model never saw).
        roles = [m["role"] for m in row["messages"]]
        assert row["message_loss"] == [r == "assistant" for r in roles]
        assert sum(row["message_loss"]) == row["num_turns"] == len(trajectory["turns"])
        assert roles[:2] == ["system", "user"] and roles[-1] == "assistant"
        # Every tool call as the model wrote it (those after a submit were never run, so the
        # turn's records stop there).
        for turn in trajectory["turns"]:
            message = row["messages"][turn["message_index"]]
            written = [
                (c["function"]["name"], c["function"]["arguments"])
                for c in message["tool_calls"] or []
            ]
            run = [(c["name"], c["arguments"]) for c in turn["tool_calls"]]
            assert written[: len(run)] == run
        # Metadata.
        verdict = verdicts[row["attempt"]]
        assert (row["instance_id"], row["resolved"], row["reward"]) == (
            verdict.instance_id,
            verdict.resolved,
            verdict.reward,
        )
        assert (row["task_type"], row["model"], row["template"]) == ("repair", "toy", "swe-default")
        assert row["source_kind"] == "benchmark" and row["policy_version"] is None
        multi_turn += row["num_turns"] > 1
    assert multi_turn >= 1
    card = (tmp_path / "ds" / "README.md").read_text()
    assert card.startswith("---\nconfigs:") and f"rows: {ATTEMPTS}" in card
    assert f"{ATTEMPTS} of {ATTEMPTS} rows render back" in card


def test_a_chat_changed_by_one_token_does_not_render_back(
    bench: tuple[Path, Path], tokenizer: Any, tmp_path: Path
) -> None:
    export_trajectories([bench[0]], tmp_path / "ds")
    row = load(tmp_path / "ds")[0]
    assert row["chat_renders_ids"] is None  # no tokenizer: not checked
    assert chat_renders_ids(tokenizer, row["messages"], row["tools"], row["input_ids"])
    ids = list(row["input_ids"])
    ids[-1] = tokenizer.pad_token_id
    assert not chat_renders_ids(tokenizer, row["messages"], row["tools"], ids)


def test_filters(bench: tuple[Path, Path], tmp_path: Path) -> None:
    results, _ = bench
    records = read_results(results)
    resolved = sum(bool(r.resolved) for r in records)
    # The same folder twice: every trajectory has an identical twin.
    report = export_trajectories([results, results], tmp_path / "twice")
    assert report.read == 2 * ATTEMPTS and report.written == ATTEMPTS
    assert report.left_out == {"duplicate": ATTEMPTS}
    report = export_trajectories(
        [results, results], tmp_path / "all", filters=ExportFilters(dedup=False)
    )
    assert report.written == 2 * ATTEMPTS

    report = export_trajectories(
        [results], tmp_path / "resolved", filters=ExportFilters(resolved_only=True)
    )
    rows = load(tmp_path / "resolved")
    assert report.written == len(rows) == resolved and all(rows["resolved"])
    report = export_trajectories(
        [results], tmp_path / "reward", filters=ExportFilters(min_reward=1)
    )
    assert report.written == resolved and report.left_out == {"reward below 1": ATTEMPTS - resolved}

    report = export_trajectories([results], tmp_path / "one", filters=ExportFilters(per_instance=1))
    (row,) = load(tmp_path / "one")
    shortest_resolved = min(
        (r for r in records if r.resolved), key=lambda r: r.prompt_tokens + r.completion_tokens
    )
    assert row["resolved"] and row["attempt"] == shortest_resolved.attempt

    report = export_trajectories([results], tmp_path / "turns", filters=ExportFilters(max_turns=1))
    assert load(tmp_path / "turns")["num_turns"] == [1] * report.written
    assert report.left_out == {"more than 1 turns": sum(r.turns > 1 for r in records)} != {}
    everything = load(tmp_path / "all")["num_tokens"]
    limit = sorted(everything)[len(everything) // 2]
    export_trajectories([results], tmp_path / "tokens", filters=ExportFilters(max_tokens=limit))
    kept = load(tmp_path / "tokens")["num_tokens"]
    assert kept and max(kept) <= limit < max(everything)


def test_unreadable_results_are_named_and_nothing_is_half_written(
    bench: tuple[Path, Path], tmp_path: Path
) -> None:
    results, _ = bench
    with pytest.raises(ExportError, match="is neither a Benchmark's results folder"):
        export_trajectories([results, tmp_path], tmp_path / "ds")
    with pytest.raises(ExportError, match="does not exist"):
        export_trajectories([tmp_path / "missing"], tmp_path / "ds")
    # A corrupt line in the middle of the second folder, after the first was read whole.
    broken = tmp_path / "broken"
    shutil.copytree(results, broken)
    lines = (broken / "trajectories.jsonl").read_text().splitlines(keepends=True)
    lines[1] = lines[1][: len(lines[1]) // 2] + "\n"
    (broken / "trajectories.jsonl").write_text("".join(lines))
    out = tmp_path / "ds"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match=rf"{broken}/trajectories.jsonl, byte \d+: not JSON"):
        export_trajectories([results, broken], out, overwrite=True)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken", "ds"]  # no leftover
    with pytest.raises(ExportError, match="not empty; choose another --out, or --overwrite"):
        export_trajectories([results], out)
    export_trajectories([results], out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "data"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken", "ds"]


def test_crl_trajectories_export(bench: tuple[Path, Path], tmp_path: Path) -> None:
    results, _ = bench
    done = crl(
        "trajectories",
        "export",
        str(results),
        "--out",
        str(tmp_path / "ds"),
        "--resolved-only",
        "-o",
        "json",
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["written"] >= 1 and summary["rendersChecked"] == 0
    assert len(load(tmp_path / "ds")) == summary["written"]
    assert summary["leftOut"] == {"not resolved": ATTEMPTS - summary["written"]}
    refused = crl("trajectories", "export", str(tmp_path), "--out", str(tmp_path / "other"))
    assert refused.returncode == 1
    assert f"{tmp_path} is neither a Benchmark's results folder" in refused.stderr
    assert not (tmp_path / "other").exists()

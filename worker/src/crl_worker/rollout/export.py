"""Trajectories as a Hugging Face dataset: the supervised warm start's training set.

:func:`export_trajectories` reads the results folders of Benchmarks (``results.jsonl`` and
``trajectories.jsonl``, see :mod:`crl_worker.rollout.results`) and of training runs (the run
folder's ``trajectories/step-NNNNNN.rankR.jsonl``) and writes a dataset folder that
``datasets.load_dataset(DIR)`` reads and TRL's ``SFTTrainer`` trains on as it is:

- ``data/train-00000-of-0000N.parquet``: one row per trajectory (the columns:
  :func:`~crl_worker.rollout.dataset.schema`, documented in docs/cli.md);
- ``README.md``: the dataset card (YAML header naming the parquet files, then what was read,
  the filters, and how many trajectories each filter left out).

Each row holds the chat exactly as the model saw it (system prompt, task, every assistant turn
with its tool calls, the tool results) up to the model's last answer, a per-message loss mask
(assistant turns), and the token sequence the server sampled (``input_ids``) with its token
loss mask (``assistant_masks``: 1 for the tokens the model sampled, 0 for the prompt and the
environment's tokens), never re-tokenized. A trajectory without token ids (a server that did not
return them) or whose turns do not form one sequence is left out and counted.

Two passes keep memory bounded: the first reads every line for its metadata and a hash of its
tokens, and remembers where the line is; the second reads only the chosen lines again. The
dataset is written to a temporary folder beside ``out`` and renamed into place: a failure
leaves nothing half-written.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from crl_worker.agent.trajectory import Trajectory
from crl_worker.errors import CrlError
from crl_worker.rollout.dataset import ExportFilters, ExportReport, dataset_card, schema
from crl_worker.rollout.results import (
    RESULTS_FILE,
    TRAJECTORIES_FILE,
    ResultsError,
    read_results,
)

logger = logging.getLogger(__name__)

#: Rows per parquet file.
ROWS_PER_SHARD = 2000
#: The training run folder's trajectories, and the file names of its steps' trajectories.
TRAINING_TRAJECTORIES = "trajectories"
STEP_GLOB = "step-*.rank*.jsonl"


class ExportError(CrlError):
    """The trajectories cannot be exported (a folder that is not results, an unreadable or
    corrupt file, an output folder in the way)."""


@dataclass
class _Candidate:
    """One trajectory from the first pass: its metadata and where its line is."""

    file: Path
    offset: int
    source: str
    source_kind: str
    instance_id: str
    attempt: int
    reward: float | None
    resolved: bool | None
    task_type: str | None
    policy_version: int | None
    step: int | None
    turns: int
    tokens: int
    digest: str
    order: int


# --- reading -----------------------------------------------------------------------------------


def _lines(file: Path) -> Iterator[tuple[int, bytes]]:
    """``(byte offset, line)`` of each whole line of a JSONL file (a torn last line is
    skipped with a warning)."""
    try:
        handle = file.open("rb")
    except OSError as exc:
        raise ExportError(f"cannot read {file}: {exc.strerror or exc}") from exc
    with handle:
        offset = 0
        for raw in handle:
            if not raw.endswith(b"\n"):
                logger.warning(
                    "%s: ignoring its last line, cut short by an interrupted write", file
                )
                return
            yield offset, raw
            offset += len(raw)


def _parse(file: Path, offset: int, raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ExportError(
            f"{file}, byte {offset}: not JSON ({exc}); the file is corrupt — repair or remove "
            "that line"
        ) from exc
    if not isinstance(value, dict):
        raise ExportError(f"{file}, byte {offset}: not a JSON object")
    return value


def _trajectory(file: Path, offset: int, value: Any) -> Trajectory:
    try:
        return Trajectory.model_validate(value)
    except ValidationError as exc:
        raise ExportError(
            f"{file}, byte {offset}: not a trajectory ({exc.error_count()} problems, first: "
            f"{exc.errors()[0]['msg']} at {'.'.join(map(str, exc.errors()[0]['loc']))})"
        ) from exc


def _digest(trajectory: Trajectory) -> tuple[str, int] | None:
    """The hash of the instance and the token sequence, and its length; ``None`` without one."""
    sequence = trajectory.token_sequence()
    if sequence is None:
        return None
    h = hashlib.sha256(trajectory.instance_id.encode())
    h.update(b"\0")
    h.update(sequence.ids.tobytes())
    return h.hexdigest(), len(sequence.ids)


def _source_kind(folder: Path) -> tuple[str, list[Path]]:
    """What ``folder`` is: ``("benchmark", [trajectories.jsonl])`` or ``("training", step
    files)``; a clear error for anything else."""
    if not folder.exists():
        raise ExportError(f"{folder} does not exist")
    if not folder.is_dir():
        raise ExportError(f"{folder} is not a folder: give a results folder")
    if (folder / RESULTS_FILE).exists():
        return "benchmark", [folder / TRAJECTORIES_FILE]
    for candidate in (folder / TRAINING_TRAJECTORIES, folder):
        steps = sorted(
            p for p in candidate.glob(STEP_GLOB) if ".failed" not in p.name and p.is_file()
        )
        if steps:
            return "training", steps
    raise ExportError(
        f"{folder} is neither a Benchmark's results folder (it has no {RESULTS_FILE}) nor a "
        f"training run's folder (no {TRAINING_TRAJECTORIES}/{STEP_GLOB}); give the folder "
        "`crl bench --results` or `crl train --output` wrote"
    )


def _scan(folder: Path, order: int, report: ExportReport) -> list[_Candidate]:
    """The first pass over one results folder."""
    kind, files = _source_kind(folder)
    source = str(folder)
    found: list[_Candidate] = []
    if kind == "benchmark":
        try:
            verdicts = {r.key: r for r in read_results(folder)}
        except ResultsError as exc:
            raise ExportError(str(exc)) from exc
        # The last trajectory of an attempt is current (an attempt retried after an
        # infrastructure failure has several).
        latest: dict[tuple[str, int], tuple[int, Trajectory]] = {}
        file = files[0]
        if not file.exists():
            raise ExportError(f"{folder} has {RESULTS_FILE} but no {TRAJECTORIES_FILE}")
        for offset, raw in _lines(file):
            trajectory = _trajectory(file, offset, _parse(file, offset, raw))
            latest[(trajectory.instance_id, trajectory.attempt)] = (offset, trajectory)
        for key, (offset, trajectory) in sorted(latest.items()):
            result = verdicts.get(key)
            if result is None:
                report.left_out["no result line (attempt unfinished)"] += 1
                continue
            report.read += 1
            candidate = _candidate(
                trajectory,
                report,
                file=file,
                offset=offset,
                source=source,
                source_kind=kind,
                reward=result.reward,
                resolved=result.resolved,
                task_type=result.task_type,
                policy_version=None,
                step=None,
                order=order + len(found),
            )
            if candidate is not None:
                found.append(candidate)
        return found
    for file in files:
        for offset, raw in _lines(file):
            record = _parse(file, offset, raw)
            trajectory = _trajectory(file, offset, record.get("trajectory"))
            report.read += 1
            reward = record.get("reward")
            evaluation = trajectory.evaluation
            resolved = None if reward is None or evaluation is None else evaluation.resolved
            candidate = _candidate(
                trajectory,
                report,
                file=file,
                offset=offset,
                source=source,
                source_kind=kind,
                reward=None if reward is None else float(reward),
                resolved=resolved,
                task_type=record.get("task_type"),
                policy_version=record.get("policy_version"),
                step=record.get("step"),
                order=order + len(found),
            )
            if candidate is not None:
                found.append(candidate)
    return found


def _candidate(trajectory: Trajectory, report: ExportReport, **fields: Any) -> _Candidate | None:
    """The candidate of one trajectory, or ``None`` (counted) when it cannot be a row."""
    if trajectory.exit_reason == "cancelled":
        report.left_out["cancelled"] += 1
        return None
    if len(trajectory.tries) > 1:
        # A benchmark's second try (agent.tries: 2) was shown the hidden tests' output, which
        # the candidate's own code may have filled with the tests: never training data.
        report.left_out["a second try (shown the hidden tests' output)"] += 1
        return None
    digest = _digest(trajectory)
    if digest is None:
        report.left_out["no token sequence"] += 1
        logger.info(
            "%s attempt %d: left out, %s",
            trajectory.instance_id,
            trajectory.attempt,
            trajectory.token_sequence_problem(),
        )
        return None
    return _Candidate(
        instance_id=trajectory.instance_id,
        attempt=trajectory.attempt,
        turns=len(trajectory.turns),
        tokens=digest[1],
        digest=digest[0],
        **fields,
    )


def _select(
    candidates: list[_Candidate], filters: ExportFilters, report: ExportReport
) -> list[_Candidate]:
    """Apply the filters, in the order the dataset card lists them."""
    kept: list[_Candidate] = []
    seen: set[str] = set()
    for c in candidates:
        if filters.resolved_only and c.resolved is not True:
            report.left_out["not resolved"] += 1
        elif filters.min_reward is not None and (c.reward is None or c.reward < filters.min_reward):
            report.left_out[f"reward below {filters.min_reward:g}"] += 1
        elif filters.max_turns is not None and c.turns > filters.max_turns:
            report.left_out[f"more than {filters.max_turns} turns"] += 1
        elif filters.max_tokens is not None and c.tokens > filters.max_tokens:
            report.left_out[f"more than {filters.max_tokens} tokens"] += 1
        elif filters.dedup and c.digest in seen:
            report.left_out["duplicate"] += 1
        else:
            seen.add(c.digest)
            kept.append(c)
    if filters.per_instance is not None:
        by_instance: dict[str, list[_Candidate]] = defaultdict(list)
        for c in kept:
            by_instance[c.instance_id].append(c)
        chosen: list[_Candidate] = []
        for group in by_instance.values():
            group.sort(key=lambda c: (-(c.reward if c.reward is not None else -1e300), c.tokens))
            chosen.extend(group[: filters.per_instance])
            report.left_out[f"over {filters.per_instance} per instance"] += max(
                0, len(group) - filters.per_instance
            )
        kept = sorted(chosen, key=lambda c: c.order)
    return kept


# --- rows --------------------------------------------------------------------------------------

_MESSAGE_KEYS = ("role", "content", "tool_calls", "tool_call_id")


def _message(message: dict[str, Any]) -> dict[str, Any]:
    """A chat message in the dataset's fixed schema."""
    extra = set(message) - set(_MESSAGE_KEYS)
    if extra:
        logger.debug("dropping message keys %s", sorted(extra))
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        content = json.dumps(content)
    calls = message.get("tool_calls")
    return {
        "role": message.get("role"),
        "content": content,
        "tool_calls": None
        if calls is None
        else [
            {
                "id": call.get("id"),
                "type": call.get("type", "function"),
                "function": {
                    "name": (call.get("function") or {}).get("name"),
                    "arguments": (call.get("function") or {}).get("arguments"),
                },
            }
            for call in calls
        ],
        "tool_call_id": message.get("tool_call_id"),
    }


def _tools_json(trajectory: Trajectory) -> str | None:
    """The OpenAI tools list the agent offered (rebuilt from the template set and the tool
    names the trajectory records); ``None`` when the template set is not bundled."""
    from crl_worker.agent.prompts import PromptError, load_prompts
    from crl_worker.agent.tools import tool_schemas

    try:
        return json.dumps(tool_schemas(list(trajectory.tools), load_prompts(trajectory.template)))
    except (PromptError, ValueError) as exc:
        logger.warning(
            "%s: the tools' descriptions cannot be rebuilt: %s", trajectory.template, exc
        )
        return None


def _row(candidate: _Candidate, tokenizer: Any, report: ExportReport) -> dict[str, Any]:
    """The second pass: one chosen trajectory read again and made a row."""
    with candidate.file.open("rb") as handle:
        handle.seek(candidate.offset)
        raw = handle.readline()
    record = _parse(candidate.file, candidate.offset, raw)
    value = record.get("trajectory") if candidate.source_kind == "training" else record
    trajectory = _trajectory(candidate.file, candidate.offset, value)
    sequence = trajectory.token_sequence()
    if sequence is None:  # pragma: no cover - the first pass checked it, the file is append-only
        raise ExportError(f"{candidate.file} changed while it was being exported")
    last = max(turn.message_index for turn in trajectory.turns)
    messages = [_message(m) for m in trajectory.messages[: last + 1]]
    tools = _tools_json(trajectory)
    renders: bool | None = None
    if tokenizer is not None:
        renders = chat_renders_ids(tokenizer, messages, tools, sequence.ids.tolist())
        report.renders_checked += 1
        report.renders_matching += renders
    trained = sum(sequence.mask)
    report.tokens += len(sequence.ids)
    report.trained_tokens += trained
    return {
        "messages": messages,
        "message_loss": [m["role"] == "assistant" for m in messages],
        "tools": tools,
        "input_ids": sequence.ids.tolist(),
        "assistant_masks": sequence.mask.tolist(),
        "num_tokens": len(sequence.ids),
        "num_trained_tokens": trained,
        "num_turns": len(trajectory.turns),
        "instance_id": trajectory.instance_id,
        "repo": trajectory.repo,
        "attempt": trajectory.attempt,
        "task_type": candidate.task_type,
        "reward": candidate.reward,
        "resolved": candidate.resolved,
        "exit_reason": trajectory.exit_reason,
        "policy_version": candidate.policy_version,
        "step": candidate.step,
        "model": trajectory.model,
        "template": trajectory.template,
        "source": candidate.source,
        "source_kind": candidate.source_kind,
        "trajectory_hash": candidate.digest,
        "chat_renders_ids": renders,
    }


def chat_renders_ids(
    tokenizer: Any, messages: Sequence[dict[str, Any]], tools: str | None, ids: Sequence[int]
) -> bool:
    """Whether ``tokenizer``'s chat template renders ``messages`` (with ``tools``, a JSON
    string) to a token sequence that starts with exactly ``ids``. A template may add text
    after the last answer (a newline after the end-of-turn token) that the model never
    sampled: only the prefix must match."""
    rendered = tokenizer.apply_chat_template(
        list(messages),
        tools=None if tools is None else json.loads(tools),
        tokenize=True,
        return_dict=True,
    )["input_ids"]
    return list(rendered[: len(ids)]) == list(ids)


# --- writing -----------------------------------------------------------------------------------


def _prepare_out(out: Path, overwrite: bool) -> None:
    if out.exists():
        if not out.is_dir():
            raise ExportError(f"{out} exists and is not a folder; choose another --out")
        if any(out.iterdir()) and not overwrite:
            raise ExportError(
                f"{out} exists and is not empty; choose another --out, or --overwrite to replace it"
            )
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ExportError(f"cannot create {out.parent}: {exc.strerror or exc}") from exc


def export_trajectories(
    sources: Sequence[Path],
    out: Path,
    *,
    filters: ExportFilters | None = None,
    tokenizer: Any = None,
    overwrite: bool = False,
) -> ExportReport:
    """Export the trajectories of the results folders ``sources`` to the dataset folder
    ``out`` (see the module docs). ``tokenizer`` (a transformers tokenizer), when given, checks
    each row's chat against its token ids (column ``chat_renders_ids``). Raises
    :class:`ExportError` naming the folder or file it cannot read; ``out`` is then untouched."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not sources:
        raise ExportError("no results folder given")
    filters = filters or ExportFilters()
    _prepare_out(out, overwrite)
    report = ExportReport(out=out)
    candidates: list[_Candidate] = []
    for folder in sources:
        candidates.extend(_scan(folder, len(candidates), report))
    chosen = _select(candidates, filters, report)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".part", dir=out.parent))
    try:
        data = staging / "data"
        data.mkdir()
        shards = max(1, -(-len(chosen) // ROWS_PER_SHARD))
        for index in range(shards):
            part = chosen[index * ROWS_PER_SHARD : (index + 1) * ROWS_PER_SHARD]
            rows = [_row(c, tokenizer, report) for c in part]
            table = pa.Table.from_pylist(rows, schema=schema())
            pq.write_table(table, data / f"train-{index:05d}-of-{shards:05d}.parquet")
        report.written = len(chosen)
        report.instances = len({c.instance_id for c in chosen})
        (staging / "README.md").write_text(dataset_card(report, sources, filters, shards))
        os.chmod(staging, 0o755)
        if out.exists():
            aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
            out.rename(aside / out.name)
            staging.rename(out)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    logger.info("exported %d trajectories to %s", report.written, out)
    return report


__all__ = [
    "ExportError",
    "ExportFilters",
    "ExportReport",
    "chat_renders_ids",
    "export_trajectories",
]

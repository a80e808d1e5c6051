"""What an exported trajectory dataset is: its filters, its columns (the parquet schema and
what each column means), and its dataset card. The export itself is
:mod:`crl_worker.rollout.export`."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ExportFilters:
    """Which trajectories go into the dataset."""

    resolved_only: bool = False
    """Only trajectories whose attempt was resolved (the grader's verdict)."""
    min_reward: float | None = None
    """Only trajectories with a reward of at least this (those without a reward are out)."""
    per_instance: int | None = None
    """At most this many per instance: the highest rewards first, then the shortest."""
    max_turns: int | None = None
    """Only trajectories of at most this many model calls."""
    max_tokens: int | None = None
    """Only trajectories of at most this many tokens (prompt, completions, environment)."""
    dedup: bool = True
    """Keep one of identical trajectories (same instance and the same token ids)."""

    def describe(self) -> dict[str, Any]:
        """The filters as a JSON-ready mapping (for the dataset card)."""
        return {
            "resolvedOnly": self.resolved_only,
            "minReward": self.min_reward,
            "perInstance": self.per_instance,
            "maxTurns": self.max_turns,
            "maxTokens": self.max_tokens,
            "dedup": self.dedup,
        }


@dataclass
class ExportReport:
    """What an export read and wrote."""

    out: Path
    """The dataset folder."""
    read: int = 0
    """Trajectories read (the current one of each attempt)."""
    written: int = 0
    """Rows written."""
    left_out: Counter[str] = field(default_factory=Counter)
    """Trajectories left out, by reason."""
    instances: int = 0
    """Distinct instances among the rows."""
    tokens: int = 0
    """Tokens over all rows."""
    trained_tokens: int = 0
    """Tokens that carry loss over all rows."""
    renders_checked: int = 0
    """Rows whose chat was rendered with the tokenizer's chat template."""
    renders_matching: int = 0
    """Of those, rows whose rendered chat starts with exactly their ``input_ids``."""


def schema() -> Any:
    """The parquet schema of the dataset's rows (pyarrow)."""
    import pyarrow as pa

    function = pa.struct([("name", pa.string()), ("arguments", pa.string())])
    call = pa.struct([("id", pa.string()), ("type", pa.string()), ("function", function)])
    message = pa.struct(
        [
            ("role", pa.string()),
            ("content", pa.string()),
            ("tool_calls", pa.list_(call)),
            ("tool_call_id", pa.string()),
        ]
    )
    return pa.schema(
        [
            ("messages", pa.list_(message)),
            ("message_loss", pa.list_(pa.bool_())),
            ("tools", pa.string()),
            ("input_ids", pa.list_(pa.int32())),
            ("assistant_masks", pa.list_(pa.int8())),
            ("num_tokens", pa.int32()),
            ("num_trained_tokens", pa.int32()),
            ("num_turns", pa.int32()),
            ("instance_id", pa.string()),
            ("repo", pa.string()),
            ("attempt", pa.int32()),
            ("task_type", pa.string()),
            ("reward", pa.float64()),
            ("resolved", pa.bool_()),
            ("exit_reason", pa.string()),
            ("policy_version", pa.int64()),
            ("step", pa.int64()),
            ("model", pa.string()),
            ("template", pa.string()),
            ("source", pa.string()),
            ("source_kind", pa.string()),
            ("trajectory_hash", pa.string()),
            ("chat_renders_ids", pa.bool_()),
        ]
    )


#: Column name -> meaning, for the dataset card (and docs/cli.md).
COLUMNS: dict[str, str] = {
    "messages": "the chat as the model saw it, up to its last answer (OpenAI message format: "
    "role, content, tool_calls with their arguments as the model wrote them, tool_call_id)",
    "message_loss": "per message: true for the model's own (assistant) messages",
    "tools": "the tools offered, as the OpenAI `tools` JSON list (a JSON string)",
    "input_ids": "the token ids the server sampled and returned, never re-tokenized",
    "assistant_masks": "per token: 1 for the tokens the model sampled, 0 for prompt and "
    "environment tokens (TRL's SFTTrainer trains on the 1s only)",
    "num_tokens": "length of input_ids",
    "num_trained_tokens": "tokens with mask 1",
    "num_turns": "model calls",
    "instance_id": "the task instance",
    "repo": "its repository",
    "attempt": "the attempt index (Benchmarks with several attempts per instance)",
    "task_type": "repair, implement or classify (null when the source did not record it)",
    "reward": "the reward (null: an infrastructure failure, not scored)",
    "resolved": "the grader's verdict (null: no verdict)",
    "exit_reason": "why the agent stopped",
    "policy_version": "the training step whose weights sampled it (training runs only)",
    "step": "the training step it was trained in (training runs only)",
    "model": "the model name the agent talked to",
    "template": "the agent's prompt template set",
    "source": "the results folder it came from",
    "source_kind": "benchmark or training",
    "trajectory_hash": "sha256 of the instance id and the token ids (what deduplication compares)",
    "chat_renders_ids": "the tokenizer's chat template renders messages and tools to a text "
    "whose tokens start with exactly input_ids (null: not checked, no --tokenizer)",
}


def dataset_card(
    report: ExportReport, sources: Sequence[Path], filters: ExportFilters, shards: int
) -> str:
    """The dataset card: a YAML header naming the data files, then what the dataset holds."""
    header = (
        "---\n"
        "configs:\n"
        "- config_name: default\n"
        "  data_files:\n"
        "  - split: train\n"
        "    path: data/train-*.parquet\n"
        "tags:\n"
        "- code-repair\n"
        "- agent-trajectories\n"
        "- tool-calling\n"
        "- coderepairrl\n"
        "---\n"
    )
    left_out = "\n".join(f"| {why} | {n} |" for why, n in sorted(report.left_out.items()))
    columns = "\n".join(f"| `{name}` | {meaning} |" for name, meaning in COLUMNS.items())
    renders = (
        f"{report.renders_matching} of {report.renders_checked} rows render back to their "
        "token ids with the tokenizer's chat template."
        if report.renders_checked
        else "Not checked against a chat template (no `--tokenizer`)."
    )
    return (
        header + "\n# Agent trajectories (CodeRepairRL)\n\n"
        "Multi-turn tool-calling chats of a code-repair agent, exported by "
        "`crl trajectories export`, token-exact: `input_ids` are the ids the model server "
        "sampled and returned, `assistant_masks` marks the tokens the model produced. TRL's "
        "`SFTTrainer` trains on it as it is (a pre-tokenized dataset: the loss falls on the "
        "assistant's tokens only).\n\n"
        f"- rows: {report.written} ({report.instances} instances, {shards} parquet files)\n"
        f"- tokens: {report.tokens}, of which trained: {report.trained_tokens}\n"
        f"- trajectories read: {report.read}\n"
        f"- chat template: {renders}\n\n"
        "## Sources\n\n"
        + "\n".join(f"- `{s}`" for s in sources)
        + "\n\n## Filters\n\n```json\n"
        + json.dumps(filters.describe(), indent=2)
        + "\n```\n\n## Left out\n\n| reason | trajectories |\n|---|---|\n"
        + (left_out or "| (none) | 0 |")
        + "\n\n## Columns\n\n| column | meaning |\n|---|---|\n"
        + columns
        + "\n"
    )


__all__ = ["COLUMNS", "ExportFilters", "ExportReport", "dataset_card", "schema"]

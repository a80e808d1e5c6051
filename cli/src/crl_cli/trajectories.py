"""`crl trajectories`: the agent's recorded trajectories as data.

`crl trajectories export RESULTS... --out DIR` turns the results folders of Benchmarks
(`crl bench --results`, a Benchmark's volume) and training runs (`crl train --output`, a
TrainingRun's checkpoint volume) into a Hugging Face dataset folder: parquet files and a dataset
card, token-exact chats that TRL's `SFTTrainer` trains on as they are
(crl_worker.rollout.export).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from crl_cli.common import INVALID, Output, err, out

app = typer.Typer(
    name="trajectories",
    help="The agent's recorded trajectories as data: export them as a Hugging Face dataset.",
    no_args_is_help=True,
)


def _tokenizer(path: str | None) -> Any:
    """The tokenizer to check the chat template with, or None."""
    if path is None:
        return None
    try:
        import transformers
    except ImportError:
        err.print(
            "[red]error:[/] --tokenizer needs transformers: "
            'pip install -c requirements/lock.txt -e ".[train]"',
            highlight=False,
        )
        raise typer.Exit(INVALID) from None
    try:
        return transformers.AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        err.print(f"[red]error:[/] --tokenizer {escape(path)}: {escape(str(exc))}", highlight=False)
        raise typer.Exit(INVALID) from None


@app.command("export")
def export(
    results: Annotated[
        list[Path],
        typer.Argument(
            help="Results folders: a Benchmark's (results.jsonl) or a training run's "
            "(trajectories/step-*.jsonl)."
        ),
    ],
    out_dir: Annotated[Path, typer.Option("--out", help="The dataset folder to write.")],
    resolved_only: Annotated[
        bool, typer.Option("--resolved-only", help="Only resolved attempts.")
    ] = False,
    min_reward: Annotated[
        float | None, typer.Option("--min-reward", help="Only trajectories rewarded at least this.")
    ] = None,
    per_instance: Annotated[
        int | None,
        typer.Option(
            "--per-instance",
            min=1,
            help="At most this many per instance (the highest rewards, then the shortest).",
        ),
    ] = None,
    max_turns: Annotated[
        int | None, typer.Option("--max-turns", min=1, help="Only trajectories of at most N turns.")
    ] = None,
    max_tokens: Annotated[
        int | None,
        typer.Option("--max-tokens", min=1, help="Only trajectories of at most N tokens."),
    ] = None,
    dedup: Annotated[
        bool,
        typer.Option("--dedup/--no-dedup", help="Keep one of identical trajectories."),
    ] = True,
    tokenizer: Annotated[
        str | None,
        typer.Option(
            "--tokenizer",
            help="Check that this tokenizer's chat template renders each chat to its token ids "
            "(a model folder or Hugging Face id).",
        ),
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace DIR if it holds something.")
    ] = False,
    output: Annotated[
        Output, typer.Option("--output", "-o", help="text (for people) or json (one object).")
    ] = Output.text,
) -> None:
    """Export trajectories as a Hugging Face dataset (parquet files and a dataset card).

    Each row is one trajectory: the chat as the model saw it, with its tool calls, a per-message
    loss mask, the token ids the model server sampled with a per-token loss mask, and the
    instance, task type, reward, verdict, policy version, model and template. DIR is written
    whole or not at all. Exits 1 when a results folder cannot be read.
    """
    from crl_worker.rollout.export import ExportError, ExportFilters, export_trajectories

    filters = ExportFilters(
        resolved_only=resolved_only,
        min_reward=min_reward,
        per_instance=per_instance,
        max_turns=max_turns,
        max_tokens=max_tokens,
        dedup=dedup,
    )
    try:
        report = export_trajectories(
            results,
            out_dir,
            filters=filters,
            tokenizer=_tokenizer(tokenizer),
            overwrite=overwrite,
        )
    except ExportError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(INVALID) from None
    summary = {
        "out": str(report.out),
        "read": report.read,
        "written": report.written,
        "instances": report.instances,
        "tokens": report.tokens,
        "trainedTokens": report.trained_tokens,
        "leftOut": dict(sorted(report.left_out.items())),
        "rendersChecked": report.renders_checked,
        "rendersMatching": report.renders_matching,
    }
    if output is Output.json:
        sys.stdout.write(json.dumps(summary) + "\n")
        return
    out.print(
        f"wrote {report.written} of {report.read} trajectories ({report.instances} instances, "
        f"{report.tokens} tokens, {report.trained_tokens} trained) to {escape(str(report.out))}",
        highlight=False,
    )
    for why, count in sorted(report.left_out.items()):
        out.print(f"  left out: {count} {escape(why)}", highlight=False)
    if report.renders_checked:
        style = "green" if report.renders_matching == report.renders_checked else "yellow"
        out.print(
            f"  [{style}]chat template: {report.renders_matching} of {report.renders_checked} "
            "render back to their token ids[/]",
            highlight=False,
        )


__all__ = ["app", "export"]

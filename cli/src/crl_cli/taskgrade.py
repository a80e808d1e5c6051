"""`crl tasks grade FILE PREDICTIONS`: other agents' predictions, graded on the integrity path.

Each prediction is graded in a pristine sandbox of its task with only its source changes and
canary tests (:mod:`crl_worker.harness.predictions`); see docs/cli.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from crl_cli.common import INVALID, Output, err, out, usage_error
from crl_cli.options import Sandbox, TableOrJsonLines, TaskFile, Timeout
from crl_cli.tasks import _VERDICT_STYLE, _load, _run_until_sigterm, _sandbox


def register(tasks: typer.Typer) -> None:
    """Add ``grade`` to the ``crl tasks`` group."""
    tasks.command()(grade)


def grade(
    file: TaskFile,
    predictions: Annotated[
        Path,
        typer.Argument(
            help="Predictions: JSONL (or a JSON list) of {instance_id, model_name_or_path, "
            "model_patch}, as SWE-bench's harness reads them."
        ),
    ],
    format: Annotated[
        str, typer.Option("--format", "-f", help="Record format of FILE (default: detected).")
    ] = "",
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="Predictions at a time.")] = 1,
    timeout: Timeout = None,
    sandbox: Sandbox = None,
    output: TableOrJsonLines = Output.text,
) -> None:
    """Grade other agents' predictions, each in a pristine sandbox with only its source changes
    and canary tests (the integrity path of every episode). Exits 0 when every prediction was
    graded, resolved or not."""
    from crl_worker.harness.predictions import (
        GradedPrediction,
        PredictionsError,
        grade_predictions,
        load_predictions,
    )

    try:
        wanted = load_predictions(predictions)
    except PredictionsError as exc:
        raise usage_error(str(exc)) from exc
    ids = list(dict.fromkeys(p.instance_id for p in wanted))
    loaded = _load(file, format, ids or None, None)
    config = _sandbox(sandbox)

    def progress(found: GradedPrediction) -> None:
        if output is Output.text:
            mark = "[green]resolved[/]" if found.resolved else "[yellow]unresolved[/]"
            err.print(f"{escape(found.instance_id)}: {mark}", highlight=False)

    results = _run_until_sigterm(
        grade_predictions(
            loaded.tasks,
            wanted,
            jobs=jobs,
            sandbox_config=config,
            timeout=timeout,
            progress=progress,
        )
    )
    if output is Output.json:
        for r in results:
            out.print(json.dumps(r.to_dict()), highlight=False, soft_wrap=True, markup=False)
    else:
        table = Table(title="Predictions", show_lines=False)
        for column in ("instance", "model", "verdict", "left out / problem"):
            table.add_column(column, overflow="fold")
        for r in results:
            verdict = "resolved" if r.resolved else "unresolved"
            if r.result is not None and r.result.tampered:
                verdict = "tampered"
            elif r.result is not None and r.result.infrastructure_error:
                verdict = "error"
            notes = r.problem or ", ".join(r.result.stripped if r.result else [])
            table.add_row(
                escape(r.instance_id),
                escape(r.model_name_or_path),
                f"[{_VERDICT_STYLE.get(verdict, 'red')}]{verdict}[/]",
                escape(notes) or "-",
            )
        out.print(table)
        resolved = sum(r.resolved for r in results)
        out.print(f"{resolved} of {len(results)} predictions resolved", highlight=False)
    if any(r.problem is not None for r in results):
        raise typer.Exit(INVALID)

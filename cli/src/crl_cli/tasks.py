"""`crl tasks`: commands on task files.

`crl tasks check FILE` validates instances the way a benchmark's curators do: the gold patch must
resolve, no patch must not, N runs find flaky tests. It runs every instance in a local sandbox
(or the sandbox the config names) through the same evaluation engine training and benchmarks
use. Imports stay light: the task loaders, the harness and the sandbox registry, no Kubernetes
client.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Annotated, Any, cast

import typer
from pydantic import ValidationError
from rich.markup import escape
from rich.table import Table

from crl_cli.common import INVALID, USAGE, Output, err, out
from crl_worker.api.common import TaskFilter, TaskFormat
from crl_worker.errors import CrlError, SandboxError
from crl_worker.harness.check import InstanceCheck, check_tasks
from crl_worker.sandbox.registry import parse_config
from crl_worker.tasks.formats import CONVERTERS
from crl_worker.tasks.loaders import load_tasks

logger = logging.getLogger(__name__)

app = typer.Typer(
    name="tasks",
    help="Validate task files: gold patches resolve, no patch does not, tests are stable.",
    no_args_is_help=True,
)


_VERDICT_STYLE = {
    "resolved": "green",
    "unresolved": "yellow",
    "patch-failed": "red",
    "error": "red",
    "mixed": "magenta",
    "not-run": "dim",
}


def _formats() -> list[str]:
    return sorted(CONVERTERS)


def _detect_format(file: Path) -> str:
    """`task` when the file's first record is a native Task (it has a `test` object), else
    `swe-bench`. Only JSON and JSONL are looked at; anything unreadable is left to the loader."""
    try:
        if file.suffix == ".jsonl":
            with file.open() as handle:
                line = next((raw for raw in handle if raw.strip()), "")
            first = json.loads(line) if line else None
        elif file.suffix == ".json":
            loaded = json.loads(file.read_text())
            first = loaded[0] if isinstance(loaded, list) and loaded else loaded
        else:
            return "swe-bench"
    except (OSError, ValueError):
        return "swe-bench"
    return (
        "task" if isinstance(first, dict) and isinstance(first.get("test"), dict) else "swe-bench"
    )


def _sandbox_config(value: str | None) -> dict[str, Any] | None:
    if value is None:
        return None
    text = value
    if not value.lstrip().startswith("{"):
        try:
            text = Path(value).read_text()
        except OSError as exc:
            raise typer.BadParameter(f"not a JSON object or a readable file: {exc}") from exc
    try:
        loaded = json.loads(text)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"not a JSON object or a JSON file: {exc}") from exc
    if not isinstance(loaded, dict):
        raise typer.BadParameter("the sandbox config must be a JSON object")
    return loaded


def _table(results: list[InstanceCheck]) -> Table:
    table = Table(title="Task check", show_lines=False)
    table.add_column("instance", no_wrap=True)
    table.add_column("gold")
    table.add_column("no patch")
    table.add_column("flaky", overflow="fold")
    table.add_column("problems", overflow="fold")
    for r in results:

        def verdict(value: str) -> str:
            return f"[{_VERDICT_STYLE.get(value, 'white')}]{value}[/]"

        problems = "\n".join(escape(p) for p in r.problems) or "[green]ok[/]"
        if r.warnings:
            problems += "\n" + "\n".join(f"[yellow]warning:[/] {escape(w)}" for w in r.warnings)
        table.add_row(
            escape(r.instance_id),
            verdict(r.gold_verdict),
            verdict(r.no_patch_verdict),
            escape(", ".join(r.flaky)) or "-",
            problems,
        )
    return table


@app.command()
def check(
    file: Annotated[Path, typer.Argument(help="Task file: .json, .jsonl or .parquet.")],
    format: Annotated[
        str,
        typer.Option(
            "--format",
            "-f",
            help="Record format: a benchmark's (swe-bench, multi-swe-bench, ...) or 'task' "
            "(Task objects as JSON/JSONL). Default: 'task' when the first record has a 'test' "
            "object (the native format), else 'swe-bench'.",
        ),
    ] = "",
    runs: Annotated[
        int, typer.Option("--runs", "-n", min=1, help="Runs of each patch, to find flaky tests.")
    ] = 1,
    instance: Annotated[
        list[str] | None,
        typer.Option("--instance", "-i", help="Only this instance id (repeatable)."),
    ] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="At most this many instances.")
    ] = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="Instances at a time.")] = 1,
    timeout: Annotated[
        float | None,
        typer.Option("--timeout", min=1, help="Seconds per test run (default: each task's)."),
    ] = None,
    sandbox: Annotated[
        str | None,
        typer.Option(
            "--sandbox",
            help='Sandbox config as JSON or a JSON file (default: {"type": "local"}).',
        ),
    ] = None,
    output: Annotated[
        Output, typer.Option("--output", "-o", help="text (a table) or json (one object per line).")
    ] = Output.text,
) -> None:
    """Run each instance with its gold patch (must resolve) and without (must not)."""
    if not format:
        format = _detect_format(file)
    if format not in _formats():
        err.print(
            f"[red]error:[/] unknown format {escape(format)!r}; use one of: "
            + ", ".join(_formats()),
            highlight=False,
        )
        raise typer.Exit(USAGE)
    if not file.exists():
        err.print(f"[red]error:[/] {escape(str(file))} does not exist", highlight=False)
        raise typer.Exit(USAGE)
    try:
        task_filter = TaskFilter(instance_ids=instance or None, limit=limit)
        loaded = load_tasks(file, cast(TaskFormat, format), task_filter)
    except (CrlError, OSError, ValueError, ValidationError) as exc:
        err.print(f"[red]error:[/] cannot read {escape(str(file))}: {escape(str(exc))}")
        raise typer.Exit(INVALID) from exc
    try:
        # Once, before any instance: a bad config is the command line's mistake, not a
        # sandbox failure to report on every instance.
        config = parse_config(_sandbox_config(sandbox))
    except SandboxError as exc:
        err.print(f"[red]error:[/] --sandbox: {escape(str(exc))}", highlight=False)
        raise typer.Exit(USAGE) from exc

    def progress(found: InstanceCheck) -> None:
        if output is Output.text:
            mark = "[green]ok[/]" if found.ok else "[red]invalid[/]"
            err.print(f"{escape(found.instance_id)}: {mark}", highlight=False)

    results = asyncio.run(
        check_tasks(
            loaded.tasks,
            runs=runs,
            jobs=jobs,
            sandbox_config=config,
            timeout=timeout,
            progress=progress,
        )
    )
    # Records that could not be read, and ids asked for that the file lacks, are failures too.
    unreadable = [
        InstanceCheck(instance_id=e.record or "?", problems=[f"unreadable record: {e}"])
        for e in loaded.errors
    ]
    missing = [
        InstanceCheck(instance_id=i, problems=["no record in the file has this instance id"])
        for i in loaded.missing_ids
    ]
    everything = [*results, *unreadable, *missing]

    if output is Output.json:
        for r in everything:
            # No markup: test ids like `test_x[negative-start]` would be read as rich tags.
            out.print(json.dumps(r.to_dict()), highlight=False, soft_wrap=True, markup=False)
    else:
        out.print(_table(everything))
        valid = sum(r.ok for r in everything)
        out.print(f"{valid} of {len(everything)} instances valid", highlight=False)
    if not everything:
        err.print("[yellow]warning:[/] no instance selected", highlight=False)
    if any(not r.ok for r in everything):
        raise typer.Exit(INVALID)

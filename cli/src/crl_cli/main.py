"""`crl`: the command line of CodeRepairRL.

Commands that only read manifests (`validate`, `render`, `crds`, `version`) need nothing but the
base install. Output for people goes to the terminal through rich; machine-readable output
(`--output json`, YAML from `render` and `crds`) goes to standard output unadorned.
"""

from __future__ import annotations

import json
import logging
import platform
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from crl_cli.bench import register as register_bench
from crl_cli.common import INVALID, Output, err, out, resources_or_exit, usage_error
from crl_cli.taskgrade import register as register_grade
from crl_cli.tasks import app as tasks_app
from crl_cli.train import register as register_train
from crl_cli.trajectories import app as trajectories_app
from crl_worker.api import API_VERSION, KINDS
from crl_worker.api.validation import (
    DocumentResult,
    Problem,
    validate_file,
)
from crl_worker.yamlutil import dump_all

app = typer.Typer(
    name="crl",
    help="CodeRepairRL: train and evaluate code-repair agents with RL, on Kubernetes or on one machine.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
register_grade(tasks_app)
app.add_typer(tasks_app, name="tasks")
register_bench(app)
register_train(app)
app.add_typer(trajectories_app, name="trajectories")


@app.callback()
def _main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log debug messages.")] = False,
) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )


def _expand(files: list[str]) -> list[str]:
    """Directories stand for the YAML files directly inside them; `-` may come once."""
    if files.count("-") > 1:
        raise usage_error("standard input (-) can be read only once")
    expanded: list[str] = []
    for f in files:
        p = Path(f)
        if f != "-" and p.is_dir():
            found = [str(x) for x in sorted(p.iterdir()) if x.suffix in (".yaml", ".yml")]
            if not found:
                raise usage_error(f"{f} holds no .yaml or .yml files")
            expanded.extend(found)
        else:
            expanded.append(f)
    return expanded


def _print_problems(problems: list[Problem], style: str) -> None:
    for p in sorted(problems, key=lambda p: p.line or 0):
        where = f"line {p.line}" if p.line else "file"
        field = f"[bold]{escape(p.path)}[/]: " if p.path else ""
        out.print(f"    [{style}]{where}[/]: {field}{escape(p.message)}", highlight=False)


def _as_json(r: DocumentResult) -> str:
    def listing(problems: list[Problem]) -> list[dict[str, object]]:
        return [{"line": p.line, "path": p.path, "message": p.message} for p in problems]

    return json.dumps(
        {
            "source": r.source,
            "index": r.index,
            "apiVersion": r.api_version,
            "kind": r.kind,
            "name": r.name,
            "valid": r.ok,
            "skipped": r.skipped,
            "problems": listing(r.problems),
            "warnings": listing(r.warnings),
        }
    )


def _label(r: DocumentResult) -> str:
    """`Kind/name` of a document, or what is known of it."""
    return f"{r.kind or '?'}/{r.name}" if r.name else (r.kind or f"document {r.index + 1}")


def _skipped(r: DocumentResult) -> bool:
    """Whether a document was skipped, with nothing wrong found (a duplicate key is still wrong)."""
    return r.skipped is not None and r.ok


def _summary(results: list[DocumentResult]) -> str:
    """The last line: how many were valid, invalid and skipped, saying so when none was checked."""
    skipped = sum(map(_skipped, results))
    bad = sum(not r.ok for r in results)
    good = len(results) - skipped - bad
    if not skipped:
        return f"[{'red' if bad else 'green'}]{good} valid, {bad} invalid[/]"
    if good + bad == 0:
        return (
            f"[yellow]0 CodeRepairRL resources checked, {skipped} skipped "
            "(no TrainingRun, RolloutPool or Benchmark in the input)[/]"
        )
    return (
        f"[{'red' if bad else 'green'}]{good} valid, {bad} invalid[/], "
        f"{skipped} skipped (not CodeRepairRL kinds)"
    )


@app.command()
def validate(
    files: Annotated[
        list[str],
        typer.Argument(help="Manifest files (multi-document YAML), directories, or - for stdin."),
    ],
    output: Annotated[
        Output,
        typer.Option("--output", "-o", help="text (for people) or json (one object per document)."),
    ] = Output.text,
    strict_kinds: Annotated[
        bool,
        typer.Option(
            "--strict-kinds",
            help="Report every document that is not a CodeRepairRL resource as an error, "
            "instead of skipping objects of other APIs (Namespace, Kueue, Argo CD...).",
        ),
    ] = False,
) -> None:
    """Check manifests offline: schema, defaults and CEL rules, as the API server would.

    Every problem is reported with its file, line, field path and what is allowed.

    Objects of other APIs (Namespace, Kueue, Argo CD...) are skipped with a note.
    A document meant to be ours (our apiVersion group, or one of our kinds) is always checked.

    Exits 1 when any document is invalid, 2 on wrong usage.
    """
    results: list[DocumentResult] = []
    for f in _expand(files):
        results.extend(validate_file(f, skip_foreign=not strict_kinds))
    if output is Output.json:
        for r in results:
            sys.stdout.write(_as_json(r) + "\n")
    else:
        for r in results:
            if r.skipped is not None and r.ok:  # as _skipped, which mypy cannot see through
                version = f" ({r.api_version})" if r.api_version else ""
                out.print(
                    f"[dim]- {escape(r.source)}: {escape(_label(r))}{escape(version)}, "
                    f"line {r.line}: skipped, {escape(r.skipped)}[/]",
                    highlight=False,
                )
                continue
            mark = "[green]✓[/]" if r.ok else "[red]✗[/]"
            out.print(f"{mark} {escape(r.source)}: {escape(_label(r))}", highlight=False)
            _print_problems(r.problems, "red")
            _print_problems(r.warnings, "yellow")
        out.print(_summary(results), highlight=False)
    if any(not r.ok for r in results):
        raise typer.Exit(INVALID)


@app.command()
def render(
    file: Annotated[str, typer.Argument(help="Manifest file (or - for stdin).")],
    namespace: Annotated[
        str | None,
        typer.Option(
            "--namespace", "-n", help="Namespace of the children (default: the resource's)."
        ),
    ] = None,
) -> None:
    """Print the Kubernetes objects the operator applies for each resource in FILE.

    The same builders as the operator, rendered as if the inference server were ready (so the
    trainer and runner Jobs show). A Benchmark that serves a TrainingRun checkpoint is resolved
    against a TrainingRun in the same input. The manifest is validated first; owner references
    appear only when the manifest carries a uid (the live object's).
    """
    from crl_operator.builders import BuildError, render_offline

    resources = resources_or_exit(file, INVALID)
    try:
        children, notes = render_offline(resources, namespace)
    except BuildError as exc:
        err.print(f"{file}: {exc}", highlight=False, markup=False)
        raise typer.Exit(INVALID) from None
    for note in notes:
        err.print(f"note: {note}", highlight=False, markup=False)
    sys.stdout.write(dump_all(children))


@app.command()
def crds(
    output_dir: Annotated[
        Path | None,
        typer.Option("--output-dir", "-d", help="Write one file per CRD into this folder."),
    ] = None,
) -> None:
    """Print (or write) the CustomResourceDefinitions generated from the models."""
    from crl_operator.crds import all_crds_yaml, write_crds

    if output_dir is None:
        sys.stdout.write(all_crds_yaml())
        return
    for path in write_crds(output_dir):
        err.print(f"wrote {path}")


@app.command()
def version(
    output: Annotated[Output, typer.Option("--output", "-o", help="text or json.")] = Output.text,
) -> None:
    """Print the versions of crl, the API and Python."""
    from crl_worker import __version__

    info = {
        "crl": __version__,
        "apiVersion": API_VERSION,
        "kinds": list(KINDS),
        "python": platform.python_version(),
    }
    if output is Output.json:
        sys.stdout.write(json.dumps(info) + "\n")
        return
    table = Table(show_header=False, box=None)
    for key, value in info.items():
        table.add_row(key, ", ".join(value) if isinstance(value, list) else str(value))
    out.print(table)


def run() -> None:
    """Entry point for `python -m crl_cli`."""
    app()

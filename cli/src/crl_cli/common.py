"""What every `crl` command shares: the consoles, the exit codes, the output formats."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from crl_worker.api.resources import AnyResource, Resource
from crl_worker.api.validation import ManifestError, load_resources

R = TypeVar("R", bound=Resource)

#: Output for people and machine-readable output (YAML, JSON lines) go to standard output.
out = Console(soft_wrap=True)
#: Diagnostics, progress and notes go to standard error.
err = Console(stderr=True, soft_wrap=True)

#: Exit code for input that is wrong (a manifest with problems, an instance that fails).
INVALID = 1
#: Exit code for wrong usage of the command line.
USAGE = 2


class Output(StrEnum):
    """Output formats."""

    text = "text"
    json = "json"


def usage_error(message: str) -> typer.Exit:
    """Print ``message`` as an error and return the exit for wrong usage (raise it)."""
    err.print(f"[red]error:[/] {escape(message)}", highlight=False)
    return typer.Exit(USAGE)


def resources_or_exit(file: str | Path, code: int) -> list[AnyResource]:
    """Every resource of the manifest ``file``, validated as the API server would; when any is
    bad, every problem printed, then exit ``code``."""
    try:
        return load_resources(file)
    except ManifestError as exc:
        for problem in exc.problems:
            err.print(str(problem), highlight=False, markup=False)
        raise typer.Exit(code) from None


def single_resource(file: Path, kind: type[R], command: str) -> R:
    """The one ``kind`` resource of the manifest ``file``, validated as the API server would;
    every problem printed, then a usage exit."""
    if not file.is_file():
        raise usage_error(f"{file} is not a file")
    resources = resources_or_exit(file, USAGE)
    found = [r for r in resources if isinstance(r, kind)]
    if len(found) != 1:
        raise usage_error(
            f"{file} holds {len(found)} {kind.__name__}s; {command} runs a file with one"
        )
    return found[0]


def sandbox_config(value: str | None) -> dict[str, Any] | None:
    """The `--sandbox` option: a JSON object, or the path of a file holding one."""
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

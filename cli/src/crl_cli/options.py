"""Options and arguments that several `crl` commands declare alike, each in one place.

Only those whose help text is the same everywhere they stand: an option that means something
else in another command (``--jobs``: instances, tasks, predictions or attempts at a time) is
declared where it is used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from crl_cli.common import Output

#: The task file a `crl tasks` command reads.
TaskFile = Annotated[Path, typer.Argument(help="Task file: .json, .jsonl or .parquet.")]

#: ``--instance``: only these instance ids.
Instances = Annotated[
    list[str] | None,
    typer.Option("--instance", "-i", help="Only this instance id (repeatable)."),
]

#: ``--limit``: at most this many instances.
Limit = Annotated[int | None, typer.Option("--limit", min=1, help="At most this many instances.")]

#: ``--timeout``: seconds per test run.
Timeout = Annotated[
    float | None,
    typer.Option("--timeout", min=1, help="Seconds per test run (default: each task's)."),
]

#: ``--sandbox``: the sandbox config (see :func:`crl_cli.common.sandbox_config`).
Sandbox = Annotated[
    str | None,
    typer.Option(
        "--sandbox",
        help='Sandbox config as JSON or a JSON file (default: {"type": "local"}).',
    ),
]

#: ``--output``: a table, or one JSON object per line.
TableOrJsonLines = Annotated[
    Output, typer.Option("--output", "-o", help="text (a table) or json (one object per line).")
]

#: ``--validate-runs``: how often ``--validate`` runs each patch (to find flaky tests).
ValidateRuns = Annotated[
    int,
    typer.Option(
        "--validate-runs", min=1, help="Runs of each patch when validating (flaky tests)."
    ),
]

"""Paths the tests read, and how they run programs."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
INVALID = sorted((ROOT / "tests" / "manifests" / "invalid").glob("*.yaml"))
EDGE = sorted((ROOT / "tests" / "manifests" / "edge").glob("*.yaml"))


def verdict(path: Path) -> str:
    """The `# verdict: valid|invalid` header of an edge-case manifest."""
    first = path.read_text().splitlines()[0]
    assert first.startswith("# verdict: "), path
    return first.removeprefix("# verdict: ")


def run(
    args: list[str], *, stdin: str | None = None, timeout: int = 300, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    """Run a program from the repository root, capturing its text output; never raises on exit."""
    options: dict[str, Any] = {"cwd": ROOT, **kwargs}
    return subprocess.run(
        args, input=stdin, capture_output=True, text=True, timeout=timeout, check=False, **options
    )

"""Paths the tests read."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
INVALID = sorted((ROOT / "tests" / "manifests" / "invalid").glob("*.yaml"))
EDGE = sorted((ROOT / "tests" / "manifests" / "edge").glob("*.yaml"))


def verdict(path: Path) -> str:
    """The `# verdict: valid|invalid` header of an edge-case manifest."""
    first = path.read_text().splitlines()[0]
    assert first.startswith("# verdict: "), path
    return first.removeprefix("# verdict: ")

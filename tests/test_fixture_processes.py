"""The helper that finds a test resource's processes must not find processes that only mention
its paths: killing those killed the other pytest worker's local sandboxes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.processes import processes_using


@pytest.fixture
def sleepers(tmp_path: Path) -> Iterator[dict[str, int]]:
    """Processes whose last argument is each of a few spellings of paths under ``tmp_path``."""
    root = str(tmp_path / "node")
    arguments = {
        "the path": root,
        "below it": f"{root}/run/containerd.sock",
        "as an option's value": f"--address={root}/run/containerd.sock",
        "inside a JSON argument": json.dumps({"sockets": [f"{root}/run/containerd.sock"]}),
        "a sibling with the same prefix": f"{root}2/run",
    }
    procs = {
        what: subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", argument])
        for what, argument in arguments.items()
    }
    time.sleep(0.3)
    try:
        yield {what: p.pid for what, p in procs.items()}
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def test_only_processes_that_use_the_path_are_found(
    tmp_path: Path, sleepers: dict[str, int]
) -> None:
    found = {pid for pid, _ in processes_using(str(tmp_path / "node"))}
    named = {what for what, pid in sleepers.items() if pid in found}
    assert named == {"the path", "below it", "as an option's value"}

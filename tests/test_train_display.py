"""`crl train` as a person runs it: the real toy run on the CPU, once on a pseudo-terminal (the
live display, the step lines, the closing summary; the JSON logs, lease lines and library
warnings kept in the run's log file and off the terminal) and once with `--log-format json`
into a pipe, which must stay exactly what a pod prints: the trainer's JSON log lines.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")

from tests.test_train_run import env, manifest, toy_files

__all__ = ["toy_files"]  # the module-scoped fixture, shared with test_train_run

CRL = str(Path(sys.executable).parent / "crl")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")


def run_on_a_terminal(command: list[str], cwd: Path, timeout: float = 600) -> tuple[int, str]:
    """Run ``command`` with a pseudo-terminal as its standard output and error; (exit status,
    everything it wrote, ANSI sequences removed)."""
    leader, follower = pty.openpty()
    child = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=follower,
        cwd=cwd,
        env={
            **env(),
            "TERM": "xterm-256color",
            "COLUMNS": "200",
            "LINES": "40",
            "CRL_PROGRESS_INTERVAL_SECONDS": "0.5",
        },
    )
    os.close(follower)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 1.0)
        if not ready:
            if child.poll() is not None:
                break
            continue
        try:
            data = os.read(leader, 65536)
        except OSError:  # the terminal closed: the child is gone
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    status = child.wait(timeout=60)
    return status, ANSI.sub("", b"".join(chunks).decode("utf-8", "replace"))


def json_lines(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def test_a_terminal_gets_the_display_and_the_log_file_gets_everything(
    toy_files: Path, tmp_path: Path
) -> None:
    config = manifest(toy_files, tmp_path, algorithm={"numGenerations": 4})
    status, shown = run_on_a_terminal([CRL, "train", str(config), "--steps", "2"], tmp_path)
    assert status == 0, shown[-4000:]
    # One line per step with its figures, and the closing summary.
    for step in (1, 2):
        assert re.search(rf"step {step}/2: reward \d\.\d{{3}}  resolved \d+%  loss ", shown), shown
    assert "rollouts/s" in shown and "staleness 0" in shown
    # While a batch runs, the bar says how far it is.
    assert re.search(r"step [12]: \d/4 rollouts \(\d running\)", shown), shown
    for row in ("outcome", "Succeeded (exit 0)", "steps", "2/2", "reward", "run folder", "log"):
        assert row in shown, shown
    # Nothing of the pod's log stream: no JSON lines, lease chatter or library warnings.
    assert not json_lines(shown), shown
    assert "lease" not in shown and "FutureWarning" not in shown, shown
    # ... which is all in the log file.
    log = tmp_path / "runs" / "toy" / "train.log"
    records = json_lines(log.read_text())
    loggers = {r["logger"] for r in records}
    assert "crl_worker.pool.leases" in loggers
    assert "py.warnings" in loggers  # transformers' FutureWarnings, captured as records
    steps = [r for r in records if r.get("event") == "train.step"]
    assert [r["step"] for r in steps] == [1, 2]
    assert any(r.get("event") == "train.rollouts" and r["total"] == 4 for r in records)
    assert all(r["rollouts"] == 4 for r in steps)
    # The wait of the sandboxes and the server between two batches is measured from step 2 on.
    metrics = [json.loads(line) for line in (log.parent / "metrics.jsonl").read_text().splitlines()]
    assert metrics[0]["idle_seconds"] is None and metrics[1]["idle_seconds"] > 0


def test_json_logs_stay_what_a_pod_prints(toy_files: Path, tmp_path: Path) -> None:
    config = manifest(toy_files, tmp_path, algorithm={"numGenerations": 4})
    done = subprocess.run(
        [CRL, "train", str(config), "--steps", "1", "--log-format", "json"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env(),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "outcome" not in done.stdout and "run folder" not in done.stdout  # no summary
    records = json_lines(done.stderr)
    steps = [r for r in records if r.get("event") == "train.step"]
    assert len(steps) == 1 and steps[0]["message"].startswith("step 1/1: reward")
    assert any(r["logger"] == "crl_worker.pool.leases" for r in records)
    assert not (tmp_path / "runs" / "toy" / "train.log").exists()

"""`crl train` as a person runs it: the real toy run on the CPU, once on a pseudo-terminal (the
live display, the step lines, the closing summary; the JSON logs, lease lines and library
warnings kept in the run's log file and off the terminal) and once with `--log-format json`
into a pipe, which must stay exactly what a pod prints: the trainer's JSON log lines. Both are
the session's two short runs (``short_runs``, tests/fixtures/trainer.py).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")

from .fixtures.trainer import ShortRuns

pytestmark = pytest.mark.train

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")


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
    short_runs: ShortRuns,
) -> None:
    # `crl train CONFIG --steps 2` on a pseudo-terminal (tests/fixtures/trainer.py).
    status, shown = short_runs.terminal_status, ANSI.sub("", short_runs.shown)
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
    log = short_runs.terminal / "train.log"
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


def test_json_logs_stay_what_a_pod_prints(short_runs: ShortRuns) -> None:
    # `crl train CONFIG --steps 2 -o DIR --log-format json` into pipes.
    done = short_runs.piped
    assert done.returncode == 0, done.stderr[-4000:]
    assert "outcome" not in done.stdout and "run folder" not in done.stdout  # no summary
    records = json_lines(done.stderr)
    steps = [r for r in records if r.get("event") == "train.step"]
    assert [s["message"].partition(": reward")[:2] for s in steps] == [
        ("step 1/2", ": reward"),
        ("step 2/2", ": reward"),
    ]
    assert any(r["logger"] == "crl_worker.pool.leases" for r in records)
    assert not (short_runs.piped_out / "train.log").exists()

"""What `crl train` shows while the trainer runs: a live progress display and a closing summary.

The trainer (a child process) logs JSON lines on its standard error, as it does in a pod.
:class:`TrainView` reads them: every line goes to the run's log file (`<run dir>/train.log`),
the step events (:mod:`crl_worker.train.events`) move the display, and only the trainer's own
warnings and errors reach the terminal; per-lease lines, library warnings and progress bars
stay in the log file. On a terminal the display is a live progress bar with one line per step
above it; elsewhere (`--log-format text` into a pipe) it prints the step lines alone.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from crl_worker.train.events import (
    RESUME_EVENT,
    ROLLOUTS_EVENT,
    START_EVENT,
    STEP_EVENT,
    WEIGHT_SYNC_EVENT,
)

#: Log file of a `crl train` run, inside its run folder.
LOG_NAME = "train.log"
#: Lines of the log kept to show when the trainer fails.
TAIL_LINES = 15


def _number(value: Any, fmt: str = "{:.3f}") -> str:
    """A figure for the display ('-' when unknown)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return fmt.format(value)
    return "-"


class TrainView:
    """Reads the trainer's log lines, keeps the log file, shows progress (see the module)."""

    def __init__(self, console: Console, log_path: Path, total_steps: int) -> None:
        self.console = console
        self.log_path = log_path
        self.total_steps = total_steps
        self.first_step: int | None = None
        """The step the run started from (0, or the checkpoint a resume continues after)."""
        self.last: dict[str, Any] | None = None
        """The last step event."""
        self.failures = 0
        """Rollouts left out for infrastructure failures, this session."""
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        """The last lines that were not step events (shown when the trainer fails)."""
        self.started = time.monotonic()
        self._figures = ""
        self._log: IO[str] | None = None
        self.bar: Progress | None = None
        if console.is_terminal:
            self.bar = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[figures]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=console,
                transient=True,
            )
            self.task = self.bar.add_task("train", total=total_steps, completed=0, figures="")

    def __enter__(self) -> TrainView:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("a", encoding="utf-8")
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()
        if self._log is not None:
            self._log.close()

    def feed(self, line: str) -> None:
        """Take one line of the trainer's output: log it, and show what a person should see."""
        if self._log is not None:
            self._log.write(line if line.endswith("\n") else line + "\n")
            self._log.flush()
        text = line.rstrip("\n")
        try:
            record = json.loads(text)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            if text.strip():
                self.tail.append(text)
            return
        event = record.get("event")
        if event == STEP_EVENT:
            self._step(record)
            return
        if event == ROLLOUTS_EVENT:
            self._rollouts(record)
            return
        if event in (START_EVENT, RESUME_EVENT):
            self._start(record)
        message = str(record.get("message", ""))
        self.tail.append(f"{record.get('level', '')}: {message}")
        if self._shown(record):
            colour = "red" if record.get("level") in ("error", "critical") else "yellow"
            self._print(f"[{colour}]{escape(str(record.get('level')))}:[/] {escape(message)}")

    @staticmethod
    def _shown(record: Mapping[str, Any]) -> bool:
        """Whether a log record reaches the terminal: the trainer's own warnings and errors
        (library warnings stay in the log file), and every error."""
        level = record.get("level")
        if level in ("error", "critical"):
            return True
        if record.get("event") == WEIGHT_SYNC_EVENT:
            return True
        logger = str(record.get("logger", ""))
        return level == "warning" and logger.startswith("crl_")

    def _start(self, record: Mapping[str, Any]) -> None:
        total = record.get("total_steps")
        if isinstance(total, int) and total > 0:
            self.total_steps = total
        step = record.get("step")
        if isinstance(step, int):
            self.first_step = step
        if self.bar is not None:
            self.bar.update(self.task, total=self.total_steps, completed=self.first_step or 0)

    def _step(self, record: dict[str, Any]) -> None:
        self.last = record
        step = int(record.get("step") or 0)
        if self.first_step is None:
            self.first_step = step - 1
        failures = int(record.get("infrastructure_failures") or 0)
        self.failures += failures
        figures = (
            f"reward {_number(record.get('reward_mean'))}"
            f"  resolved {_number(record.get('resolve_rate'), '{:.0%}')}"
            f"  loss {_number(record.get('loss'), '{:.4f}')}"
            f"  {_number(record.get('rollouts_per_second'), '{:.2f}')} rollouts/s"
            f"  failures {self.failures}"
            f"  staleness {_number(record.get('staleness_max'), '{}')}"
        )
        line = (
            f"step {step}/{record.get('total_steps', self.total_steps)}: {figures}"
            f"  ({_number(record.get('step_seconds'), '{:.1f}')} s)"
        )
        self._figures = figures
        if self.bar is not None:
            self.bar.update(self.task, completed=step, figures=escape(figures))
        self._print(escape(line))

    def _rollouts(self, record: Mapping[str, Any]) -> None:
        """A batch in progress: its rollouts done and running, after the last step's
        figures."""
        progress = (
            f"step {record.get('step')}: {record.get('done')}/{record.get('total')} rollouts"
            f" ({record.get('in_flight')} running)"
        )
        if self.bar is not None:
            self.bar.update(self.task, figures=escape(f"{self._figures}  {progress}".strip()))

    def _print(self, markup: str) -> None:
        if self.bar is not None:
            self.bar.console.print(markup, highlight=False)
        else:
            self.console.print(markup, highlight=False)

    def summary(self, run_dir: Path, status: int) -> Table:
        """The closing table: steps, reward and resolve rate from first to last step, rollouts,
        failures, time, the last checkpoint, the run folder and the log file."""
        steps = _metrics(run_dir)
        state = _status(run_dir)
        table = Table(title="crl train", show_header=False, title_justify="left")
        table.add_column(style="bold")
        table.add_column()
        phase = state.get("phase") or ("Succeeded" if status == 0 else "Failed")
        table.add_row("outcome", escape(f"{phase} (exit {status})"))
        if state.get("message"):
            table.add_row("message", escape(str(state["message"])))
        done = steps[-1]["step"] if steps else 0
        table.add_row("steps", f"{done}/{state.get('totalSteps', self.total_steps)}")
        if steps:
            first, last = steps[0], steps[-1]
            table.add_row(
                "reward",
                f"{_number(first.get('reward_mean'))} (step {first['step']}) -> "
                f"{_number(last.get('reward_mean'))} (step {last['step']})",
            )
            table.add_row(
                "resolved",
                f"{_number(first.get('resolve_rate'), '{:.0%}')} -> "
                f"{_number(last.get('resolve_rate'), '{:.0%}')}",
            )
            rollouts = sum(int(s.get("rollouts") or 0) for s in steps)
            failures = sum(int(s.get("infrastructure_failures") or 0) for s in steps)
            seconds = sum(float(s.get("step_seconds") or 0.0) for s in steps)
            table.add_row(
                "rollouts",
                f"{rollouts} ({failures} infrastructure failures), "
                f"{_number(rollouts / seconds if seconds else None, '{:.2f}')} per second",
            )
            table.add_row("loss (last)", _number(last.get("loss"), "{:.4f}"))
        table.add_row("time", f"{time.monotonic() - self.started:.0f} s")
        checkpoint = state.get("lastCheckpoint")
        if isinstance(checkpoint, dict):
            table.add_row("checkpoint", escape(str(run_dir / str(checkpoint.get("path")))))
        table.add_row("run folder", escape(str(run_dir)))
        table.add_row("log", escape(str(self.log_path)))
        return table


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The run's step records (`metrics.jsonl`; those of earlier sessions included)."""
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            out.append(record)
    return out


def _status(run_dir: Path) -> dict[str, Any]:
    """The trainer's last `status.json` ({} when it wrote none)."""
    try:
        data = json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


__all__ = ["LOG_NAME", "TrainView"]

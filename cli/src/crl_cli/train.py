"""`crl train`: run a TrainingRun on this machine, from the same manifest the cluster takes.

Sandboxes are local (a pool gateway runs in-process), and generation goes to the vLLM server
given with `--url` or, without one, runs in-process through transformers with the model being
trained (slow, but it needs nothing else). `--nproc N` starts N training processes with torchrun
(DeepSpeed ZeRO shards across them when `spec.trainer.deepspeed.zeroStage` is set). The run
folder (`--output`, default `./runs/NAME`) holds checkpoints, trajectories, `metrics.jsonl` and
`status.json`; running the same command again resumes from the newest checkpoint.

On a terminal (or with `--log-format text`) it shows a progress display and a closing summary
(crl_cli.trainview) and keeps the trainer's JSON logs in `RUN_FOLDER/train.log`; otherwise (or
with `--log-format json`) the trainer's JSON log lines go to standard error, as in a pod.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from crl_cli.common import err, out, single_resource, usage_error
from crl_cli.trainview import LOG_NAME, TrainView
from crl_worker.api import TrainingRun


class LogFormat(StrEnum):
    """What `crl train` prints."""

    auto = "auto"
    text = "text"
    json = "json"


def train(
    file: Annotated[Path, typer.Argument(help="TrainingRun manifest (YAML).")],
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            help="vLLM server's API root, e.g. http://localhost:8000/v1 (default: generate "
            "in-process with transformers).",
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", help="Model name the server serves (default: spec.model.name)."),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Run folder (default: ./runs/NAME)."),
    ] = None,
    steps: Annotated[
        int | None,
        typer.Option("--steps", min=1, help="Optimizer steps (default: spec.algorithm.steps)."),
    ] = None,
    nproc: Annotated[
        int,
        typer.Option("--nproc", min=1, help="Training processes on this machine (torchrun)."),
    ] = 1,
    metrics_port: Annotated[
        int | None,
        typer.Option("--metrics-port", help="Serve Prometheus metrics on this port."),
    ] = None,
    validate: Annotated[
        bool,
        typer.Option(
            "--validate",
            help="Validate the tasks first in local sandboxes (gold resolves, no patch does not,"
            " flaky tests), verdicts cached by content hash; failing tasks are left out and"
            " listed in RUN_FOLDER/quarantine.json.",
        ),
    ] = False,
    validate_runs: Annotated[
        int,
        typer.Option(
            "--validate-runs", min=1, help="Runs of each patch when validating (flaky tests)."
        ),
    ] = 2,
    validate_jobs: Annotated[
        int, typer.Option("--validate-jobs", min=1, help="Tasks validated at a time.")
    ] = 2,
    log_format: Annotated[
        LogFormat,
        typer.Option(
            "--log-format",
            help="text: a progress display (live on a terminal) and a closing summary, the "
            "trainer's JSON logs in RUN_FOLDER/train.log; json: the trainer's JSON log lines on "
            "standard error, as in a pod; auto: text on a terminal, json otherwise.",
        ),
    ] = LogFormat.auto,
) -> None:
    """Train a TrainingRun on this machine (local sandboxes; resumes from the run folder)."""
    single_resource(file, TrainingRun, "crl train")
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("trl") is None:
        raise usage_error(
            "crl train needs the trainer's dependencies: pip install -e '.[train]' (then "
            "pip install --no-build-isolation deepspeed for ZeRO)"
        )
    view, run_dir = _view(file, output if output is None else output.resolve(), log_format)
    if steps is not None and view is not None:
        view.total_steps = steps
    args = ["--config", str(file)]
    if validate:
        args += ["--quarantine", str(_validate(file, output, validate_runs, validate_jobs))]
    for flag, value in (
        ("--url", url),
        ("--model", model),
        ("--output", output),
        ("--steps", steps),
        ("--metrics-port", metrics_port),
    ):
        if value is not None:
            args += [flag, str(value)]
    # A child process (never an import): the CLI stays free of torch, and the trainer owns its
    # signal handling (SIGTERM/SIGINT checkpoint, then exit 143/130).
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1"}
    trainer = [sys.executable, "-m", "crl_worker.train", *args]
    if nproc > 1:
        # torchrun turns a worker's exit status into 1: check the config first, so a config
        # error still exits 2 (with the field named), and set the workers' grace after SIGTERM.
        checked = subprocess.run(
            [*trainer, "--preflight-only"],
            env={**env, "WORLD_SIZE": str(nproc)},
            check=False,
            capture_output=view is not None,
            text=True,
        )
        if view is not None:
            for line in (checked.stdout + checked.stderr).splitlines():
                view.feed(line)
        if checked.returncode != 0:
            raise typer.Exit(checked.returncode)
        env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "270")
        trainer = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
            *trainer[1:],
        ]
    if view is None:
        raise typer.Exit(_run_forwarding_signals(trainer, env))
    with view:
        status = _run_forwarding_signals(trainer, env, view=view)
    out.print(view.summary(run_dir, status))
    if status != 0 and view.tail:
        err.print(f"[red]the trainer exited with {status}[/]; its last lines:", highlight=False)
        for line in view.tail:
            err.print(line, highlight=False, markup=False)
    raise typer.Exit(status)


def _validate(file: Path, output: Path | None, runs: int, jobs: int) -> Path:
    """Validate the run's tasks (``crl train --validate``); the quarantine file to hand on."""
    from crl_worker.train.errors import TrainConfigError
    from crl_worker.train.validation import validate_run

    try:
        report, path = validate_run(file, output=output, runs=runs, jobs=jobs)
    except TrainConfigError as exc:
        raise usage_error(str(exc)) from None
    total = len(report.valid) + len(report.quarantined)
    err.print(
        f"validated {total} tasks ({report.cached} verdicts cached): {len(report.valid)} valid,"
        f" {len(report.quarantined)} quarantined (listed in {path})",
        highlight=False,
        markup=False,
    )
    for verdict in report.quarantined:
        err.print(f"  quarantined {verdict.instance_id}: {verdict.problems[0]}", markup=False)
    return path


def _view(file: Path, output: Path | None, log_format: LogFormat) -> tuple[TrainView | None, Path]:
    """The display for ``log_format`` (None: the trainer's JSON lines go straight to standard
    error) and the run folder the trainer will use."""
    from crl_worker.train.errors import TrainConfigError
    from crl_worker.train.settings import resolve_settings

    try:
        settings = resolve_settings(file, output=output)
    except TrainConfigError:
        # The trainer names the problem itself (exit 2), in its own words.
        return None, output or Path("runs")
    chosen = log_format
    if chosen is LogFormat.auto:
        chosen = LogFormat.text if err.is_terminal else LogFormat.json
    if chosen is LogFormat.json:
        return None, settings.run_dir
    view = TrainView(err, settings.run_dir / LOG_NAME, settings.total_steps)
    return view, settings.run_dir


def _run_forwarding_signals(
    command: list[str], env: dict[str, str], *, view: TrainView | None = None
) -> int:
    """Run ``command`` in its own session and pass SIGINT/SIGTERM on to it, once each (a
    terminal's Ctrl-C would otherwise reach it twice: directly and forwarded). After a stop,
    the exit status is 128 + the signal, whatever the launcher made of it. With a ``view``, its
    standard output and error are read line by line into it."""
    received: list[int] = []

    def forward(number: int, _frame: object) -> None:
        if number not in received:
            received.append(number)
            child.send_signal(number)

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    piped = subprocess.PIPE if view is not None else None
    child = subprocess.Popen(
        command,
        env=env,
        start_new_session=True,
        stdout=piped,
        stderr=subprocess.STDOUT if view is not None else None,
        text=view is not None,
        errors="replace",
    )
    try:
        for sig in previous:
            signal.signal(sig, forward)
        if view is not None:
            assert child.stdout is not None
            for line in child.stdout:
                view.feed(line)
        status = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received and status != 0:
        return 128 + received[0]
    return status


def register(app: typer.Typer) -> None:
    """Add `crl train` to the command line."""
    app.command("train")(train)

"""`crl train`: run a TrainingRun on this machine, from the same manifest the cluster takes.

Sandboxes are local (a pool gateway runs in-process), and generation goes to the vLLM server
given with `--url` or, without one, runs in-process through transformers with the model being
trained (slow, but it needs nothing else). `--nproc N` starts N training processes with torchrun
(DeepSpeed ZeRO shards across them when `spec.trainer.deepspeed.zeroStage` is set). The run
folder (`--output`, default `./runs/NAME`) holds checkpoints, trajectories, `metrics.jsonl` and
`status.json`; running the same command again resumes from the newest checkpoint.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from crl_cli.common import single_resource, usage_error
from crl_worker.api import TrainingRun


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
) -> None:
    """Train a TrainingRun on this machine (local sandboxes; resumes from the run folder)."""
    single_resource(file, TrainingRun, "crl train")
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("trl") is None:
        raise usage_error(
            "crl train needs the trainer's dependencies: pip install -e '.[train]' (then "
            "pip install --no-build-isolation deepspeed for ZeRO)"
        )
    args = ["--config", str(file)]
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
            [*trainer, "--preflight-only"], env={**env, "WORLD_SIZE": str(nproc)}, check=False
        )
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
    raise typer.Exit(_run_forwarding_signals(trainer, env))


def _run_forwarding_signals(command: list[str], env: dict[str, str]) -> int:
    """Run ``command`` in its own session and pass SIGINT/SIGTERM on to it, once each (a
    terminal's Ctrl-C would otherwise reach it twice: directly and forwarded). After a stop,
    the exit status is 128 + the signal, whatever the launcher made of it."""
    received: list[int] = []

    def forward(number: int, _frame: object) -> None:
        if number not in received:
            received.append(number)
            child.send_signal(number)

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    child = subprocess.Popen(command, env=env, start_new_session=True)
    try:
        for sig in previous:
            signal.signal(sig, forward)
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

"""What the worker's ``python -m`` entry points share: the trainer (``crl_worker.train``), the
pool gateway (``crl_worker.pool``) and the benchmark runner (``crl_worker.bench``).

Each reads its settings from a config file (the operator's ``config.yaml`` or a manifest) named
by ``--config``, else by ``$CRL_CONFIG``; the pool gateway and the benchmark runner take the same
logging flags; and each exits with :data:`CONFIG_ERROR` when it cannot start.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Literal

from crl_worker.api.contract import CONFIG_ERROR_EXIT_CODE, Env

#: Exit status of a worker that cannot start: its config or command line cannot work, or (the
#: pool gateway, the benchmark runner) what it needs could not be set up. Nothing was spent on
#: the run; the trainer Job fails at once on it instead of retrying.
CONFIG_ERROR = CONFIG_ERROR_EXIT_CODE


def env_path(name: Env) -> Path | None:
    """The path in the environment variable ``name``, or ``None`` when it is unset or empty."""
    value = os.environ.get(name)
    return Path(value) if value else None


def entry_parser(module: str, description: str, *, config: str) -> argparse.ArgumentParser:
    """The command line of ``python -m module``, with its ``--config`` flag (by default
    ``$CRL_CONFIG``); ``config`` says which files the flag takes."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=description)
    parser.add_argument(
        "--config",
        type=Path,
        default=env_path(Env.CONFIG),
        help=f"{config} (default: ${Env.CONFIG})",
    )
    return parser


def add_logging_flags(parser: argparse.ArgumentParser, *, fmt: Literal["text", "json"]) -> None:
    """``--log-level`` (default ``INFO``) and ``--log-format`` (``text`` or ``json``, by default
    ``fmt``): what :func:`crl_worker.logs.setup_logging` takes."""
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--log-format", choices=["text", "json"], default=fmt)

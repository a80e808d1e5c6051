"""``python -m crl_worker.train``: the trainer process (one per GPU, started by ``accelerate
launch`` in the trainer pods, by ``torchrun`` or ``crl train`` on one machine).

Exit status: 0 when the run reached its last step, 2 when the config cannot work (nothing was
spent on it), 143 or 130 after SIGTERM or SIGINT (a checkpoint was written: run the same command
to resume), 1 for anything else.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from crl_worker.api.contract import Env
from crl_worker.entrypoint import CONFIG_ERROR, entry_parser
from crl_worker.logs import setup_logging
from crl_worker.train.errors import TrainConfigError
from crl_worker.train.events import START_EVENT
from crl_worker.train.settings import TrainSettings, resolve_settings
from crl_worker.train.tasklist import load_tasks

logger = logging.getLogger("crl_worker.train")


def parser() -> argparse.ArgumentParser:
    """The trainer's command line."""
    p = entry_parser(
        "crl_worker.train",
        "Train a TrainingRun: agent rollouts in sandboxes, GRPO updates, checkpoints.",
        config="the operator's config.yaml or a TrainingRun manifest",
    )
    p.add_argument(
        "--output", type=Path, help=f"run folder (default: ${Env.CHECKPOINT_DIR}, else ./runs/NAME)"
    )
    p.add_argument(
        "--url",
        help=f"vLLM server's OpenAI API root (default: ${Env.INFERENCE_URL}; none: in-process)",
    )
    p.add_argument("--model", help="model name the server serves (default: spec.model.name)")
    p.add_argument("--tasks", type=Path, help="task file where the operator mounted the source")
    p.add_argument("--steps", type=int, help="optimizer steps (default: spec.algorithm.steps)")
    p.add_argument(
        "--metrics-port", type=int, help=f"Prometheus port (default: ${Env.METRICS_PORT})"
    )
    p.add_argument(
        "--quarantine",
        type=Path,
        help="a quarantine.json written by crl train --validate: its tasks are left out",
    )
    p.add_argument(
        "--preflight-only",
        action="store_true",
        help="check the config (exit 0, or 2 naming the field) and start nothing; run once "
        "before a launcher, which turns a worker's exit status 2 into 1",
    )
    return p


def _run_sft(settings: TrainSettings, *, preflight_only: bool) -> int:
    """``spec.algorithm.type: sft``: check the dataset, then train (crl_worker.train.sft)."""
    from crl_worker.train.sft import load_sft_dataset, run_sft

    if preflight_only:
        rows = len(load_sft_dataset(settings))
        logger.info("the config of %s can be trained (%d rows)", settings.name, rows)
        return 0
    logger.info(
        "supervised fine-tuning of %s: %d steps, run folder %s",
        settings.name,
        settings.total_steps,
        settings.run_dir,
        extra={
            "event": START_EVENT,
            "run": settings.name,
            "total_steps": settings.total_steps,
            "run_dir": str(settings.run_dir),
        },
    )
    return run_sft(settings)


def main(argv: list[str] | None = None) -> int:
    """Run one trainer process; returns the exit status."""
    args = parser().parse_args(argv)
    setup_logging()
    # Library warnings (transformers' FutureWarnings, ...) become log records: JSON lines in a
    # pod, and `crl train` keeps them in its log file instead of on the terminal.
    logging.captureWarnings(True)
    # One line per sandbox request (hundreds per step) would bury the step lines.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # TRL warns with the whole sample for every rollout left out (reward None): ours are
    # counted and kept with their trajectories instead.
    logging.getLogger("trl.trainer.grpo_trainer").addFilter(
        lambda record: "All reward functions returned None" not in record.getMessage()
    )
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    if args.config is None:
        logger.error("no config: give --config or set %s", Env.CONFIG)
        return CONFIG_ERROR
    world = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        settings = resolve_settings(
            args.config,
            output=args.output,
            url=args.url,
            served_model=args.model,
            tasks_file=args.tasks,
            metrics_port=args.metrics_port,
            steps=args.steps,
        )
        if settings.spec.algorithm.type == "sft":
            # Supervised fine-tuning trains on recorded trajectories: no tasks, no rollouts.
            return _run_sft(settings, preflight_only=args.preflight_only)
        tasks = load_tasks(settings)
        if args.quarantine is not None:
            from crl_worker.train.validation import drop_quarantined

            tasks = drop_quarantined(tasks, args.quarantine)
        from crl_worker.train.preflight import preflight

        preflight(settings, tasks, world=world)
    except TrainConfigError as exc:
        logger.error("the run cannot start: %s", exc)
        return CONFIG_ERROR
    if args.preflight_only:
        logger.info("the config of %s can be trained", settings.name)
        return 0
    from crl_worker.train.trainer import TrainingJob

    logger.info(
        "training %s: %d tasks, %d steps, generation %s, run folder %s",
        settings.name,
        len(tasks),
        settings.total_steps,
        settings.inference_url or "in-process (transformers)",
        settings.run_dir,
        extra={
            "event": START_EVENT,
            "run": settings.name,
            "total_steps": settings.total_steps,
            "run_dir": str(settings.run_dir),
        },
    )
    try:
        return TrainingJob(settings, tasks).run()
    except TrainConfigError as exc:
        logger.error("the run cannot go on: %s", exc)
        return CONFIG_ERROR


if __name__ == "__main__":
    sys.exit(main())

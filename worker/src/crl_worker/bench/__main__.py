"""``python -m crl_worker.bench``: run a Benchmark's suite; the runner Job's command.

The config file is the operator's ``config.yaml`` (``{apiVersion, kind: Benchmark, name,
spec}``) or a Benchmark manifest. The model comes from ``CRL_MODEL_URL``, ``CRL_MODEL_NAME`` and
``CRL_API_KEY`` (else ``spec.model.endpoint``); sandboxes from the pool gateway at
``CRL_POOL_URL`` when set, else local ones; results go to ``--results``, else
``CRL_RESULTS_DIR``, else ``spec.results.path``. Progress goes to the Benchmark's status
through :func:`crl_worker.rollout.report.reporter_from_env` when the operator set it up. The
setup itself is :func:`crl_worker.bench.setup.prepare_benchmark`, shared with ``crl bench``.

Exit status: 0 when the suite finished (whatever its resolve rate; infrastructure failures are
counted in the summary), 1 when it gave up (too many infrastructure failures in a row, or a
result that could not be written), 2 when the run cannot be set up (or the command line is
wrong), 128 + the signal's number when stopped by SIGINT or SIGTERM (rerun the same command to
resume).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from crl_worker.api.contract import Env
from crl_worker.bench.config import BenchConfigError, read_benchmark
from crl_worker.bench.setup import prepare_benchmark
from crl_worker.entrypoint import CONFIG_ERROR, add_logging_flags, entry_parser, env_path
from crl_worker.logs import setup_logging
from crl_worker.rollout.report import reporter_from_env

logger = logging.getLogger("crl_worker.bench")


def _count(text: str) -> int:
    """A whole number of at least 0 (argparse's type for ``--retries`` and ``--max-errors``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, not {value}")
    return value


def parser() -> argparse.ArgumentParser:
    """The runner's command line."""
    p = entry_parser(
        "crl_worker.bench",
        "Run a Benchmark's suite: agent, evaluation, results and summary.",
        config="config.yaml from the operator, or a Benchmark manifest",
    )
    p.add_argument("--tasks", type=Path, help="task file where the operator mounted the source")
    p.add_argument(
        "--results",
        type=Path,
        help=f"results folder (default: ${Env.RESULTS_DIR}, else the spec's)",
    )
    p.add_argument(
        "--agent",
        choices=["openai", "gold"],
        default="openai",
        help="openai: the model endpoint; gold: replay each task's gold patch (harness check)",
    )
    p.add_argument(
        "--baseline",
        type=Path,
        default=env_path(Env.BASELINE_RESULTS),
        help=f"results folder of the baseline to compare with (default: ${Env.BASELINE_RESULTS})",
    )
    p.add_argument("--restart", action="store_true", help="move old results aside, start over")
    p.add_argument(
        "--retries",
        type=_count,
        default=1,
        help="run an attempt that had an infrastructure failure again, after the rest, up to"
        " this many times (default 1)",
    )
    p.add_argument(
        "--max-errors",
        type=_count,
        help="give up after this many infrastructure failures in a row (default: max(10, 2 x"
        " parallelism); 0: never)",
    )
    add_logging_flags(p, fmt="json")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return the exit status."""
    args = parser().parse_args(argv)
    setup_logging(args.log_format, args.log_level)
    if args.config is None:
        logger.error("no config: give --config FILE (or set %s)", Env.CONFIG)
        return CONFIG_ERROR
    try:
        config = read_benchmark(args.config, name=os.environ.get(Env.BENCHMARK_NAME))
        setup = prepare_benchmark(
            config,
            agent=args.agent,
            tasks_file=args.tasks,
            results=args.results or env_path(Env.RESULTS_DIR),
            restart=args.restart,
            baseline=args.baseline,
            retries=args.retries,
            max_errors=args.max_errors,
            pool_url=os.environ.get(Env.POOL_URL) or None,
            # In a cluster the model server may still be coming up; the client's retries wait.
            require_endpoint=False,
            reporter=reporter_from_env(),
        )
    except BenchConfigError as exc:
        logger.error("%s", exc)
        return CONFIG_ERROR
    results = setup.folder
    logger.info(
        "benchmark %s: %d instances x %d attempts of %s with %s, %d already done, results in %s",
        config.name,
        len(setup.tasks),
        config.spec.attempts,
        config.spec.suite.name,
        setup.model,
        setup.done_before,
        results,
    )
    outcome, signalled = setup.run()
    summary = outcome.summary
    logger.info(
        "benchmark %s: %d/%d done, %d resolved, %d errored, resolve rate %s",
        config.name,
        summary["done"],
        summary["total"],
        summary["resolved"],
        summary["errored"],
        summary["resolveRate"],
    )
    if outcome.gave_up:
        logger.error(
            "gave up: %s; %d of %d attempts are in %s; run again to resume once the cause is fixed",
            outcome.gave_up,
            summary["done"],
            summary["total"],
            results,
        )
        return 1
    if outcome.interrupted:
        logger.error(
            "stopped with %d of %d attempts written to %s; run the same command again to resume",
            summary["done"],
            summary["total"],
            results,
        )
        return 128 + signalled if signalled else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m crl_worker.bench``: run a Benchmark's suite; the runner Job's command.

The config file is the operator's ``config.yaml`` (``{apiVersion, kind: Benchmark, name,
spec}``) or a Benchmark manifest. The model comes from ``CRL_MODEL_URL``, ``CRL_MODEL_NAME`` and
``CRL_API_KEY`` (else ``spec.model.endpoint``); sandboxes from the pool gateway at
``CRL_POOL_URL`` when set, else local ones; results go to ``--results``, else
``CRL_RESULTS_DIR``, else ``spec.results.path``. Progress goes to the Benchmark's status
through :func:`crl_worker.rollout.report.reporter_from_env` when the operator set it up.

Exit status: 0 when the suite finished (whatever its resolve rate; infrastructure failures are
counted in the summary), 2 when the run cannot be set up, 128 + the signal's number when
stopped by SIGINT or SIGTERM (rerun the same command to resume).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

from crl_worker.agent.loop import tune_gc
from crl_worker.api.contract import Env
from crl_worker.bench.config import (
    check_agent,
    load_benchmark_tasks,
    read_benchmark,
    resolve_endpoint,
    run_identity,
)
from crl_worker.bench.runner import (
    Baseline,
    BenchmarkRunner,
    default_error_limit,
    run_until_signalled,
)
from crl_worker.logs import setup_logging
from crl_worker.rollout.report import reporter_from_env
from crl_worker.rollout.results import ResultsError, ResultsStore
from crl_worker.rollout.setup import Policies, RolloutSetupError, Sandboxes, check_endpoint

logger = logging.getLogger("crl_worker.bench")

#: Exit status when the run cannot be set up.
SETUP_ERROR = 2


def parser() -> argparse.ArgumentParser:
    """The runner's command line."""
    p = argparse.ArgumentParser(
        prog="python -m crl_worker.bench",
        description="Run a Benchmark's suite: agent, evaluation, results and summary.",
    )
    p.add_argument(
        "--config",
        type=Path,
        default=Path(os.environ["CRL_CONFIG"]) if os.environ.get("CRL_CONFIG") else None,
        help="config.yaml from the operator, or a Benchmark manifest (default: $CRL_CONFIG)",
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
        default=Path(os.environ[Env.BASELINE_RESULTS])
        if os.environ.get(Env.BASELINE_RESULTS)
        else None,
        help=f"results folder of the baseline to compare with (default: ${Env.BASELINE_RESULTS})",
    )
    p.add_argument("--restart", action="store_true", help="move old results aside, start over")
    p.add_argument(
        "--retries",
        type=int,
        default=1,
        help="run an attempt that had an infrastructure failure again, after the rest, up to"
        " this many times (default 1)",
    )
    p.add_argument(
        "--max-errors",
        type=int,
        help="give up after this many infrastructure failures in a row (default: max(10, 2 x"
        " parallelism); 0: never)",
    )
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--log-format", choices=["text", "json"], default="json")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return the exit status."""
    args = parser().parse_args(argv)
    setup_logging(args.log_format, args.log_level)
    if args.config is None:
        logger.error("no config: give --config FILE (or set CRL_CONFIG)")
        return SETUP_ERROR
    try:
        config = read_benchmark(args.config, name=os.environ.get(Env.BENCHMARK_NAME))
        spec = config.spec
        check_agent(spec.agent)
        tasks = load_benchmark_tasks(config, tasks_file=args.tasks)
        endpoint = None if args.agent == "gold" else resolve_endpoint(spec)
        policies = Policies.make(args.agent, endpoint)
        model = policies.model
        results = args.results or Path(os.environ.get(Env.RESULTS_DIR) or spec.results.path)
        store = ResultsStore(results)
        store.open(run_identity(config, agent=args.agent, model=model), restart=args.restart)
    except (RolloutSetupError, ResultsError) as exc:
        logger.error("%s", exc)
        return SETUP_ERROR
    if endpoint is not None:
        try:
            asyncio.run(check_endpoint(endpoint))
        except RolloutSetupError as exc:
            # In a cluster the server may still be coming up; the client's retries wait for it.
            logger.warning("%s", exc)
    sandboxes = Sandboxes.make(os.environ.get(Env.POOL_URL))
    baseline = None
    if args.baseline is not None:
        minimum = spec.baseline.minimum_improvement if spec.baseline else None
        confidence = spec.baseline.confidence_level if spec.baseline else 0.95
        name = spec.baseline.name if spec.baseline else str(args.baseline)
        baseline = Baseline(args.baseline, name, confidence, minimum)
    runner = BenchmarkRunner(
        tasks,
        agent=spec.agent,
        store=store,
        policy_factory=policies.factory,
        sandbox_factory=sandboxes.factory,
        suite=spec.suite.name,
        model=model,
        attempts=spec.attempts,
        pass_at_k=spec.pass_at_k,
        parallelism=spec.parallelism,
        reporter=reporter_from_env(),
        baseline=baseline,
        retries=max(args.retries, 0),
        max_consecutive_errors=(
            default_error_limit(spec.parallelism)
            if args.max_errors is None
            else (args.max_errors or None)
        ),
    )
    logger.info(
        "benchmark %s: %d instances x %d attempts of %s with %s, results in %s",
        config.name,
        len(tasks),
        spec.attempts,
        spec.suite.name,
        model,
        results,
    )
    # Many trajectories in flight: fewer full GC passes over them (see tune_gc).
    tune_gc()
    try:
        outcome, signalled = asyncio.run(run_until_signalled(runner, policies, sandboxes))
    finally:
        store.close()
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

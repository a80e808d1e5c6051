"""One way to set a benchmark run up, for ``crl bench`` and ``python -m crl_worker.bench`` alike.

:func:`prepare_benchmark` takes a Benchmark already read (each front door reads its own kind of
file: ``crl bench`` a manifest validated as the API server would, the runner Job the operator's
``config.yaml``) and what its front door resolved from flags and environment, and returns a
:class:`BenchmarkSetup`: the runner, ready to run, and what must be closed after it. Every
failure raises :class:`~crl_worker.bench.config.BenchConfigError` (its subclass
:class:`~crl_worker.bench.config.BenchTasksError` when the suite's tasks are the problem) before
any sandbox starts, with nothing left open. Parsing flags, reading ``CRL_*`` variables, the
output and the exit codes stay with the front doors.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crl_worker.agent.loop import tune_gc
from crl_worker.bench.config import (
    BenchConfigError,
    BenchmarkConfig,
    BenchTasksError,
    check_agent,
    load_benchmark_tasks,
    resolve_endpoint,
    run_identity,
)
from crl_worker.bench.runner import (
    Baseline,
    BenchmarkRunner,
    ProgressCallback,
    ProgressReporter,
    RunOutcome,
    default_error_limit,
    run_until_signalled,
)
from crl_worker.errors import SandboxError
from crl_worker.harness.validate import ValidationReport, validate_tasks, write_quarantine
from crl_worker.pool.client import GatewayClient
from crl_worker.rollout.results import ResultsError, ResultsStore
from crl_worker.rollout.served import NothingServed, ServedTasks, served_tasks
from crl_worker.rollout.setup import (
    AgentKind,
    Policies,
    RolloutSetupError,
    Sandboxes,
    check_endpoint,
    wait_for_gateway,
)
from crl_worker.tasks.model import Task

logger = logging.getLogger(__name__)


@dataclass
class BenchmarkSetup:
    """A benchmark run ready to start: the runner and what it holds open."""

    config: BenchmarkConfig
    """The Benchmark."""
    runner: BenchmarkRunner
    """The runner; :meth:`run` runs it (its ``progress`` callback may still be set before)."""
    store: ResultsStore
    """The results folder, open and locked until :meth:`close`."""
    policies: Policies
    """The policy of each attempt (and the chat client to close)."""
    sandboxes: Sandboxes
    """The sandbox of each attempt (and the pool gateway client to close)."""
    folder: Path
    """The results folder, as given or from ``spec.results.path``."""
    done_before: int
    """Attempts of the selection already on record (not run again)."""
    validation: ValidationReport | None = None
    """What validating the tasks found (``validate_runs``); ``None`` when not asked."""

    @property
    def tasks(self) -> list[Task]:
        """The selected instances."""
        return self.runner.tasks

    @property
    def model(self) -> str:
        """The model's name (``gold`` for the gold replays)."""
        return self.policies.model

    @property
    def total(self) -> int:
        """Attempts in the selection (instances x attempts)."""
        return self.runner.total

    def run(self) -> tuple[RunOutcome, int | None]:
        """Run until done, given up, or stopped by SIGINT or SIGTERM; then close everything.

        Returns the outcome and the number of the signal that stopped the run (``None`` when
        none did). Sets the process's garbage collection up for many trajectories in flight
        (:func:`~crl_worker.agent.loop.tune_gc`) first.
        """
        tune_gc()
        try:
            return asyncio.run(run_until_signalled(self.runner, self.policies, self.sandboxes))
        finally:
            self.store.close()

    def close(self) -> None:
        """Close what :func:`prepare_benchmark` opened, for a setup that will not :meth:`run`."""
        self.store.close()
        asyncio.run(_close(self.policies, self.sandboxes))


def prepare_benchmark(
    config: BenchmarkConfig,
    *,
    agent: AgentKind = "openai",
    url: str | None = None,
    model: str | None = None,
    env: Mapping[str, str] | None = None,
    tasks_file: Path | None = None,
    instance_ids: Sequence[str] | None = None,
    limit: int | None = None,
    results: Path | None = None,
    restart: bool = False,
    baseline: Path | None = None,
    parallelism: int | None = None,
    retries: int = 1,
    max_errors: int | None = None,
    spares: bool = False,
    pool_url: str | None = None,
    sandbox: Mapping[str, Any] | None = None,
    require_endpoint: bool = True,
    reporter: ProgressReporter | None = None,
    progress: ProgressCallback | None = None,
    validate_runs: int | None = None,
) -> BenchmarkSetup:
    """Set the run of ``config`` up, in this order (so that the first problem is the one said):

    1. the agent's prompt templates load;
    2. the model endpoint (``agent="openai"``): ``url``/``model``, else ``CRL_MODEL_URL`` /
       ``CRL_MODEL_NAME`` in ``env`` (default: the process's), else ``spec.model.endpoint``;
    3. the suite's tasks (from ``tasks_file`` when given), then ``instance_ids`` and ``limit``;
    4. the results folder (``results``, else ``spec.results.path``) opened for this run's
       identity, moved aside first with ``restart``;
    5. something answers at the endpoint: refused when ``require_endpoint``, else a warning (in
       a cluster the server may still be starting; the client's retries wait for it);
    6. sandboxes leased from the pool gateway at ``pool_url``, else made from the ``sandbox``
       config (default: local ones). A pool that validates its tasks is waited for; the tasks
       it quarantined are left out and listed with their reasons in the results folder's
       ``quarantine.json`` (and in :attr:`BenchmarkSetup.validation`).

    With ``validate_runs``, the selected tasks are validated after step 3
    (:func:`~crl_worker.harness.validate.validate_tasks`: gold resolves, no patch does not, that
    many runs of each, ``parallelism`` at a time in sandboxes made from ``sandbox``, verdicts
    cached); the failing ones are left out and listed with their reasons in the results
    folder's ``quarantine.json``.

    ``baseline`` is a results folder to compare with at the end, named ``spec.baseline.name``
    (a Benchmark, as the operator's status requires) and judged with its confidence level and
    minimum improvement when the spec has a baseline, else named by the folder. ``parallelism``
    overrides ``spec.parallelism``; ``retries``, ``max_errors`` and ``spares`` are
    :class:`~crl_worker.bench.runner.BenchmarkRunner`'s (``max_errors`` ``None``: the default
    limit for the parallelism, ``0``: never give up). ``reporter`` and ``progress`` go to the
    runner.

    Raises :class:`~crl_worker.bench.config.BenchConfigError` (a
    :class:`~crl_worker.bench.config.BenchTasksError` for the tasks); nothing stays open then.
    """
    spec = config.spec
    parallelism = spec.parallelism if parallelism is None else parallelism
    if parallelism < 1:
        raise BenchConfigError(f"parallelism must be at least 1, not {parallelism}")
    if retries < 0:
        raise BenchConfigError(f"retries must be at least 0, not {retries}")
    if max_errors is not None and max_errors < 0:
        raise BenchConfigError(f"the error limit must be at least 0, not {max_errors}")
    check_agent(spec.agent)
    if spec.model.gold is not None:
        agent = "gold"  # the manifest asks for the gold replay, whatever the default agent
    endpoint = None if agent == "gold" else resolve_endpoint(spec, url=url, model=model, env=env)
    selected = load_benchmark_tasks(
        config,
        tasks_file=tasks_file,
        instance_ids=list(instance_ids) if instance_ids else None,
        limit=limit,
    )
    validation: ValidationReport | None = None
    if validate_runs is not None:
        if pool_url:
            raise BenchConfigError("validating the tasks first needs local sandboxes, not a pool")
        validation = asyncio.run(
            validate_tasks(selected, runs=validate_runs, jobs=parallelism, sandbox_config=sandbox)
        )
        if not validation.valid:
            raise BenchTasksError(
                f"every one of the {len(selected)} tasks failed validation: "
                + "; ".join(f"{v.instance_id}: {v.problems[0]}" for v in validation.quarantined[:5])
            )
        selected = validation.valid
    model_name = "gold" if endpoint is None else endpoint.model
    folder = results or Path(spec.results.path)
    store = ResultsStore(folder)
    try:
        store.open(run_identity(config, agent=agent, model=model_name), restart=restart)
    except ResultsError as exc:
        raise BenchConfigError(str(exc)) from exc
    sandboxes: Sandboxes | None = None
    try:
        if validation is not None:
            write_quarantine(folder, validation)
        if endpoint is not None:
            try:
                asyncio.run(check_endpoint(endpoint))
            except RolloutSetupError as exc:
                if require_endpoint:
                    raise BenchConfigError(str(exc)) from exc
                logger.warning("%s", exc)
        if pool_url:
            try:
                asyncio.run(wait_for_gateway(pool_url))
                served = asyncio.run(_served(pool_url, selected))
            except NothingServed as exc:
                raise BenchTasksError(str(exc)) from exc
            except RolloutSetupError as exc:
                raise BenchConfigError(str(exc)) from exc
            if served.quarantined:
                selected, validation = served.tasks, served.report()
                listed = write_quarantine(folder, validation)
                logger.warning(
                    "the pool quarantined %d of the %d selected tasks when it validated them"
                    " (%s): they are left out of the run, listed in %s",
                    len(served.quarantined),
                    len(served.quarantined) + len(selected),
                    served.reasons(),
                    listed,
                )
        try:
            sandboxes = Sandboxes.make(pool_url, sandbox)
        except SandboxError as exc:
            raise BenchConfigError(str(exc)) from exc
        policies = Policies.make(agent, endpoint)
        runner = BenchmarkRunner(
            selected,
            agent=spec.agent,
            store=store,
            policy_factory=policies.factory,
            sandbox_factory=sandboxes.factory,
            suite=spec.suite.name,
            model=policies.model,
            attempts=spec.attempts,
            pass_at_k=spec.pass_at_k,
            parallelism=parallelism,
            reporter=reporter,
            progress=progress,
            baseline=_baseline(config, baseline),
            retries=retries,
            spares=spares,
            quarantined=len(validation.quarantined) if validation is not None else 0,
            max_consecutive_errors=(
                default_error_limit(parallelism) if max_errors is None else (max_errors or None)
            ),
        )
    except BaseException:
        store.close()
        if sandboxes is not None:
            asyncio.run(sandboxes.aclose())
        raise
    keys = {(t.instance_id, a) for t in selected for a in range(spec.attempts)}
    return BenchmarkSetup(
        config=config,
        runner=runner,
        store=store,
        policies=policies,
        sandboxes=sandboxes,
        folder=folder,
        done_before=len(store.finished() & keys),
        validation=validation,
    )


def _baseline(config: BenchmarkConfig, folder: Path | None) -> Baseline | None:
    """The comparison at the end: the spec's baseline Benchmark (its name, as the operator's
    status requires, its confidence level and minimum improvement) when the spec has one, else
    the folder by its path with the defaults."""
    if folder is None:
        return None
    wanted = config.spec.baseline
    if wanted is None:
        return Baseline(folder, str(folder))
    return Baseline(folder, wanted.name, wanted.confidence_level, wanted.minimum_improvement)


async def _served(pool_url: str, tasks: list[Task]) -> ServedTasks:
    """``tasks`` split by what the pool at ``pool_url`` serves, once it has validated them."""
    async with GatewayClient(pool_url) as gateway:
        served = await served_tasks(gateway, tasks)
    assert served is not None  # nothing stops the wait
    return served


async def _close(policies: Policies, sandboxes: Sandboxes) -> None:
    """Close the chat client and the pool gateway client."""
    await policies.aclose()
    await sandboxes.aclose()


__all__ = ["BenchmarkSetup", "prepare_benchmark"]

"""The benchmark runner: every (instance, attempt) of a suite through the agent and the harness.

One attempt, always in this order and in one sandbox::

    sandbox start -> run_agent(deadline) -> evaluate (same sandbox) -> reward -> write -> close

At most ``parallelism`` attempts run at once: that many workers pull attempts from one list, so
sandboxes are created only as workers free up (back-pressure; hundreds of pending attempts never
mean hundreds of sandboxes). Attempts go attempt-major (attempt 0 of every instance first), so
an interrupted run has the fullest pass@1 picture.

Failures stay with their attempt. A sandbox that does not start, a model server that does not
answer, a harness step that times out: the attempt is written as an infrastructure failure (no
verdict) and the others go on (a test run that outlives its time is different: unresolved, as in
SWE-bench's harness, so a patch that hangs the tests counts against the model); it is run again
after the rest of the suite up to ``retries`` times, and on resume. An environment error (the
task's test run reported no tests) is errored too, but not retried within the run: it is not
transient, and a retry would repeat a whole agent episode to get it again; a resume (after the
environment is fixed) runs it again. :meth:`BenchmarkRunner.stop` (the callers wire
it to SIGINT and SIGTERM) stops starting attempts and cancels the running ones; a cancelled
attempt writes no result (its trajectory so far goes to ``cancelled.jsonl``), everything written
stays, and the next run resumes from there. A
sandbox being closed or a result being written when the cancellation comes (a second Ctrl-C
included) is finished first. An attempt that cannot be written (a full disk) stops the run.

Time: see :mod:`crl_worker.agent.episode` (the agent and the evaluation share
``agent.timeoutSeconds``).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from crl_worker.agent.client import Policy
from crl_worker.agent.episode import run_episode, to_the_end
from crl_worker.agent.gold import gold_patch_failure
from crl_worker.agent.pristine import PristineSpares
from crl_worker.agent.trajectory import Trajectory
from crl_worker.agent.tries import first_try_resolved
from crl_worker.api.common import AgentSpec
from crl_worker.bench.compare import instance_attempts
from crl_worker.bench.stats import Comparison, ComparisonError, compare
from crl_worker.bench.summary import (
    build_summary,
    comparison_wire,
    progress_report,
    report_pass_at_k,
)
from crl_worker.harness.integrity import confirmation_enabled
from crl_worker.rewards import tests_score
from crl_worker.rollout.results import AttemptResult, ResultsError, ResultsStore, read_results
from crl_worker.sandbox.base import Sandbox
from crl_worker.tasks.model import Task

logger = logging.getLogger(__name__)


def default_error_limit(parallelism: int) -> int:
    """Infrastructure failures in a row after which a run gives up, by default: enough that a
    few bad instances never trip it, few enough that a dead server costs minutes, not hours."""
    return max(10, 2 * parallelism)


#: Seconds between recomputations of pass@k for the per-attempt progress reports (the counts
#: are always current; the last report is computed whole).
PASS_AT_K_INTERVAL = 1.0


class ProgressReporter(Protocol):
    """Where the progress report goes (:class:`crl_worker.rollout.report.ConfigMapReporter` in a
    cluster). The same protocol as ``report.ProgressReporter``, restated here because that
    module reaches the Kubernetes client, which ``crl bench`` must not import."""

    async def publish(self, report: Mapping[str, Any]) -> None:
        """Make ``report`` the current progress; never raises."""
        ...


SandboxFactory = Callable[[Task], Sandbox]
"""Makes the (not yet started) sandbox of one attempt: local, or leased from a pool."""
PolicyFactory = Callable[[Task], Policy]
"""The policy of one attempt: the gold replay of the task, or a shared chat client."""
ProgressCallback = Callable[[AttemptResult, Mapping[str, Any]], None]
"""Called after each written attempt with its result and the progress report."""


@dataclass(frozen=True)
class Baseline:
    """A results folder to compare with at the end of the run."""

    path: Path
    """The baseline's results folder."""
    name: str
    """How the summary names it (a Benchmark name in a cluster, else the folder)."""
    confidence: float = 0.95
    """Level of the bootstrap interval."""
    minimum_improvement: float | None = None
    """Absolute improvement that counts as success."""


@dataclass
class RunOutcome:
    """What a run did."""

    summary: dict[str, Any]
    """``summary.json`` as written."""
    total: int
    """Attempts the suite holds (instances x attempts)."""
    ran: int
    """Attempts run (and written) by this call."""
    skipped: int
    """Attempts already on record without an infrastructure failure, not run again."""
    interrupted: bool
    """``stop()`` was called (or the run gave up) before every attempt was done."""
    elapsed: float
    """Seconds this call took."""
    records: list[AttemptResult] = field(default_factory=list)
    """The latest result of every attempt of the suite on record."""
    gave_up: str | None = None
    """Why the run stopped itself: too many infrastructure failures in a row, or an attempt
    that could not be written to the results folder."""

    @property
    def errored(self) -> int:
        """Attempts on record with an infrastructure failure."""
        return sum(r.infrastructure_failure for r in self.records)


class BenchmarkRunner:
    """Runs a suite's attempts with bounded concurrency into a :class:`ResultsStore`."""

    def __init__(
        self,
        tasks: Sequence[Task],
        *,
        agent: AgentSpec,
        store: ResultsStore,
        policy_factory: PolicyFactory,
        sandbox_factory: SandboxFactory,
        suite: str,
        model: str,
        attempts: int = 1,
        pass_at_k: Sequence[int] = (1,),
        parallelism: int = 8,
        reporter: ProgressReporter | None = None,
        progress: ProgressCallback | None = None,
        baseline: Baseline | None = None,
        max_consecutive_errors: int | None = None,
        retries: int = 0,
        spares: bool = False,
        quarantined: int = 0,
    ) -> None:
        ids = [t.instance_id for t in tasks]
        if len(set(ids)) != len(ids):
            duplicated = sorted({i for i in ids if ids.count(i) > 1})
            raise ValueError(f"the suite holds duplicate instance ids: {', '.join(duplicated)}")
        if attempts < 1 or parallelism < 1:
            raise ValueError("attempts and parallelism must be at least 1")
        self.tasks = list(tasks)
        self.agent = agent
        self.store = store
        self.policy_factory = policy_factory
        self.sandbox_factory = sandbox_factory
        self.suite = suite
        self.model = model
        self.attempts = attempts
        self.pass_at_k = list(pass_at_k)
        self.parallelism = parallelism
        self.reporter = reporter
        self.progress = progress
        self.baseline = baseline
        self.max_consecutive_errors = max_consecutive_errors
        self.retries = retries
        #: Tasks left out because their validation quarantined them (``summary.json``).
        self.quarantined = quarantined
        self._consecutive_errors = 0
        self._gave_up: str | None = None
        self._by_id = {t.instance_id: t for t in self.tasks}
        self._keys = [(t.instance_id, a) for a in range(attempts) for t in self.tasks]
        self._selected = set(self._keys)
        self._stopping = False
        self._workers: list[asyncio.Task[None]] = []
        self._latest: dict[tuple[str, int], AttemptResult] = {}
        self._pass_at_k: list[dict[str, Any]] | None = None
        self._pass_at_k_at = 0.0
        # Pristine sandboxes for the integrity check, started with each task's episode (up to
        # twice the parallelism's sandboxes at once: opt-in, as a pool's capacity may not allow).
        self._spares = (
            PristineSpares(sandbox_factory, limit=parallelism)
            if spares and confirmation_enabled()
            else None
        )

    @property
    def spares(self) -> PristineSpares | None:
        """The pristine sandboxes the integrity check takes (``None``: it starts fresh ones)."""
        return self._spares

    @property
    def total(self) -> int:
        """Attempts in the suite."""
        return len(self._keys)

    def stop(self) -> None:
        """Start no more attempts and cancel the running ones (safe from a signal handler)."""
        if not self._stopping:
            logger.warning("stopping: no new attempts; cancelling the running ones")
        self._stopping = True
        for worker in self._workers:
            worker.cancel()

    def _count_error(self, result: AttemptResult) -> None:
        """Give up after ``max_consecutive_errors`` infrastructure failures in a row: the model
        server or the sandboxes are down, and going on would only write the rest of the suite
        off as errored (a rerun resumes once they are back). An environment error resets the
        count: the sandbox started and the tests ran, so the infrastructure is up; the task's
        environment is what failed."""
        if not result.infrastructure_failure or result.environment_error:
            self._consecutive_errors = 0
            return
        self._consecutive_errors += 1
        limit = self.max_consecutive_errors
        if limit is not None and self._consecutive_errors >= limit and self._gave_up is None:
            self._gave_up = (
                f"{self._consecutive_errors} attempts in a row had infrastructure failures"
                f" (last: {result.infrastructure_error}); the infrastructure looks down"
            )
            logger.error("giving up: %s", self._gave_up)
            self.stop()

    def _current(self) -> list[AttemptResult]:
        return [self._latest[k] for k in sorted(self._latest)]

    async def run(self) -> RunOutcome:
        """Run every attempt not yet on record (or on record as an infrastructure failure)."""
        started = time.monotonic()
        self._latest = {r.key: r for r in self.store.records() if r.key in self._selected}
        finished = self.store.finished()
        pending = [k for k in self._keys if k not in finished]
        skipped = self.total - len(pending)
        if skipped:
            logger.info(
                "%d of %d attempts already done; running %d", skipped, self.total, len(pending)
            )
        # A report before the first attempt ends: once the operator has read one, it waits for
        # the last before it says the Benchmark succeeded (crl_operator.reports).
        report = progress_report(
            list(self._latest.values()), total=self.total, ks=self.pass_at_k, finished=False
        )
        await self._publish(report)
        queue = deque(pending)
        tries: dict[tuple[str, int], int] = {}
        ran = 0

        async def worker() -> None:
            nonlocal ran
            while not self._stopping and queue:
                key = queue.popleft()
                try:
                    result = await self._attempt(self._by_id[key[0]], key[1])
                except Exception as exc:
                    # _attempt catches everything an attempt can raise: this is the results
                    # folder refusing writes (a full disk) or a bug of the runner. Either way
                    # nothing more can be recorded: stop the run, say why, keep what is written.
                    logger.exception("%s#%d: the attempt could not be recorded", *key)
                    if self._gave_up is None:
                        self._gave_up = (
                            f"recording {key[0]}#{key[1]} in {self.store.path} failed"
                            f" ({type(exc).__name__}: {exc}); fix that (free disk space?), then"
                            " run again to resume"
                        )
                    self.stop()
                    return
                ran += 1
                tries[key] = tries.get(key, 0) + 1
                if (
                    result.infrastructure_failure
                    and not result.environment_error
                    and tries[key] <= self.retries
                ):
                    # Again after everything else: a transient failure (an evicted pod, a
                    # restarting server) has had time to pass. This worker is still running,
                    # so the retry is taken even when the other workers have finished. An
                    # environment error is not transient (the same environment reports no
                    # tests again): another agent episode would only repeat it.
                    queue.append(key)
                self._count_error(result)
                await self._after(result)

        self._workers = [
            asyncio.create_task(worker(), name=f"bench-worker-{i}")
            for i in range(min(self.parallelism, len(pending)))
        ]
        if self._stopping:  # stopped before the workers existed
            for w in self._workers:
                w.cancel()
        try:
            outcomes = await asyncio.gather(*self._workers, return_exceptions=True)
        finally:
            if self._spares is not None:
                await to_the_end(self._spares.close(), "benchmark", "closing spare sandboxes")
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(
                outcome, asyncio.CancelledError
            ):
                # _attempt catches everything an attempt can raise; this is the runner's bug
                # or a disk that refuses writes: say so, the finished attempts are on disk.
                logger.error("a benchmark worker failed", exc_info=outcome)
                self._stopping = True
        # From the store: an attempt whose write finished while its worker was being cancelled
        # is on disk (the store's lock waits for a write in progress) but never reached _after.
        self._latest = {r.key: r for r in self.store.records() if r.key in self._selected}
        records = self._current()
        done = {r.key for r in records if not r.infrastructure_failure}
        interrupted = self._stopping and any(k not in done for k in self._keys)
        all_done = len(records) == self.total
        elapsed = time.monotonic() - started
        summary = self._summary(records, finished=all_done and not interrupted, elapsed=elapsed)
        try:
            await asyncio.to_thread(self.store.write_summary, summary)
        except OSError as exc:
            # Every attempt is on disk already; the summary is only derived from them (the next
            # run into the folder writes it again). Losing the outcome here would lose the
            # table and the progress report too.
            logger.error(
                "cannot write %s: %s; the results are intact, run again to rewrite it",
                self.store.summary_file,
                exc,
            )
        report = progress_report(
            records, total=self.total, ks=self.pass_at_k, finished=all_done and not interrupted
        )
        if summary.get("comparison") and self.baseline is not None:
            report["comparison"] = _status_comparison(summary["comparison"])
        await self._publish(report)
        return RunOutcome(
            summary=summary,
            total=self.total,
            ran=ran,
            skipped=skipped,
            interrupted=interrupted,
            gave_up=self._gave_up,
            elapsed=elapsed,
            records=records,
        )

    def _summary(
        self, records: list[AttemptResult], *, finished: bool, elapsed: float
    ) -> dict[str, Any]:
        comparison = None
        if self.baseline is not None:
            try:
                # This run's attempts only (a --limit run is compared on its own instances).
                found: Comparison = compare(
                    instance_attempts(records),
                    instance_attempts(read_results(self.baseline.path)),
                    confidence=self.baseline.confidence,
                    minimum_improvement=self.baseline.minimum_improvement,
                )
                comparison = comparison_wire(found, self.baseline.name)
            except (ComparisonError, ResultsError) as exc:
                logger.warning("no comparison with the baseline %s: %s", self.baseline.name, exc)
        return build_summary(
            records,
            suite=self.suite,
            model=self.model,
            total=self.total,
            ks=self.pass_at_k,
            finished=finished,
            elapsed=elapsed,
            comparison=comparison,
            quarantined=self.quarantined,
        )

    async def _after(self, result: AttemptResult) -> None:
        self._latest[result.key] = result
        records = list(self._latest.values())
        now = time.monotonic()
        if self._pass_at_k is None or now - self._pass_at_k_at >= PASS_AT_K_INTERVAL:
            # Over every instance: on a long suite, at most once per interval.
            self._pass_at_k = report_pass_at_k(records, self.pass_at_k)
            self._pass_at_k_at = now
        report = progress_report(
            records,
            total=self.total,
            ks=self.pass_at_k,
            finished=False,
            pass_at_k=self._pass_at_k,
        )
        if self.progress is not None:
            try:
                self.progress(result, report)
            except Exception:
                logger.exception("the progress callback failed")
        await self._publish(report)

    async def _publish(self, report: Mapping[str, Any]) -> None:
        if self.reporter is None:
            return
        try:
            await self.reporter.publish(report)
        except Exception as exc:  # reporting never stops a benchmark
            logger.warning("publishing the progress failed: %s", exc)

    async def _attempt(self, task: Task, attempt: int) -> AttemptResult:
        """Run one attempt and write it. When cancelled, the agent's trajectory so far goes to
        ``cancelled.jsonl`` and the cancellation goes on (nothing in ``results.jsonl``)."""
        t0 = time.monotonic()
        label = f"{task.instance_id}#{attempt}"

        async def keep(trajectory: Trajectory) -> None:
            await self._keep_cancelled(trajectory, label)

        trajectory, started = await run_episode(
            task,
            attempt,
            self.sandbox_factory,
            self.policy_factory(task),
            self.agent,
            keep_cancelled=keep,
            spares=self._spares,
        )
        evaluation = trajectory.evaluation
        agent_seconds = trajectory.duration if started else 0.0
        eval_seconds = evaluation.duration if evaluation is not None else 0.0
        if evaluation is not None:
            # SWE-bench's rule: tests that outlive their time are not resolved (a patch that
            # makes them hang must not drop out of the rate as "errored").
            trajectory.reward = (
                0.0 if evaluation.tests_timed_out else tests_score(evaluation, "binary")
            )
        result = _result(trajectory, agent_seconds, eval_seconds, time.monotonic() - t0, task)
        failure = gold_patch_failure(trajectory) if result.resolved is not None else None
        if failure is not None:
            # Not an ordinary 'unresolved': the task's patch, its base commit or the harness is
            # wrong, and every model would be scored against a broken instance.
            logger.warning(
                "%s: %s; check the task (patch, base commit) or the harness", label, failure
            )
            result = result.model_copy(update={"error": failure})
        # Once the write started, the attempt is done even if the run is cancelled meanwhile.
        await to_the_end(
            asyncio.to_thread(self.store.append, result, trajectory.model_dump_json()),
            label,
            "writing its result",
        )
        logger.info(
            "%s: %s (%s)",
            label,
            "error" if result.resolved is None else "resolved" if result.resolved else "unresolved",
            result.exit_reason,
        )
        return result

    async def _keep_cancelled(self, trajectory: Trajectory, label: str) -> None:
        """Save the trajectory of a cancelled attempt (the cancellation is already under way)."""
        try:
            await to_the_end(
                asyncio.to_thread(self.store.append_cancelled, trajectory.model_dump_json()),
                label,
                "saving its cancelled trajectory",
            )
        except Exception as exc:
            logger.warning("%s: saving its cancelled trajectory failed: %s", label, exc)


def _result(
    trajectory: Trajectory,
    agent_seconds: float,
    eval_seconds: float,
    wall_seconds: float,
    task: Task | None = None,
) -> AttemptResult:
    evaluation = trajectory.evaluation
    if trajectory.exit_reason == "infrastructure_error":
        infrastructure_error = trajectory.error or "infrastructure failure"
    elif (
        evaluation is not None
        and evaluation.infrastructure_error is not None
        and not evaluation.tests_timed_out
    ):
        infrastructure_error = f"evaluation: {evaluation.infrastructure_error}"
    else:
        infrastructure_error = None
    resolved = (
        None if infrastructure_error is not None else bool(evaluation and evaluation.resolved)
    )
    return AttemptResult(
        instance_id=trajectory.instance_id,
        repo=trajectory.repo,
        attempt=trajectory.attempt,
        resolved=resolved,
        exit_reason=trajectory.exit_reason,
        infrastructure_error=infrastructure_error,
        reward=None if resolved is None else trajectory.reward,
        prompt_tokens=trajectory.prompt_tokens,
        completion_tokens=trajectory.completion_tokens,
        turns=len(trajectory.turns),
        agent_seconds=round(agent_seconds, 3),
        eval_seconds=round(eval_seconds, 3),
        wall_seconds=round(wall_seconds, 3),
        model=trajectory.model,
        started_at=trajectory.started_at,
        error=trajectory.error,
        task_type=task.task_type if task is not None else "repair",
        language=task.language if task is not None else None,
        label=task.classification.cwe if task is not None and task.classification else None,
        answer=evaluation.answer if evaluation is not None else None,
        credit=None if resolved is None or evaluation is None else evaluation.credit,
        first_try_resolved=first_try_resolved(trajectory, resolved),
    )


def _status_comparison(comparison: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a summary comparison that the Benchmark's status holds."""
    keys = (
        "baseline",
        "sharedInstances",
        "difference",
        "ciLow",
        "ciHigh",
        "confidenceLevel",
        "mcnemarPValue",
        "meetsMinimumImprovement",
    )
    return {k: comparison[k] for k in keys if comparison.get(k) is not None}


class _Closable(Protocol):
    """What is closed after the run: a chat client, a gateway client."""

    async def aclose(self) -> None: ...


async def run_until_signalled(
    runner: BenchmarkRunner, *resources: _Closable
) -> tuple[RunOutcome, int | None]:
    """Run ``runner`` with SIGINT and SIGTERM wired to :meth:`BenchmarkRunner.stop`, then
    close ``resources`` (the model client, the pool gateway client) whatever happened.

    Returns the outcome and the number of the signal that stopped it (``None`` when none did).
    """
    loop = asyncio.get_running_loop()
    received: list[int] = []

    def on_signal(number: int) -> None:
        received.append(number)
        runner.stop()

    installed: list[int] = []
    for number in (int(signal.SIGINT), int(signal.SIGTERM)):
        try:
            loop.add_signal_handler(number, on_signal, number)
            installed.append(number)
        except (NotImplementedError, RuntimeError):  # not the main thread, or no such support
            pass
    try:
        outcome = await runner.run()
    finally:
        for number in installed:
            loop.remove_signal_handler(number)
        for resource in resources:
            await resource.aclose()
    return outcome, (received[0] if received else None)

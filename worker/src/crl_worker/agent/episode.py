"""One episode: the agent in a started sandbox, then the evaluation in that same sandbox.

Shared by the benchmark runner and the trainer's rollouts; what each makes of the result (a
benchmark's binary verdict, a training reward) is theirs.

Time: ``agent.timeoutSeconds`` covers the agent and the evaluation together, from the moment
the sandbox is up. The agent's deadline keeps back :data:`EVALUATION_SHARE` of it (at most the
task's test timeout) for the evaluation; the evaluation gets whatever the agent left, and never
less than that reserve.

Integrity (:func:`run_episode`): a resolved verdict from the agent's sandbox (or a run there
without a verdict) is graded again, once that sandbox is closed, in a fresh one from the
same factory with only the candidate's source changes and canary tests
(:mod:`crl_worker.harness.integrity`); an unresolved one stands. The second grading comes on
top of ``agent.timeoutSeconds`` (at most the task's test timeout, and the sandbox's start).
``$CRL_GRADING_CONFIRM=0`` or ``integrity=False`` turns it off.

Second try (``agent.tries: 2``, benchmarks): the first try is graded in fresh sandboxes, and
an unresolved one continues in the agent's sandbox with the failing tests' output
(:mod:`crl_worker.agent.tries`); the last try is graded as above.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TypeVar

from crl_worker.agent.client import Policy
from crl_worker.agent.loop import AgentCancelled, run_agent
from crl_worker.agent.pristine import PristineSpares
from crl_worker.agent.trajectory import Trajectory
from crl_worker.agent.tries import SecondTry
from crl_worker.api.common import AgentSpec
from crl_worker.harness.classify import grade_answer
from crl_worker.harness.evaluate import evaluate
from crl_worker.harness.integrity import confirm, confirmation_enabled, needs_confirmation
from crl_worker.harness.result import EvalResult
from crl_worker.sandbox.base import Sandbox
from crl_worker.tasks.model import Task

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Share of ``agent.timeoutSeconds`` the agent's deadline keeps back for the evaluation.
EVALUATION_SHARE = 0.25
#: Seconds a sandbox gets to close before the caller moves on.
CLOSE_TIMEOUT = 120.0

#: Called with the trajectory so far when the episode is cancelled (it is re-raised after).
KeepCancelled = Callable[[Trajectory], Awaitable[None]]


def failed_trajectory(
    task: Task, attempt: int, model: str, started_at: datetime, t0: float, error: str
) -> Trajectory:
    """The trajectory of an episode that never reached (or got lost in) the agent loop."""
    return Trajectory(
        instance_id=task.instance_id,
        repo=task.repo,
        attempt=attempt,
        model=model,
        started_at=started_at,
        duration=time.monotonic() - t0,
        messages=[],
        turns=[],
        exit_reason="infrastructure_error",
        error=error,
    )


def classification_answer(trajectory: Trajectory) -> tuple[str | None, str]:
    """The CWE id and reasoning of the last ``classify`` call the tool accepted (``None`` and
    ``""`` when the episode ended without one)."""
    for turn in reversed(trajectory.turns):
        for call in reversed(turn.tool_calls):
            if call.name != "classify" or call.error:
                continue
            try:
                arguments = json.loads(call.arguments)
            except ValueError:
                continue
            if isinstance(arguments, dict) and isinstance(arguments.get("cwe"), str):
                reasoning = arguments.get("reasoning")
                return arguments["cwe"], reasoning if isinstance(reasoning, str) else ""
    return None, ""


async def agent_then_evaluate(
    task: Task,
    attempt: int,
    sandbox: Sandbox,
    policy: Policy,
    agent: AgentSpec,
    *,
    started_at: datetime,
    keep_cancelled: KeepCancelled,
    second_try: SecondTry | None = None,
) -> Trajectory:
    """Run the agent, then (unless it ended on an infrastructure failure) the evaluation in the
    same sandbox; the trajectory carries the evaluation and no reward.

    With ``second_try``, a first try it graded as final (no second try) is not evaluated
    again: its verdict is the trajectory's.

    A cancellation hands the trajectory so far to ``keep_cancelled`` and goes on; anything the
    agent loop or the harness raise unexpectedly ends only this episode, as an infrastructure
    failure.
    """
    budget = float(agent.timeout_seconds)
    reserve = min(task.timeouts.test, EVALUATION_SHARE * budget)
    t_agent = time.monotonic()
    label = f"{task.instance_id}#{attempt}"
    try:
        trajectory = await run_agent(
            task,
            sandbox,
            policy,
            agent,
            attempt=attempt,
            deadline=t_agent + budget - reserve,
            next_try=second_try,
        )
    except AgentCancelled as cancelled:
        # Stopped (Ctrl-C, SIGTERM, giving up): the work done so far is kept.
        await keep_cancelled(cancelled.trajectory)
        raise
    except Exception as exc:
        # run_agent reports model and sandbox failures in the trajectory; anything raised
        # here is unexpected, but it ends only this episode.
        logger.exception("%s: the agent loop failed", label)
        return failed_trajectory(
            task, attempt, policy.model, started_at, t_agent, f"the agent loop failed: {exc!r}"
        )
    if trajectory.exit_reason == "infrastructure_error":
        return trajectory
    if second_try is not None and second_try.final is not None and not second_try.began:
        trajectory.evaluation = second_try.final
        return trajectory
    if second_try is not None and second_try.started is not None:
        t_agent = second_try.started
    if task.task_type == "classify":
        # No tests: the answer is graded against the label (none given: credit 0, recorded).
        trajectory.evaluation = grade_answer(task, *classification_answer(trajectory))
        return trajectory
    remaining = t_agent + budget - time.monotonic()
    try:
        # What the agent left (at least the reserve), never more than the task's own limit.
        evaluation = await evaluate(
            sandbox, task, timeout=min(task.timeouts.test, max(remaining, reserve))
        )
    except asyncio.CancelledError:
        ended = trajectory.exit_reason
        trajectory.exit_reason = "cancelled"
        trajectory.error = (
            f"the run was stopped during the evaluation (the agent had ended: {ended})"
        )
        await keep_cancelled(trajectory)
        raise
    except Exception as exc:
        # evaluate() reports its failures in the result; anything raised is unexpected.
        logger.exception("%s: the evaluation failed", label)
        evaluation = EvalResult(
            instance_id=task.instance_id,
            resolved=False,
            infrastructure_error=f"the evaluation failed: {exc!r}",
        )
    trajectory.evaluation = evaluation
    return trajectory


async def confirm_resolved(
    task: Task,
    first: EvalResult,
    diff: str,
    factory: Callable[[Task], Sandbox],
    label: str,
    spares: PristineSpares | None = None,
) -> EvalResult:
    """Grade ``first`` (resolved, or without a verdict) again in a fresh sandbox from
    ``factory`` (or a spare that started ahead of need, from ``spares``) with only the source
    changes of ``diff`` (:func:`crl_worker.harness.integrity.confirm`), then close that
    sandbox. A sandbox that does not start leaves the episode without a verdict (an
    infrastructure error), never with the unconfirmed one."""
    fresh: Sandbox | None = None
    try:
        try:
            if spares is not None:
                fresh = await spares.take(task)
            else:
                fresh = factory(task)
                await fresh.start()
        except Exception as exc:
            logger.warning("%s: the integrity check's sandbox did not start: %s", label, exc)
            error = f"the integrity check's sandbox did not start: {exc}"
            return first.model_copy(
                update={
                    "resolved": False,
                    "infrastructure_error": first.infrastructure_error or error,
                }
            )
        return await confirm(fresh, task, first, diff, timeout=task.timeouts.test)
    finally:
        if fresh is not None and spares is not None:
            spares.dispose(fresh)  # closed off the episode's path; spares.close() waits for it
        elif fresh is not None:
            await close_sandbox(fresh, f"{label} (integrity check)")


async def run_episode(
    task: Task,
    attempt: int,
    sandbox_factory: Callable[[Task], Sandbox],
    policy: Policy,
    agent: AgentSpec,
    *,
    keep_cancelled: KeepCancelled,
    integrity: bool | None = None,
    spares: PristineSpares | None = None,
    confirm_partial: bool = False,
) -> tuple[Trajectory, bool]:
    """A whole episode: start a sandbox, :func:`agent_then_evaluate` in it, close it (to the end,
    even when cancelled). Returns the trajectory and whether the sandbox started; a sandbox that
    does not start is an infrastructure failure of this episode only.

    ``integrity`` (default: :func:`~crl_worker.harness.integrity.confirmation_enabled`, on):
    a resolved verdict, or an evaluation without one (an infrastructure error), is graded again
    in a second sandbox from ``sandbox_factory`` (:func:`confirm_resolved`), made once the
    agent's is closed, so an episode never holds two; with ``spares``
    (:class:`~crl_worker.agent.pristine.PristineSpares`), one starts beside the agent's for the
    check instead, so that a resolved episode does not wait for its start.

    ``confirm_partial`` (a reward paying the share of passing tests): an unresolved verdict that
    some listed test passed is checked too (:func:`~crl_worker.harness.integrity.needs_confirmation`).

    ``agent.tries: 2`` (:class:`~crl_worker.agent.tries.SecondTry`): the first try is graded
    in fresh sandboxes (the integrity check included) while the agent's stays open; an
    unresolved one gets a second try in it."""
    if integrity is None:
        integrity = confirmation_enabled()
    if integrity and spares is not None and task.task_type != "classify":
        spares.prefetch(task)
    started_at = datetime.now(UTC)
    t0 = time.monotonic()
    label = f"{task.instance_id}#{attempt}"
    sandbox: Sandbox | None = None
    diff: str | None = None
    try:
        try:
            sandbox = sandbox_factory(task)
            await sandbox.start()
        except Exception as exc:
            logger.warning("%s: the sandbox did not start: %s", label, exc)
            error = f"the sandbox did not start: {exc}"
            return failed_trajectory(task, attempt, policy.model, started_at, t0, error), False
        second_try = _second_try(
            task, sandbox, sandbox_factory, agent, label, integrity, spares, confirm_partial
        )
        trajectory = await agent_then_evaluate(
            task,
            attempt,
            sandbox,
            policy,
            agent,
            started_at=started_at,
            keep_cancelled=keep_cancelled,
            second_try=second_try,
        )
        graded = second_try is not None and second_try.final is not None and not second_try.began
        if (
            integrity
            and not graded  # the first try's grading, the integrity check included, is final
            and task.task_type != "classify"  # nothing ran in the sandbox to tamper with
            and trajectory.evaluation
            and needs_confirmation(trajectory.evaluation, partial=confirm_partial)
        ):
            # The diff the agent submitted (taken when its loop ended), never one taken now:
            # the evaluation has since run the hidden tests in this sandbox, with whatever the
            # agent left behind (a sitecustomize outside the repository could have copied them
            # into the package). An empty one is no source change: unresolved.
            diff = trajectory.diff
    finally:
        if sandbox is not None:
            await close_sandbox(sandbox, label)
    if diff is not None and trajectory.evaluation is not None:
        try:
            trajectory.evaluation = await confirm_resolved(
                task, trajectory.evaluation, diff, sandbox_factory, label, spares
            )
        except asyncio.CancelledError:
            trajectory.exit_reason = "cancelled"
            trajectory.error = "the run was stopped during the integrity check"
            await keep_cancelled(trajectory)
            raise
        except Exception as exc:
            logger.exception("%s: the integrity check failed", label)
            trajectory.evaluation = EvalResult(
                instance_id=task.instance_id,
                resolved=False,
                infrastructure_error=f"the integrity check failed: {exc!r}",
            )
    return trajectory, True


def _second_try(
    task: Task,
    sandbox: Sandbox,
    factory: Callable[[Task], Sandbox],
    agent: AgentSpec,
    label: str,
    integrity: bool,
    spares: PristineSpares | None,
    confirm_partial: bool = False,
) -> SecondTry | None:
    """The episode's :class:`~crl_worker.agent.tries.SecondTry` (``agent.tries: 2``), or
    ``None``."""
    if agent.tries < 2 or task.task_type == "classify":
        return None

    async def check(first: EvalResult, diff: str) -> EvalResult:
        return await confirm_resolved(task, first, diff, factory, label, spares)

    budget = float(agent.timeout_seconds)
    return SecondTry(
        task,
        sandbox,
        factory,
        label=label,
        agent_seconds=budget - min(task.timeouts.test, EVALUATION_SHARE * budget),
        confirm=check if integrity else None,
        close=close_sandbox,
        confirm_partial=confirm_partial,
    )


async def to_the_end(awaitable: Awaitable[T], label: str, what: str) -> T:
    """Await ``awaitable`` to its end even when the caller is cancelled meanwhile (a second
    Ctrl-C), then let the cancellation go on.

    A shield alone is not enough: the cancelled caller would return at once, the run would
    end, and ``asyncio.run`` would cancel the shielded close on its way out, leaving the
    sandbox (a pod, a leased pool slot, a folder) behind. The wait is bounded by what is
    awaited (``CLOSE_TIMEOUT`` for a close; a write is a few disk operations).
    """
    inner = asyncio.ensure_future(awaitable)
    cancelled = False
    while not inner.done():
        try:
            await asyncio.wait({inner})
        except asyncio.CancelledError:
            if not cancelled:
                logger.warning("%s: stopping; %s first", label, what)
            cancelled = True
    if cancelled:
        if not inner.cancelled() and inner.exception() is not None:
            logger.warning("%s: %s failed: %s", label, what, inner.exception())
        raise asyncio.CancelledError
    return inner.result()


async def close_sandbox(sandbox: Sandbox, label: str) -> None:
    """Close a sandbox, to the end even while the attempt is being cancelled; log failures."""
    try:
        await to_the_end(
            asyncio.wait_for(sandbox.close(), CLOSE_TIMEOUT), label, "closing its sandbox"
        )
    except Exception as exc:
        logger.warning("%s: closing the sandbox failed: %s", label, exc)

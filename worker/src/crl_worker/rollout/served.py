"""The tasks a run may draw when its sandboxes come from a pool gateway.

A pool that validates its tasks (``spec.validation``) serves only the valid ones; a lease of a
quarantined task is a 404, which a rollout can only count as an infrastructure failure. So the
trainer and the benchmark runner ask the gateway first (``GET /v1/tasks``, waiting while it
validates) and leave the quarantined tasks out of their own task list, with their reasons:
such a task is never drawn, never scored 0, never counted as a failure.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from crl_worker.harness.validate import TaskVerdict, ValidationReport
from crl_worker.pool.client import GatewayClient, GatewayError
from crl_worker.pool.models import QuarantinedInstance
from crl_worker.rollout.setup import RolloutSetupError
from crl_worker.tasks.model import Task

logger = logging.getLogger(__name__)

#: Seconds one request waits for the pool's verdicts before it asks again (and a stop is seen).
POLL_SECONDS = 5.0
#: Seconds between two log lines while waiting.
SAY_EVERY = 300.0


class NothingServed(RolloutSetupError):
    """The pool quarantined every one of the run's tasks: there is nothing to run."""


@dataclass(frozen=True)
class ServedTasks:
    """The run's tasks split by what the pool does with them."""

    tasks: list[Task]
    """The tasks the pool serves, in the run's order."""
    quarantined: list[QuarantinedInstance]
    """The run's tasks the pool quarantined, with their reasons."""

    def reasons(self) -> str:
        """The reasons in words, the most common first (``resolved without the fix: 2, ...``)."""
        counts = Counter(q.reason for q in self.quarantined)
        return ", ".join(f"{reason}: {count}" for reason, count in counts.most_common())

    def report(self) -> ValidationReport:
        """The same as a :class:`ValidationReport` (for ``quarantine.json`` and ``crl bench``'s
        lines); verdicts the pool took from its cache are not told apart."""
        return ValidationReport(
            valid=list(self.tasks),
            quarantined=[
                TaskVerdict(
                    q.instance_id,
                    q.digest,
                    ok=False,
                    problems=list(q.problems) or [q.reason],
                    flaky=list(q.flaky),
                )
                for q in self.quarantined
            ],
        )


async def served_tasks(
    gateway: GatewayClient,
    tasks: Sequence[Task],
    *,
    stopped: Callable[[], bool] | None = None,
    poll: float = POLL_SECONDS,
) -> ServedTasks | None:
    """``tasks`` split into the ones the pool at ``gateway`` serves and the ones it quarantined,
    once its verdicts are in (this waits while it validates); ``None`` when ``stopped`` turned
    true while waiting.

    Raises :class:`NothingServed` when the pool quarantined every one of ``tasks`` (naming the
    reasons), :class:`RolloutSetupError` when the pool's validation failed or the gateway
    cannot say.
    """
    began = time.monotonic()
    said: float | None = None
    while True:
        asked = time.monotonic()
        try:
            answer = await gateway.tasks(wait=poll)
        except GatewayError as exc:
            if exc.status == 404 and exc.code is None:
                # A gateway older than GET /v1/tasks: it does not validate either.
                logger.warning("the pool gateway does not list its tasks; every task is drawn")
                return ServedTasks(list(tasks), [])
            raise RolloutSetupError(f"cannot learn which tasks the pool serves: {exc}") from exc
        if answer.state == "failed":
            raise RolloutSetupError(f"the pool serves no task: {answer.message}")
        if answer.state == "serving":
            break
        if stopped is not None and stopped():
            return None
        now = time.monotonic()
        if said is None or now - said >= SAY_EVERY:
            said = now
            logger.info(
                "waiting for the pool's verdicts before drawing tasks (%s; %.0f s so far)",
                answer.message,
                now - began,
            )
        if now - asked < 1.0:
            await asyncio.sleep(1.0)  # a gateway that answered at once: do not spin
    excluded = {q.instance_id: q for q in answer.quarantined}
    served = ServedTasks(
        [t for t in tasks if t.instance_id not in excluded],
        [excluded[t.instance_id] for t in tasks if t.instance_id in excluded],
    )
    if tasks and not served.tasks:
        raise NothingServed(
            f"the pool quarantined every one of the {len(tasks)} tasks when it validated them"
            f" ({served.reasons()}): nothing is left to run; fix or replace the tasks"
            " (`crl tasks check` shows each one's problems)"
        )
    return served


__all__ = ["POLL_SECONDS", "NothingServed", "ServedTasks", "served_tasks"]

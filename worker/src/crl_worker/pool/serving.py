"""Which of its tasks a pool serves, as its clients learn it (``GET /v1/tasks``).

A pool serves every task it was given, unless it validates them (``spec.validation``): then it
serves none until the verdicts are in (:meth:`TaskGate.hold`), and afterwards every task but the
quarantined ones (:meth:`TaskGate.serve`), or none at all when validating failed
(:meth:`TaskGate.fail`). A trainer or benchmark runner asks before it samples, so that it never
draws a quarantined task (whose lease would be a 404, an infrastructure failure of the rollout);
a request may wait for the verdicts (a long poll) instead of asking again and again.
"""

from __future__ import annotations

import asyncio
import contextlib

from crl_worker.harness.validate import ValidationReport
from crl_worker.pool.leases import SandboxPool
from crl_worker.pool.models import QuarantinedInstance, ServingState, TaskSet


class TaskGate:
    """The serving state of one pool; the gateway moves it, ``GET /v1/tasks`` reads it."""

    def __init__(self, pool: SandboxPool) -> None:
        self.pool = pool
        self.total = len(pool.tasks)
        """Tasks the pool was given (validation never adds one)."""
        self.state: ServingState = "serving"
        self.message = ""
        self.quarantined: list[QuarantinedInstance] = []
        self._settled = asyncio.Event()
        self._settled.set()

    def hold(self, message: str) -> None:
        """Serve nothing until :meth:`serve` or :meth:`fail`; ``message`` says why."""
        self.pool.holding = message
        self.state, self.message = "validating", message
        self._settled.clear()

    def serve(self, report: ValidationReport) -> None:
        """Serve every task but the ones ``report`` quarantined."""
        self.quarantined = [
            QuarantinedInstance(
                instance_id=v.instance_id,
                reason=v.reason,
                problems=list(v.problems),
                flaky=list(v.flaky),
                digest=v.digest,
            )
            for v in report.quarantined
        ]
        self.pool.serve_only({q.instance_id: q.reason for q in self.quarantined})
        self.state, self.message = "serving", ""
        self._settled.set()

    def fail(self, message: str) -> None:
        """Validating failed: keep leasing held for good (a lease request says ``message``)."""
        self.pool.holding = message
        self.state, self.message = "failed", message
        self._settled.set()

    async def answer(self, wait: float = 0.0) -> TaskSet:
        """The task set, once validation is over or after ``wait`` seconds, whichever is first."""
        if wait > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._settled.wait(), wait)
        return TaskSet(
            state=self.state,
            message=self.message,
            total=self.total,
            served=0 if self.state != "serving" else len(self.pool.tasks),
            quarantined=self.quarantined if self.state == "serving" else [],
        )


__all__ = ["TaskGate"]

"""RolloutPool: the sandbox gateway that keeps sandboxes warm and leases them to rollouts
(children: ``crl_operator.builders``, status: :func:`~crl_operator.status.rolloutpool_status`).

It runs no Job and Kueue does not queue it; its pods are the gateway's, and its one write
outside the render is the gateway's token Secret."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from crl_operator import conditions as c
from crl_operator.apply import KubeError
from crl_operator.builders import RenderState
from crl_operator.cache import Key
from crl_operator.kinds.base import KindHandler, Subject
from crl_operator.metrics import ERRORS, forget_quarantined, record_quarantined
from crl_operator.status import Observed, Problem, rolloutpool_status
from crl_worker.api import RolloutPool
from crl_worker.api.progress import PoolProgress

log = logging.getLogger(__name__)


class RolloutPoolKind(KindHandler[RolloutPool]):
    """The RolloutPool's steps: the token Secret before the gateway, the sandbox pods in the
    status."""

    kind = "RolloutPool"
    model = RolloutPool

    def read(
        self, key: Key, resource: RolloutPool, uid: str, previous: Mapping[str, Any]
    ) -> Subject[RolloutPool]:
        """The gateway's validation report, when the pool validates its tasks."""
        report = None
        if resource.spec.validation.enabled:
            report = self.ctx.reports.read(resource, uid, PoolProgress)
        return Subject(key, resource, uid, previous, report)

    def render_state(self, s: Subject[RolloutPool]) -> tuple[RenderState, Problem | None]:
        """Nothing to wait for: the gateway is always wanted."""
        return RenderState(inference_ready=True), None

    def before_apply(self, s: Subject[RolloutPool]) -> Problem | None:
        """Create the token Secret before the gateway Deployment: its pods read the token."""
        _, ns, name = s.key
        try:
            self.ctx.writes.ensure_token(s.key, s.resource, ns, s.uid)
        except KubeError as err:
            if err.namespace_terminating:
                raise
            ERRORS.labels(kind=self.kind, reason=c.APPLY_FAILED).inc()
            log.warning("creating the token Secret of RolloutPool %s/%s failed: %s", ns, name, err)
            return Problem(c.APPLY_FAILED, f"token Secret: {err.message}")
        return None

    def observe(self, s: Subject[RolloutPool], problem: Problem | None) -> Observed:
        """The owned children and the sandbox pods (labelled with the pool's name)."""
        pods = tuple(self.ctx.cache.pool_pods(s.namespace, s.resource.metadata.name or ""))
        return Observed(
            children=tuple(self.ctx.cache.owned(s.uid)), pods=pods, report=s.report, problem=problem
        )

    def status(self, s: Subject[RolloutPool], seen: Observed, now: datetime) -> dict[str, Any]:
        """:func:`~crl_operator.status.rolloutpool_status`."""
        return rolloutpool_status(s.resource, seen, s.previous, now)

    def record(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """The quarantined tasks by reason, as a gauge."""
        record_quarantined(namespace, name, status)

    def forget(self, namespace: str, name: str) -> None:
        """Drop the pool's quarantine gauge."""
        forget_quarantined(namespace, name)

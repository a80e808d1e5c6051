"""The operator's side of Kueue (docs/scheduling.md): whether Kueue is installed, the priority
of a WorkloadPriorityClass, a resource's admission read off its Workload, and the two Workload
status writes Kueue's own job integrations make for the jobs they manage (the quota released
after an eviction, the `PodsReady` condition)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from crl_operator import builders
from crl_operator import conditions as c
from crl_operator.admission import (
    WL_ADMITTED,
    WL_EVICTED,
    WL_PODS_READY,
    WL_QUOTA_RESERVED,
    Admission,
    pods_ready_condition,
    workload_admission,
)
from crl_operator.apply import Kube, KubeError, controller_uid, kind_info
from crl_operator.cache import Cache
from crl_operator.status import Problem
from crl_worker.api import Benchmark, TrainingRun

log = logging.getLogger(__name__)

#: Kueue's API, served when Kueue is installed.
KUEUE_API = "/apis/kueue.x-k8s.io/v1beta2"
#: How long an answer about Kueue (installed, a priority class's value) is reused, in seconds.
KUEUE_CHECK_SECONDS = 30.0


class KueueWorkloads:
    """Kueue as the reconcile sees it, over the shared client and cache (thread-safe)."""

    def __init__(self, kube: Kube, cache: Cache, now: Callable[[], datetime]) -> None:
        """``now``: the reconcile's clock (condition timestamps)."""
        self.kube = kube
        self.cache = cache
        self.now = now
        self._lock = threading.Lock()
        # Whether Kueue's API is served, and when that was last checked (monotonic seconds).
        self._kueue: tuple[bool, float] | None = None
        # WorkloadPriorityClass name -> (value or None when missing, when it was read).
        self._priorities: dict[str, tuple[int | None, float]] = {}

    def installed(self) -> bool:
        """Whether the API server serves Kueue's API (rechecked every 30 s).

        Without Kueue, a resource that names a queue runs unqueued and says so in its
        `Admitted` condition. An error other than 404 keeps the last answer.
        """
        now = time.monotonic()
        with self._lock:
            known = self._kueue
        if known is not None and now - known[1] < KUEUE_CHECK_SECONDS:
            return known[0]
        try:
            self.kube.request("GET", "APIResourceList", KUEUE_API)
            present = True
        except KubeError as err:
            if not err.not_found and known is not None:
                return known[0]
            present = False
        except Exception:  # no answer at all: assume the last state (or absent)
            return known[0] if known is not None else False
        with self._lock:
            if known is None or known[0] != present:
                log.info("Kueue is %s", "installed" if present else "not installed")
            self._kueue = (present, now)
        return present

    def workload_priority(self, name: str) -> int | None:
        """The value of WorkloadPriorityClass `name` (None when it does not exist); read at
        most every 30 s per class (the value is copied into the Workload when created)."""
        now = time.monotonic()
        with self._lock:
            known = self._priorities.get(name)
        if known is not None and now - known[1] < KUEUE_CHECK_SECONDS:
            return known[0]
        try:
            body = self.kube.request(
                "GET", "WorkloadPriorityClass", f"{KUEUE_API}/workloadpriorityclasses/{name}"
            )
            value: int | None = int(body.get("value") or 0)
        except KubeError as err:
            if not err.not_found:
                raise
            value = None
        with self._lock:
            self._priorities[name] = (value, now)
        return value

    def admission(self, resource: TrainingRun | Benchmark, uid: str) -> Admission | None:
        """Kueue's admission of a TrainingRun or Benchmark that names a queue, else None."""
        queue = resource.spec.scheduling.queue_name
        if not queue:
            return None
        if not self.installed():
            return workload_admission(queue, None, kueue=False)
        ns = resource.metadata.namespace or "default"
        live = self.cache.get("Workload", ns, builders.workload_name(resource))
        if live is not None and controller_uid(live) != uid:
            live = None
        return workload_admission(queue, live, kueue=True)

    def _stopped(self, uid: str) -> bool:
        """No pod-running child of the resource is left (after an eviction, the render drops
        the trainer or runner Job, the vLLM Deployment and the inline pool)."""
        return not any(
            child.get("kind") in ("Job", "Deployment", "RolloutPool")
            for child in self.cache.owned(uid)
        )

    def release_quota(self, resource: TrainingRun | Benchmark, uid: str) -> Problem | None:
        """Clear the evicted Workload's quota reservation once its children stopped.

        What Kueue's job integrations do for the Jobs they manage: `Requeued` (True after a
        preemption, so Kueue queues it again at once), `QuotaReserved=False` (`Pending`),
        `Admitted=False` and no `status.admission`. The patch carries the Workload's
        resourceVersion: a concurrent change by Kueue makes it fail, and the next reconcile
        (which that change triggers) tries again.
        """
        if not self._stopped(uid):
            return None
        ns = resource.metadata.namespace or "default"
        name = builders.workload_name(resource)
        live = self.cache.get("Workload", ns, name)
        if live is None:
            return None
        conds = list((live.get("status") or {}).get("conditions") or ())
        evicted = c.find(conds, WL_EVICTED) or {}
        reason = str(evicted.get("reason") or "Evicted")
        message = str(evicted.get("message") or reason)
        generation = live["metadata"].get("generation")
        stamp = c.timestamp(self.now())

        def entry(type_: str, status: str, why: str, text: str) -> dict[str, Any]:
            old = c.find(conds, type_)
            changed = old is None or old.get("status") != status
            return {
                "type": type_,
                "status": status,
                "reason": why,
                "message": text[:32768],
                "observedGeneration": generation,
                "lastTransitionTime": stamp
                if old is None or changed
                else old.get("lastTransitionTime"),
            }

        requeued = reason in ("Preempted", "NodeFailures")
        replaced = {"Requeued", WL_QUOTA_RESERVED, WL_ADMITTED, WL_PODS_READY}
        new = [x for x in conds if x.get("type") not in replaced] + [
            entry("Requeued", "True" if requeued else "False", reason, message),
            entry(WL_QUOTA_RESERVED, "False", "Pending", message),
            entry(WL_ADMITTED, "False", "NoReservation", "The workload has no reservation"),
            # The next admission's pods start from scratch (and Kueue's timeout with them).
            entry(WL_PODS_READY, "False", "WaitForStart", "Not all pods are ready or succeeded"),
        ]
        problem, patched = self._patch_workload_status(
            ns, name, live, {"admission": None, "conditions": new}, "releasing its quota"
        )
        if patched:
            log.info(
                "released the quota of Workload %s/%s after its eviction (%s)", ns, name, reason
            )
        return problem

    def _patch_workload_status(
        self, ns: str, name: str, live: dict[str, Any], status: dict[str, Any], doing: str
    ) -> tuple[Problem | None, bool]:
        """Merge-patch a Workload's status with its resourceVersion as a precondition.

        Returns (problem, patched): a Workload gone or changed meanwhile is neither (the
        change's event reconciles again); another failure is an `ApplyFailed` problem that
        names ``doing``. The patched object goes into the cache.
        """
        body = {
            "metadata": {"resourceVersion": live["metadata"]["resourceVersion"]},
            "status": status,
        }
        try:
            result = self.kube.request(
                "PATCH",
                "Workload/status",
                kind_info("Workload").path(ns, name) + "/status",
                body=body,
                content_type="application/merge-patch+json",
            )
        except KubeError as err:
            if err.status in (404, 409):
                return None, False
            return Problem(c.APPLY_FAILED, f"Workload {name}: {doing}: {err.message}"), False
        result.setdefault("kind", "Workload")
        result.setdefault("apiVersion", kind_info("Workload").api_version)
        self.cache.upsert(result)
        return None, True

    def report_pods_ready(self, resource: TrainingRun | Benchmark, uid: str) -> Problem | None:
        """Write the admitted Workload's `PodsReady` condition when it changes.

        Kueue computes it only for the jobs of its own integrations; without it, its
        `waitForPodsReady` timeout would evict every admitted run, pods up or not. A merge patch
        of the conditions with the Workload's resourceVersion as a precondition, as
        :meth:`release_quota`: a concurrent change by Kueue wins and triggers a new reconcile.
        """
        ns = resource.metadata.namespace or "default"
        name = builders.workload_name(resource)
        live = self.cache.get("Workload", ns, name)
        if live is None:
            return None
        status, reason, message = pods_ready_condition(live, self.cache.owned(uid))
        conds = list((live.get("status") or {}).get("conditions") or ())
        old = c.find(conds, WL_PODS_READY)
        if old is not None and (old.get("status"), old.get("reason")) == (status, reason):
            return None
        entry = {
            "type": WL_PODS_READY,
            "status": status,
            "reason": reason,
            "message": message,
            "observedGeneration": live["metadata"].get("generation"),
            "lastTransitionTime": c.timestamp(self.now())
            if old is None or old.get("status") != status
            else old.get("lastTransitionTime"),
        }
        conditions = [x for x in conds if x.get("type") != WL_PODS_READY] + [entry]
        problem, patched = self._patch_workload_status(
            ns, name, live, {"conditions": conditions}, "reporting PodsReady"
        )
        if patched:
            log.info("Workload %s/%s: PodsReady %s (%s)", ns, name, status, reason)
        return problem


__all__ = ["KUEUE_API", "KUEUE_CHECK_SECONDS", "KueueWorkloads"]
